"""IR step: a question (and its subject, for KB facts) -> the top-N articles to search."""

from __future__ import annotations

import re

from bertknn_search.backends.base import Backend
from bertknn_search.encoding.encoder import MASK
from bertknn_search.records import ArticleHit, Question

_TRAILING_PUNCT = re.compile(r"[\s.?!]+$")


def ir_query(question: Question) -> str:
    """What the article index is searched with.

    KB facts use their subject (lowercased by the shared tokenizer); free questions use the question
    with [MASK] and the final full stop removed, as the reference does for SQuAD.
    """
    if question.subject and question.subject.strip():
        return question.subject.strip()
    return _TRAILING_PUNCT.sub("", question.text.replace(MASK, " ")).strip()


def retrieve(backend: Backend, question: Question, n: int) -> list[ArticleHit]:
    """The subject's own article when its title matches exactly, else the BM25 top ``n``.

    Several articles may carry the subject's title (two inputs, one title): all of them, up to ``n``, are
    the subject's own, so all are searched rather than one picked by id.
    """
    query = ir_query(question)
    if question.subject:
        # One call: an engine asks for the title and the BM25 top n in one request.
        return backend.subject_articles(question.subject, query, n)
    return backend.search_articles(query, n) if query else []
