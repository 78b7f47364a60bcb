"""Start-up with a model: a lazy ingest shows its bar before the model's libraries load, the model loads
without SciPy's optimizers, a question run as the program prints everything before its quick exit, and
``serve`` announces itself beside its index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bertknn_search.config import Config
from bertknn_search.encoding.deferred_imports import deferred
from bertknn_search.server import discovery


def test_a_lazy_ingest_shows_its_bar_before_the_encoder_is_made(
    base_config: Config, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.ingest import pipeline

    order: list[str] = []
    real = pipeline.Encoder

    class Bar(pipeline.Progress):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            order.append("bar")
            super().__init__(*args, **kwargs)

    def encoder(*args: Any, **kwargs: Any) -> Any:
        order.append("encoder")
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "Progress", Bar)
    monkeypatch.setattr(pipeline, "Encoder", encoder)
    config = base_config.replace(index=tmp_path / "index", contexts="lazy")
    summary = pipeline.ingest(corpus, config, progress=True, workers=0)
    assert order == ["bar", "encoder"]
    assert summary.articles > 0 and summary.contexts_mode == "lazy"


def test_a_lazy_ingest_writes_a_small_first_chunk() -> None:
    from bertknn_search.ingest.pipeline import _chunks
    from bertknn_search.records import Article

    records = [Article(str(i), f"T{i}", "x" * 10) for i in range(7)]
    sizes = [len(c) for c in _chunks(records, 1_000_000, 5, first=(1_000_000, 2))]
    assert sizes == [2, 5]


def test_a_deferred_module_is_imported_when_its_function_is_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "slowmod.py").write_text("LOADS = []\nLOADS.append(1)\ndef twice(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slowmod", raising=False)
    with deferred({"slowmod": ("twice",)}):
        from slowmod import twice  # type: ignore[import-not-found]
    assert "slowmod" not in sys.modules
    assert twice(21) == 42
    import slowmod  # type: ignore[import-not-found]

    assert slowmod.LOADS == [1]  # imported once, the real module


def test_the_model_loads_without_scipy_optimize(tiny_model: Path) -> None:
    probe = (
        "import sys\n"
        "from bertknn_search.encoding.encoder import Encoder\n"
        f"encoder = Encoder({str(tiny_model)!r}, 2, 'cpu', 64, 'fp32')\n"
        "encoder.mlm\n"
        "print('scipy.optimize' in sys.modules)\n"
        "from transformers.loss import loss_for_object_detection as lod\n"
        "import numpy as np\n"
        "print(lod.linear_sum_assignment(np.eye(2))[1].tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "[1,", "0]"]  # not imported; works (least cost) when called


def test_a_question_run_as_the_program_prints_all_its_answers(built_index: Config, tmp_path: Path) -> None:
    questions = tmp_path / "q.txt"
    questions.write_text("".join(f"Person {i} was born in [MASK].\n" for i in range(40)))
    argv = [sys.executable, "-m", "bertknn_search", "query", "--index", str(built_index.index), "--json"]
    out = subprocess.run(
        [*argv, "--file", str(questions), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr
    answers = [json.loads(line) for line in out.stdout.splitlines()]
    assert [a["question"] for a in answers] == [f"Person {i} was born in [MASK]." for i in range(40)]


@pytest.mark.slow
def test_serve_announces_itself_beside_its_index_until_it_stops(index_copy: Config) -> None:
    from tests.test_server_process import serve

    served = serve(index_copy.index)
    try:
        found = discovery.find(index_copy.index)
        assert found == discovery.Serving(served.url, served.proc.pid)
        with urllib.request.urlopen(found.url + "/health", timeout=60) as reply:
            assert json.loads(reply.read())["status"] == "ready"
    finally:
        assert served.stop() == 0
    assert not (index_copy.index / discovery.FILE).exists()
