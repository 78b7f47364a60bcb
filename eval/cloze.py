"""Leave-one-out cloze: mask a stored word, answer from the other contexts, score the word's rank.

Targets are word occurrences of the index's own sentences, chosen with a seed by the text and the
tokenizer alone (never by the index's mask policy), so that indexes of one corpus under different
policies are asked the same questions. A target's question is its sentence with the whole word
replaced by one [MASK], asked with its article's title as subject; the kNN leaves out every context of
that sentence (the masked word's own context would give the answer away) and keeps the k nearest of
the others. A target whose word cannot be an answer in the index (a word of several wordpieces under a
single-wordpiece policy) is a miss, counted, never dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from bertknn_search import progress_lines
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.eval.cloze_targets import KINDS, Sample, Target, article_sentences, draw_targets
from bertknn_search.eval.harness import available_models
from bertknn_search.ingest.contexts import make_row_table
from bertknn_search.query.search import Scored, Searcher
from bertknn_search.records import ArticleHit, Neighbors, Question
from bertknn_search.values import word_key

CLOZE_KS = (1, 10)


@dataclass(frozen=True)
class TargetResult:
    """One target's outcome.

    Attributes:
        value: what the word is stored under in this index; None: it cannot be an answer here (a miss).
        ranks: model -> 1-based rank of the word in that model's top max(CLOZE_KS), None if not there.
        own_article: whether the IR step searched the target's own article.
        left_out: neighbours of the target's own sentence dropped before the k were kept.
        top: model -> its first answer, as a word.
        reachable: whether a context of the searched articles outside the target's sentence holds its
            value: kNN can only name a word stored elsewhere, and a rare name often is not.
    """

    target: Target
    value: int | None
    ranks: dict[str, int | None]
    own_article: bool
    left_out: int
    top: dict[str, str] = field(default_factory=dict)
    reachable: bool = False


@dataclass(frozen=True)
class KindScore:
    """P@k of one kind of target (single or multi wordpiece), per model."""

    kind: str
    targets: int
    no_value: int  # targets whose word cannot be an answer in this index (counted as misses)
    precision: dict[str, dict[int, float | None]]  # model -> k -> P@k (None without targets)
    reachable: int = 0  # targets whose value is stored outside their sentence in the articles searched
    precision_reachable: dict[str, dict[int, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClozeResult:
    """What ``cloze`` returns."""

    mask_policy: str
    models: tuple[str, ...]
    scores: list[KindScore]
    results: list[TargetResult]
    sample: Sample
    own_article_missed: int  # targets whose own article the IR step did not return
    not_in_index: int  # articles given that the index does not hold (skipped)
    settings: dict[str, object]


def own_contexts(searcher: Searcher, sentence: str) -> int:
    """How many contexts the index holds for ``sentence``: its rows under the index's mask policy."""
    meta = searcher.backend.meta()
    return len(make_row_table([[sentence]], searcher.encoder, meta.mask_policy, meta.max_length))


def leave_out(
    searcher: Searcher, state: np.ndarray, hits: list[ArticleHit] | None, target: Target, k: int
) -> tuple[Neighbors, int]:
    """The k nearest contexts outside the target's own sentence, and how many of its own were dropped.

    Asks for k plus the sentence's own contexts, so the k kept are exactly the k nearest of the others.
    """
    ids = None if hits is None else [h.id for h in hits]
    if ids == []:
        return Neighbors.empty(), 0
    wanted = k + own_contexts(searcher, target.sentence)
    while True:
        nb = searcher.backend.knn(state, wanted, ids)
        keep = [
            r
            for r in range(len(nb))
            if not (nb.article_ids[r] == target.article_id and int(nb.sentence_ids[r]) == target.sentence_id)
        ]
        dropped = len(nb) - len(keep)
        # Fewer than k left although the store had more: the sentence holds more contexts than counted.
        if len(keep) >= k or len(nb) < wanted:
            break
        wanted += dropped
    rows = np.asarray(keep[:k], dtype=np.int64)
    kept = Neighbors(
        nb.distances[rows],
        nb.token_ids[rows],
        [nb.article_ids[r] for r in rows.tolist()],
        nb.sentence_ids[rows],
        nb.starts[rows],
        nb.ends[rows],
        None if nb.vectors is None else nb.vectors[rows],
    )
    return searcher.resolve_words(kept), dropped


class Stored:
    """Where each value (a word of several pieces: its key) is stored in an article, read once an article."""

    def __init__(self, searcher: Searcher) -> None:
        self.searcher = searcher
        self.cache: dict[str, dict[int, set[int]]] = {}

    def sentences(self, article_id: str) -> dict[int, set[int]]:
        if article_id not in self.cache:
            meta, encoder = self.searcher.backend.meta(), self.searcher.encoder
            texts = article_sentences(self.searcher.backend, article_id)
            table = make_row_table([texts], encoder, meta.mask_policy, meta.max_length)
            found: dict[int, set[int]] = {}
            for r, (value, sentence) in enumerate(zip(table.token_id.tolist(), table.sentence.tolist())):
                if value < 0:  # the stored hash of a word of several pieces: compared by its key
                    pos, span = int(table.position[r]), int(table.length[r])
                    value = word_key(table.tokens[table.sentence_index[r]][pos : pos + span].tolist())
                found.setdefault(value, set()).add(sentence)
            self.cache[article_id] = found
        return self.cache[article_id]

    def reachable(self, value: int | None, target: Target, article_ids: Sequence[str]) -> bool:
        if value is None:
            return False
        for aid in article_ids:
            held = self.sentences(aid).get(value, set())
            if held - ({target.sentence_id} if aid == target.article_id else set()):
                return True
        return False


def score_targets(
    searcher: Searcher, targets: Sequence[Target], config: Config, stored: Stored | None = None
) -> tuple[list[TargetResult], int]:
    """Rank each target's word with every model the searcher has; also count own articles missed."""
    top = max(CLOZE_KS)
    models = available_models(searcher)
    questions = [Question(t.question, t.title) for t in targets]
    found = [searcher.retrieve(q, config.n_articles) if config.use_ir else None for q in questions]
    searched = sorted({h.id for hits in found for h in hits or []})
    if searched:
        searcher.backend.ensure_contexts(searched)  # no plan: every context of them (exact answers)
    states, p_bert = searcher.encode(questions)
    rows: Sequence[np.ndarray | None] = p_bert if p_bert is not None else [None] * len(targets)
    stored = stored or Stored(searcher)
    out, missed = [], 0
    for target, state, pb, hits in zip(targets, states, rows, found):
        own = hits is None or any(h.id == target.article_id for h in hits)
        missed += not own
        nb, dropped = leave_out(searcher, state, hits, target, config.k)
        space, p_knn, p = searcher.distributions(nb, pb, config)
        scored = Scored(hits, nb, pb, p_knn, p, space)
        value = searcher.value(target.word)
        dists = {"bert": pb, "knn": p_knn, "bert_knn": p}
        ranked = {m: searcher.ranked(dists[m], scored, top)[0] for m in models if dists[m] is not None}
        words = searcher.words(sorted({ids[0] for ids in ranked.values() if ids}), nb)
        ranks = {m: (ids.index(value) + 1 if value in ids else None) for m, ids in ranked.items()}
        first = {m: words[ids[0]][0] for m, ids in ranked.items() if ids}
        searched_ids = sorted({nb.article_ids[r] for r in range(len(nb))} | {h.id for h in hits or []})
        reach = stored.reachable(value, target, searched_ids)
        out.append(TargetResult(target, value, ranks, own, dropped, first, reach))
    return out, missed


def summarize(results: Sequence[TargetResult], models: Sequence[str]) -> list[KindScore]:
    """P@1 and P@10 per kind of target and model; a target without a value counts as wrong."""
    scores = []
    for kind in KINDS:
        rows = [r for r in results if r.target.kind == kind]
        reach = [r for r in rows if r.reachable]
        no_value = sum(r.value is None for r in rows)
        scores.append(
            KindScore(
                kind, len(rows), no_value, _precision(rows, models), len(reach), _precision(reach, models)
            )
        )
    return scores


def _precision(rows: Sequence[TargetResult], models: Sequence[str]) -> dict[str, dict[int, float | None]]:
    precision: dict[str, dict[int, float | None]] = {}
    for m in models:
        ranks = [r.ranks.get(m) for r in rows]
        precision[m] = {
            k: (sum(rank is not None and rank <= k for rank in ranks) / len(rows) if rows else None)
            for k in CLOZE_KS
        }
    return precision


def cloze(
    searcher: Searcher,
    articles: Sequence[tuple[str, str]],
    config: Config,
    *,
    per_kind: int = 100,
    seed: int = 0,
    per_article: int = 2,
    batch_size: int | None = None,
    progress: bool = False,
) -> ClozeResult:
    """Leave-one-out cloze over ``articles`` of the searcher's index: P@1 and P@10 per kind of target.

    Args:
        searcher: an open Searcher; its stages are used with ``config``'s n_articles, k, l, λ, distance.
        articles: (id, title) of the articles to draw targets from; each must be in the index.
        per_kind: targets wanted of each kind (fewer when the articles run out).
        seed: decides the articles' order and the targets drawn (the same under every mask policy).
        per_article: at most this many targets of each kind from one article.
        batch_size: questions per model call; default ``config.batch_size``.
        progress: show progress bars.

    Raises:
        ConfigError: none of ``articles`` is in the index.
    """
    held = searcher.backend.titles([aid for aid, _ in articles]) if articles else {}
    if not held:
        raise ConfigError(
            f"none of the corpus's {len(articles)} articles is in the index at {searcher.backend.location};"
            " give the corpus that index was built from"
        )
    # A page ingest skipped (no text) is not asked about; the count says how many there were.
    present = [(aid, title) for aid, title in articles if aid in held]
    with tqdm(
        total=len(present), disable=not progress, desc="draw", unit=" articles", file=progress_lines.stream()
    ) as bar:
        sample = draw_targets(searcher, present, per_kind, seed, per_article, lambda n: bar.update(1))
    models = available_models(searcher)
    size = batch_size or config.batch_for(searcher.encoder.placement.device.type)
    results: list[TargetResult] = []
    missed = 0
    stored = Stored(searcher)
    with tqdm(
        total=len(sample.targets), disable=not progress, desc="cloze", file=progress_lines.stream()
    ) as bar:
        for lo in range(0, len(sample.targets), size):
            batch = sample.targets[lo : lo + size]
            done, lost = score_targets(searcher, batch, config, stored)
            results.extend(done)
            missed += lost
            bar.update(len(batch))
    settings = {
        "model": searcher.encoder.model_name,
        "layer": searcher.encoder.layer,
        "index": searcher.backend.location,
        "contexts": searcher.backend.meta().contexts,
        "per_kind": per_kind,
        "seed": seed,
        "per_article": per_article,
        **{k: v for k, v in config.method_settings().items() if k != "evidence"},
    }
    policy = searcher.backend.meta().mask_policy
    scores = summarize(results, models)
    absent = len(articles) - len(present)
    return ClozeResult(policy, models, scores, results, sample, missed, absent, settings)


def cloze_json(result: ClozeResult) -> dict[str, object]:
    """The result as plain JSON data: settings, counts and P@k per kind (targets not listed)."""
    return {
        "mask_policy": result.mask_policy,
        "models": list(result.models),
        "settings": result.settings,
        "articles_read": result.sample.articles,
        "sentences_read": result.sample.sentences,
        "too_long": result.sample.too_long,
        "own_article_missed": result.own_article_missed,
        "not_in_index": result.not_in_index,
        "kinds": {
            s.kind: {
                "targets": s.targets,
                "no_value": s.no_value,
                **{f"P@{k}": {m: p[k] for m, p in s.precision.items()} for k in CLOZE_KS},
                "reachable": s.reachable,
                **{f"reachable_P@{k}": {m: p[k] for m, p in s.precision_reachable.items()} for k in CLOZE_KS},
            }
            for s in result.scores
        },
    }


def render_cloze(result: ClozeResult) -> str:
    """A Markdown table: a row per kind of target, P@1 and P@10 per model, then the counts."""
    head = ["target", "n", "no value", *(f"{m} P@{k}" for m in result.models for k in CLOZE_KS)]
    head += ["reachable", *(f"{m} P@1 of reachable" for m in result.models)]
    lines = [f"| {' | '.join(head)} |", f"|{'---|' * len(head)}"]
    for s in result.scores:
        cells = [_percent(s.precision[m][k]) for m in result.models for k in CLOZE_KS]
        cells.append(str(s.reachable))
        cells += [_percent(s.precision_reachable[m][1]) for m in result.models]
        name = "single wordpiece" if s.kind == KINDS[0] else "several wordpieces"
        lines.append(f"| {name} | {s.targets} | {s.no_value} | {' | '.join(cells)} |")
    sample = result.sample
    lines.append("")
    lines.append(
        f"mask policy {result.mask_policy}; {sample.articles} articles, {sample.sentences} sentences read;"
        f" {sample.too_long} words too long to ask;"
        f" own article not retrieved for {result.own_article_missed};"
        " reachable: the word is stored outside its sentence in the articles searched (kNN's ceiling)"
    )
    return "\n".join(lines)


def _percent(p: float | None) -> str:
    return "–" if p is None else f"{100 * p:.1f}"
