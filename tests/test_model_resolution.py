"""Finding a model's files: local path, HF cache, then one quick look at the hub; errors name the origin."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertknn_search.config import Config
from bertknn_search.encoding.model_lookup import CACHE, LOCAL, locate_model
from bertknn_search.errors import ModelLoadError
from bertknn_search.session import open_index, resolve_config

# Port 9 (discard) on the loopback: refused at once, so "the hub is unreachable" needs no network.
UNREACHABLE = "http://127.0.0.1:9"


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Empty HF and ``model get`` caches and a hub that refuses connections, for this process."""
    from huggingface_hub import constants

    monkeypatch.setenv("BERTKNN_MODEL_CACHE", str(tmp_path / "converted"))  # bert-base-uncased not got here
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return cache


def cache_model(cache: Path, name: str, model: Path) -> None:
    """Lay ``model``'s files out as huggingface_hub's cache holds a downloaded repo ``name``."""
    repo = cache / f"models--{name.replace('/', '--')}"
    shutil.copytree(model, repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)


def test_a_local_folder_and_a_cached_name_need_no_hub(no_hub: Path, tiny_model: Path) -> None:
    assert locate_model(str(tiny_model)) == LOCAL
    cache_model(no_hub, "someone/tiny-bert", tiny_model)
    assert locate_model("someone/tiny-bert") == CACHE


@pytest.mark.reliability
@pytest.mark.parametrize(
    ("flags", "env", "origin"),
    [
        ({"model": "bert-base-uncased"}, {}, "from --model"),
        ({}, {"BERTKNN_MODEL": "bert-base-uncased"}, "from BERTKNN_MODEL"),
        ({}, {}, "the default"),
    ],
)
def test_an_unreachable_hub_is_one_line_naming_the_origin(
    no_hub: Path, tmp_path: Path, flags: dict[str, str], env: dict[str, str], origin: str
) -> None:
    with pytest.raises(ModelLoadError) as err:
        open_index({"index": tmp_path / "new-index", **flags}, env=env, must_exist=False)
    assert str(err.value).startswith(
        f"cannot load model 'bert-base-uncased' ({origin}): not a local path and not in the HF cache"
        f" ({no_hub}), and the hub is unreachable ({UNREACHABLE}: "
    )
    assert "\n" not in str(err.value)


@pytest.mark.reliability
def test_a_relative_model_recorded_by_an_index_is_reported_as_the_index_s(
    no_hub: Path, base_config: Config, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index built through the library with a relative path, queried from elsewhere (issue 19)."""
    from bertknn_search.ingest.pipeline import ingest

    model = Path(base_config.model)
    monkeypatch.chdir(model.parent)
    index = tmp_path / "index"
    ingest(corpus, base_config.replace(model=model.name, index=index), progress=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ModelLoadError, match=rf"^cannot load model '{model.name}' \(from the index at {index}\): "
    ):
        open_index({"index": index})


def test_offline_mode_is_named_without_asking_the_hub(no_hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match=r"the hub is unreachable \(HF_HUB_OFFLINE is set\)"):
        locate_model("bert-base-uncased", "from --model")


def test_a_missing_path_is_not_looked_up_on_the_hub(no_hub: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no such folder \(and not an HF model name\)$"):
        locate_model(str(tmp_path / "models" / "nope"))


def test_resolve_config_says_where_each_value_came_from(tiny_model: Path, monkeypatch) -> None:
    monkeypatch.chdir(tiny_model.parent)
    resolved = resolve_config({"k": 7}, env={"BERTKNN_MODEL": tiny_model.name, "BERTKNN_DEVICE": "cpu"})
    assert resolved.config.model == str(tiny_model.resolve())
    assert (resolved.origin("model"), resolved.origin("k"), resolved.origin("lam")) == (
        "from BERTKNN_MODEL",
        "from -k",
        "the default",
    )


@pytest.mark.reliability
@pytest.mark.slow
def test_the_command_uses_the_cache_and_fails_fast_without_retry_logging(
    tiny_model: Path, corpus: Path, tmp_path: Path
) -> None:
    """The real processes: huggingface_hub's retry lines must not reach the terminal."""
    home = tmp_path / "hf-home"
    cache_model(home / "hub", "someone/tiny-bert", tiny_model)
    env = {
        **os.environ, "HF_HOME": str(home), "HF_ENDPOINT": UNREACHABLE,
        "BERTKNN_MODEL_CACHE": str(tmp_path / "converted"),
    }  # fmt: skip
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_HUB_CACHE", None)
    command = [sys.executable, "-m", "bertknn_search", "ingest", "wiki", str(corpus), "--no-progress"]
    common = ["--device", "cpu", "--max-length", "64"]

    cached = subprocess.run(
        [*command, *common, "--model", "someone/tiny-bert", "--index", str(tmp_path / "a")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cached.returncode == 0, cached.stderr
    assert cached.stdout.startswith("ingested 20 articles") and "Retry" not in cached.stderr

    missing = subprocess.run(
        [*command, *common, "--model", "bert-base-uncased", "--index", str(tmp_path / "b")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith(
        "Error: cannot load model 'bert-base-uncased' (from --model): not a local"
    )
    assert len(missing.stderr.splitlines()) == 1, missing.stderr
