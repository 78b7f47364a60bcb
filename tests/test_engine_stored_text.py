"""A lazy index's article docs on a real engine, edited behind its back: the text a cold question would
encode is checked for its type and against the article's fingerprint first (issue 34, stored text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bertknn_search.backends.engines import dialect_for
from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.backends.engines.bodies import index_names
from bertknn_search.config import Config
from bertknn_search.errors import IndexCorruptError
from bertknn_search.ingest.pipeline import ingest


def edit_article(config: Config, article_id: str, fields: dict[str, Any]) -> None:
    client = dialect_for(config.backend).client(config)
    try:
        name = index_names(config.opensearch_prefix)["articles"]
        if config.backend == "elasticsearch":
            client.update(index=name, id=article_id, doc=fields)
        else:
            client.update(index=name, id=article_id, body={"doc": fields})
    finally:
        client.close()


@pytest.fixture
def lazy_engine(cluster_config: Config, corpus: Path) -> Config:
    config = cluster_config.replace(contexts="lazy")
    ingest(corpus, config, progress=False)
    return config


def pending_texts(config: Config) -> dict[str, str]:
    backend = EngineBackend.open(config)
    try:
        return {p.article.id: p.article.text for p in backend.unencoded(["100", "101"])}
    finally:
        backend.close()


def test_stored_texts_are_handed_out_as_ingested(lazy_engine: Config, corpus: Path) -> None:
    texts = pending_texts(lazy_engine)
    assert set(texts) == {"100", "101"} and all(texts.values())


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"text": 42}, "its text is int, not text"),
        ({"title": ["a", "list"]}, "its title is list, not text"),
    ],
)
# (A popularity that is not a number is refused by the engine's own mapping, a double.)
def test_a_stored_field_of_the_wrong_type_is_said_damaged(
    lazy_engine: Config, fields: dict[str, Any], why: str
) -> None:
    edit_article(lazy_engine, "101", fields)
    with pytest.raises(IndexCorruptError, match=rf"the stored article '101' is damaged \({why}\)"):
        pending_texts(lazy_engine)


def test_another_articles_text_is_not_encoded_as_this_one(lazy_engine: Config) -> None:
    other = pending_texts(lazy_engine)["100"]
    edit_article(lazy_engine, "101", {"text": other})
    with pytest.raises(IndexCorruptError, match="its text is not the text its fingerprint was made from"):
        pending_texts(lazy_engine)
