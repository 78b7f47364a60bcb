"""A pruned BM25 top-k through tantivy's Python binding: the terms of many articles made optional.

tantivy-py's ``Searcher.search`` wraps its top-k collector in a ``MultiCollector``, which never takes
tantivy's block-max WAND path, so a disjunction of a question's terms scores every article that matches
any of them (70% of 100,000 Wikipedia-shaped articles for a ten-word question). As in MaxScore, the
terms that match many articles are made optional beside a required disjunction of the rarer ones, so
only articles holding a rare term are scored, with their whole score. An article holding no rare term
scores at most the frequent terms' upper bounds summed, (k1 + 1) * idf each (BM25's term-frequency
factor is below 1), so the required query's top n is the whole query's once its n-th score is above that
bound; when it is not, the caller searches with the whole query.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tantivy

K1 = 1.2  # tantivy's BM25 k1
# A term in more than this share of the articles is optional. On 300 questions over 100,000 articles:
# 0.05 and 0.1 both cut retrieve's CPU p50 from 0.85 to 0.65 ms, 0.1 with no question searched again
# in whole (0.05: 19, 0.01: 115); 0.2 leaves too many long postings required (0.78 ms).
FREQUENT_SHARE = 0.1
MARGIN = 1e-4  # relative: tantivy sums float32 scores, so the bound is raised past their rounding


@dataclass(frozen=True)
class Split:
    """A question's query with its rare terms required, and the most an article it misses can score."""

    query: tantivy.Query
    bound: float


def split_query(
    searcher: tantivy.Searcher,
    terms: Sequence[tuple[str, str]],
    term_query: Callable[[str, str], tantivy.Query],
    total_docs: int,
) -> Split | None:
    """The pruned form of the disjunction of ``terms`` ((field, term) pairs); None when every term is
    rare or every one frequent (the whole query is then no slower).

    Args:
        total_docs: the document count tantivy's BM25 uses (``bm25_total_docs``), deleted ones included.
    """
    rare, frequent, bound = [], [], 0.0
    for field, term in terms:
        df = searcher.doc_freq(field, term)
        if df > FREQUENT_SHARE * total_docs:
            frequent.append(term_query(field, term))
            bound += (K1 + 1) * math.log(1 + (total_docs - df + 0.5) / (df + 0.5))
        else:
            rare.append(term_query(field, term))
    if not rare or not frequent:
        return None
    should = tantivy.Occur.Should
    required = tantivy.Query.boolean_query([(should, q) for q in rare])
    query = tantivy.Query.boolean_query([(tantivy.Occur.Must, required), *((should, q) for q in frequent)])
    return Split(query, bound * (1 + MARGIN) + MARGIN)


def bm25_total_docs(searcher: tantivy.Searcher, probe: tantivy.Query) -> int | None:
    """The document count tantivy's BM25 uses in ``searcher`` (it counts deleted documents too, which
    the binding's ``num_docs`` does not), read from the explanation of a hit of ``probe`` (a term query
    of a term most documents hold); None when there is no hit or the explanation does not say."""
    hits = searcher.search(probe, 1, count=False).hits
    if not hits:
        return None
    try:
        explained = json.loads(probe.explain(searcher, hits[0][1]).to_json())
        for part in explained["details"]:
            for detail in part.get("details", []):
                if detail["description"].startswith("N,"):
                    return int(detail["value"])
    except (ValueError, KeyError, TypeError):
        return None
    return None
