"""How hard a question is, read without knowing its relation or kind (issue 49).

A fit of ``p`` that never saw a kind of relation gives its answers about the average ``p``, though
BERT-kNN is right 23% of the time on some kinds and 75% on others. What the answer's own signals (votes,
agreement) do not say, the question may: how spread BERT's guess is over the vocabulary at its [MASK]
(entropy, top-1 probability), how spread the kNN distribution is (its entropy; ``exp`` of it is the
effective number of distinct values), and how far the neighbours are (the mean squared distance of the
k; the nearest's is in ``confidence.Signals``). These are signals of the question, not of the relation,
so a fit can use them on relations it never saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertknn_search.query.gates import confidence


@dataclass(frozen=True)
class Hardness:
    """What a question's distributions and neighbours say about how hard it is (None: not known).

    Attributes:
        bert_top1: BERT's top-1 probability over the answerable wordpieces; None without an MLM head.
        bert_entropy: the entropy (nats) of BERT's distribution over the answerable wordpieces,
            renormalised; None without an MLM head.
        knn_entropy: the entropy (nats) of the kNN distribution over the neighbours' values; None
            without neighbours or where not recorded (checkpoints written before it was).
        mean_distance: the mean squared distance of the k neighbours; None without neighbours.
    """

    bert_top1: float | None = None
    bert_entropy: float | None = None
    knn_entropy: float | None = None
    mean_distance: float | None = None


def entropy(p: np.ndarray) -> float | None:
    """The entropy (nats) of ``p`` normalised to sum 1; None where it holds no mass."""
    q = np.asarray(p, dtype=np.float64).ravel()
    q = q[q > 0]
    total = q.sum()
    if not len(q) or not np.isfinite(total) or total <= 0:
        return None
    q = q / total
    return float(max(-(q * np.log(q)).sum(), 0.0))


def hardness(
    p_knn: np.ndarray, distances: np.ndarray, p_bert: np.ndarray | None, answerable: np.ndarray | None
) -> Hardness:
    """The hardness signals of one question: ``p_knn`` its kNN distribution (any space), ``distances``
    its neighbours' squared distances, ``p_bert`` BERT's (V,) distribution (None without an MLM head)
    and ``answerable`` a (V,) bool mask of the wordpieces that may be answers (None: all). A
    distribution longer than the vocabulary's mask (a head with padded rows) gives no BERT signals, as
    ``KindTable.signals`` gives no BERT share there: unknown, not a failed question."""
    bert_top1 = bert_entropy = None
    if p_bert is not None and len(p_bert):
        every = np.ones(len(p_bert), dtype=bool)
        allowed = every if answerable is None else np.asarray(answerable, dtype=bool)
        if allowed.shape == (len(p_bert),):
            said = confidence(np.asarray(p_bert)[None, :], allowed)
            bert_top1, bert_entropy = float(said["top1"][0]), float(said["entropy"][0])
    d = np.asarray(distances, dtype=np.float64)
    mean = float(d.mean()) if len(d) and np.isfinite(d).all() else None
    return Hardness(bert_top1, bert_entropy, entropy(p_knn) if len(d) else None, mean)
