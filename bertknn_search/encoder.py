"""Encoder: text -> hidden states at [MASK] (the kNN keys and queries) and p_BERT."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from bertknn_search.errors import ConfigError, ModelLoadError, QuestionError
from bertknn_search.textcheck import describe_unencodable, first_unencodable

MASK = "[MASK]"


@dataclass(frozen=True)
class Placement:
    """Where the encoder runs: the torch device and the compute dtype chosen for it."""

    device: Any  # torch.device; typed loosely so that importing this module does not import torch
    dtype: Any


DEVICES = "auto, cpu, cuda or cuda:N"


def place(device: str) -> Placement:
    """Choose device and dtype: bf16 on a GPU (tensor cores, fp32 range), fp32 on the CPU.

    This is the one place that branches on the device kind. On the CPU, torch's thread pool is sized
    to the cores this process may use (see ``threads.size_torch_threads``).

    Raises:
        ConfigError: ``device`` is not one of auto, cpu, cuda, cuda:N, or N is not a GPU here.
        ModelLoadError: a GPU was asked for and there is none.
    """
    import torch

    from bertknn_search.threads import size_torch_threads

    name = device.strip().lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    kind, colon, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (
        colon and (kind == "cpu" or not (index.isascii() and index.isdigit()))
    ):
        raise ConfigError(f"device {device!r} (--device or BERTKNN_DEVICE) is not one of {DEVICES}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"--device {device} asked for, but no CUDA GPU is available; use --device cpu"
            )
        count = torch.cuda.device_count()
        if index and int(index) >= count:
            raise ConfigError(
                f"device {device!r} asked for, but this machine has {count} GPU(s):"
                f" cuda:0 to cuda:{count - 1}"
            )
    size_torch_threads()
    return Placement(torch.device(name), torch.bfloat16 if kind == "cuda" else torch.float32)


LOCAL, CACHE, HUB = "local", "cache", "hub"
HUB_TIMEOUT_S = 3.0  # one quick look: a reachable hub answers well within it


def locate_model(name: str, origin: str | None = None) -> str:
    """Where the files of model ``name`` are: ``LOCAL`` (a folder), ``CACHE`` (the HF cache) or ``HUB``.

    Disk comes first, so a local or cached model never touches the network. For a name that is neither,
    one quick request tells whether the hub can be reached, instead of huggingface_hub's minute of retries.

    Args:
        name: a local path or an HF checkpoint name.
        origin: where the name came from, for the message (e.g. "from --model").

    Raises:
        ModelLoadError: neither a local path nor cached, and the hub cannot be reached (or is not a name
            the hub could hold).
    """
    from huggingface_hub import constants, try_to_load_from_cache

    said = f"model {name!r}" + (f" ({origin})" if origin else "")
    if Path(name).exists():
        return LOCAL
    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError as exc:  # HFValidationError: "./models/x", "a/b/c" are paths, not hub names
        raise ModelLoadError(f"cannot load {said}: no such folder (and not an HF model name)") from exc
    if isinstance(cached, str):
        return CACHE
    why = hub_unreachable()
    if why is not None:
        raise ModelLoadError(
            f"cannot load {said}: not a local path and not in the HF cache ({constants.HF_HUB_CACHE}), and"
            f" the hub is unreachable ({why}); give a local path, or download it once where the hub is"
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
    from huggingface_hub import try_to_load_from_cache

    path: Any = Path(name) / "config.json"
    if not path.is_file():
        try:
            path = try_to_load_from_cache(name, "config.json")
        except ValueError:
            return None
    try:
        limit = json.loads(Path(path).read_text(encoding="utf-8")).get("max_position_embeddings")
    except (TypeError, OSError, ValueError, AttributeError):
        return None
    return limit if isinstance(limit, int) else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Encoder:
    """A masked language model loaded from an HF checkpoint name or a local path.

    Two views of the same weights, each loaded on first use:
    - ``trunk``: only the first ``layer`` blocks, for datastore keys (ingest never needs the rest);
    - ``mlm``: the whole model, for queries (hidden state at ``layer`` and p_BERT in one pass).
    """

    def __init__(self, model: str, layer: int, device: str = "auto", max_length: int = 512) -> None:
        self.model_name = model
        self.layer = layer
        self.requested_device = device
        self.max_length = max_length
        self.source = locate_model(model)
        try:
            from transformers import AutoConfig, AutoTokenizer

            # On disk (a folder or the HF cache): never ask the hub, which retries for a minute offline.
            offline = self.source != HUB
            self.tokenizer = AutoTokenizer.from_pretrained(model, use_fast=True, local_files_only=offline)
            self.model_config = AutoConfig.from_pretrained(model, local_files_only=offline)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load model {model!r}: {_first_line(exc)}") from exc
        n_layers = int(getattr(self.model_config, "num_hidden_layers", 0))
        if not 1 <= layer <= n_layers:
            raise ModelLoadError(f"--layer {layer} is out of range: model {model!r} has {n_layers} layers")
        if self.tokenizer.mask_token_id is None:
            raise ModelLoadError(f"model {model!r} has no mask token; a masked language model is needed")
        self.max_length = min(max_length, int(getattr(self.model_config, "max_position_embeddings", 512)))
        # Read once: during ingest another thread tokenizes, and the Rust tokenizer is not to be shared.
        self.pad_id = int(self.tokenizer.pad_token_id or 0)

    # -- facts about the model -------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return int(self.model_config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.model_config.vocab_size)

    @cached_property
    def vocab(self) -> list[str]:
        """Token string of each id."""
        words = [""] * self.vocab_size
        for word, idx in self.tokenizer.get_vocab().items():
            if 0 <= idx < self.vocab_size:
                words[idx] = word
        return words

    def single_token_id(self, word: str) -> int | None:
        """The id of ``word`` if the tokenizer turns it into exactly one token, else None."""
        ids = self.tokenizer(word, add_special_tokens=False)["input_ids"]
        return int(ids[0]) if len(ids) == 1 else None

    @cached_property
    def placement(self) -> Placement:
        return place(self.requested_device)

    # -- the two views -----------------------------------------------------------------------------
    def _load(self, **overrides: Any) -> Any:
        from transformers import AutoModelForMaskedLM
        from transformers.utils import logging as hf_logging

        # The trunk deliberately leaves the top blocks unloaded; the load report would list them as
        # "unexpected" keys, which is noise to a user, so it is silenced for the load alone.
        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            model = self._from_pretrained(AutoModelForMaskedLM, overrides)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load weights of {self.model_name!r}: {_first_line(exc)}") from exc
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
        return model.to(self.placement.device).eval()

    def _from_pretrained(self, loader: Any, overrides: dict[str, Any]) -> Any:
        kwargs = {"attn_implementation": "sdpa", "dtype": self.placement.dtype, **overrides}
        if self.source == HUB:
            return loader.from_pretrained(self.model_name, **kwargs)
        try:
            return loader.from_pretrained(self.model_name, local_files_only=True, **kwargs)
        except OSError:
            # The cache may hold the tokenizer without the weights (a tokenizer was loaded once alone):
            # fetch them when the hub answers, else report what is missing.
            if self.source != CACHE or hub_unreachable() is not None:
                raise
            return loader.from_pretrained(self.model_name, **kwargs)

    @cached_property
    def trunk(self) -> Any:
        """The base model cut after block ``layer``: its last hidden state is the datastore key."""
        return self._load(num_hidden_layers=self.layer).base_model

    @cached_property
    def mlm(self) -> Any:
        return self._load()

    # -- keys (ingest) -----------------------------------------------------------------------------
    def key_states(self, rows: Sequence[Sequence[int]], mask_positions: Sequence[int]) -> np.ndarray:
        """Hidden states of block ``layer`` at the mask, one per row.

        Args:
            rows: token ids with special tokens, one [MASK] each; lengths may differ (padded here).
            mask_positions: index of the [MASK] in each row.

        Returns:
            (len(rows), dim) float16.
        """
        if not rows:
            return np.zeros((0, self.dim), np.float16)
        return next(self.key_states_many([(rows, mask_positions)]))

    def key_states_many(
        self, batches: Iterable[tuple[Sequence[Sequence[int]], Sequence[int]]]
    ) -> Iterator[np.ndarray]:
        """``key_states`` for each (rows, mask_positions) batch, in order, pipelined on a GPU.

        On CUDA a batch's states are copied back into pinned memory asynchronously and handed out only
        after the next batch has been queued, so the device never waits for Python to collect a result.
        """
        import torch

        dev = self.placement.device
        cuda = dev.type == "cuda"
        in_flight: tuple[Any, Any] | None = None
        for rows, positions in batches:
            ids, attention = self._pad(rows)
            with torch.inference_mode():
                out = self.trunk(
                    input_ids=ids.to(dev, non_blocking=True),
                    attention_mask=attention.to(dev, non_blocking=True),
                )
                pos = torch.as_tensor(positions, device=dev)
                states = out.last_hidden_state[torch.arange(len(rows), device=dev), pos].to(torch.float16)
                if cuda:
                    host = torch.empty(states.shape, dtype=torch.float16, pin_memory=True)
                    host.copy_(states, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record()
            # Yield outside inference_mode: the caller runs while this generator is suspended.
            if not cuda:
                yield states.numpy()
                continue
            if in_flight is not None:
                yield _collect(*in_flight)
            in_flight = (host, done)
        if in_flight is not None:
            yield _collect(*in_flight)

    def _pad(self, rows: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        """Right-padded (B, width) int64 ids and attention mask, built with numpy in one pass."""
        import torch

        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        attention = np.arange(int(lengths.max())) < lengths[:, None]
        ids = np.full(attention.shape, self.pad_id, dtype=np.int64)
        # A row-major boolean assignment fills each row's first len(row) slots, in row order.
        ids[attention] = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
        ids_t, attention_t = torch.from_numpy(ids), torch.from_numpy(attention.astype(np.int64))
        if self.placement.device.type == "cuda":
            # Pinned host memory lets the copy to the GPU overlap with the previous batch's compute.
            ids_t, attention_t = ids_t.pin_memory(), attention_t.pin_memory()
        return ids_t, attention_t

    # -- queries -----------------------------------------------------------------------------------
    def prepare(self, question: str) -> list[int]:
        """Token ids of a cloze question with its single [MASK], special tokens included.

        Raises:
            QuestionError: no [MASK], several, nothing else in the question, or characters that are not
                text (undecodable bytes given on a command line).
        """
        text = question.strip()
        bad = first_unencodable(text)
        if bad is not None:
            raise QuestionError(
                f"the question is not valid text: {describe_unencodable(text, bad, from_bytes=True)}"
            )
        count = text.count(MASK)
        if not text:
            raise QuestionError("the question is empty; write a sentence with one [MASK]")
        if count != 1:
            raise QuestionError(f"the question must contain exactly one {MASK}, found {count}: {text!r}")
        text = text.replace(MASK, self.tokenizer.mask_token)
        ids = self.tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"]
        if len(ids) > self.max_length:
            raise QuestionError(f"the question is {len(ids)} tokens long; the model takes {self.max_length}")
        return list(ids)

    def query(self, questions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Query states and p_BERT for a batch of cloze questions.

        Returns:
            states: (B, dim) float32, hidden state of block ``layer`` at [MASK].
            p_bert: (B, vocab_size) float32, softmax of the MLM logits at [MASK] over the whole vocabulary.
        """
        import torch

        rows = [self.prepare(q) for q in questions]
        if not rows:
            return np.zeros((0, self.dim), np.float32), np.zeros((0, self.vocab_size), np.float32)
        mask_id = self.tokenizer.mask_token_id
        positions = [row.index(mask_id) for row in rows]
        ids, attention = self._pad(rows)
        dev = self.placement.device
        with torch.inference_mode():
            out = self.mlm(input_ids=ids.to(dev), attention_mask=attention.to(dev), output_hidden_states=True)
            index = (torch.arange(len(rows), device=dev), torch.as_tensor(positions, device=dev))
            states = out.hidden_states[self.layer][index].float()
            p_bert = torch.softmax(out.logits[index].float(), dim=-1)
        return states.cpu().numpy(), p_bert.cpu().numpy()


def _collect(host: Any, done: Any) -> np.ndarray:
    done.synchronize()
    return host.numpy()
