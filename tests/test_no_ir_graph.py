"""The no-IR graph: no HNSW graph unless an index is made for --no-ir (``ingest --no-ir-graph``); its
record in the index metadata, on every backend, and what a graph-less OpenSearch index survives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from bertknn_search.backends.base import check_meta
from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.backends.engines import bodies
from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.backends.engines.elasticsearch import ElasticsearchDialect
from bertknn_search.backends.engines.opensearch import OpenSearchDialect
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError, IndexMismatchError
from bertknn_search.output import render_stats
from bertknn_search.records import Article, ContextBlock, EncodedArticle, IndexMeta

META = IndexMeta("tiny-bert", 4, 8, 100, "single-wordpiece", contexts="eager")
GRAPH = IndexMeta("tiny-bert", 4, 8, 100, "single-wordpiece", contexts="eager", no_ir_graph=True)
NAMES = {"articles": "bk-articles", "contexts": "bk-contexts"}


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def contexts_body(dialect: OpenSearchDialect | ElasticsearchDialect, meta: IndexMeta) -> dict:
    return dialect.create_bodies(bodies.meta_doc(meta), meta.dim)["contexts"]


def test_a_new_opensearch_index_builds_no_graph_unless_made_for_no_ir() -> None:
    plain = contexts_body(OpenSearchDialect(), META)
    assert "method" not in plain["mappings"]["properties"]["vector"]
    # index.knn stays true (false would fail the shards on a mapping update); the threshold builds none.
    assert plain["settings"]["index"] == {"knn": True, "knn.advanced.approximate_threshold": -1}
    made = contexts_body(OpenSearchDialect(), GRAPH)
    assert made["mappings"]["properties"]["vector"] == {
        "type": "knn_vector",
        "dimension": 8,
        "method": {
            "name": "hnsw",
            "space_type": "l2",
            "engine": "lucene",
            "parameters": {"m": 16, "ef_construction": 128},
        },
    }
    assert made["settings"]["index"] == {"knn": True}
    assert made["mappings"]["_meta"]["no_ir_graph"] is True
    # Each create starts from the shipped file: asking for a graph once leaves the next index without.
    assert "method" not in contexts_body(OpenSearchDialect(), META)["mappings"]["properties"]["vector"]


def test_elasticsearch_keeps_its_flat_field_with_the_option() -> None:
    made = contexts_body(ElasticsearchDialect(), GRAPH)
    # An hnsw field would make the filtered IR-first knn approximate: the option is recorded, no graph built.
    assert made["mappings"]["properties"]["vector"]["index_options"] == {"type": "flat"}
    assert made["mappings"]["_meta"]["no_ir_graph"] is True


def mappings(meta_doc: dict, vector: dict) -> dict:
    return {
        NAMES["articles"]: {"mappings": {"_meta": meta_doc, "properties": {}}},
        NAMES["contexts"]: {"mappings": {"_meta": meta_doc, "properties": {"vector": vector}}},
    }


def test_the_metadata_records_the_option_and_reads_older_indexes_by_their_mapping() -> None:
    made = bodies.meta_doc(GRAPH)
    assert bodies.meta_from_mappings(mappings(made, {}), NAMES, "here").no_ir_graph is True
    older = {k: v for k, v in bodies.meta_doc(META).items() if k != "no_ir_graph"}
    hnsw = {"type": "knn_vector", "method": {"name": "hnsw", "engine": "lucene"}}
    assert bodies.meta_from_mappings(mappings(older, hnsw), NAMES, "here").no_ir_graph is True
    flat = {"type": "dense_vector", "index_options": {"type": "flat"}}
    assert bodies.meta_from_mappings(mappings(older, flat), NAMES, "here").no_ir_graph is False


def test_a_graph_cannot_be_asked_of_an_index_made_without_one() -> None:
    with pytest.raises(IndexMismatchError, match="made without the no-IR graph, which only a new index"):
        check_meta(META, GRAPH, "idx")
    check_meta(GRAPH, META, "idx")  # a later add or ingest without the flag keeps the index's graph


def test_the_option_needs_an_eager_index(base_config: Config, corpus: Path, tmp_path: Path) -> None:
    from bertknn_search.ingest.pipeline import ingest

    lazy = base_config.replace(index=tmp_path / "idx", contexts="lazy", no_ir_graph=True)
    with pytest.raises(ConfigError, match="--no-ir-graph is for an eager index"):
        ingest(corpus, lazy, progress=False)
    assert not (tmp_path / "idx").exists()


def block(n: int) -> ContextBlock:
    ints = np.arange(n, dtype=np.int32)
    return ContextBlock(
        sentences=["One.", "Two."],
        vectors=np.eye(n, 8, dtype=np.float16),
        token_ids=ints + 10,
        sentence_ids=ints % 2,
        starts=ints,
        ends=ints + 1,
    )


def test_the_embedded_backend_records_the_option_and_searches_exactly(tmp_path: Path) -> None:
    made = EmbeddedBackend.create(tmp_path / "idx", GRAPH)
    made.add_articles([EncodedArticle(Article("1", "One", "One. Two."), block(3), "f1")])
    made.close()
    opened = EmbeddedBackend.open(tmp_path / "idx")
    try:
        assert opened.meta().no_ir_graph is True
        stats = opened.stats()
        assert stats.no_ir_graph is False
        assert "exact scan of every context (made with --no-ir-graph; embedded builds no graph)" in (
            render_stats(stats)
        )
        assert opened.knn(np.eye(1, 8, 2, dtype=np.float32)[0], 1).token_ids.tolist() == [12]
    finally:
        opened.close()


def test_ingest_takes_the_option_and_a_later_ingest_keeps_it(
    base_config: Config, corpus: Path, tmp_path: Path
) -> None:
    index = tmp_path / "idx"
    common = ["--index", index, "--device", "cpu"]
    ingest = ["ingest", "wiki", corpus, "--model", base_config.model, "--max-length", "64", "--no-progress"]
    r = run(*ingest, "--no-ir-graph", *common)  # the default lazy index
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.strip().splitlines() == [
        "Error: --no-ir-graph is for an eager index (--contexts eager): --no-ir searches every context,"
        " which a lazy index does not hold"
    ]
    assert run(*ingest, "--contexts", "eager", "--no-ir-graph", "--limit", "5", *common).exit_code == 0
    assert run(*ingest, *common).exit_code == 0  # again, without the flag: the index keeps its record
    stats = json.loads(run("stats", "--index", index, "--json").output)
    assert stats["meta"]["no_ir_graph"] is True and stats["articles"] == 20
    r = run("query", "Zorblat was born in [MASK].", "--no-ir", "--json", *common)
    assert r.exit_code == 0 and json.loads(r.output)["n_neighbors"] > 0

    plain = tmp_path / "plain"
    assert (
        run(*ingest, "--contexts", "eager", "--limit", "5", "--index", plain, "--device", "cpu").exit_code
        == 0
    )
    r = run(*ingest, "--no-ir-graph", "--index", plain, "--device", "cpu")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "was made without the no-IR graph, which only a new index gets" in r.output


# -- on a real OpenSearch node ---------------------------------------------------------------------------
def opensearch_config(make_cluster_config) -> Config:  # type: ignore[no-untyped-def]
    return make_cluster_config("opensearch").replace(contexts="eager")


ARTICLES = [
    EncodedArticle(Article("1", "Zorbland", "Zorbland is a country. Its capital is Quimby."), block(3), "a1"),
    EncodedArticle(Article("2", "Quimby", "Quimby is a town. It has a harbour."), block(2), "a2"),
]


def primary_terms(backend: EngineBackend) -> dict[str, int]:
    """Each contexts shard's primary term: it goes up each time the cluster fails that shard's primary."""
    name = backend.names["contexts"]
    state = backend.client.cluster.state(metric="metadata", index=name)
    return state["metadata"]["indices"][name]["primary_terms"]


@pytest.mark.opensearch
def test_a_graph_less_index_survives_a_mapping_update(make_cluster_config) -> None:  # type: ignore[no-untyped-def]
    """An older bertknn-search's add recorded its restore settings in the contexts' ``_meta``: on an
    ``index.knn: false`` index k-NN 2.19.1 failed every shard of it. The graph-less index of now takes it."""
    config = opensearch_config(make_cluster_config)
    backend = EngineBackend.create(config, META)
    try:
        backend.add_articles(ARTICLES)
        mapping = backend.client.indices.get_mapping(index=backend.names["contexts"])
        vector = mapping[backend.names["contexts"]]["mappings"]["properties"]["vector"]
        assert "method" not in vector and not backend._has_graph
        meta = mapping[backend.names["contexts"]]["mappings"]["_meta"]
        before = primary_terms(backend)
        backend.client.indices.put_mapping(
            index=backend.names["contexts"], body={"_meta": {**meta, "bulk_restore": {"owner": "x"}}}
        )
        backend.client.indices.refresh(index=backend.names["contexts"])  # after the mapping is applied
        # On an index.knn false index every primary was failed here (terms 1 -> 3 on a 2.19.1 node).
        assert primary_terms(backend) == before
        got = backend.knn(np.eye(1, 8, 1, dtype=np.float32)[0], 2, ["1", "2"])
        assert got.distances.tolist() == [0.0, 0.0]  # row 1 of both articles is the query itself
        assert got.article_ids == ["1", "2"]
        no_ir = backend.knn(np.eye(1, 8, 2, dtype=np.float32)[0], 1)
        assert (no_ir.article_ids, no_ir.token_ids.tolist()) == (["1"], [12])
        assert backend.stats().no_ir_graph is False
    finally:
        backend.close()


@pytest.mark.opensearch
def test_an_index_made_for_no_ir_searches_its_graph(make_cluster_config) -> None:  # type: ignore[no-untyped-def]
    config = opensearch_config(make_cluster_config)
    made = EngineBackend.create(config, GRAPH)
    made.add_articles(ARTICLES)
    made.close()
    backend = EngineBackend.open(config)  # the graph is read back from the mapping, the option from _meta
    try:
        assert backend._has_graph and backend.meta().no_ir_graph
        assert backend.stats().no_ir_graph is True
        sent = backend.dialect.knn_approx_body(np.zeros(8, dtype=np.float32), 1, backend._has_graph)
        assert sent["query"]["knn"]["vector"]["method_parameters"] == {"ef_search": 256}
        # k 1 explored one candidate and missed the nearest of these 5 contexts (two pairs are equal).
        no_ir = backend.knn(np.eye(1, 8, 2, dtype=np.float32)[0], 1)
        assert (no_ir.article_ids, no_ir.token_ids.tolist()) == (["1"], [12])
        exact = backend.knn(np.eye(1, 8, 1, dtype=np.float32)[0], 2, ["1", "2"])
        assert exact.article_ids == ["1", "2"] and exact.distances.tolist() == [0.0, 0.0]
    finally:
        backend.close()


def test_both_engines_keep_the_record_and_only_opensearch_builds_a_graph(
    cluster_config: Config, engine_name: str
) -> None:
    made = EngineBackend.create(cluster_config.replace(contexts="eager"), GRAPH)
    made.add_articles(ARTICLES)
    made.close()
    backend = EngineBackend.open(cluster_config)
    try:
        assert backend.meta().no_ir_graph is True
        assert backend.stats().no_ir_graph is (engine_name == "opensearch")
        no_ir = backend.knn(np.eye(1, 8, 2, dtype=np.float32)[0], 1)
        assert (no_ir.article_ids, no_ir.token_ids.tolist()) == (["1"], [12])
    finally:
        backend.close()
