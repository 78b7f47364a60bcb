"""Issue 43's small things: each one a line a new user read wrong (units, plurals, advice, help)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search import session
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import IndexMismatchError
from bertknn_search.output import render_answer, render_stats
from bertknn_search.records import Answer, IndexMeta, IndexStats

META = IndexMeta(
    model="model-a", layer=11, dim=8, vocab_size=100, mask_policy="single-wordpiece", contexts="lazy"
)


@pytest.mark.parametrize("typed", ["<mask>", "<MASK>", "___"])
def test_another_models_mask_gets_did_you_mean(typed: str) -> None:
    result = CliRunner().invoke(main, ["query", "--index", "/nonexistent", f"Einstein was born in {typed}."])
    assert result.exit_code == 1
    assert f"the question has '{typed}': did you mean [MASK] (BERT's mask)?" in result.output


def test_a_float_option_without_bounds_shows_no_range_in_its_help() -> None:
    shown = CliRunner().invoke(main, ["query", "--help"], terminal_width=200).output
    assert "x<=None" not in shown and "--gate-threshold FLOAT" in shown


def stats(partial: int, estimated: int) -> IndexStats:
    return IndexStats(
        "embedded", "/i", 3, 30, 120, 4096, META, encoded_articles=1, estimated_contexts=estimated,
        partial_articles=partial, partial_contexts=7,
    )  # fmt: skip


def test_stats_say_units_and_singulars() -> None:
    lines = {line[:18].strip(): line[18:] for line in render_stats(stats(1, 240_519)).splitlines()}
    assert lines["eager estimate"] == "240,519 contexts if every article were encoded (eager)"
    assert lines["partly encoded"].startswith("1 article (7 contexts so far;")
    assert render_stats(stats(2, 0)).count("2 articles (7 contexts so far;") == 1


def test_no_ranking_header_over_no_answers() -> None:
    empty = Answer(question="X was born in [MASK].", subject="Nobody", articles=[], bert_knn=[], bert=None,
                   knn=[], evidence=[], n_neighbors=0, bert_available=False)  # fmt: skip
    text = render_answer(empty, 10)
    assert "BERT-kNN" not in text
    assert "articles: none found; no answer without BERT" in text and "answers: none" in text


class FakeBackend:
    location = "opensearch at http://127.0.0.1:9200, index prefix 'team'"

    def meta(self) -> IndexMeta:
        return META

    def close(self) -> None:
        pass


def test_a_model_mismatch_on_an_engine_names_index_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    import bertknn_search.backends as backends

    monkeypatch.setattr(backends, "open_backend", lambda config: FakeBackend())
    flags: dict[str, Any] = {"backend": "opensearch", "opensearch_url": "http://127.0.0.1:9200", "model": "b"}
    with pytest.raises(IndexMismatchError) as caught:
        session.adopt_index(session.resolve_config(flags, env={}))
    assert str(caught.value).endswith("drop --model or use another --index-prefix")
    with pytest.raises(IndexMismatchError) as caught:
        session.adopt_index(session.resolve_config({"model": "b", "index": Path("/i")}, env={}))
    assert str(caught.value).endswith("drop --model or use another --index")


def test_serve_names_an_engine_index_by_its_prefix() -> None:
    from bertknn_search.server.run import index_name

    engine = Config(
        backend="elasticsearch", elasticsearch_url="http://127.0.0.1:9201", opensearch_prefix="team"
    )
    assert index_name(engine) == "index prefix 'team' on elasticsearch at http://127.0.0.1:9201"
    assert index_name(Config(index=Path("/data/idx"))) == "/data/idx"
