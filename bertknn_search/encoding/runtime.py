"""Which runtime runs a checkpoint: plain torch (``bert_torch``) for BERT, transformers for the rest.

One encoder interface (``Encoder``), two runtimes behind it. A BERT checkpoint on disk runs in plain torch:
a process that answers a question never imports transformers' model code, which is most of a warm CLI
question's start-up. Any other architecture (RoBERTa, DistilBERT, ...) runs in transformers, said in one
line; ``--runtime`` (``Config.runtime``) forces either, transformers being the reference to check against.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertknn_search.config import RUNTIMES
from bertknn_search.encoding.model_lookup import config_path, model_files
from bertknn_search.encoding.placement import Placement
from bertknn_search.errors import ConfigError, ModelLoadError

TORCH, TRANSFORMERS = "torch", "transformers"
RUNTIME_ENV = "BERTKNN_RUNTIME"  # what "auto" means for every encoder of a process, when set
# Token rows per matrix product of the plain-torch runtime in bf16 on a CPU (see bert_torch). Blocks of one
# fixed size make a row's numbers independent of its batch, and a question's state the same as the key of
# the same masked sentence. Measured on this project's 2-core CPU with AMX (one thread): blocks of 256 rows
# cost the products 1.4-1.7x of one product per batch, blocks of 64 2.8-5.7x; bf16 stays about 3x fp32.
ROW_BLOCK = 256


@dataclass(frozen=True)
class Runtime:
    """The runtime chosen for a model, where its files are, and the line said when it loads.

    Attributes:
        name: ``TORCH`` or ``TRANSFORMERS``.
        model: the model's name (an HF checkpoint name or a local path).
        folder: the folder holding its config.json, None when it is not on disk here (on the hub).
        line: said once when the weights load: why transformers runs the model ("" when nothing to say).
    """

    name: str
    model: str
    folder: Path | None
    line: str = ""

    def tokenizer_and_config(self) -> tuple[Any, Any]:
        """The tokenizer and the model's config, as this runtime reads them.

        Raises:
            OSError, ValueError: files missing or unreadable.
        """
        if self.name == TORCH and self.folder is not None:
            from bertknn_search.encoding.bert_torch import BertConfig

            config = BertConfig.read(self.folder / "config.json")
            if (self.folder / "tokenizer.json").is_file():
                from bertknn_search.encoding.tokenizer_file import FileTokenizer

                return FileTokenizer(self.folder), config
            return self._hf_tokenizer(), config
        from transformers import AutoConfig

        return self._hf_tokenizer(), AutoConfig.from_pretrained(
            self._files, local_files_only=self.folder is not None
        )

    @property
    def _files(self) -> str:
        """What transformers loads: the name, or the folder of a model 'model get' converted."""
        return model_files(self.model) if self.folder is not None else self.model

    def _hf_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        # On disk (a folder or the HF cache): never ask the hub, which retries for a minute offline.
        return AutoTokenizer.from_pretrained(
            self._files, use_fast=True, local_files_only=self.folder is not None
        )

    def load_torch(self, placement: Placement, layers: int | None = None) -> tuple[Any, list[str]]:
        """The plain-torch model (its first ``layers`` blocks; None: all) in ``placement``'s dtype, and
        the MLM head's weights its checkpoint lacks (``bert_torch.load``)."""
        from bertknn_search.encoding.bert_torch import load

        assert self.folder is not None  # choose_runtime picks TORCH only for a model on disk
        model, missing = load(self.folder, placement.dtype, layers)
        model.set_row_block(row_block(placement))
        return model, missing


def not_torch(folder: Path | None) -> str | None:
    """Why the plain-torch runtime cannot run the checkpoint in ``folder``; None when it can."""
    if folder is None:
        return "it is not on disk yet"
    from bertknn_search.encoding.bert_torch import not_bert, weights_file

    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"its config.json cannot be read ({exc})"
    if not isinstance(raw, dict):
        return "its config.json is not an object"
    why = not_bert(raw)
    if why is None and weights_file(folder) is None:
        why = "no model.safetensors or pytorch_model.bin beside its config"
    return why


def choose_runtime(model: str, on_disk: bool, requested: str = "auto") -> Runtime:
    """The runtime for ``model``: ``requested``, or for "auto" plain torch where it can run the checkpoint.

    Args:
        model: an HF checkpoint name or a local path.
        on_disk: whether its files are here (a folder or the HF cache), not only on the hub.
        requested: one of ``RUNTIMES``; "auto" takes ``BERTKNN_RUNTIME`` when it is set.

    Raises:
        ConfigError: an unknown runtime.
        ModelLoadError: "torch" asked for a checkpoint it cannot run.
    """
    if requested == "auto":
        # The environment picks for every encoder of a process, so the whole suite can run on either.
        requested = os.environ.get(RUNTIME_ENV, "").strip().lower() or "auto"
    if requested not in RUNTIMES:
        raise ConfigError(f"--runtime must be one of {', '.join(RUNTIMES)}, got {requested!r}")
    config = config_path(model) if on_disk else None
    folder = config.parent if config is not None else None
    if requested == TRANSFORMERS:
        return Runtime(TRANSFORMERS, model, folder)
    why = not_torch(folder)
    if why is None:
        return Runtime(TORCH, model, folder)
    if requested == TORCH:
        raise ModelLoadError(
            f"--runtime torch runs BERT checkpoints only, and model {model!r} cannot run there: {why};"
            " use --runtime auto or transformers"
        )
    line = f"model {model}: runs in transformers ({why}; the plain-torch runtime runs BERT checkpoints)"
    return Runtime(TRANSFORMERS, model, folder, line)


def row_block(placement: Placement) -> int | None:
    """Token rows per matrix product of the plain-torch runtime (None: a batch at once).

    Fixed blocks in bf16 on a CPU only: fp32 rounds a row the same to within 1e-6 in any batch, int8 scales
    each product by its batch's largest value anyway, and a GPU's products want a whole batch.
    """
    if placement.precision == "bf16" and placement.device.type == "cpu":
        return ROW_BLOCK
    return None
