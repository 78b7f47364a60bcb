"""Encoder precision: chosen per machine, int8 close to fp32, recorded by the index and never mixed."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.encoding.placement import choose_precision
from bertknn_search.errors import ConfigError, IndexMismatchError
from bertknn_search.records import IndexMeta

AVX2 = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})
TEXTS = [
    "zorblat was born in [MASK] .",
    "[MASK] knew zorblat as a famous painter in the north .",
    "the [MASK] is near the river north of quenton .",
]


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# -- the choice ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("device", "flags", "chosen"),
    [
        ("cuda", AVX2, "bf16"),
        ("cpu", AVX2 | {"avx512f", "avx512_bf16"}, "bf16"),
        ("cpu", AVX2 | {"amx_tile", "amx_bf16"}, "bf16"),
        ("cpu", AVX2 | {"avx512f", "avx512_vnni"}, "fp32"),  # AVX-512 without bf16: emulated, slow
        ("cpu", AVX2, "fp32"),
        ("cpu", frozenset(), "fp32"),  # flags unknown (not Linux)
    ],
)
def test_auto_picks_bf16_only_where_it_is_fast(device: str, flags: frozenset[str], chosen: str) -> None:
    precision, why = choose_precision("auto", device, flags)
    assert precision == chosen
    assert why.startswith("auto: ") and "--precision" in why


@pytest.mark.parametrize("asked", ["fp32", "bf16", "int8"])
def test_a_named_precision_is_used_as_given_on_a_cpu(asked: str) -> None:
    assert choose_precision(asked, "cpu", AVX2)[0] == asked


def test_int8_on_a_gpu_is_a_one_line_error_that_says_what_to_do() -> None:
    with pytest.raises(ConfigError) as err:
        choose_precision("int8", "cuda", AVX2)
    assert "\n" not in str(err.value) and "CPU only" in str(err.value) and "--device cpu" in str(err.value)


def test_int8_without_a_quantized_engine_is_refused() -> None:
    with pytest.raises(ConfigError, match="not available in this torch build"):
        choose_precision("int8", "cpu", AVX2, int8_ok=False)


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ConfigError, match="--precision must be one of"):
        Config(precision="fp16")
    with pytest.raises(ConfigError, match="--precision must be one of"):
        choose_precision("fp16", "cpu", AVX2)


def test_the_cli_refuses_an_unknown_precision(tmp_path: Path) -> None:
    r = run("query", "x [MASK] .", "--index", tmp_path / "none", "--precision", "fp16")
    assert r.exit_code == 2 and "fp16" in r.output


# -- int8 ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def encoders(tiny_model: Path) -> dict[str, Encoder]:
    return {
        p: Encoder(str(tiny_model), layer=11, device="cpu", max_length=64, precision=p)
        for p in ("fp32", "int8")
    }


def _keys(encoder: Encoder) -> np.ndarray:
    rows = [encoder.prepare(t) for t in TEXTS]
    return encoder.key_states(rows, [r.index(encoder.tokenizer.mask_token_id) for r in rows]).astype(
        np.float32
    )


def test_int8_keys_are_quantized_yet_close_to_fp32(encoders: dict[str, Encoder]) -> None:
    fp32, int8 = _keys(encoders["fp32"]), _keys(encoders["int8"])
    assert not np.array_equal(fp32, int8)  # the blocks really ran in int8
    cosine = (fp32 * int8).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(int8, axis=1)
    assert cosine.min() > 0.99


def test_int8_quantizes_the_blocks_once_for_both_views(encoders: dict[str, Encoder]) -> None:
    from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

    encoder = encoders["int8"]
    block = encoder.mlm.base_model.encoder.layer[0]
    assert isinstance(block.attention.self.query, Int8Linear)
    assert isinstance(block.intermediate.dense, Int8Linear)
    assert not isinstance(block.output.dense, Int8Linear)  # the FFN down-projection stays fp32
    assert encoder.trunk.encoder.layer[0] is block
    states, p_bert = encoder.query(TEXTS)
    np.testing.assert_allclose(states[:, :4], _keys(encoder)[:, :4], atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(p_bert.sum(1), 1.0, rtol=1e-5)


# -- the index records it and refuses to mix -----------------------------------------------------------
@pytest.fixture(scope="module")
def int8_index(base_config: Config, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Config:
    from bertknn_search.ingest.pipeline import ingest

    config = base_config.replace(index=tmp_path_factory.mktemp("int8") / "index", precision="int8")
    ingest(corpus, config, progress=False)
    return config


def test_the_index_records_the_precision(int8_index: Config) -> None:
    from bertknn_search.backends import open_backend

    backend = open_backend(int8_index.replace(precision="auto"))
    try:
        assert backend.meta().precision == "int8"
    finally:
        backend.close()
    r = run("stats", "--index", int8_index.index, "--json")
    assert json.loads(r.output)["meta"]["precision"] == "int8"
    assert "precision         int8" in run("stats", "--index", int8_index.index).output


def test_ingest_with_another_precision_is_a_one_line_error_naming_the_flag(
    int8_index: Config, corpus: Path
) -> None:
    r = run(
        *("ingest", "wiki", corpus, "--index", int8_index.index, "--device", "cpu"),
        *("--precision", "fp32", "--no-progress"),
    )
    assert r.exit_code == 1
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "precision='int8'" in lines[0] and "--precision" in lines[0]


def test_the_library_refuses_to_add_another_precision(int8_index: Config, corpus: Path) -> None:
    from bertknn_search.ingest.pipeline import add_articles

    with pytest.raises(IndexMismatchError, match="precision"):
        add_articles(corpus, int8_index.replace(precision="fp32"), progress=False)


def test_auto_resumes_in_the_index_precision(int8_index: Config, corpus: Path) -> None:
    r = run(
        *("ingest", "wiki", corpus, "--index", int8_index.index, "--device", "cpu"),
        *("--precision", "auto", "--no-progress", "--json"),
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.splitlines()[-1])
    assert summary["already_stored"] == 20 and summary["articles"] == 0


def test_a_query_is_encoded_in_the_index_precision(int8_index: Config) -> None:
    from bertknn_search.query.search import Searcher

    searcher = Searcher.open(int8_index.replace(precision="auto"))
    try:
        assert searcher.encoder.precision == "int8"
    finally:
        searcher.close()
    r = run(
        "query", "Zorblat was born in [MASK].", "--index", int8_index.index, "--precision", "auto", "--json"
    )
    assert r.exit_code == 0, r.output


def test_a_lazy_encode_in_another_precision_is_refused(
    base_config: Config, corpus: Path, tmp_path: Path
) -> None:
    from bertknn_search.ingest.pipeline import ingest
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Question

    config = base_config.replace(index=tmp_path / "lazy", contexts="lazy", precision="fp32")
    ingest(corpus, config, progress=False)
    searcher = Searcher.open(config.replace(precision="int8"))
    try:
        with pytest.raises(IndexMismatchError) as err:
            searcher.answer(Question("Zorblat was born in [MASK].", "Zorblat"))
        assert "encoded in fp32, not int8" in str(err.value) and "--precision fp32" in str(err.value)
        assert searcher.backend.stats().encoded_articles == 0  # nothing was written
    finally:
        searcher.close()


def test_the_ingest_says_what_it_encodes_in(base_config: Config, corpus: Path, tmp_path: Path) -> None:
    from bertknn_search.ingest.pipeline import ingest

    config = base_config.replace(index=tmp_path / "said", contexts="eager", precision="auto")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        ingest(corpus, config, limit=2, progress=True)
    lines = err.getvalue().replace("\r", "\n").splitlines()
    (said,) = [line for line in lines if line.startswith("encoder: ")]
    # fp32, or bf16 on a CPU with AVX512-BF16 or AMX: either way the line says why and how to choose.
    assert re.match(r"encoder: (fp32|bf16) on cpu \(auto: ", said) and "--precision" in said


def test_opensearch_meta_carries_the_precision() -> None:
    from bertknn_search.backends.engines import bodies

    meta = IndexMeta("bert-base-uncased", 11, 8, 30522, "single-wordpiece", precision="int8")
    from bertknn_search.backends.engines import dialect_for

    made = dialect_for("opensearch").create_bodies(bodies.meta_doc(meta), meta.dim)
    names = {"articles": "p-articles", "contexts": "p-contexts"}
    response = {names[kind]: {"mappings": made[kind]["mappings"]} for kind in ("articles", "contexts")}
    assert bodies.meta_from_mappings(response, names, "here").precision == "int8"


# -- the same question, the same answer (issue 39): bf16 that does not depend on the batch --------------
QUESTIONS = [
    *TEXTS,
    "the painter from quenton was born in [MASK] in the north near the river .",
    "[MASK] lived in quenton .",
]


@pytest.fixture(scope="module")
def bf16(tiny_model: Path) -> Encoder:
    # The plain-torch runtime's property (transformers' bf16 forward depends on the batch), whatever
    # BERTKNN_RUNTIME says for the rest of the suite.
    return Encoder(str(tiny_model), layer=7, device="cpu", max_length=64, precision="bf16", runtime="torch")


def test_a_bf16_question_is_encoded_the_same_alone_and_in_any_batch(bf16: Encoder) -> None:
    states, p_bert = bf16.query(QUESTIONS)
    assert p_bert is not None
    for i, question in enumerate(QUESTIONS):
        alone_states, alone_p = bf16.query([question])
        assert alone_p is not None
        np.testing.assert_array_equal(alone_states[0], states[i])
        np.testing.assert_array_equal(alone_p[0], p_bert[i])
    reordered = bf16.query(QUESTIONS[::-1] + QUESTIONS[:2])[1]
    assert reordered is not None
    np.testing.assert_array_equal(reordered[: len(QUESTIONS)], p_bert[::-1])


def _bf16_keys(encoder: Encoder, order: list[int]) -> np.ndarray:
    rows = [encoder.prepare(QUESTIONS[i]) for i in order]
    keys = encoder.key_states(rows, [r.index(encoder.tokenizer.mask_token_id) for r in rows])
    return keys[np.argsort(order)]


def test_bf16_keys_do_not_depend_on_batch_mates_order_or_the_process(bf16: Encoder, tiny_model: Path) -> None:
    every = list(range(len(QUESTIONS)))
    keys = _bf16_keys(bf16, every)
    np.testing.assert_array_equal(keys, _bf16_keys(bf16, every[::-1]))
    for i in every:
        np.testing.assert_array_equal(keys[i : i + 1], _bf16_keys(bf16, [i]))
    # Another process, with one thread where this one may have several (a server beside a CLI).
    probe = (
        "import sys, torch, numpy as np\n"
        "torch.set_num_threads(1)\n"
        "from bertknn_search.encoding.encoder import Encoder\n"
        f"e = Encoder({str(tiny_model)!r}, 7, 'cpu', 64, 'bf16', 'torch')\n"
        f"rows = [e.prepare(q) for q in {QUESTIONS!r}]\n"
        "k = e.key_states(rows, [r.index(e.tokenizer.mask_token_id) for r in rows])\n"
        "sys.stdout.write(k.astype(np.float32).tobytes().hex())\n"
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True
    )
    other = np.frombuffer(bytes.fromhex(out.stdout), dtype=np.float32).reshape(keys.shape)
    np.testing.assert_array_equal(other, keys.astype(np.float32))


def test_bf16_answers_are_the_same_asked_together_or_one_at_a_time(
    base_config: Config, corpus: Path, facts: list, minilm: Path, tmp_path: Path
) -> None:
    """Two copies of one lazy bf16 index of all-MiniLM-L6-v2: one asked a batch (its contexts encoded
    together), the other each question alone (its contexts encoded in other batches). Every distribution
    agrees within 1e-4 (transformers' bf16 forward: up to 0.023 apart here)."""
    import shutil

    from bertknn_search.ingest.pipeline import ingest
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Question

    config = base_config.replace(
        model=str(minilm),
        layer=6,
        index=tmp_path / "a",
        contexts="lazy",
        precision="bf16",
        exact=True,
        runtime="torch",
    )
    ingest(corpus, config, progress=False)
    shutil.copytree(config.index, tmp_path / "b")
    questions = [Question(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in facts[:8]]
    together = Searcher.open(config.replace(temperature=1.0))
    alone = Searcher.open(config.replace(index=tmp_path / "b", temperature=1.0))
    try:
        batch = together.score_batch(questions)
        singles = [alone.score_batch([q])[0] for q in questions]
    finally:
        together.close()
        alone.close()
    for a, b in zip(batch, singles):
        np.testing.assert_allclose(a.p_knn, b.p_knn, atol=1e-4, rtol=0)
        np.testing.assert_allclose(a.p, b.p, atol=1e-4, rtol=0)
