"""P@k, LAMA's macro average (facts -> relations -> corpora) and PopQA's popularity buckets (pure)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bertknn_search.errors import ConfigError

MODELS = ("bert", "knn", "bert_knn")
KS = (1, 5, 10)
NO_ARTICLE = "no-article"
# The paper's LAMA figure averages over the relations of these two corpora together.
LAMA_PARTS = ("T-REx", "Google-RE")
POPULARITY_BINS = 10


@dataclass(frozen=True)
class FactResult:
    """What the harness found for one fact (one JSONL line of its checkpoint).

    Attributes:
        corpus, relation, uuid: as in the Fact.
        ranks: model -> 1-based rank of the first gold answer in that model's top ranking, None when no gold
            answer is in it. Empty for skipped facts.
        skipped: why the fact is not scored (e.g. "multi-token-answer"), or None. ``NO_ARTICLE`` marks a
            fact whose IR step found no context: its ranks are kept, but it is left out of the averages
            unless ``macro_average(no_article_wrong=True)``.
        popularity: the subject's popularity (PopQA), else None.
    """

    corpus: str
    relation: str
    uuid: str
    ranks: Mapping[str, int | None] = field(default_factory=dict)
    skipped: str | None = None
    popularity: float | None = None

    def hit(self, model: str, k: int) -> bool:
        rank = self.ranks.get(model)
        return rank is not None and rank <= k


@dataclass(frozen=True)
class Score:
    """Mean P@k of one relation, corpus or aggregate.

    Attributes:
        name: relation id, corpus name or aggregate name ("LAMA").
        corpus: the corpus (for an aggregate: its parts joined by "+").
        facts: facts read.
        scored: facts that entered the mean.
        relations: relations that entered the mean (1 for a relation with scored facts, 0 without).
        skipped: reason -> count of facts left out.
        no_article: facts whose IR step found no context (also counted in ``skipped`` unless scored as wrong).
        precision: model -> k -> mean P@k in [0, 1]; empty when nothing was scored.
    """

    name: str
    corpus: str
    facts: int
    scored: int
    relations: int
    skipped: dict[str, int]
    no_article: int
    precision: dict[str, dict[int, float]]


@dataclass(frozen=True)
class Bucket:
    """Facts whose log-popularity lies in [low, high) (the last bucket includes ``high``)."""

    low: float
    high: float
    facts: int
    precision: dict[str, float]  # model -> P@1; empty when the bucket has no facts


@dataclass(frozen=True)
class MacroResult:
    """Everything ``macro_average`` computes; corpora in order of first appearance."""

    models: tuple[str, ...]
    ks: tuple[int, ...]
    relations: list[Score]
    corpora: list[Score]
    aggregates: list[Score]
    popularity: list[Bucket]


def precision_at_k(ranked: Sequence[str], gold: Collection[str], k: int) -> float:
    """1.0 if any gold answer is among the first ``k`` of ``ranked`` (already ordered, ties broken), else 0.0.

    Raises:
        ConfigError: ``k`` < 1.
    """
    if k < 1:
        raise ConfigError(f"k must be >= 1 for P@k, got {k}")
    return float(any(word in gold for word in ranked[:k]))


def first_gold_rank(ranked: Sequence[str], gold: Collection[str]) -> int | None:
    """1-based position of the first gold answer in ``ranked``, or None."""
    return next((i for i, word in enumerate(ranked, 1) if word in gold), None)


def macro_average(
    rows: Iterable[FactResult],
    models: Sequence[str] = MODELS,
    ks: Sequence[int] = KS,
    *,
    no_article_wrong: bool = False,
) -> MacroResult:
    """LAMA's mean P@k: over facts within each relation, then over the relations of each corpus.

    Args:
        rows: one result per fact.
        models: the rankings to score.
        ks: the cut-offs.
        no_article_wrong: score facts without retrieved context as wrong for every model, as the reference
            code does; by default they are left out and counted.

    Returns:
        Per-relation, per-corpus and "LAMA" (T-REx + Google-RE relations, when present) scores, and
        popularity buckets of the scored facts that have a popularity.
    """
    by_relation: dict[tuple[str, str], list[FactResult]] = defaultdict(list)
    for row in rows:
        by_relation[(row.corpus, row.relation)].append(row)
    relations = [
        _relation_score(corpus, relation, facts, models, ks, no_article_wrong)
        for (corpus, relation), facts in by_relation.items()
    ]
    corpus_names = list(dict.fromkeys(s.corpus for s in relations))
    corpora = [_combine(c, c, [s for s in relations if s.corpus == c], models, ks) for c in corpus_names]
    aggregates = []
    parts = [c for c in LAMA_PARTS if c in corpus_names]
    if parts:
        members = [s for s in relations if s.corpus in parts]
        aggregates.append(_combine("LAMA", "+".join(parts), members, models, ks))
    scored = [r for facts in by_relation.values() for r in facts if _counts(r, no_article_wrong)]
    return MacroResult(
        tuple(models), tuple(ks), relations, corpora, aggregates, popularity_buckets(scored, models)
    )


def _counts(row: FactResult, no_article_wrong: bool) -> bool:
    return row.skipped is None or (no_article_wrong and row.skipped == NO_ARTICLE)


def _relation_score(
    corpus: str,
    relation: str,
    facts: list[FactResult],
    models: Sequence[str],
    ks: Sequence[int],
    no_article_wrong: bool,
) -> Score:
    import numpy as np  # here, not at the top: the CLI imports this module for MODELS at every start

    scored = [f for f in facts if _counts(f, no_article_wrong)]
    skipped = Counter(f.skipped for f in facts if f.skipped is not None and not _counts(f, no_article_wrong))
    precision = {}
    if scored:
        # A no-article fact that is scored counts as wrong for every model (the reference's choice).
        hits = {m: {k: [f.skipped is None and f.hit(m, k) for f in scored] for k in ks} for m in models}
        precision = {m: {k: float(np.mean(hits[m][k])) for k in ks} for m in models}
    no_article = sum(f.skipped == NO_ARTICLE for f in facts)
    return Score(
        relation,
        corpus,
        len(facts),
        len(scored),
        int(bool(scored)),
        dict(sorted(skipped.items())),
        no_article,
        precision,
    )


def _combine(name: str, corpus: str, members: list[Score], models: Sequence[str], ks: Sequence[int]) -> Score:
    """Unweighted mean over the member relations that have scored facts."""
    import numpy as np

    with_facts = [s for s in members if s.scored]
    skipped: Counter[str] = Counter()
    for s in members:
        skipped.update(s.skipped)
    precision = {}
    if with_facts:
        precision = {
            m: {k: float(np.mean([s.precision[m][k] for s in with_facts])) for k in ks} for m in models
        }
    return Score(
        name,
        corpus,
        sum(s.facts for s in members),
        sum(s.scored for s in members),
        len(with_facts),
        dict(sorted(skipped.items())),
        sum(s.no_article for s in members),
        precision,
    )


def popularity_buckets(
    rows: Sequence[FactResult], models: Sequence[str] = MODELS, bins: int = POPULARITY_BINS
) -> list[Bucket]:
    """P@1 by log-popularity bucket; edges of a ``bins``-bin histogram of log(popularity), as PopQA's.

    Rows without a popularity are ignored; a popularity below 1 counts as 1 (log(0) is undefined).

    Returns:
        ``bins`` buckets, low to high; [] when no row has a popularity.
    """
    import numpy as np

    rows = [r for r in rows if r.popularity is not None]
    if not rows:
        return []
    logs = np.log(np.maximum([float(r.popularity or 0.0) for r in rows], 1.0))
    edges = np.histogram_bin_edges(logs, bins=bins)
    # digitize against the inner edges: bucket i holds [edges[i], edges[i+1]); the top edge is inclusive.
    which = np.digitize(logs, edges[1:-1], right=False)
    buckets = []
    for i in range(bins):
        members = [r for r, b in zip(rows, which) if b == i]
        precision = {m: float(np.mean([r.hit(m, 1) for r in members])) for m in models} if members else {}
        buckets.append(Bucket(float(edges[i]), float(edges[i + 1]), len(members), precision))
    return buckets


def adaptive_thresholds(
    dev: Sequence[FactResult],
    parametric: str = "bert",
    retrieval: str = "bert_knn",
    bins: int = POPULARITY_BINS,
) -> dict[str, float]:
    """PopQA's adaptive retrieval: per relation, the log-popularity threshold that maximises dev P@1.

    Below the threshold the ``retrieval`` answer is used, at or above it the ``parametric`` one. The
    candidates are the edges of a ``bins``-bin histogram of the relation's log(popularity); ties go to
    the lowest threshold (less retrieval).

    Returns:
        relation -> threshold in log space; relations without popularity are absent.
    """
    import numpy as np

    by_relation: dict[str, list[FactResult]] = defaultdict(list)
    for row in dev:
        if row.popularity is not None and row.skipped is None:
            by_relation[row.relation].append(row)
    thresholds = {}
    for relation, rows in by_relation.items():
        logs = np.log(np.maximum([float(r.popularity or 0.0) for r in rows], 1.0))
        best, best_acc = -np.inf, -1.0
        for edge in np.histogram_bin_edges(logs, bins=bins):
            acc = np.mean([r.hit(retrieval if lg < edge else parametric, 1) for r, lg in zip(rows, logs)])
            if acc > best_acc:
                best, best_acc = float(edge), float(acc)
        thresholds[relation] = best
    return thresholds
