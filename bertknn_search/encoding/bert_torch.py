"""BERT in plain torch: the encoder's runtime for BERT checkpoints, without transformers' model code.

Importing transformers' BERT classes pulls in ``torch._dynamo`` and ``torch.distributed``: seconds of a warm
CLI question, for nothing a masked LM's forward needs. This module is that forward (embeddings, the encoder
blocks with their padding mask, every block's hidden states, the MLM head tied to the word embeddings) over
the checkpoint's own files: ``config.json`` and ``model.safetensors`` (or ``pytorch_model.bin``).
transformers stays the reference: tests/test_bert_torch.py compares every layer with it.

The modules carry transformers' names (``bert.encoder.layer.3.attention.self.query``), so a checkpoint loads
by name and what the encoder does to a model (``first_blocks``, the int8 quantization of the blocks, a hook
before each block) works on either runtime.

A batch runs packed: its real tokens, without padding, are the rows of one (tokens, hidden) matrix, and
attention runs per group of sequences of one length. With ``row_block`` set (bf16), every matrix product
sees blocks of exactly that many token rows: bf16 kernels choose their blocking by the number of rows and
round a row differently in a batch of another size, which moved a question's probabilities by up to 2e-3
with its batch-mates (issue 39). So a row's numbers depend on the row alone, not on what it is batched with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    # transformers' NewGELUActivation, written as it writes it (the same rounding in bf16)
    "gelu_new": lambda x: (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))
    ),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# The MLM head's weights (its decoder is the word embeddings, tied); a checkpoint lacking any has no head.
HEAD_KEYS = (
    "cls.predictions.bias",
    "cls.predictions.transform.LayerNorm.bias",
    "cls.predictions.transform.LayerNorm.weight",
    "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.dense.weight",
)


@dataclass(frozen=True)
class BertConfig:
    """What ``config.json`` says of a BERT model (the fields this runtime reads; the rest is ignored)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    tie_word_embeddings: bool = True
    architectures: tuple[str, ...] = ()
    model_type: str = "bert"

    @classmethod
    def read(cls, path: Path) -> BertConfig:
        raw = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known and v is not None}
        values["architectures"] = tuple(values.get("architectures", ()))
        return cls(**values)


def not_bert(raw: dict[str, Any]) -> str | None:
    """Why a checkpoint's config (``config.json`` as a dict) is not one this runtime runs; None when it is.

    BERT with absolute positions, as an encoder (no decoder, no cross-attention), with an activation of
    ``ACTIVATIONS``: BertForMaskedLM, BertModel, BertForPreTraining and the task heads over the same body.
    """
    if raw.get("model_type") != "bert":
        return f"model_type {raw.get('model_type')!r} is not bert"
    if raw.get("is_decoder") or raw.get("add_cross_attention"):
        return "it is configured as a decoder"
    position = raw.get("position_embedding_type", "absolute")
    if position != "absolute":
        return f"position_embedding_type {position!r}"
    act = raw.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        return f"hidden_act {act!r}"
    return None


@dataclass
class BertOutput:
    """What a forward gives, shaped as transformers' outputs (padded (B, L, ...); zeros at padding)."""

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    logits: torch.Tensor | None = None


@dataclass(frozen=True)
class Group:
    """The sequences of one length in a packed batch: how many, their length, and where their tokens are
    in the packed rows (a slice when they are adjacent, else an index of every token, sequence by
    sequence)."""

    rows: int
    length: int
    at: slice | torch.Tensor


class Packing:
    """Where the tokens of a padded (B, L) batch sit in the (tokens, hidden) matrix the blocks run on.

    On a CPU the real tokens alone, in row-major order; ``groups`` holds, per distinct sequence length,
    where its sequences' tokens are, so attention runs on each group as one unpadded batch. In a batch
    sorted by length (ingest sorts its batches) a group's tokens are one run of rows, read and written in
    place rather than gathered and scattered back (with the output projection's inputs no longer copied
    side by side, a BERT-base forward took 0.75x the CPU time at load 20-24: docs/performance.md).
    On a GPU (``padded``) every position, padding included, as transformers runs them: there the index
    work and a kernel launch per group cost more than the padding (a batch of 128 keys of BERT-base took
    1.7x transformers' time on an H200 packed, 11x with attention per group).
    """

    def __init__(self, mask: torch.Tensor, padded: bool = False) -> None:
        self.mask = mask
        self.padded = padded

    def pack(self, batch: torch.Tensor) -> torch.Tensor:
        """(B, L, ...) -> (tokens, ...)."""
        return batch.reshape(-1, *batch.shape[2:]) if self.padded else batch[self.mask]

    @cached_property
    def groups(self) -> list[Group]:
        lengths = self.mask.sum(1)
        starts = torch.cumsum(lengths, 0) - lengths
        out = []
        for length in torch.unique(lengths).tolist():
            rows = (lengths == length).nonzero().flatten()
            first, last = int(rows[0]), int(rows[-1])
            if last - first + 1 == len(rows):
                # Adjacent sequences (a batch sorted by length, as ingest makes them): their tokens are
                # one run of the packed rows, read in place rather than gathered and scattered back.
                begin = int(starts[first])
                out.append(Group(len(rows), length, slice(begin, begin + len(rows) * length)))
            else:
                index = starts[rows, None] + torch.arange(length, device=self.mask.device)
                out.append(Group(len(rows), length, index.flatten()))
        return out

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """(B, L, H) with the packed rows in their places (zeros at padding, unless ``padded``)."""
        if self.padded:
            return packed.view(*self.mask.shape, packed.shape[-1])
        out = packed.new_zeros((*self.mask.shape, packed.shape[-1]))
        out[self.mask] = packed
        return out


def blockwise(fn: Callable[..., torch.Tensor], *xs: torch.Tensor, block: int | None) -> torch.Tensor:
    """``fn`` (a token-wise function of ``xs``) over their rows in blocks of exactly ``block`` rows (None:
    at once).

    Each of ``xs`` is (..., features), their leading dimensions the same rows. The last block is filled
    up with zero rows, which cost a little work and change no other row.
    """
    if block is None or xs[0].numel() == 0:
        return fn(*xs)
    lead = xs[0].shape[:-1]
    flat = [x.reshape(-1, x.shape[-1]) for x in xs]
    n = flat[0].shape[0]
    if n % block:
        flat = [torch.cat([x, x.new_zeros(block - n % block, x.shape[1])]) for x in flat]
    out = torch.cat([fn(*parts) for parts in zip(*(x.split(block) for x in flat))])[:n]
    return out.reshape(*lead, out.shape[-1])


def _holder(**children: nn.Module) -> nn.Module:
    """A module holding ``children`` by name: the levels of transformers' weight names."""
    holder = nn.Module()
    for name, child in children.items():
        holder.add_module(name, child)
    return holder


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Summed in transformers' order (words + type, then + position): in bf16 the order is the rounding.
        x = self.word_embeddings(ids) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x + self.position_embeddings(positions))


class BertLayer(nn.Module):
    """One encoder block: self-attention over each sequence's own tokens, then the feed-forward."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        h, eps = c.hidden_size, c.layer_norm_eps
        self.heads = c.num_attention_heads
        self.act = ACTIVATIONS[c.hidden_act]
        self.attention = _holder(
            self=_holder(query=nn.Linear(h, h), key=nn.Linear(h, h), value=nn.Linear(h, h)),
            output=_holder(dense=nn.Linear(h, h), LayerNorm=nn.LayerNorm(h, eps=eps)),
        )
        self.intermediate = _holder(dense=nn.Linear(h, c.intermediate_size))
        self.output = _holder(dense=nn.Linear(c.intermediate_size, h), LayerNorm=nn.LayerNorm(h, eps=eps))

    def forward(self, x: torch.Tensor, packing: Packing, block: int | None) -> torch.Tensor:
        h = x.shape[1]
        qkv, out = self.attention.self, self.attention.output
        fused = self._fused_qkv()
        if fused is not None:
            q, k, v = blockwise(lambda t: F.linear(t, *fused), x, block=block).split(h, 1)
        else:
            q, k, v = blockwise(
                lambda t: torch.cat([qkv.query(t), qkv.key(t), qkv.value(t)], 1), x, block=block
            ).split(h, 1)
        context = self._attend(q, k, v, packing)
        x = blockwise(lambda c, t: out.LayerNorm(out.dense(c) + t), context, x, block=block)
        ffn, down = self.intermediate, self.output
        return blockwise(lambda t: down.LayerNorm(down.dense(self.act(ffn.dense(t))) + t), x, block=block)

    def fuse_qkv(self) -> None:
        """Hold the Q, K and V weights in one (3h, h) tensor, the three Linear layers' weights views of it,
        so that one product makes all three (0.76x the three products and their concatenation, fp32,
        BERT-base's shapes). The names and the state dict stay transformers'."""
        qkv = self.attention.self
        layers = (qkv.query, qkv.key, qkv.value)
        weight = torch.cat([m.weight for m in layers])
        bias = torch.cat([m.bias for m in layers])
        h = qkv.query.out_features
        for i, m in enumerate(layers):
            m.weight = nn.Parameter(weight[i * h : (i + 1) * h], requires_grad=False)
            m.bias = nn.Parameter(bias[i * h : (i + 1) * h], requires_grad=False)
        self._qkv = (weight, bias)

    def _fused_qkv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The fused weights while the three layers are still the plain Linear views of them: after a
        move (``.to``) or a quantization (int8) they are not, and the three products run apart."""
        fused = getattr(self, "_qkv", None)
        if fused is None:
            return None
        qkv = self.attention.self
        layers = (qkv.query, qkv.key, qkv.value)
        weight, bias = fused
        step, bias_step = weight.numel() // 3 * weight.element_size(), bias.numel() // 3 * bias.element_size()
        views = all(
            type(m) is nn.Linear
            and m.weight.data_ptr() == weight.data_ptr() + i * step
            and m.bias.data_ptr() == bias.data_ptr() + i * bias_step
            for i, m in enumerate(layers)
        )
        if not views:
            self._qkv = None  # for good: the old tensors are freed
            return None
        return fused

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing) -> torch.Tensor:
        """Scaled dot-product attention of each sequence over its own tokens.

        On a CPU per group of sequences of one length (no padding, so a sequence's numbers do not depend
        on its batch-mates' lengths); on a GPU (``packing.padded``) as one batch with the padding masked.
        """
        n, h = q.shape
        shape = (self.heads, h // self.heads)
        if packing.padded:
            batch, width = packing.mask.shape
            q_, k_, v_ = (t.reshape(batch, width, *shape).transpose(1, 2) for t in (q, k, v))
            keep = packing.mask[:, None, None, :]
            att = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=keep)
            return att.transpose(1, 2).reshape(n, h)
        out = q.new_empty(n, h)
        for group in packing.groups:
            rows, length = group.rows, group.length
            q_, k_, v_ = (t[group.at].view(rows, length, *shape).transpose(1, 2) for t in (q, k, v))
            att = F.scaled_dot_product_attention(q_, k_, v_)
            out[group.at] = att.transpose(1, 2).reshape(rows * length, h)
        return out


class BertModel(nn.Module):
    """Embeddings and the encoder blocks (no pooler: nothing here uses it)."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.config = c
        self.embeddings = BertEmbeddings(c)
        self.encoder = _holder(layer=nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers)))
        self.row_block: int | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> BertOutput:
        mask = (
            torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        )
        packing = Packing(mask, padded=input_ids.is_cuda)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.embeddings(packing.pack(input_ids), packing.pack(positions))
        states = [x]
        for layer in self.encoder.layer:
            x = layer(x, packing, self.row_block)
            if output_hidden_states:
                states.append(x)
        hidden = tuple(packing.unpack(s) for s in states) if output_hidden_states else None
        return BertOutput(packing.unpack(x), hidden)


class BertMlmHead(nn.Module):
    """transformers' ``cls``: transform (dense, activation, layer norm), then the word embeddings + a bias."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        h = c.hidden_size
        self.act = ACTIVATIONS[c.hidden_act]
        self.predictions = _holder(
            transform=_holder(dense=nn.Linear(h, h), LayerNorm=nn.LayerNorm(h, eps=c.layer_norm_eps)),
            decoder=nn.Linear(h, c.vocab_size),
        )
        self.row_block: int | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        p = self.predictions
        return blockwise(
            lambda t: p.decoder(p.transform.LayerNorm(self.act(p.transform.dense(t)))),
            hidden,
            block=self.row_block,
        )


class BertForMaskedLM(nn.Module):
    """The model the encoder sees: ``base_model`` (``bert``) and ``cls`` where the checkpoint has one."""

    base_model_prefix = "bert"

    def __init__(self, c: BertConfig, head: bool) -> None:
        super().__init__()
        self.config = c
        self.bert = BertModel(c)
        self.cls = BertMlmHead(c) if head else None

    @property
    def base_model(self) -> BertModel:
        return self.bert

    def set_row_block(self, block: int | None) -> None:
        """Run every matrix product over blocks of exactly ``block`` token rows (see the module's note)."""
        self.bert.row_block = block
        if self.cls is not None:
            self.cls.row_block = block

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> BertOutput:
        out = self.bert(input_ids, attention_mask, output_hidden_states)
        if self.cls is not None:
            out.logits = self.cls(out.last_hidden_state)
        return out


def weights_file(folder: Path) -> Path | None:
    """The checkpoint's weights in ``folder``: model.safetensors, else pytorch_model.bin; None if neither."""
    return next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    # weights_only: a pickle that holds anything but tensors is refused rather than run.
    return dict(torch.load(path, map_location="cpu", weights_only=True, mmap=True))


def _weight_name(key: str) -> str:
    """transformers' name for a checkpoint key: TF-era checkpoints call LayerNorm's weights gamma and beta."""
    if key.endswith(".gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith(".beta"):
        return key[: -len("beta")] + "bias"
    return key


def load(
    folder: Path, dtype: torch.dtype = torch.float32, layers: int | None = None
) -> tuple[BertForMaskedLM, list[str]]:
    """The model in ``folder`` (config.json and its weights), in ``dtype``, on the CPU, in eval mode.

    ``layers`` keeps the first blocks only (a model cut short; None: all of them).

    Returns:
        The model, and the MLM head's weights the checkpoint lacks (sorted; empty when it has its head).
        A model lacking any has no head (``cls`` is None), where transformers would draw one at random.

    Raises:
        ValueError: no weights file, or weights of the encoder missing or of the wrong shape.
    """
    config = BertConfig.read(folder / "config.json")
    if layers is not None:
        config = replace(config, num_hidden_layers=layers)
    path = weights_file(folder)
    if path is None:
        raise ValueError(f"no {' or '.join(WEIGHT_FILES)} in {folder}")
    found = {_weight_name(k): v for k, v in read_weights(path).items()}
    state = {("bert." + k if not k.startswith(("bert.", "cls.")) else k): v for k, v in found.items()}
    missing_head = sorted(k for k in HEAD_KEYS if k not in state)
    with torch.device("meta"):
        model = BertForMaskedLM(config, head=not missing_head)
    wanted = model.state_dict()
    untied = "cls.predictions.decoder.weight"
    tie = model.cls is not None and (config.tie_word_embeddings or untied not in state)
    if model.cls is not None:
        state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
        if tie:
            state[untied] = state["bert.embeddings.word_embeddings.weight"]
    absent = [k for k in wanted if k not in state]
    if absent:
        raise ValueError(
            f"the weights in {path.name} lack {absent[0]}"
            + (f" and {len(absent) - 1} more" if len(absent) > 1 else "")
        )
    for key, meta in wanted.items():
        if tuple(state[key].shape) != tuple(meta.shape):
            raise ValueError(
                f"{key} in {path.name} is {tuple(state[key].shape)}, the config makes it {tuple(meta.shape)}"
            )
    model.load_state_dict({k: state[k].to(dtype) for k in wanted}, assign=True)
    if model.cls is not None:
        decoder = model.cls.predictions.decoder
        if tie:  # one tensor, as in transformers, not a copy of the embeddings
            decoder.weight = model.bert.embeddings.word_embeddings.weight
    model.requires_grad_(False)
    for layer in model.bert.encoder.layer:
        layer.fuse_qkv()
    return model.eval(), missing_head
