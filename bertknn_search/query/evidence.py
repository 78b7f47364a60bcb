"""Evidence: the stored sentences shown for an answer, nearest first or chosen by information gain.

The top answers get theirs; a question may also name words (``Question.evidence_for``) to get the
sentences that voted for them, wherever they rank.

Banerjee et al. (2019, OpenBookQA) re-rank retrieved knowledge by information gain: each pick is the
candidate with the highest relevance minus redundancy, the redundancy growing with its highest cosine
similarity to what was already picked, so that a sentence repeated across articles does not crowd out
new facts. Both terms are taken in log space: relevance is the neighbour's kNN logit -d/l (the log of its
kNN weight, relative to the nearest), redundancy is -log(1 - max cosine). Subtracting the raw cosine from
the raw weight instead can never prefer a new sentence to an exact copy unless the new one's weight
exceeds its cosine, and BERT's states of one word in two sentences have cosines of 0.9 and more (0.91 in
the test's two sentences), so the copy would always win. In log space a copy (cosine 1) has no gain at
all and is never shown twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from bertknn_search.backends.base import Backend
from bertknn_search.errors import QuestionError
from bertknn_search.query.knn import knn_logits
from bertknn_search.records import Answer, Evidence, EvidenceSentence, Neighbors, WordEvidence

EVIDENCE_ANSWERS = 3  # top answers that get their supporting sentences shown
EVIDENCE_SENTENCES = 3
# Re-encodes neighbours' masked sentences (sentence, start, end) -> (n, dim) keys, for backends that do
# not return the stored ones.
Reencode = Callable[[Sequence[tuple[str, int, int]]], np.ndarray]


# A cosine this close to 1 is the same context stored again (float16 keys from other batches differ in
# the last bits): no information at all.
SAME = 1e-4


def diverse_order(relevance: np.ndarray, vectors: np.ndarray, n: int) -> list[int]:
    """Greedy information-gain selection: relevance minus redundancy, -log(1 - highest cosine so far).

    Args:
        relevance: (m,) the candidates' kNN logits -d/l, nearest first (a common shift changes nothing).
        vectors: (m, dim) their context vectors.
        n: how many to pick at most.

    Returns:
        Candidate indices in the order picked; ties go to the nearer candidate. Copies of a picked
        context (cosine within ``SAME`` of 1) are never picked, so fewer than ``n`` may come back.
    """
    unit = vectors.astype(np.float64)
    unit = unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    novelty = np.ones(len(relevance))  # 1 - the highest cosine to a pick, floored at 0
    free = np.ones(len(relevance), dtype=bool)
    picked: list[int] = []
    while len(picked) < n and free.any():
        with np.errstate(divide="ignore"):
            gain = np.where(novelty > SAME, relevance + np.log(novelty), -np.inf)
        gain[~free] = -np.inf
        best = int(np.argmax(gain))  # the first maximum: the nearer candidate wins a tie
        if not np.isfinite(gain[best]):
            break
        picked.append(best)
        free[best] = False
        novelty = np.minimum(novelty, np.clip(1.0 - unit @ unit[best], 0.0, 1.0))
    return picked


def with_evidence(
    answer: Answer,
    nb: Neighbors,
    backend: Backend,
    *,
    chosen: Sequence[tuple[str, int | None]] = (),
    mode: str = "diverse",
    temperature: float = 6.0,
    squared: bool = True,
    reencode: Reencode | None = None,
) -> Answer:
    """Attach, for each top answer and each chosen word, stored sentences whose masked word was it.

    Args:
        answer: the answer without evidence.
        nb: the question's neighbours.
        backend: reads the sentences and titles.
        chosen: words asked about (``query --evidence-for``) and their values in this index (None: the
            word cannot be an answer here); they go to ``answer.evidence_for``, in order.
        mode: "nearest": the nearest neighbours of each answer; "diverse": chosen by information gain
            among all of the answer's neighbours (needs their vectors: ``nb.vectors``, else ``reencode``).
        temperature, squared: the kNN weight's l and distance, as for p_kNN.
        reencode: computes keys from sentences when ``nb.vectors`` is None.
    """
    top: list[tuple[str, list[int]]] = []
    for pred in answer.bert_knn[:EVIDENCE_ANSWERS]:
        rows = _rows(nb, pred.token_id)
        if rows:
            top.append((pred.word, rows))
    asked = [(word, _rows(nb, value)) for word, value in chosen]
    # One pass over both: a sentence is read, and a key encoded again, once.
    groups = top + [(word, rows) for word, rows in asked if rows]
    if not groups:
        return replace(answer, evidence_for=_chosen(chosen, asked, {})) if chosen else answer
    if mode == "diverse":
        groups = _diverse(groups, nb, backend, temperature, squared, reencode)
    else:
        groups = [(word, rows[:EVIDENCE_SENTENCES]) for word, rows in groups]
    wanted = list(dict.fromkeys(r for _, rows in groups for r in rows))
    texts = dict(zip(wanted, _sentences(backend, nb, wanted)))
    titles = backend.titles([nb.article_ids[r] for r in wanted])
    found = [
        [
            EvidenceSentence(
                article_id=nb.article_ids[r],
                title=titles.get(nb.article_ids[r], ""),
                sentence=texts[r],
                start=int(nb.starts[r]),
                end=int(nb.ends[r]),
                distance=float(nb.distances[r]),
            )
            for r in rows
        ]
        for _, rows in groups
    ]
    evidence = [Evidence(word, sentences) for (word, _), sentences in zip(top, found)]
    picked = dict(zip((word for word, rows in asked if rows), found[len(top) :]))
    return replace(answer, evidence=evidence, evidence_for=_chosen(chosen, asked, picked))


def _rows(nb: Neighbors, value: int | None) -> list[int]:
    """The neighbours whose masked word is ``value``, nearest first."""
    return [] if value is None else np.flatnonzero(nb.token_ids == value).tolist()


def _chosen(
    chosen: Sequence[tuple[str, int | None]],
    asked: Sequence[tuple[str, list[int]]],
    picked: dict[str, list[EvidenceSentence]],
) -> list[WordEvidence]:
    return [
        WordEvidence(word, picked.get(word, []), len(rows), value is not None)
        for (word, value), (_, rows) in zip(chosen, asked)
    ]


def _sentences(backend: Backend, nb: Neighbors, rows: Sequence[int]) -> list[str]:
    return backend.sentences([(nb.article_ids[r], int(nb.sentence_ids[r])) for r in rows])


def _diverse(
    picks: list[tuple[str, list[int]]],
    nb: Neighbors,
    backend: Backend,
    temperature: float,
    squared: bool,
    reencode: Reencode | None,
) -> list[tuple[str, list[int]]]:
    vectors = nb.vectors
    if vectors is None:
        if reencode is None:  # nothing to measure redundancy with: the nearest, as before
            return [(word, rows[:EVIDENCE_SENTENCES]) for word, rows in picks]
        rows = list(dict.fromkeys(r for _, rs in picks for r in rs))
        texts = _sentences(backend, nb, rows)
        try:
            keys = reencode([(t, int(nb.starts[r]), int(nb.ends[r])) for t, r in zip(texts, rows)])
        except QuestionError:  # a stored sentence the question encoder refuses (too long, a literal [MASK])
            return [(word, rows[:EVIDENCE_SENTENCES]) for word, rows in picks]
        vectors = np.zeros((len(nb), keys.shape[1]), dtype=np.float32)
        vectors[rows] = keys
    out = []
    for word, rows in picks:
        relevance = knn_logits(nb.distances[rows], temperature, squared)
        order = diverse_order(relevance, vectors[rows], EVIDENCE_SENTENCES)
        out.append((word, [rows[i] for i in order]))
    return out
