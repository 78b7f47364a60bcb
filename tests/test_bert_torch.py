"""The plain-torch BERT runtime against transformers, the reference: every layer's hidden states and the MLM
logits, on the tiny model, all-MiniLM-L6-v2 and a random BERT-base-shaped model; and its tokenizer.

fp32 agrees within 1e-5 (measured: 1.9e-6 tiny, 3.3e-6 MiniLM, 3.0e-6 BERT-base, at the maximum length).
bf16 is held to transformers' own bf16: the plain-torch runtime in bf16 is as far from fp32 as transformers
in bf16 is (measured: hidden states 0.061 vs 0.061 tiny, 0.132 vs 0.119 MiniLM, 0.091 vs 0.086 BERT-base;
logits 0.045 vs 0.054, 0.048 vs 0.045), so the bound is 1.5x transformers' bf16 error.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from bertknn_search.encoding.bert_torch import BertForMaskedLM, Packing, load, not_bert
from bertknn_search.encoding.tokenizer_file import FileTokenizer

FP32_TOLERANCE = 1e-5
BF16_VS_TRANSFORMERS = 1.5


@pytest.fixture(scope="module")
def bert_base_shaped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BertForMaskedLM of BERT-base's shapes (12 x 768, vocabulary 30,522), randomly initialised."""
    from transformers import BertConfig
    from transformers import BertForMaskedLM as HfBert

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("bert-base-shaped")
    HfBert(BertConfig()).save_pretrained(out)
    return out


def reference(folder: Path, head: bool, dtype: torch.dtype) -> Any:
    from transformers import AutoModel, AutoModelForMaskedLM

    loader = AutoModelForMaskedLM if head else AutoModel
    return loader.from_pretrained(str(folder), attn_implementation="sdpa", dtype=dtype).eval()


def batch(vocab: int, lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random ids ([CLS]-like first token) and their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), width), generator=generator)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids[:, 0] = 2
    return ids * mask, mask


def run(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> Any:
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask, output_hidden_states=True)


def worst(ours: Any, ref: Any, mask: torch.Tensor, head: bool) -> tuple[float, float]:
    """Largest difference of any layer's hidden states, and of the logits, at the real tokens."""
    real = mask.bool()
    assert len(ours.hidden_states) == len(ref.hidden_states)
    hidden = max(
        (a[real].float() - b[real].float()).abs().max().item()
        for a, b in zip(ours.hidden_states, ref.hidden_states)
    )
    logits = (ours.logits[real].float() - ref.logits[real].float()).abs().max().item() if head else 0.0
    return hidden, logits


CASES = {
    # name: (lengths of the rows: a single question, then padded batches with one at the maximum length)
    "single": [9],
    "padded": [12, 5, 9, 3],
    "max-length": [-1, 7, 3],
}


def compare(folder: Path, head: bool, case: str) -> None:
    ours, missing = load(folder)
    assert (missing == []) is head
    ref = reference(folder, head, torch.float32)
    limit = ours.config.max_position_embeddings
    lengths = [limit if n == -1 else n for n in CASES[case]]
    ids, mask = batch(ours.config.vocab_size, lengths)
    hidden, logits = worst(run(ours, ids, mask), run(ref, ids, mask), mask, head)
    assert hidden <= FP32_TOLERANCE and logits <= FP32_TOLERANCE


@pytest.mark.parametrize("case", CASES)
def test_tiny_model_every_layer_and_logits_equal_transformers(tiny_model: Path, case: str) -> None:
    compare(tiny_model, True, case)


@pytest.mark.parametrize("case", CASES)
def test_minilm_every_layer_equals_transformers(minilm: Path, case: str) -> None:
    compare(minilm, False, case)


@pytest.mark.parametrize("case", ["single", "max-length"])
def test_bert_base_shaped_every_layer_and_logits_equal_transformers(
    bert_base_shaped: Path, case: str
) -> None:
    compare(bert_base_shaped, True, case)


@pytest.mark.parametrize("which", ["tiny", "minilm", "base"])
def test_bf16_is_as_close_to_fp32_as_transformers_bf16(
    which: str, tiny_model: Path, minilm: Path, bert_base_shaped: Path
) -> None:
    folder, head, width = {
        "tiny": (tiny_model, True, 64),
        "minilm": (minilm, False, 128),
        "base": (bert_base_shaped, True, 128),
    }[which]
    ours, _ = load(folder, torch.bfloat16)
    ours.set_row_block(256)
    ids, mask = batch(ours.config.vocab_size, [width, 7, width // 2, 3])
    exact = run(reference(folder, head, torch.float32), ids, mask)
    theirs = worst(run(reference(folder, head, torch.bfloat16), ids, mask), exact, mask, head)
    mine = worst(run(ours, ids, mask), exact, mask, head)
    assert mine[0] <= BF16_VS_TRANSFORMERS * theirs[0]
    assert mine[1] <= BF16_VS_TRANSFORMERS * theirs[1]


def test_a_row_in_bf16_does_not_depend_on_its_batch(minilm: Path) -> None:
    """Blocks of a fixed number of rows: a row alone, in a sub-batch and in the whole batch, bit for bit."""
    ours, _ = load(minilm, torch.bfloat16)
    ours.set_row_block(256)
    lengths = [31, 12, 40, 12, 7, 25, 33, 18]
    ids, mask = batch(ours.config.vocab_size, lengths)
    whole = run(ours, ids, mask).last_hidden_state
    for i, n in enumerate(lengths):
        alone = run(ours, ids[i : i + 1, :n], mask[i : i + 1, :n]).last_hidden_state
        assert torch.equal(alone[0], whole[i, :n])
    some = run(ours, ids[2:6], mask[2:6]).last_hidden_state
    assert torch.equal(some[:, : max(lengths[2:6])], whole[2:6, : max(lengths[2:6])])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sequences_read_in_place_equal_gathered_ones(tiny_model: Path, dtype: torch.dtype) -> None:
    """A batch sorted by length (as ingest makes them) attends over each length's tokens in place; the same
    sequences apart are gathered: a sequence's states are the same bit for bit either way."""
    ours, _ = load(tiny_model, dtype)
    ours.set_row_block(256 if dtype == torch.bfloat16 else None)
    lengths = [5, 5, 5, 9, 9, 14]
    ids, mask = batch(ours.config.vocab_size, lengths)
    apart = [3, 0, 5, 1, 4, 2]
    assert all(isinstance(g.at, slice) for g in Packing(mask.bool()).groups)
    assert not any(isinstance(g.at, slice) for g in Packing(mask[apart].bool()).groups if g.rows > 1)
    in_place = run(ours, ids, mask).last_hidden_state
    gathered = run(ours, ids[apart], mask[apart]).last_hidden_state
    assert torch.equal(gathered, in_place[apart])


def test_q_k_v_run_as_one_product_until_the_weights_move(tiny_model: Path) -> None:
    """One (3h, h) product while the three layers are views of it; after ``.to(dtype)`` three again, and
    the same states either way (fp32)."""
    ours, _ = load(tiny_model)
    layer = ours.bert.encoder.layer[0]
    assert layer._fused_qkv() is not None
    ids, mask = batch(ours.config.vocab_size, [9, 4])
    fused = run(ours, ids, mask).last_hidden_state
    ours.to(torch.float64).to(torch.float32)  # new tensors: the layers are no longer views of the fused one
    assert layer._fused_qkv() is None and layer._qkv is None
    assert torch.allclose(run(ours, ids, mask).last_hidden_state, fused, atol=1e-6)


def test_weights_from_pytorch_model_bin_and_tf_era_names_load_the_same(
    tiny_model: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    copy = tmp_path / "bin"
    shutil.copytree(tiny_model, copy)
    (copy / "model.safetensors").unlink()
    weights = load_file(str(tiny_model / "model.safetensors"))
    # Old checkpoints name LayerNorm's parameters gamma and beta.
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in weights.items()
    }
    torch.save(renamed, copy / "pytorch_model.bin")
    ids, mask = batch(137, [10, 4])
    a, b = run(load(tiny_model)[0], ids, mask), run(load(copy)[0], ids, mask)
    assert torch.equal(a.logits, b.logits)


def test_missing_encoder_weights_and_wrong_shapes_are_clear_errors(tiny_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(tiny_model / "model.safetensors"))
    for name, change in {
        "lack": lambda w: {k: v for k, v in w.items() if "layer.3.output.dense.weight" not in k},
        "shape": lambda w: {**w, "bert.embeddings.word_embeddings.weight": torch.zeros(10, 64)},
    }.items():
        folder = tmp_path / name
        shutil.copytree(tiny_model, folder)
        save_file(change(weights), str(folder / "model.safetensors"))
        with pytest.raises(
            ValueError,
            match="lack bert.encoder.layer.3.output.dense.weight" if name == "lack" else r"\(10, 64\)",
        ):
            load(folder)


def test_the_mlm_decoder_is_the_word_embeddings(tiny_model: Path) -> None:
    model, _ = load(tiny_model)
    assert isinstance(model, BertForMaskedLM) and model.cls is not None
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"model_type": "roberta"}, "model_type 'roberta'"),
        ({"is_decoder": True}, "decoder"),
        ({"position_embedding_type": "relative_key"}, "relative_key"),
        ({"hidden_act": "mish"}, "mish"),
    ],
)
def test_configs_it_cannot_run_are_named(tiny_model: Path, change: dict[str, Any], why: str) -> None:
    raw = json.loads((tiny_model / "config.json").read_text())
    assert not_bert(raw) is None
    assert why in (not_bert({**raw, **change}) or "")


TEXTS = [
    "Albert Einstein was born in [MASK].",
    "Zorblat Quenton's café — naïve résumé 東京 ",
    "",
    "  several   spaces\tand\nnewlines ",
    "HELLO WORLD!!! 1879-03-14 isn't",
]


@pytest.mark.parametrize("which", ["tiny", "minilm"])
def test_tokenizer_file_gives_what_transformers_gives(which: str, tiny_model: Path, minilm: Path) -> None:
    from transformers import AutoTokenizer

    folder = tiny_model if which == "tiny" else minilm
    ours, theirs = FileTokenizer(folder), AutoTokenizer.from_pretrained(str(folder), use_fast=True)
    for special in (True, False):
        a = ours(TEXTS, add_special_tokens=special, return_offsets_mapping=True)
        b = theirs(TEXTS, add_special_tokens=special, return_offsets_mapping=True)
        assert a["input_ids"] == b["input_ids"]  # MiniLM's tokenizer.json pads to 128: not here
        assert [list(map(tuple, o)) for o in a["offset_mapping"]] == [
            list(map(tuple, o)) for o in b["offset_mapping"]
        ]
        assert [a.word_ids(i) for i in range(len(TEXTS))] == [b.word_ids(i) for i in range(len(TEXTS))]
    for text in TEXTS:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"]
        assert ours.tokenize(text) == theirs.tokenize(text)
        pieces = ours.tokenize(text)
        assert ours.convert_tokens_to_string(pieces) == theirs.convert_tokens_to_string(pieces)
    for name in (
        "unk_token_id",
        "sep_token_id",
        "pad_token_id",
        "cls_token_id",
        "mask_token_id",
        "mask_token",
    ):
        assert getattr(ours, name) == getattr(theirs, name)
    assert set(ours.all_special_ids) == set(theirs.all_special_ids)
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.convert_tokens_to_ids(["hello", "qqzzqq"]) == theirs.convert_tokens_to_ids(
        ["hello", "qqzzqq"]
    )
