"""The OpenSearch backend's pure parts: request bodies, response parsing and error messages."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import TransportError

from bertknn_search.backends import codec
from bertknn_search.backends.engines import bodies, neighbors
from bertknn_search.backends.engines.client import bulk_error_message, describe, is_transient
from bertknn_search.backends.engines.dialect import public_url
from bertknn_search.backends.engines.elasticsearch import ElasticsearchDialect
from bertknn_search.backends.engines.opensearch import OpenSearchDialect
from bertknn_search.backends.engines.reads import STATE_FIELDS, ArticleCache, stored_sentences
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError, IndexCorruptError
from bertknn_search.records import Article, ArticleHit, ContextBlock, EncodedArticle, IndexMeta

META = IndexMeta("bert-base-uncased", 11, 8, 30522, "single-wordpiece")
META_DOC = {
    "schema_version": bodies.SCHEMA_VERSION,
    "model": "bert-base-uncased",
    "layer": 11,
    "dim": 8,
    "vocab_size": 30522,
    "mask_policy": "single-wordpiece",
    "store_dtype": "float16",
    "max_length": 512,
    "contexts": "eager",
    "precision": "fp32",
    "splitter": "",
    "no_ir_graph": False,
}
NAMES = {"articles": "bk-articles", "contexts": "bk-contexts"}


def encoded(vectors: list[list[float]] | None = None) -> EncodedArticle:
    rows = vectors if vectors is not None else [[0.1] * 8, [-1.3] * 4 + [2.0] * 4]
    n = len(rows)
    block = ContextBlock(
        sentences=["Café Noir is a jazz club.", "It opened in 1931."],
        vectors=np.array(rows, dtype=np.float16).reshape(n, 8),
        token_ids=np.array([4481, 2325][:n], dtype=np.int32),
        sentence_ids=np.array([0, 1][:n], dtype=np.int32),
        starts=np.array([0, 10][:n], dtype=np.int32),
        ends=np.array([4, 14][:n], dtype=np.int32),
    )
    return EncodedArticle(Article("42", "Café Noir", "Café Noir is a jazz club in Lyon."), block, "fp1")


def test_index_names() -> None:
    assert bodies.index_names("bk") == NAMES


OPENSEARCH, ELASTICSEARCH = OpenSearchDialect(), ElasticsearchDialect()


def create_bodies(meta: IndexMeta) -> dict:
    return OPENSEARCH.create_bodies(bodies.meta_doc(meta), meta.dim)


def test_create_bodies_fill_dimension_and_meta() -> None:
    made = create_bodies(META)
    # No graph by default: no method, and a threshold that never builds one (index.knn stays true: k-NN
    # 2.19.1 fails an index.knn false index's shards on a mapping update). The graph-made index: see
    # tests/test_no_ir_graph.py.
    assert made["contexts"]["mappings"]["properties"]["vector"] == {
        "type": "knn_vector",
        "dimension": 8,
        "space_type": "l2",
    }
    assert made["contexts"]["settings"] == {"index": {"knn": True, "knn.advanced.approximate_threshold": -1}}
    # The vector and its stored key are doc values only; the terms are indexed only.
    assert made["contexts"]["mappings"]["_source"] == {"excludes": ["vector", "key"]}
    assert made["contexts"]["mappings"]["properties"]["key"] == {"type": "binary", "doc_values": True}
    assert made["articles"]["mappings"]["_source"] == {"excludes": ["terms"]}
    assert ELASTICSEARCH.create_bodies({}, 8)["articles"]["mappings"]["_source"] == {
        "excludes": ["terms", "bigrams"]
    }
    assert made["articles"]["mappings"]["_meta"] == META_DOC
    assert made["contexts"]["mappings"]["_meta"] == META_DOC
    # The shipped file keeps its placeholder: every create starts from a fresh copy.
    assert bodies.load_mapping("opensearch-contexts")["mappings"]["properties"]["vector"]["dimension"] is None


def test_bm25_fields_are_indexed_without_positions() -> None:
    """BM25 reads term frequencies and norms, and no query of an article is a phrase: positions would
    be most of the unigram and bigram postings (ES 5,000 articles: 40 MB -> 31 MB without them)."""
    os_fields = OPENSEARCH.create_bodies({}, 8)["articles"]["mappings"]["properties"]
    es_fields = ELASTICSEARCH.create_bodies({}, 8)["articles"]["mappings"]["properties"]
    for field in (
        os_fields["terms"],
        os_fields["terms"]["fields"]["bigrams"],
        es_fields["terms"],
        es_fields["bigrams"],
    ):
        assert field["index_options"] == "freqs"
        assert field.get("norms", True)  # BM25's length normalisation


def test_elasticsearch_bodies_keep_float_vectors_and_send_bigrams() -> None:
    made = ELASTICSEARCH.create_bodies(bodies.meta_doc(META), 8)
    # flat, not the default int8_hnsw: float32 vectors, brute force, so a filtered knn is exact.
    assert made["contexts"]["mappings"]["properties"]["vector"] == {
        "type": "dense_vector",
        "dims": 8,
        "index": True,
        "similarity": "l2_norm",
        "index_options": {"type": "flat"},
    }
    assert made["articles"]["mappings"]["_meta"] == META_DOC
    terms = made["articles"]["mappings"]["properties"]
    assert terms["terms"]["analyzer"] == terms["bigrams"]["analyzer"] == "whitespace"
    assert ELASTICSEARCH.article_fields(["albert", "einstein", "ulm"]) == {
        "bigrams": "albert_einstein einstein_ulm"
    }
    source = bodies.article_action(encoded(), "a", ELASTICSEARCH.article_fields)["_source"]
    assert source["bigrams"].split() == [
        f"{a}_{b}" for a, b in zip(source["terms"].split(), source["terms"].split()[1:])
    ]
    assert bodies.search_body("Albert Einstein", 3, ELASTICSEARCH.bigram_field)["query"]["bool"]["should"][
        1
    ] == {"match": {"bigrams": "albert_einstein"}}


def test_elasticsearch_knn_body_is_filtered_and_asks_for_spare_hits() -> None:
    body = ELASTICSEARCH.knn_exact_body(np.array([0.5, 2.0], dtype=np.float32), 4, ["1:a"])
    assert body["knn"] == {
        "field": "vector",
        "query_vector": [0.5, 2.0],
        "k": 36,
        "num_candidates": 36,
        "filter": {"terms": {"generation": ["1:a"]}},
    }
    # The 36 candidates are cut to 4 by the engine's sort (score, article, sentence, start), the
    # embedded backend's order: only those 4 hits come back.
    assert body["size"] == 4
    assert body["sort"] == bodies.TIE_ORDER
    # Unfiltered, the spares come back too: hits of a generation being replaced are dropped after the
    # search, and the spares take their places.
    approx = ELASTICSEARCH.knn_approx_body(np.ones(2), 4)
    assert "filter" not in approx["knn"]
    assert approx["size"] == approx["knn"]["k"] == 36


def test_articles_mapping_indexes_the_shared_terms() -> None:
    body = create_bodies(META)["articles"]
    index = body["settings"]["index"]
    assert index["number_of_shards"] == 1
    assert index["codec"] == "best_compression"  # the stored text (_source) DEFLATE-compressed
    assert index["similarity"] == {"bm25_lucene": {"type": "BM25", "k1": 1.2, "b": 0.75}}
    assert index["analysis"]["filter"]["word_bigrams"] == {
        "type": "shingle",
        "min_shingle_size": 2,
        "max_shingle_size": 2,
        "output_unigrams": False,
        "token_separator": "_",
    }
    assert index["analysis"]["analyzer"] == {
        "terms": {"type": "custom", "tokenizer": "whitespace", "filter": ["lowercase"]},
        "term_bigrams": {
            "type": "custom",
            "tokenizer": "whitespace",
            "filter": ["lowercase", "word_bigrams"],
        },
    }
    props = body["mappings"]["properties"]
    assert props["terms"] == {
        "type": "text",
        "analyzer": "terms",
        "similarity": "bm25_lucene",
        "index_options": "freqs",
        "fields": {
            "bigrams": {
                "type": "text",
                "analyzer": "term_bigrams",
                "search_analyzer": "whitespace",
                "similarity": "bm25_lucene",
                "index_options": "freqs",
            }
        },
    }
    assert props["title"] == {
        "type": "text",
        "fields": {"key": {"type": "keyword", "normalizer": "title_key"}},
    }
    assert props["sentences"] == {"type": "text", "index": False}


def test_meta_from_mappings_round_trip() -> None:
    response = {name: {"mappings": {"_meta": dict(META_DOC)}} for name in NAMES.values()}
    assert bodies.meta_from_mappings(response, NAMES, "here") == META


def test_a_version_4_index_still_opens() -> None:
    """Version 5 added whole-word values; a version-4 index holds token ids only and reads as before."""
    response = {name: {"mappings": {"_meta": {**META_DOC, "schema_version": 4}}} for name in NAMES.values()}
    assert bodies.SCHEMA_VERSION == 5
    assert bodies.meta_from_mappings(response, NAMES, "here") == META


@pytest.mark.parametrize(
    ("metas", "message"),
    [
        (
            [None, META_DOC],
            "indices at here have no bertknn-search metadata (_meta); they were not made by bertknn-search:"
            " choose another --opensearch-prefix",
        ),
        (
            [META_DOC, {**META_DOC, "layer": 12}],
            "the articles and contexts indices at here disagree on their metadata;"
            " delete both and ingest again",
        ),
        (
            [{**META_DOC, "schema_version": 9}] * 2,
            "indices at here have schema version 9, this version of bertknn-search reads 4 and 5;"
            " ingest again under another --opensearch-prefix",
        ),
    ],
)
def test_meta_from_mappings_rejects(metas: list[dict | None], message: str) -> None:
    response = {
        name: {"mappings": {} if meta is None else {"_meta": meta}}
        for name, meta in zip(NAMES.values(), metas)
    }
    with pytest.raises(IndexCorruptError) as info:
        bodies.meta_from_mappings(response, NAMES, "here")
    assert str(info.value) == message


def test_context_actions_have_deterministic_ids_and_float16_values() -> None:
    actions = list(bodies.context_actions(encoded(), "bk-contexts", "float16"))
    assert actions == [
        {
            "_op_type": "index",
            "_index": "bk-contexts",
            "_id": "42:fp1:0",
            "_source": {
                "article_id": "42",
                "generation": "42:fp1",
                "token_id": 4481,
                "sentence_id": 0,
                "start": 0,
                "end": 4,
                "vector": [0.0999755859375] * 8,
            },
        },
        {
            "_op_type": "index",
            "_index": "bk-contexts",
            "_id": "42:fp1:1",
            "_source": {
                "article_id": "42",
                "generation": "42:fp1",
                "token_id": 2325,
                "sentence_id": 1,
                "start": 10,
                "end": 14,
                "vector": [-1.2998046875] * 4 + [2.0] * 4,
            },
        },
    ]
    assert list(bodies.context_actions(encoded(), "bk-contexts", "float16")) == actions


def test_context_actions_send_the_int8_decoded_values() -> None:
    item = encoded()
    sent = [a["_source"]["vector"] for a in bodies.context_actions(item, "c", "int8")]
    blob = codec.encode(item.contexts.vectors, "int8")
    assert sent == codec.decode(blob, 2, 8, "int8").tolist()


def test_article_action_carries_pre_tokenised_terms() -> None:
    assert bodies.article_action(encoded(), "bk-articles") == {
        "_op_type": "index",
        "_index": "bk-articles",
        "_id": "42",
        "_source": {
            "id": "42",
            "title": "Café Noir",
            "fingerprint": "fp1",
            "settled": False,
            "n_chars": len(encoded().article.text),
            "encoded": "42:fp1",
            "n_sentences": 2,
            "n_contexts": 2,
            "sentences": ["Café Noir is a jazz club.", "It opened in 1931."],
            "terms": "cafe noir cafe noir is a jazz club in lyon",
        },
    }


def test_a_lazy_article_doc_holds_its_text_and_no_contexts() -> None:
    item = replace(encoded(), contexts=None)
    source = bodies.article_action(item, "bk-articles")["_source"]
    assert (source["text"], source["n_contexts"], source["sentences"]) == (item.article.text, 0, [])
    assert "encoded" not in source  # the first query that needs it encodes it
    assert list(bodies.context_actions(item, "bk-contexts", "float16")) == []
    assert "sentences" not in bodies.article_action(item, "bk-articles", spans=True)["_source"]


TEXT = "Zorbland is a country.  Its capital is Quimby.\n\nIt has a river."
SENTENCES = ["Zorbland is a country.", "Its capital is Quimby.", "It has a river."]


def test_sentences_are_stored_once_as_offsets_into_the_text() -> None:
    item = EncodedArticle(
        Article("9", "Zorbland", TEXT), replace(encoded().contexts, sentences=SENTENCES), "fp"
    )
    source = bodies.article_action(item, "bk-articles", spans=True)["_source"]
    assert source["text"] == TEXT and source["sentences"] is None  # no second copy of the text
    assert len(base64.b64decode(source["spans"])) == 8 * len(SENTENCES)
    assert stored_sentences(source) == SENTENCES
    # A sentence the splitter changed (not found in the text in order): the list itself, as before.
    fallback = bodies.sentence_fields(["Zorbland is a country.", "Quimby is not here."], TEXT)
    assert fallback == {"sentences": ["Zorbland is a country.", "Quimby is not here."], "spans": None}
    assert stored_sentences({"text": TEXT, **fallback}) == fallback["sentences"]
    # Older indices (no spans field) keep the list: nothing is sent they would refuse.
    assert "spans" not in bodies.article_action(item, "bk-articles")["_source"]


def test_updates_send_the_terms_again() -> None:
    # An update re-indexes the doc from _source, which keeps no terms: without them the article would
    # drop out of BM25 (tests/test_engine_requests.py checks it on the real engines).
    item = encoded()
    doc = bodies.update_action(item.article, "bk-articles", {"settled": True}, ELASTICSEARCH.article_fields)
    assert doc["doc"]["settled"] is True
    assert doc["doc"]["terms"] == "cafe noir cafe noir is a jazz club in lyon"
    assert doc["doc"]["bigrams"].split()[:2] == ["cafe_noir", "noir_cafe"]


def test_context_actions_carry_the_stored_key_when_the_index_has_the_field() -> None:
    item = encoded()
    for dtype in ("float16", "int8"):
        sent = list(bodies.context_actions(item, "c", dtype, keys=True))
        blob = codec.encode(item.contexts.vectors, dtype)
        keys = [base64.b64decode(a["_source"]["key"]) for a in sent]
        stored = np.concatenate([codec.decode(k, 1, 8, dtype) for k in keys])
        np.testing.assert_array_equal(stored, codec.decode(blob, 2, 8, dtype))
    assert "key" not in next(bodies.context_actions(item, "c", "float16"))["_source"]


def test_knn_extras_count_generations_over_every_match_on_both_engines() -> None:
    vector = np.zeros(8, dtype=np.float32)
    gens = ["1:a", "2:b"]
    os_body = neighbors.knn_extras(OPENSEARCH.knn_exact_body(vector, 4, gens), gens, keys=True)
    es_body = neighbors.knn_extras(ELASTICSEARCH.knn_exact_body(vector, 4, gens), gens, keys=True)
    count = {"terms": {"field": "generation", "size": 2}}
    assert os_body["aggs"] == es_body["aggs"] == {neighbors.GENERATION_COUNTS: count}
    assert os_body["docvalue_fields"] == es_body["docvalue_fields"] == [*bodies.CONTEXT_FIELDS, "key"]
    # No stored field is read (a hit's block holds its whole source, vector included, until a merge).
    assert os_body["stored_fields"] == es_body["stored_fields"] == "_none_"
    assert "_source" not in os_body and "_source" not in es_body
    # OpenSearch's score script already runs over the filter; Elasticsearch's knn aggregates its own
    # top hits only, so the filter is given as the query too (its matches score 0).
    assert os_body["query"] == OPENSEARCH.knn_exact_body(vector, 4, gens)["query"]
    assert es_body["query"] == {"bool": {"filter": [{"terms": {"generation": gens}}]}}
    response = {
        "hits": {
            "hits": [
                {"_score": 0.5, "_source": {"article_id": "1", "generation": "1:a", "token_id": 3,
                                            "sentence_id": 0, "start": 0, "end": 2}},
                {"_score": 0.0, "_source": {"article_id": "2", "generation": "2:b", "token_id": 4,
                                            "sentence_id": 0, "start": 0, "end": 2}},
            ]
        },
        "aggregations": {neighbors.GENERATION_COUNTS: {"buckets": [{"key": "1:a", "doc_count": 7}]}},
    }  # fmt: skip
    assert neighbors.generation_counts(response) == {"1:a": 7}
    assert neighbors.parse_neighbors(response, 4).token_ids.tolist() == [
        3
    ]  # the query's match is no neighbour


def test_stale_contexts_query_keeps_only_new_generations() -> None:
    other = EncodedArticle(Article("7", "Seven", "x"), ContextBlock.empty(8), "fp9")
    assert bodies.stale_contexts_query([encoded(), other]) == {
        "query": {
            "bool": {
                "filter": [{"terms": {"article_id": ["42", "7"]}}],
                "must_not": [{"terms": {"generation": ["42:fp1", "7:fp9"]}}],
            }
        }
    }


def test_search_body_matches_unigrams_and_bigrams() -> None:
    assert bodies.search_body("Where is the Eiffel Tower in Paris?", 3) == {
        "size": 3,
        "query": {
            "bool": {
                "should": [
                    {"match": {"terms": "eiffel tower paris"}},
                    {"match": {"terms.bigrams": "eiffel_tower"}},
                ]
            }
        },
        "sort": [{"_score": "desc"}, {"id": "asc"}],
        # The question's next steps (coverage, the kNN filter, titles) without another request.
        "_source": STATE_FIELDS,
    }
    assert bodies.search_body("the of and", 3) is None


def test_title_body() -> None:
    assert bodies.title_body("  Café NOIR ", 3) == {
        "size": 3,
        "query": {"term": {"title.key": "café noir"}},
        "sort": [{"id": "asc"}],
        # The adaptive-retrieval gate reads the subject's popularity; the kNN step the generation.
        "_source": STATE_FIELDS,
    }


def test_knn_exact_body_filters_on_generations() -> None:
    vector = np.array([0.5, -1, 0, 0, 0, 0, 0, 2], dtype=np.float32)
    assert OPENSEARCH.knn_exact_body(vector, 4, ["1:a", "2:b"]) == {
        "size": 4,
        "track_total_hits": False,
        "query": {
            "script_score": {
                "query": {"bool": {"filter": [{"terms": {"generation": ["1:a", "2:b"]}}]}},
                "script": {
                    "source": "knn_score",
                    "lang": "knn",
                    "params": {
                        "field": "vector",
                        "query_value": [0.5, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0],
                        "space_type": "l2",
                    },
                },
            }
        },
        "sort": [{"_score": "desc"}, {"article_id": "asc"}, {"sentence_id": "asc"}, {"start": "asc"}],
        "stored_fields": "_none_",  # doc values only: no stored-field block decompressed
        "docvalue_fields": ["article_id", "generation", "token_id", "sentence_id", "start", "end"],
    }


def test_knn_approx_body() -> None:
    assert OPENSEARCH.knn_approx_body(np.ones(2, dtype=np.float16), 5) == {
        "size": 5,
        "track_total_hits": False,
        # ef_search: the lucene engine would explore only k candidates (see opensearch.EF_SEARCH).
        "query": {"knn": {"vector": {"vector": [1.0, 1.0], "k": 5, "method_parameters": {"ef_search": 256}}}},
        "sort": [{"_score": "desc"}, {"article_id": "asc"}, {"sentence_id": "asc"}, {"start": "asc"}],
        "stored_fields": "_none_",  # doc values only: no stored-field block decompressed
        "docvalue_fields": ["article_id", "generation", "token_id", "sentence_id", "start", "end"],
    }


def hit(article: str, d2: float, sentence: int, start: int, token: int, gen: str | None = None) -> dict:
    source = {
        "article_id": article,
        "generation": gen or f"{article}:fp",
        "token_id": token,
        "sentence_id": sentence,
        "start": start,
        "end": start + 3,
    }
    return {"_id": f"{article}:{token}", "_score": float(np.float32(1.0 / (1.0 + d2))), "_source": source}


def test_squared_distances_invert_the_l2_score() -> None:
    d2 = np.array([0.0, 0.25, 3.0, 812.5])
    scores = (1.0 / (1.0 + d2)).astype(np.float32)
    np.testing.assert_allclose(neighbors.squared_distances(scores), d2, rtol=1e-5, atol=1e-6)
    assert neighbors.squared_distances(np.array([1.0000001])).tolist() == [0.0]


def test_parse_neighbors_orders_ties_by_article_sentence_start() -> None:
    response = {
        "hits": {
            "hits": [
                hit("9", 1.0, 0, 5, 11),
                hit("10", 1.0, 2, 0, 12),  # "10" < "9" as strings, as both backends compare ids
                hit("10", 1.0, 1, 7, 13),
                hit("10", 1.0, 1, 2, 14),
                hit("3", 0.5, 4, 4, 15),
                hit("3", 2.0, 0, 0, 16),
            ]
        }
    }
    got = neighbors.parse_neighbors(response, 5)
    assert got.article_ids == ["3", "10", "10", "10", "9"]
    assert got.token_ids.tolist() == [15, 14, 13, 12, 11]
    assert got.sentence_ids.tolist() == [4, 1, 1, 2, 0]
    assert got.starts.tolist() == [4, 2, 7, 0, 5]
    assert got.ends.tolist() == [7, 5, 10, 3, 8]
    np.testing.assert_allclose(got.distances, [0.5, 1.0, 1.0, 1.0, 1.0], rtol=1e-6)
    assert got.distances.dtype == np.float32
    assert got.token_ids.dtype == np.int64
    assert got.sentence_ids.dtype == got.starts.dtype == got.ends.dtype == np.int32


def test_parse_neighbors_reads_doc_values_as_it_reads_source() -> None:
    # What an engine answers to context_fetch: each field a one-value list, no _source, no _id.
    sourced = [hit("10", 1.0, 2, 0, 12), hit("9", 0.5, 0, 5, 11), hit("9", 0.7, 1, 1, 13, gen="9:old")]
    valued = [
        {"_score": h["_score"], "fields": {name: [h["_source"][name]] for name in bodies.CONTEXT_FIELDS}}
        for h in sourced
    ]
    want = neighbors.parse_neighbors({"hits": {"hits": sourced}}, 3, {"10:fp", "9:fp"})
    got = neighbors.parse_neighbors({"hits": {"hits": valued}}, 3, {"10:fp", "9:fp"})
    assert got.article_ids == want.article_ids == ["9", "10"]
    for name in ("distances", "token_ids", "sentence_ids", "starts", "ends"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))


@pytest.mark.parametrize("padded", [True, False])  # Elasticsearch pads base64, OpenSearch does not
@pytest.mark.parametrize(("dim", "dtype"), [(6, "float16"), (8, "float16"), (6, "int8"), (8, "int8")])
def test_parse_neighbors_decodes_every_hits_key(dim: int, dtype: str, padded: bool) -> None:
    # float16 rows of 12 bytes are base64 without padding, joined and decoded at once; the others one
    # by one: the same keys either way.
    rng = np.random.default_rng(dim)
    vectors = rng.standard_normal((3, dim)).astype(np.float32)
    texts = [base64.b64encode(codec.encode(v[None, :], dtype)).decode() for v in vectors]
    hits = [
        hit(str(i), float(i), 0, 0, i) | {"fields": {"key": [t if padded else t.rstrip("=")]}}
        for i, t in enumerate(texts)
    ]
    meta = replace(META, dim=dim, store_dtype=dtype)
    got = neighbors.parse_neighbors({"hits": {"hits": hits}}, 3, None, meta)
    want = np.concatenate([codec.decode(codec.encode(v[None, :], dtype), 1, dim, dtype) for v in vectors])
    assert got.vectors is not None
    np.testing.assert_array_equal(got.vectors, want)


def test_parse_neighbors_drops_generations_not_current() -> None:
    response = {"hits": {"hits": [hit("1", 0.1, 0, 0, 5, gen="1:old"), hit("1", 0.2, 0, 0, 6, gen="1:new")]}}
    got = neighbors.parse_neighbors(response, 2, {"1:new"})
    assert got.token_ids.tolist() == [6]
    assert len(neighbors.parse_neighbors({"hits": {"hits": []}}, 3)) == 0


def test_parse_articles_reads_score_from_sort_when_absent() -> None:
    response = {
        "hits": {
            "hits": [
                {"_id": "2", "_score": 3.5, "_source": {"title": "Two"}, "sort": [3.5, "2"]},
                {"_id": "1", "_score": None, "_source": {"title": "One"}, "sort": [1.25, "1"]},
            ]
        }
    }
    assert bodies.parse_articles(response) == [ArticleHit("2", "Two", 3.5), ArticleHit("1", "One", 1.25)]


def test_settings_to_restore() -> None:
    names = {"articles": "a", "contexts": "c"}
    settings = {
        "a": {"settings": {"index": {"number_of_replicas": "1", "refresh_interval": "5s"}}},
        "c": {"settings": {"index": {"number_of_replicas": "0", "refresh_interval": "-1"}}},
    }
    saved = {"refresh_interval": "30s", "number_of_replicas": "2"}
    record = bodies.meta_with_restore(META_DOC, {"c": saved}, "writer-1")
    state = {"a": settings["a"] | {"mappings": {"_meta": record}}, "c": settings["c"]}
    assert bodies.restore_owner(record) == "writer-1"
    # The record in the articles index's _meta (an add died in bulk mode) wins over the bulk values.
    assert bodies.settings_to_restore(state, names) == {
        "a": {"refresh_interval": "5s", "number_of_replicas": "1"},
        "c": saved,
    }
    # Bulk values and no record: back to the defaults, never "0" replicas for good.
    assert bodies.settings_to_restore(settings, names)["c"] == {
        "refresh_interval": None,
        "number_of_replicas": None,
    }


def test_settings_to_restore_reads_an_older_versions_record_in_each_index() -> None:
    """Before the one record in the articles index, each index kept its own: ``{"owner", "settings"}``."""
    names = {"articles": "a", "contexts": "c"}
    old = {"refresh_interval": "30s", "number_of_replicas": "2"}
    own = {**META_DOC, bodies.RESTORE_KEY: {"owner": "older", "settings": old}}
    bulk = {"settings": {"index": {"number_of_replicas": "2", "refresh_interval": "-1"}}}
    state = {
        "a": {"settings": {"index": {"number_of_replicas": "1"}}},
        "c": bulk | {"mappings": {"_meta": own}},
    }
    assert bodies.settings_to_restore(state, names)["c"] == old
    # A new record beside it (written before the old one was dropped) holds the same values, and wins.
    newer = {"refresh_interval": "10s", "number_of_replicas": "3"}
    state["a"]["mappings"] = {"_meta": bodies.meta_with_restore(META_DOC, {"c": newer}, "w")}
    assert bodies.settings_to_restore(state, names)["c"] == newer


def test_restore_record_is_not_part_of_the_index_metadata() -> None:
    with_record = {**META_DOC, bodies.RESTORE_KEY: {"number_of_replicas": "1"}}
    assert bodies.meta_with_restore(with_record, None) == META_DOC
    response = {
        NAMES["articles"]: {"mappings": {"_meta": with_record}},
        NAMES["contexts"]: {"mappings": {"_meta": META_DOC}},
    }
    assert bodies.meta_from_mappings(response, NAMES, "here") == META


def test_bulk_error_message_is_one_line() -> None:
    failure = {
        "index": {
            "_id": "42:fp1:0",
            "status": 400,
            "error": {
                "type": "mapper_parsing_exception",
                "reason": "failed to parse\nfield [vector]",
                "caused_by": {"type": "illegal_argument_exception", "reason": "Vector dimension mismatch"},
            },
        }
    }
    assert bulk_error_message("OpenSearch", "write contexts", "http://h:9200", [failure], 5) == (
        "OpenSearch at http://h:9200 rejected 1 of 5 documents while trying to write contexts (first: index"
        " '42:fp1:0', status 400, mapper_parsing_exception: failed to parse field [vector]"
        " (illegal_argument_exception: Vector dimension mismatch)); those articles were not written"
        " (an earlier version stays as it was); fix the input and run the add again"
    )


def test_public_url_drops_credentials() -> None:
    assert public_url("https://admin:s3cret@search.example.org:9200/") == "https://search.example.org:9200"
    assert public_url("http://[::1]:9200/proxy") == "http://[::1]:9200/proxy"


def test_make_client_needs_a_url(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set OPENSEARCH_URL or --opensearch-url"):
        OPENSEARCH.client(Config(backend="opensearch"))
    with pytest.raises(ConfigError, match="set ELASTICSEARCH_URL or --elasticsearch-url"):
        ELASTICSEARCH.client(Config(backend="elasticsearch"))
    with pytest.raises(ConfigError, match="'localhost:9200' is not a node URL \\(no http:// or https://;"):
        OPENSEARCH.client(Config(backend="opensearch", opensearch_url="localhost:9200"))
    with pytest.raises(ConfigError, match="not found"):
        OPENSEARCH.client(Config(opensearch_url="https://h:9200", opensearch_ca=tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="not found"):
        ELASTICSEARCH.client(Config(elasticsearch_url="https://h:9200", elasticsearch_ca=tmp_path / "x.pem"))


@pytest.mark.parametrize(
    ("exc", "transient", "message"),
    [
        (
            OSConnectionError("N/A", "refused", OSError("Connection refused")),
            True,
            "cannot reach OpenSearch at http://h:9200 to search articles after 3 attempts"
            " (ConnectionError: Connection refused);"
            " check that the cluster is up and OPENSEARCH_URL is right",
        ),
        (
            TransportError(
                429, "too_many_requests", {"error": {"type": "es_rejected", "reason": "queue\nfull"}}
            ),
            True,
            "OpenSearch at http://h:9200 failed to search articles after 3 attempts: HTTP 429 es_rejected:"
            " queue full; the cluster is overloaded:"
            " run the command again later or give the cluster more resources",
        ),
        (
            TransportError(503, "unavailable", "no master"),
            True,
            "OpenSearch at http://h:9200 failed to search articles after 3 attempts: HTTP 503 unavailable;"
            " check the cluster's health and logs, then run the command again",
        ),
        (
            TransportError(401, "security_exception", {"error": {"type": "security", "reason": "bad login"}}),
            False,
            "OpenSearch at http://h:9200 failed to search articles after 3 attempts: HTTP 401 security:"
            " bad login; check OPENSEARCH_USER / OPENSEARCH_PASSWORD and the user's index permissions",
        ),
    ],
)
def test_describe_and_is_transient(exc: Exception, transient: bool, message: str) -> None:
    assert is_transient(exc, OPENSEARCH) is transient
    assert describe("search articles", "http://h:9200", exc, OPENSEARCH, 3) == message


def test_elasticsearch_errors_are_read_alike() -> None:
    from elastic_transport import (
        ApiResponseMeta,
        HttpHeaders,
        NodeConfig,
    )
    from elastic_transport import (
        ConnectionError as ESConnectionError,
    )
    from elasticsearch import ApiError

    meta = ApiResponseMeta(429, "1.1", HttpHeaders(), 0.1, NodeConfig("http", "h", 9200))
    busy = ApiError("busy", meta, {"error": {"type": "es_rejected", "reason": "queue\nfull"}})
    assert is_transient(busy, ELASTICSEARCH) and is_transient(ESConnectionError("refused"), ELASTICSEARCH)
    assert describe("search articles", "http://h:9200", busy, ELASTICSEARCH, 3) == (
        "Elasticsearch at http://h:9200 failed to search articles after 3 attempts: HTTP 429 es_rejected:"
        " queue full; the cluster is overloaded:"
        " run the command again later or give the cluster more resources"
    )
    down = describe("search articles", "http://h:9200", ESConnectionError("refused"), ELASTICSEARCH)
    assert down.startswith("cannot reach Elasticsearch at http://h:9200 to search articles")
    assert down.endswith("check that the cluster is up and ELASTICSEARCH_URL is right")


def test_the_article_cache_is_bounded_and_keyed_by_generation() -> None:
    cache = ArticleCache(states_max=2, chars_max=30)
    cache.record([("1", {"fingerprint": "a", "title": "One"}), ("2", {"fingerprint": "b"})])
    cache.record([("3", {"fingerprint": "c"}), ("4", {"title": "no fingerprint: not a state"})])
    assert [cache.state(a) is not None for a in "1234"] == [False, True, True, False]
    assert cache.fresh("3") is not None and cache.state("3").generation == "3:c"
    cache.keep_sentences("1", "1:a", ["x" * 10])
    cache.keep_sentences("2", "2:b", ["y" * 10])
    assert cache.sentences("1", "1:b") is None  # a new generation is another key
    assert cache.sentences("1", "1:a") == ["x" * 10]  # used: the older one goes first
    cache.keep_sentences("3", "3:c", ["z" * 10])
    assert cache.sentences("2", "2:b") is None and cache.sentences("1", "1:a") is not None
    cache.forget(["3"])
    assert cache.state("3") is None


def test_closest_titles_wait_for_a_knn_request_newest_first_kept_and_are_read_once() -> None:
    from bertknn_search.backends.engines import subject_search
    from bertknn_search.records import SubjectArticles

    waiting = subject_search.Waiting()
    asks = [subject_search.Ask(f"s{i}", 5) for i in range(subject_search.Waiting.LIMIT + 2)]
    for ask in asks:
        waiting.add(ask)
    waiting.withdraw(asks[-1])  # read before a request took it: it asks alone
    assert waiting.take() == asks[2:-1] and waiting.take() == []  # the oldest dropped (asked alone if read)

    lines = subject_search.carried(asks[:2], "p-articles")
    assert [line.get("index") for line in lines[::2]] == ["p-articles"] * 2
    subject_search.share(asks[:2], [{"hits": {"hits": []}}, {"error": {}}])
    assert asks[0].answer == {"hits": {"hits": []}} and asks[1].answer == {"error": {}}

    # The top score's titles only: those holding the first pattern any title holds.
    def hit(i: int, score: float) -> dict[str, Any]:
        return {"_id": str(i), "_source": {"title": f"T{i}"}, "sort": [score, f"t{i}", str(i)]}

    response = {"hits": {"hits": [hit(1, 2.0), hit(2, 2.0), hit(3, 1.0)]}}
    assert [h.id for h in subject_search.closest_hits(response)] == ["1", "2"]
    assert subject_search.closest_hits({"hits": {"hits": []}}) == []

    reads = []
    found = SubjectArticles([], lambda: reads.append(1) or [ArticleHit("1", "T1", 0.0)])
    assert found.closest == found.closest == [ArticleHit("1", "T1", 0.0)] and reads == [1]
    assert SubjectArticles([]).closest is None
