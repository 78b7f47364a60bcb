"""Settings of one command: flags, environment, a settings file and the index become one Config.

The CLI (and any other front end) calls these, so every front end resolves settings alike and can say
where each value came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertknn_search.config import Config, env_settings, flag_name, read_settings_file
from bertknn_search.errors import ConfigError, IndexMismatchError, IndexNotFoundError
from bertknn_search.records import IndexStats

# What an index fixes once it is built; later commands take these from it.
ADOPTED = ("model", "layer", "mask_policy", "store_dtype", "max_length", "contexts", "precision")


@dataclass(frozen=True)
class Resolved:
    """A Config and where each value that is not a default came from.

    Attributes:
        config: the settings.
        origins: field -> a flag ("--model"), a variable ("BERTKNN_MODEL"), "settings file X" or
            "the index at X". Fields absent here hold their defaults.
    """

    config: Config
    origins: Mapping[str, str] = field(default_factory=dict)

    def origin(self, name: str) -> str:
        """Where field ``name`` came from, as a phrase for messages ("from --model", "the default")."""
        where = self.origins.get(name)
        return "the default" if where is None else f"from {where}"

    def given(self, name: str) -> bool:
        """Whether the user asked for field ``name`` (a flag, a variable or a settings file)."""
        return name in self.origins and not self.origins[name].startswith("the index")


def resolve_config(
    flags: Mapping[str, Any], env: Mapping[str, str] | None = None, settings: Path | None = None
) -> Resolved:
    """Flags, a settings file, the environment and the defaults, in that order of precedence.

    A model that names an existing path is made absolute, whether it came from a flag or a variable: an
    index records it, and later commands may run in another directory.

    Args:
        flags: Config field -> value; None means not given.
        env: environment variables; default ``os.environ``.
        settings: a tuned settings file (``eval grid``'s output) for the method settings.

    Raises:
        ConfigError: a value out of range, a bad variable or settings file.
    """
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for name, (value, var) in env_settings(env).items():
        values[name], origins[name] = value, var
    if settings is not None:
        for name, value in read_settings_file(settings).items():
            values[name], origins[name] = value, f"settings file {settings}"
    flags = dict(flags)
    threshold = flags.pop("gate_threshold", None)
    for name, value in flags.items():
        if value is not None:
            values[name], origins[name] = value, flag_name(name)
    if "model" in values and Path(values["model"]).exists():
        values["model"] = str(Path(values["model"]).resolve())
    _check_index_flag(values, origins)
    if threshold is None:
        return Resolved(Config(**values), origins)
    # --gate-threshold supplies the thresholds the gate is checked for, so the gate goes on after it.
    gate = values.pop("gate", "none")
    return Resolved(Config(**values).with_gate_threshold(gate, threshold), origins)


def _check_index_flag(values: Mapping[str, Any], origins: Mapping[str, str]) -> None:
    """``--index`` names an embedded index's folder: with an engine backend it would be ignored in silence.

    Raises:
        ConfigError: ``--index`` was given with ``--backend opensearch`` or ``elasticsearch``.
    """
    backend = values.get("backend", "embedded")
    if origins.get("index") == "--index" and backend in ("opensearch", "elasticsearch"):
        prefix = values.get("opensearch_prefix") or Config().opensearch_prefix
        given = origins.get("backend", "")
        undo = f"drop {given}" if given.startswith("-") else f"unset {given}"
        raise ConfigError(
            f"--index names an embedded index's folder, but the backend is {backend} (from {given}), whose"
            f" index is named by --index-prefix (now {prefix!r}): drop --index, or {undo} to use the folder"
        )


def engine_hint(error: IndexNotFoundError, resolved: Resolved) -> IndexNotFoundError:
    """A missing embedded index while an engine's URL is set (as the README exports it) most likely means
    the engine's index was meant: the line says how to reach it rather than only how to build a second."""
    if type(error) is not IndexNotFoundError or resolved.config.backend != "embedded":
        return error
    if resolved.given("backend"):
        return error
    for engine in ("opensearch", "elasticsearch"):
        origin = resolved.origins.get(f"{engine}_url")
        if origin is not None:
            return IndexNotFoundError(
                f"{error}; {origin} is set: for the index on {engine}, add --backend {engine} (or export"
                f" BERTKNN_BACKEND={engine})"
            )
    return error


def new_index_note(resolved: Resolved) -> str | None:
    """The line for ``ingest wiki`` about to make a new embedded index while an engine's URL is set and no
    backend was asked for: most likely the engine was meant (the README exports its URL)."""
    from bertknn_search.backends.embedded.sqlite_file import DB_NAME

    if resolved.config.backend != "embedded" or resolved.given("backend"):
        return None
    for engine in ("opensearch", "elasticsearch"):
        origin = resolved.origins.get(f"{engine}_url")
        if origin is not None and not (resolved.config.index / DB_NAME).exists():
            return (
                f"building an embedded index at {resolved.config.index} (the default backend); {origin} is"
                f" set: --backend {engine} builds it on {engine} instead"
            )
    return None


def adopt_index(resolved: Resolved, must_exist: bool = True) -> Resolved:
    """Take the encoding settings (``ADOPTED``) from the index; any the user gave must agree with it.

    A value from a variable (``BERTKNN_MODEL``) is held to the index exactly as one from a flag.

    Args:
        resolved: settings from ``resolve_config``.
        must_exist: False for ``ingest wiki``, which may be creating the index.

    Raises:
        IndexNotFoundError: no index (when ``must_exist``).
        IndexMismatchError: a given value differs from the index's.
    """
    from bertknn_search.backends import open_backend

    config = resolved.config
    try:
        backend = open_backend(config)
    except IndexNotFoundError as exc:
        if must_exist:
            raise engine_hint(exc, resolved) from exc
        return resolved
    try:
        meta, where = backend.meta(), backend.location
    finally:
        backend.close()
    if resolved.given("max_length") and config.max_length > meta.max_length:
        from bertknn_search.encoding.encoder import Encoder
        from bertknn_search.encoding.model_lookup import locate_model

        # The index records the limit in effect, capped at the model's: a larger request means the same.
        locate_model(meta.model, f"from the index at {where}")
        capped = Encoder(meta.model, meta.layer, "cpu", config.max_length, runtime=config.runtime).max_length
        config = config.replace(max_length=capped)
    for name in ADOPTED:
        # --precision auto means "whatever the index holds", so only a named precision can disagree.
        asked = getattr(config, name)
        if resolved.given(name) and asked != getattr(meta, name) and asked != "auto":
            origin = resolved.origins[name]
            fix = f"drop {origin}" if origin.startswith("-") else f"unset {origin}"
            raise IndexMismatchError(
                f"index at {where} was built with {name}={getattr(meta, name)!r}, not"
                f" {getattr(config, name)!r} (from {origin}); {fix} or use another"
                f" {'--index' if config.backend == 'embedded' else '--index-prefix'}"
            )
    adopted = {name: getattr(meta, name) for name in ADOPTED}
    origins = {**resolved.origins, **{name: f"the index at {where}" for name in ADOPTED}}
    return Resolved(config.replace(**adopted), origins)


def check_model(resolved: Resolved) -> None:
    """Fail fast, naming where the model name came from, when its files cannot be had.

    Raises:
        ModelLoadError: not a local path, not cached, and the hub cannot be reached.
    """
    from bertknn_search.encoding.model_lookup import locate_model

    locate_model(resolved.config.model, resolved.origin("model"))


def open_index(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    settings: Path | None = None,
    must_exist: bool = True,
) -> Resolved:
    """Settings for a command that encodes text against an index: resolved, adopted, model located.

    Args:
        flags, env, settings: as for ``resolve_config``.
        must_exist: False for a command that may create the index.

    Raises:
        ConfigError, IndexNotFoundError, IndexMismatchError, ModelLoadError.
    """
    resolved = adopt_index(resolve_config(flags, env, settings), must_exist)
    check_model(resolved)
    return resolved


def policy_for_model(resolved: Resolved) -> tuple[Resolved, str | None]:
    """A new index of a model without a masked-LM head leaves out stopwords unless a policy was asked for.

    Such a model's answers are kNN alone, and then the contexts of "the", "of" and "in" crowd the
    neighbours (kNN P@1 on T-REx 15.3 with them, 20.2 without: docs/reproducing.md). An existing index
    keeps its own policy (``adopt_index`` took it).

    Returns:
        The settings, and the line to say when the policy was chosen here (else None).
    """
    if "mask_policy" in resolved.origins:
        return resolved, None
    from bertknn_search.encoding.heads import model_has_head

    if model_has_head(resolved.config.model) is not False:
        return resolved, None
    policy = f"{resolved.config.mask_policy}-no-stopwords"
    origins = {**resolved.origins, "mask_policy": "the model (no masked-LM head)"}
    line = (
        f"mask policy: {policy} (the model has no masked-LM head, so answers are kNN alone and stopwords"
        " would crowd the neighbours); --mask-policy chooses another"
    )
    return Resolved(resolved.config.replace(mask_policy=policy), origins), line


@dataclass(frozen=True)
class Title:
    """An article a question can name as its subject, and how much of it is encoded."""

    id: str
    title: str
    encoded: int | None  # contexts stored: None where every one is (an eager index) or none yet
    total: int | None


def list_titles(config: Config, pattern: str, limit: int) -> list[Title]:
    """Up to ``limit`` titles holding ``pattern``, with each article's coverage on a lazy index."""
    from bertknn_search.backends import open_backend

    backend = open_backend(config)
    try:
        hits = backend.list_titles(pattern, limit)
        coverage = backend.coverage([h.id for h in hits])
        lazy = backend.meta().contexts == "lazy"
    finally:
        backend.close()
    out = []
    for hit in hits:
        held = coverage.get(hit.id)
        if held is not None:
            out.append(Title(hit.id, hit.title, held.encoded, held.total))
        else:
            out.append(Title(hit.id, hit.title, 0 if lazy else None, None))
    return out


def index_stats(config: Config) -> IndexStats:
    """What the index holds, with the model's own input limit and whether it has an MLM head, when its
    files can be read offline."""
    from bertknn_search.backends import open_backend
    from bertknn_search.encoding.heads import model_has_head
    from bertknn_search.encoding.model_lookup import model_max_length

    backend = open_backend(config)
    try:
        stats = backend.stats()
    finally:
        backend.close()
    model = stats.meta.model
    return dataclasses.replace(
        stats, model_max_length=model_max_length(model), mlm_head=model_has_head(model)
    )
