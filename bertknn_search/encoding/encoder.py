"""Encoder: text -> hidden states at [MASK] (the kNN keys and queries) and p_BERT.

Where it runs is ``placement``, where its files are ``model_lookup``, whether it has an MLM head
``heads``, which runtime runs it ``runtime``; this module loads the model and runs it.
"""

from __future__ import annotations

import copy
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from itertools import chain
from typing import Any

import numpy as np

from bertknn_search import interrupts
from bertknn_search.encoding.deferred_imports import deferred
from bertknn_search.encoding.heads import architectures_have_head, no_head_line
from bertknn_search.encoding.model_lookup import (
    CACHE,
    CONVERTED,
    HUB,
    hub_unreachable,
    locate_model,
    model_files,
)
from bertknn_search.encoding.placement import Placement, place
from bertknn_search.encoding.runtime import TORCH, Runtime, choose_runtime
from bertknn_search.errors import ModelLoadError, QuestionError
from bertknn_search.textcheck import MASK, check_question


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Encoder:
    """A masked language model loaded from an HF checkpoint name or a local path.

    The weights are loaded once, on first use, and seen two ways:
    - ``trunk``: only the first ``layer`` blocks, for datastore keys (ingest never runs the rest);
    - ``mlm``: the whole model, for queries (the state at ``layer`` and p_BERT in one pass, the MLM head
      applied only at the mask).
    The trunk is a view of the same modules, so a process that ingests and answers (a lazy index) holds
    one copy of the weights. In int8 the blocks' Linear layers are quantized once, for both views.
    """

    def __init__(
        self,
        model: str,
        layer: int,
        device: str = "auto",
        max_length: int = 512,
        precision: str = "auto",
        runtime: str = "auto",
    ) -> None:
        self.model_name = model
        self.layer = layer
        self.requested_device = device
        self.requested_precision = precision
        self.max_length = max_length
        self.source = locate_model(model)
        self.runtime: Runtime = choose_runtime(model, self.source != HUB, runtime)
        try:
            self.tokenizer, self.model_config = self.runtime.tokenizer_and_config()
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load model {model!r}: {_first_line(exc)}") from exc
        n_layers = int(getattr(self.model_config, "num_hidden_layers", 0))
        if not 1 <= layer <= n_layers:
            raise ModelLoadError(
                f"--layer {layer} is out of range: model {model!r} has {n_layers} layers, so --layer takes"
                f" 1 to {n_layers}; use --layer {n_layers} for its last layer"
            )
        if self.tokenizer.mask_token_id is None:
            raise ModelLoadError(f"model {model!r} has no mask token; a masked language model is needed")
        self.max_length = min(max_length, int(getattr(self.model_config, "max_position_embeddings", 512)))
        # Sentences longer than the model takes are windowed around each mask (ingest.contexts) and a
        # question that long is refused, so the tokenizer's own "sequence length is longer than the
        # specified maximum" warning says nothing a user can act on: its limit is lifted.
        self.tokenizer.model_max_length = sys.maxsize
        # Read once: during ingest another thread tokenizes, and the Rust tokenizer is not to be shared.
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        # What the config says of an MLM head; the weights have the last word when they load (``mlm``).
        self._head_in_config = architectures_have_head(getattr(self.model_config, "architectures", None))
        self._head_missing: list[str] = []
        # Per thread (see between_blocks): a server advances several cold encodes, each on its own thread.
        self._hook = threading.local()

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
        return place(self.requested_device, self.requested_precision)

    @property
    def precision(self) -> str:
        """What the encoder computes in: "fp32", "bf16" or "int8" (what "auto" chose on this machine)."""
        return str(self.placement.precision)

    @property
    def n_layers(self) -> int:
        return int(self.model_config.num_hidden_layers)

    @property
    def has_head(self) -> bool:
        """Whether the model has a trained masked-LM head (loads the weights, which decide it).

        A checkpoint saved without one (``BertModel``, a sentence encoder) would get a randomly
        initialised head from ``AutoModelForMaskedLM``: its p_BERT would be noise. Such a model gives no
        p_BERT (``query`` returns None for it) and BERT-kNN is kNN alone.
        """
        self.mlm  # noqa: B018 (the load fills _head_missing)
        return self._head_in_config is not False and not self._head_missing

    def _no_head_reason(self) -> str | None:
        if self._head_in_config is False:
            names = ", ".join(getattr(self.model_config, "architectures", None) or [])
            return f"its config names {names}"
        if self._head_missing:
            return f"its weights lack {', '.join(self._head_missing[:2])}" + (
                ", ..." if len(self._head_missing) > 2 else ""
            )
        return None

    # -- the two views -----------------------------------------------------------------------------
    def _load(self, **overrides: Any) -> tuple[Any, list[str]]:
        """The model, and the names of the head's weights the checkpoint lacks (randomly initialised)."""
        if self.runtime.name == TORCH:
            model, missing = self.runtime.load_torch(self.placement, overrides.get("num_hidden_layers"))
        else:
            model, missing = self._load_transformers(overrides)
        model = model.to(self.placement.device).eval()
        if self.precision == "int8":
            _quantize_blocks(model.base_model)
        return model, missing

    def _load_transformers(self, overrides: dict[str, Any]) -> tuple[Any, list[str]]:
        from transformers import AutoModelForMaskedLM
        from transformers.utils import logging as hf_logging

        # The load report lists the weights a checkpoint lacks (a head-less one: the MLM head's) or has
        # beyond the model (a model cut short: the top blocks). The head is judged below and said once in
        # this project's words; the report is noise to a user, so it is silenced for the load alone.
        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            with deferred():  # SciPy's optimizers, which transformers imports for losses never used here
                model, info = self._from_pretrained(AutoModelForMaskedLM, overrides)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load weights of {self.model_name!r}: {_first_line(exc)}") from exc
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
        base = f"{model.base_model_prefix}."
        missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(base))
        return model, missing

    def _from_pretrained(self, loader: Any, overrides: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        kwargs = {
            "attn_implementation": "sdpa",
            "dtype": self.placement.dtype,
            "output_loading_info": True,
            **overrides,
        }
        if self.source == HUB:
            return loader.from_pretrained(self.model_name, **kwargs)
        try:
            # model_files: the folder of a model 'model get' converted (its name is not an HF cache's)
            return loader.from_pretrained(model_files(self.model_name), local_files_only=True, **kwargs)
        except OSError:
            # The cache may hold the tokenizer without the weights (a tokenizer was loaded once alone):
            # fetch them when the hub answers, else report what is missing.
            if self.source != CACHE or hub_unreachable() is not None:
                raise
            return loader.from_pretrained(self.model_name, **kwargs)

    @cached_property
    def mlm(self) -> Any:
        """The whole masked LM (its head randomly initialised where the checkpoint has none: unused)."""
        model, self._head_missing = self._load()
        lines = [self.runtime.line] if self.runtime.line else []
        if self.source == CONVERTED:  # not the HF cache: say which files these are
            lines.append(f"model {self.model_name}: from 'model get' ({self.runtime.folder})")
        why = self._no_head_reason()
        if why is not None:
            lines.append(no_head_line(self.model_name, why))
        if lines:
            # tqdm.write: the model loads while an ingest or eval progress bar may be on screen.
            from tqdm import tqdm

            for line in lines:
                tqdm.write(line, file=sys.stderr)
        return model

    @cached_property
    def trunk(self) -> Any:
        """The base model cut after block ``layer``: its last hidden state is the datastore key.

        A view of ``mlm``'s modules (the block above ``layer`` and the MLM head cost about 7% more to
        load, and nothing to run); a model whose block list cannot be found is loaded cut short instead.
        """
        view = first_blocks(self.mlm.base_model, self.layer)
        return view if view is not None else self._load(num_hidden_layers=self.layer)[0].base_model

    @contextmanager
    def between_blocks(self, between: Callable[[], None] | None) -> Iterator[None]:
        """Call ``between`` before each transformer block of the key encodes run inside.

        A server's cold encode lets the questions that arrived meanwhile use the model there: one block
        of a few rows is milliseconds on a CPU, where a whole row of BERT-base is tens of them. Passes
        made from inside ``between`` do not call it again. ``between`` applies to this thread's passes
        only: a server runs each cold encode on its own thread and advances them in turn.
        """
        if between is None:
            yield
            return
        self._block_hooks  # noqa: B018  installed once, on the blocks queries share
        previous = getattr(self._hook, "between", None)
        self._hook.between = between
        try:
            yield
        finally:
            self._hook.between = previous

    @cached_property
    def _block_hooks(self) -> list[Any]:
        from torch import nn

        blocks = next(
            (m for m in self.trunk.modules() if isinstance(m, nn.ModuleList) and len(m) == self.layer), []
        )
        return [block.register_forward_pre_hook(self._before_block) for block in blocks]

    def _before_block(self, module: Any, args: Any) -> None:
        between = getattr(self._hook, "between", None)
        if between is None or getattr(self._hook, "inside", False):
            return
        self._hook.inside = True
        try:
            between()
        finally:
            self._hook.inside = False

    @cached_property
    def _head(self) -> Any | None:
        """The MLM head as one module (BERT's ``cls``, RoBERTa's ``lm_head``), or None when the model's
        head is spread over several modules (DistilBERT) and only its own forward applies it."""
        model = self.mlm
        base = model.base_model
        heads = [m for m in model.children() if m is not base and any(True for _ in m.parameters())]
        return heads[0] if len(heads) == 1 else None

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
            interrupts.check()  # a Ctrl-C noted during the last batch stops here, outside torch
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
        text = check_question(question).replace(MASK, self.tokenizer.mask_token)
        ids = self.tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"]
        if len(ids) > self.max_length:
            raise QuestionError(f"the question is {len(ids)} tokens long; the model takes {self.max_length}")
        return list(ids)

    def query(self, questions: Sequence[str]) -> tuple[np.ndarray, np.ndarray | None]:
        """Query states and p_BERT for a batch of cloze questions.

        Returns:
            states: (B, dim) float32, hidden state of block ``layer`` at [MASK].
            p_bert: (B, vocab_size) float32, softmax of the MLM logits at [MASK] over the whole vocabulary;
                None for a model without an MLM head (``has_head``), whose states come from the trunk.
        """
        import torch

        interrupts.check()
        rows = [self.prepare(q) for q in questions]
        empty_p = np.zeros((0, self.vocab_size), np.float32) if self.has_head else None
        if not rows:
            return np.zeros((0, self.dim), np.float32), empty_p
        mask_id = self.tokenizer.mask_token_id
        positions = [row.index(mask_id) for row in rows]
        ids, attention = self._pad(rows)
        dev = self.placement.device
        pos = torch.as_tensor(positions, device=dev)
        with torch.inference_mode():
            if not self.has_head:
                out = self.trunk(input_ids=ids.to(dev), attention_mask=attention.to(dev))
                states = out.last_hidden_state[torch.arange(len(rows), device=dev), pos]
                return states.float().cpu().numpy(), None
            states, logits = self._states_and_logits(ids.to(dev), attention.to(dev), pos)
            p_bert = torch.softmax(logits.float(), dim=-1)
        return states.float().cpu().numpy(), p_bert.cpu().numpy()

    def _states_and_logits(self, ids: Any, attention: Any, positions: Any) -> tuple[Any, Any]:
        """The state at ``layer`` and the MLM logits, both at the mask of each row only.

        The head's vocabulary projection is the widest matrix of the model (30,522 x 768 in BERT-base):
        applied at every position of a question it costs about as much as two blocks, so it is applied
        to the mask rows alone. ``_full_states_and_logits`` is the model's own forward, for comparison.
        """
        head = self._head
        if head is None:
            return self._full_states_and_logits(ids, attention, positions)
        import torch

        below_top = self.layer < self.n_layers
        out = self.mlm.base_model(input_ids=ids, attention_mask=attention, output_hidden_states=below_top)
        index = (torch.arange(ids.shape[0], device=ids.device), positions)
        last = out.last_hidden_state[index]
        states = out.hidden_states[self.layer][index] if below_top else last
        return states, head(last)

    def _full_states_and_logits(self, ids: Any, attention: Any, positions: Any) -> tuple[Any, Any]:
        """As ``_states_and_logits``, through the model's own forward (logits at every position)."""
        import torch

        out = self.mlm(input_ids=ids, attention_mask=attention, output_hidden_states=True)
        index = (torch.arange(ids.shape[0], device=ids.device), positions)
        return out.hidden_states[self.layer][index], out.logits[index]


def first_blocks(base: Any, n: int) -> Any | None:
    """A view of transformer ``base`` that runs only its first ``n`` blocks, sharing all its weights.

    The containers from ``base`` down to its block list are copied shallowly (their own module tables,
    the same modules inside), and the copy of the block list holds the first ``n`` blocks.

    Returns:
        The view, or None when ``base`` has no module list of ``num_hidden_layers`` blocks.
    """
    from torch import nn

    total = int(base.config.num_hidden_layers)
    path = next(
        (
            name
            for name, m in base.named_modules()
            if name and isinstance(m, nn.ModuleList) and len(m) == total
        ),
        None,
    )
    if path is None:
        return None
    *parents, leaf = path.split(".")
    view = _shallow(base)
    holder = view
    for name in parents:
        child = _shallow(holder._modules[name])
        holder._modules[name] = child
        holder = child
    holder._modules[leaf] = nn.ModuleList(list(holder._modules[leaf])[:n])
    return view


def _shallow(module: Any) -> Any:
    out = copy.copy(module)
    out._modules = dict(module._modules)  # its own table, so replacing a child leaves ``module`` whole
    return out


def _quantize_blocks(base: Any) -> None:
    """Quantize ``base``'s blocks to int8 in place: dynamic activations, a scale per output channel.

    The FFN's down-projection (the Linear whose input is wider than its output) stays fp32: its input,
    the GELU output, holds the outlier values of trained BERT, and one scale per batch for them moved
    trained MiniLM's keys to cosine 0.90 with fp32; without it 0.99. Embeddings, layer norms and the MLM
    head stay fp32 as well.
    """
    import torch
    from torch import nn
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    blocks = next(m for name, m in base.named_children() if name not in ("embeddings", "pooler"))
    spec = {
        name: per_channel_dynamic_qconfig
        for name, m in blocks.named_modules()
        if isinstance(m, nn.Linear) and m.in_features <= m.out_features
    }
    with warnings.catch_warnings():
        # torch marks torch.ao.quantization deprecated in favour of torchao, whose CPU int8 kernels are
        # not faster; the call still works, and its notice is noise to a user.
        warnings.simplefilter("ignore")
        quantize_dynamic(blocks, spec, dtype=torch.qint8, inplace=True)


def _collect(host: Any, done: Any) -> np.ndarray:
    done.synchronize()
    return host.numpy()
