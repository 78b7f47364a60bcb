"""Encoder: datastore keys equal query states, p_BERT, question validation, load errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertknn_search.encoding.encoder import Encoder
from bertknn_search.errors import ModelLoadError, QuestionError


@pytest.fixture(scope="module")
def encoder(tiny_model: Path) -> Encoder:
    return Encoder(str(tiny_model), layer=11, device="cpu", max_length=64)


def test_trunk_key_equals_full_model_state_at_layer(encoder: Encoder) -> None:
    # Ingest runs only the first `layer` blocks; queries run the whole model. Both must give the same
    # vector or kNN would compare apples with pears.
    states, _ = encoder.query(["zorblat was born in [MASK] ."])
    row = encoder.prepare("zorblat was born in [MASK] .")
    key = encoder.key_states([row], [row.index(encoder.tokenizer.mask_token_id)])
    assert key.dtype == np.float16 and key.shape == (1, encoder.dim)
    np.testing.assert_allclose(key[0].astype(np.float32), states[0], atol=2e-3, rtol=2e-3)


def test_keys_do_not_depend_on_padding_or_batching(encoder: Encoder) -> None:
    texts = ["zorblat was born in [MASK] .", "[MASK] knew zorblat as a famous painter in the north ."]
    rows = [encoder.prepare(t) for t in texts]
    positions = [r.index(encoder.tokenizer.mask_token_id) for r in rows]
    assert len(rows[0]) != len(rows[1])  # the shorter row is padded in a shared batch
    together = encoder.key_states(rows, positions)
    batches = [([rows[1]], [positions[1]]), ([rows[0]], [positions[0]])]
    one_by_one = list(encoder.key_states_many(batches))
    np.testing.assert_allclose(together[1], one_by_one[0][0], atol=2e-3)
    np.testing.assert_allclose(together[0], one_by_one[1][0], atol=2e-3)
    assert not np.allclose(together[0], together[1], atol=2e-3)


def test_layer_changes_the_state(tiny_model: Path, encoder: Encoder) -> None:
    other = Encoder(str(tiny_model), layer=12, device="cpu", max_length=64)
    a, _ = encoder.query(["zorblat was born in [MASK] ."])
    b, _ = other.query(["zorblat was born in [MASK] ."])
    assert not np.allclose(a, b)


def test_p_bert_is_a_distribution_over_the_vocabulary(encoder: Encoder) -> None:
    _, p = encoder.query(["zorblat was born in [MASK] .", "[MASK] is a small town ."])
    assert p.shape == (2, encoder.vocab_size)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)


def test_batched_queries_equal_single_queries(encoder: Encoder) -> None:
    qs = ["zorblat was born in [MASK] .", "the [MASK] is near the river north of quenton ."]
    s_batch, p_batch = encoder.query(qs)
    for i, q in enumerate(qs):
        s, p = encoder.query([q])
        np.testing.assert_allclose(s_batch[i], s[0], atol=1e-4)
        np.testing.assert_allclose(p_batch[i], p[0], atol=1e-5)


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ("zorblat was born in quenton .", "exactly one [MASK], found 0"),
        ("[MASK] was born in [MASK] .", "exactly one [MASK], found 2"),
        ("   ", "the question is empty"),
    ],
)
def test_bad_questions(encoder: Encoder, question: str, message: str) -> None:
    with pytest.raises(QuestionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        encoder.prepare(question)


def test_single_token_id(encoder: Encoder) -> None:
    assert encoder.single_token_id("Quenton") == encoder.tokenizer.convert_tokens_to_ids("quenton")
    assert encoder.single_token_id("unknown") is None  # un ##known: two pieces
    assert encoder.vocab[encoder.single_token_id("quenton")] == "quenton"


def test_missing_model_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        Encoder(str(tmp_path / "no-such-model"), layer=11, device="cpu")
    assert "\n" not in str(err.value) and "no-such-model" in str(err.value)


def test_layer_out_of_range_names_the_range_and_the_last_layer(tiny_model: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        Encoder(str(tiny_model), layer=13, device="cpu")
    message = str(err.value)
    assert "has 12 layers" in message and "1 to 12" in message and "use --layer 12 for its last" in message


@pytest.mark.parametrize("device", ["garbage", "meta", "cpu:99", "cpu:0", "cuda:", "cuda:x", "cuda:²"])
def test_place_refuses_what_is_not_a_device(device: str) -> None:
    from bertknn_search.encoding.placement import place
    from bertknn_search.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        place(device)
    assert (
        str(err.value)
        == f"device {device!r} (--device or BERTKNN_DEVICE) is not one of auto, cpu, cuda or cuda:N"
    )


@pytest.mark.parametrize("device", ["cpu", " CPU ", "auto"])
def test_place_accepts_the_devices_it_names(device: str) -> None:
    import torch

    from bertknn_search.encoding.placement import place

    placement = place(device)
    assert placement.device.type == ("cuda" if device == "auto" and torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ("zorblat was born in \udcff [MASK] .", "byte 0xff at character 21 is not UTF-8"),
        ("\ud800 was born in [MASK] .", "character 1 is a lone surrogate (U+D800), not text"),
    ],
)
def test_questions_that_are_not_text(encoder: Encoder, question: str, message: str) -> None:
    with pytest.raises(QuestionError) as err:
        encoder.prepare(question)
    assert str(err.value) == f"the question is not valid text: {message}"


# -- the query path: the MLM head at the mask only, one copy of the weights ----------------------------
QUESTIONS = [
    "zorblat was born in [MASK] .",
    "[MASK] knew zorblat as a famous painter in the north .",
    "the [MASK] is near the river north of quenton .",
]


@pytest.fixture(scope="module")
def base_shaped(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BERT-base widths (768 hidden, 12 heads, 3,072 FFN, 30,522 words) with 3 blocks, random weights."""
    import shutil

    import torch
    from transformers import BertConfig, BertForMaskedLM

    out = tmp_path_factory.mktemp("base-shaped")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model / name).exists():
            shutil.copy(tiny_model / name, out / name)
    torch.manual_seed(1)
    config = BertConfig(vocab_size=30522, num_hidden_layers=3, max_position_embeddings=64)
    BertForMaskedLM(config).eval().save_pretrained(out)
    return out


def _full_model_query(encoder: Encoder, questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The path before the head moved to the mask rows: the model's own forward, logits everywhere."""
    import torch

    rows = [encoder.prepare(q) for q in questions]
    positions = torch.as_tensor([r.index(encoder.tokenizer.mask_token_id) for r in rows])
    ids, attention = encoder._pad(rows)
    with torch.inference_mode():
        out = encoder.mlm(input_ids=ids, attention_mask=attention, output_hidden_states=True)
        at = (torch.arange(len(rows)), positions)
        return out.hidden_states[encoder.layer][at].numpy(), torch.softmax(out.logits[at], -1).numpy()


@pytest.mark.parametrize(("which", "layer"), [("tiny", 11), ("tiny", 12), ("base", 2), ("base", 3)])
def test_query_equals_the_full_model_forward(
    which: str, layer: int, tiny_model: Path, base_shaped: Path
) -> None:
    path = tiny_model if which == "tiny" else base_shaped
    # fp32: "auto" is bf16 on CPUs with AVX512-BF16, and the reference forward runs in fp32.
    encoder = Encoder(str(path), layer=layer, device="cpu", max_length=64, precision="fp32")
    states, p_bert = encoder.query(QUESTIONS)
    want_states, want_p = _full_model_query(encoder, QUESTIONS)
    np.testing.assert_allclose(states, want_states, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(p_bert, want_p, rtol=1e-4, atol=1e-8)
    assert (p_bert.argmax(1) == want_p.argmax(1)).all()


def test_the_mlm_head_sees_only_the_mask_rows(encoder: Encoder) -> None:
    seen: list[tuple[int, ...]] = []
    hook = encoder.mlm.cls.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    try:
        encoder.query(QUESTIONS)
    finally:
        hook.remove()
    assert seen == [(len(QUESTIONS), encoder.dim)]


def test_the_trunk_shares_the_mlm_weights(tiny_model: Path) -> None:
    encoder = Encoder(str(tiny_model), layer=5, device="cpu", max_length=64)
    encoder.query(QUESTIONS[:1])  # the mlm is loaded first, as in a lazy index's first question
    mlm_tensors = {p.data_ptr() for p in encoder.mlm.parameters()}
    trunk = encoder.trunk
    assert {p.data_ptr() for p in trunk.parameters()} <= mlm_tensors
    assert len(trunk.encoder.layer) == 5
    assert len(encoder.mlm.base_model.encoder.layer) == 12  # the view left the model whole


def test_keys_are_the_same_from_the_view_and_from_a_model_cut_short(tiny_model: Path) -> None:
    encoder = Encoder(str(tiny_model), layer=7, device="cpu", max_length=64)
    rows = [encoder.prepare(q) for q in QUESTIONS]
    positions = [r.index(encoder.tokenizer.mask_token_id) for r in rows]
    viewed = encoder.key_states(rows, positions)
    alone = Encoder(str(tiny_model), layer=7, device="cpu", max_length=64)
    alone.__dict__["trunk"] = alone._load(num_hidden_layers=7)[0].base_model  # the old, separate load
    np.testing.assert_array_equal(viewed, alone.key_states(rows, positions))
    states, _ = encoder.query(QUESTIONS)
    np.testing.assert_allclose(viewed.astype(np.float32), states, atol=2e-3, rtol=2e-3)


def test_a_model_without_a_block_list_has_no_view(encoder: Encoder) -> None:
    from torch import nn

    from bertknn_search.encoding.encoder import first_blocks

    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = encoder.model_config
            self.proj = nn.Linear(2, 2)

    assert first_blocks(Flat(), 3) is None


def test_between_blocks_runs_before_each_block_of_a_key_encode_and_not_within_itself(
    encoder: Encoder,
) -> None:
    rows = [encoder.prepare("zorblat was born in [MASK] .")] * 2
    positions = [r.index(encoder.tokenizer.mask_token_id) for r in rows]
    calls: list[int] = []

    def between() -> None:
        calls.append(1)
        encoder.query(["a question asked in between [MASK] ."])  # its own pass: no call from inside

    want = encoder.key_states(rows, positions)
    with encoder.between_blocks(between):
        got = encoder.key_states(rows, positions)
    assert len(calls) == encoder.layer  # once before each block the key passes through
    np.testing.assert_array_equal(got, want)  # what runs in between does not touch the encode
    encoder.key_states(rows, positions)
    encoder.query(["after [MASK] ."])
    assert len(calls) == encoder.layer  # outside the block, nothing is called


# -- one encoder interface, two runtimes (issue 41) ---------------------------------------------------------
def test_a_bert_checkpoint_runs_in_plain_torch_with_the_tokenizers_library(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.encoding.bert_torch import BertForMaskedLM
    from bertknn_search.encoding.tokenizer_file import FileTokenizer

    monkeypatch.delenv("BERTKNN_RUNTIME", raising=False)
    encoder = Encoder(str(tiny_model), layer=11, device="cpu", max_length=64)
    assert encoder.runtime.name == "torch" and encoder.runtime.line == ""
    assert isinstance(encoder.tokenizer, FileTokenizer)
    assert isinstance(encoder.mlm, BertForMaskedLM)


def test_both_runtimes_give_the_same_states_and_p_bert_in_fp32(tiny_model: Path) -> None:
    questions = ["zorblat was born in [MASK] .", "[MASK] knew zorblat as a famous painter in the north ."]
    torch_run = Encoder(str(tiny_model), 7, "cpu", 64, "fp32", runtime="torch")
    reference = Encoder(str(tiny_model), 7, "cpu", 64, "fp32", runtime="transformers")
    assert type(reference.mlm).__module__.startswith("transformers.")
    (s1, p1), (s2, p2) = torch_run.query(questions), reference.query(questions)
    np.testing.assert_allclose(s1, s2, atol=1e-5, rtol=0)
    np.testing.assert_allclose(p1, p2, atol=1e-5, rtol=0)
    rows = [torch_run.prepare(q) for q in questions]
    assert rows == [reference.prepare(q) for q in questions]
    positions = [r.index(torch_run.tokenizer.mask_token_id) for r in rows]
    np.testing.assert_allclose(
        torch_run.key_states(rows, positions).astype(np.float32),
        reference.key_states(rows, positions).astype(np.float32),
        atol=2e-3,  # float16 keys: one step of float16 at most
    )


def test_the_oracle_answers_are_the_same_with_either_runtime(built_index: Any, facts: list[Any]) -> None:
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Question

    questions = [Question(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in facts]
    scored = {}
    for runtime in ("torch", "transformers"):
        searcher = Searcher.open(built_index.replace(runtime=runtime))
        try:
            scored[runtime] = searcher.score_batch(questions)
        finally:
            searcher.close()
    for a, b in zip(scored["torch"], scored["transformers"]):
        np.testing.assert_allclose(a.p, b.p, atol=1e-5, rtol=0)
        assert list(a.neighbors.token_ids) == list(b.neighbors.token_ids)


@pytest.fixture(scope="module")
def distilbert(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised DistilBERT masked LM with the tiny model's tokenizer: not BERT."""
    import shutil

    import torch
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    out = tmp_path_factory.mktemp("distilbert")
    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=137, dim=64, n_layers=2, n_heads=2, hidden_dim=128, max_position_embeddings=64
    )
    DistilBertForMaskedLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(tiny_model / name, out / name)
    return out


def test_another_architecture_runs_in_transformers_and_says_so_in_one_line(
    distilbert: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BERTKNN_RUNTIME", raising=False)
    encoder = Encoder(str(distilbert), 2, "cpu", 64, "fp32")
    assert encoder.runtime.name == "transformers"
    states, p_bert = encoder.query(["zorblat was born in [MASK] ."])
    assert states.shape == (1, 64) and p_bert is not None
    said = [line for line in capsys.readouterr().err.splitlines() if "transformers" in line]
    assert len(said) == 1 and "model_type 'distilbert' is not bert" in said[0]


def test_runtime_torch_on_another_architecture_is_a_one_line_error(distilbert: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        Encoder(str(distilbert), 2, "cpu", 64, "fp32", runtime="torch")
    assert "\n" not in str(err.value) and "--runtime auto or transformers" in str(err.value)


def test_an_unknown_runtime_is_refused(tiny_model: Path) -> None:
    from bertknn_search.config import Config
    from bertknn_search.errors import ConfigError

    with pytest.raises(ConfigError, match="--runtime must be one of"):
        Config(runtime="jax")
    with pytest.raises(ConfigError, match="--runtime must be one of"):
        Encoder(str(tiny_model), 2, "cpu", 64, runtime="jax")


def test_the_environment_picks_the_runtime_of_auto(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTKNN_RUNTIME", "transformers")
    assert Encoder(str(tiny_model), 2, "cpu", 64).runtime.name == "transformers"
    assert Encoder(str(tiny_model), 2, "cpu", 64, runtime="torch").runtime.name == "torch"


def test_a_checkpoint_without_tokenizer_json_runs_in_torch_with_transformers_tokenizer(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BERTKNN_RUNTIME", raising=False)
    import shutil

    from bertknn_search.encoding.tokenizer_file import FileTokenizer

    folder = tmp_path / "no-tokenizer-json"
    shutil.copytree(tiny_model, folder)
    (folder / "tokenizer.json").unlink()
    encoder = Encoder(str(folder), 7, "cpu", 64, "fp32")
    assert encoder.runtime.name == "torch" and not isinstance(encoder.tokenizer, FileTokenizer)
    reference = Encoder(str(tiny_model), 7, "cpu", 64, "fp32")
    question = ["zorblat was born in [MASK] ."]
    np.testing.assert_array_equal(encoder.query(question)[1], reference.query(question)[1])
