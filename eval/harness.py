"""Evaluation harness: facts -> BERT, kNN and BERT-kNN rankings per fact -> checkpoint -> metrics -> report.

The layer is fixed by the index (its keys were computed at one layer). The paper's layer ablation needs
one index per layer: ingest with ``Config(layer=...)`` into a new ``--index`` and evaluate each.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bertknn_search import progress_lines
from bertknn_search.config import Config, flag_name
from bertknn_search.errors import ConfigError, InputFormatError, QuestionError
from bertknn_search.eval.calibration import from_lines, summary
from bertknn_search.eval.datasets import MASK, Fact
from bertknn_search.eval.metrics import KS, MODELS, NO_ARTICLE, FactResult, MacroResult, macro_average
from bertknn_search.eval.reliability import reliability
from bertknn_search.eval.report import write_report
from bertknn_search.query.confidence import judge, signals_of
from bertknn_search.query.gates import SIGNALS, confidence, retrieves, threshold_for
from bertknn_search.query.search import Searcher
from bertknn_search.query.signals_json import signals_json
from bertknn_search.records import Question
from bertknn_search.values import Candidates, is_word

CHECKPOINT = "facts.jsonl"
ADAPTIVE = "adaptive_"  # + the gate's signal: the model that retrieves only where that gate says so
RUN_FILE = "run.json"
# Why a fact is not scored (besides metrics.NO_ARTICLE).
NOT_ONE_TOKEN = "answer-not-one-token"
NOT_IN_COMMON_VOCAB = "answer-not-in-common-vocab"
SPECIAL_ANSWER = "answer-is-special-token"  # "[MASK]", "[CLS]"…: never listed, so never right
BAD_QUESTION = "bad-question"  # several [MASK]s (3 SQuAD lines), or no text the model takes
MASK_IN_SUBJECT = "mask-in-subject"  # a subject such as "[MASK] [MASK]": the cloze has several
QUESTION_TOO_LONG = "question-too-long"  # longer than the model takes (a 3,000-word subject)


@dataclass(frozen=True)
class EvalResult:
    """What ``evaluate`` returns.

    Attributes:
        scores: macro-averaged P@k per relation, corpus and aggregate.
        report: the report files, by name (see ``report.write_report``).
        checkpoint: the per-fact JSONL (one line per fact, with the top words of each model).
        facts: facts read.
        computed: facts ranked by the model in this call.
        resumed: facts whose result was read back from the checkpoint of an earlier call.
        datastore: contexts this call had encoded (a lazy index encodes only what its facts need), the
            contexts the index holds, and how many an eager index of the same articles would hold.
    """

    scores: MacroResult
    report: dict[str, Path]
    checkpoint: Path
    facts: int
    computed: int
    resumed: int = 0
    datastore: dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> int:
        """Facts that entered the averages."""
        return sum(s.scored for s in self.scores.corpora)

    @property
    def skipped(self) -> dict[str, int]:
        """Reason -> facts left out of the averages."""
        counts: Counter[str] = Counter()
        for s in self.scores.corpora:
            counts.update(s.skipped)
        return dict(sorted(counts.items()))


@dataclass(frozen=True)
class Prepared:
    """A fact that can be scored: its question and the token ids that count as correct."""

    fact: Fact
    question: Question
    gold: tuple[int, ...]


def vocab_mask(searcher: Searcher, words: Collection[str]) -> Candidates:
    """LAMA's common-vocabulary filter: the words that are one token, and under a whole-word policy
    the words of several wordpieces too (by value)."""
    mask = np.zeros(searcher.encoder.vocab_size, dtype=bool)
    values = [v for v in map(searcher.value, sorted(words)) if v is not None]
    mask[[v for v in values if not is_word(v)]] = True
    return Candidates(mask, frozenset(v for v in values if is_word(v)))


def _special_token(searcher: Searcher, word: str) -> bool:
    """Whether ``word`` is one special token of the model's vocabulary ("[MASK]", "[CLS]", ...)."""
    tok = searcher.encoder.tokenizer
    ids = tok(word, add_special_tokens=False)["input_ids"]
    return len(ids) == 1 and ids[0] != tok.unk_token_id and not searcher.answerable[ids[0]]


def prepare(
    searcher: Searcher, facts: Sequence[Fact], allowed: Candidates | None
) -> tuple[list[Prepared], list[tuple[Fact, str]]]:
    """Split facts into scorable ones and skipped ones (with the reason).

    Answers are matched as values (token ids; a word's key under a whole-word policy, from its own
    wordpieces), so the tokenizer's own normalisation (lowercasing and accent stripping for an uncased
    model) applies to them exactly as to the model's output. Every fact left out has its reason.
    """
    ready, skipped = [], []
    for fact in facts:
        ids = [searcher.value(a) for a in fact.answers]
        gold = tuple(dict.fromkeys(i for i in ids if i is not None))
        reason = None
        if ids[0] is None:
            # LAMA's rule: the main object must be one token; a whole-word index takes one word. A special
            # token ("[MASK]", "[CLS]") is one token too, but never ranked (``Searcher.value`` gives None).
            reason = SPECIAL_ANSWER if _special_token(searcher, fact.answers[0]) else NOT_ONE_TOKEN
        elif allowed is not None and ids[0] not in allowed:
            reason = NOT_IN_COMMON_VOCAB
        else:
            reason = question_problem(searcher, fact)
        if reason:
            skipped.append((fact, reason))
        else:
            allowed_gold = gold if allowed is None else tuple(i for i in gold if i in allowed)
            question = Question(fact.question, fact.subject, fact.popularity, fact.relation)
            ready.append(Prepared(fact, question, allowed_gold))
    return ready, skipped


def question_problem(searcher: Searcher, fact: Fact) -> str | None:
    """Why ``fact``'s question cannot be asked (a skip reason), or None when it can."""
    if fact.subject and MASK.lower() in fact.subject.lower():
        return MASK_IN_SUBJECT
    try:
        searcher.encoder.prepare(fact.question)
    except QuestionError:
        tok = searcher.encoder.tokenizer
        text = fact.question.replace(MASK, tok.mask_token)
        if fact.question.count(MASK) == 1 and len(tok(text)["input_ids"]) > searcher.encoder.max_length:
            return QUESTION_TOO_LONG
        return BAD_QUESTION
    return None


def batches(items: Sequence[Prepared], size: int) -> Iterator[Sequence[Prepared]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def evaluate(
    searcher: Searcher,
    facts: Sequence[Fact],
    config: Config,
    out_dir: Path,
    *,
    common_vocab: Collection[str] | None = None,
    batch_size: int | None = None,
    resume: bool = True,
    no_article_wrong: bool = False,
    progress: bool = False,
) -> EvalResult:
    """Rank every fact with BERT, kNN and BERT-kNN, then write metrics and the report into ``out_dir``.

    Args:
        searcher: an open Searcher; its stages are used with the settings of ``config``.
        facts: what to evaluate (keys ``corpus/relation/uuid`` must be unique).
        config: n_articles, k, temperature, lam, distance and use_ir to evaluate with.
        out_dir: receives facts.jsonl (checkpoint), run.json (settings) and the report.
        common_vocab: LAMA's common vocabulary: facts whose answer is outside it are skipped and all three
            rankings are restricted to it. None ranks the whole vocabulary (as BERT-kNN's reference).
        batch_size: questions per model call; default ``config.batch_size``.
        resume: keep the facts already in the checkpoint (same settings only); False starts afresh.
        no_article_wrong: count facts without retrieved context as wrong (the reference's convention).
        progress: show a progress bar.

    Raises:
        ConfigError: the checkpoint in ``out_dir`` was written with other settings (or another index).
        InputFormatError: the checkpoint is damaged beyond its last line.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    held_before = searcher.backend.stats().contexts
    allowed = vocab_mask(searcher, common_vocab) if common_vocab is not None else None
    models = available_models(searcher)
    run = _run_settings(searcher, config, allowed, models)
    done = _open_checkpoint(out_dir, run, resume)
    resumed = sum(f.key in done for f in facts)
    ready, skipped = prepare(searcher, facts, allowed)
    todo = [p for p in ready if p.fact.key not in done]
    path = out_dir / CHECKPOINT
    with (
        path.open("a", encoding="utf-8") as out,
        tqdm(total=len(todo), disable=not progress, desc="eval", file=progress_lines.stream()) as bar,
    ):
        # Skipped facts cost nothing to redo; they are written once so that the checkpoint lists every fact.
        lines = [_line(fact, {}, reason) for fact, reason in skipped if fact.key not in done]
        _append(out, lines)
        done.update({line["key"]: line for line in lines})
        for batch in batches(todo, batch_size or config.batch_for(searcher.encoder.placement.device.type)):
            lines = _rank_batch(searcher, batch, config, allowed)
            _append(out, lines)
            done.update({line["key"]: line for line in lines})
            bar.update(len(batch))
    gates = {signal: config.thresholds(signal) for signal in SIGNALS if config.thresholds(signal)}
    if not searcher.encoder.has_head:
        # Without p_BERT there is no confidence to gate on; popularity still gates (to no answer).
        gates = {signal: t for signal, t in gates.items() if signal == "popularity"}
    rows = [_fact_result(done[f.key], gates) for f in facts]
    scored_models = (*models, *(ADAPTIVE + signal for signal in gates))
    scores = macro_average(rows, scored_models, no_article_wrong=no_article_wrong)
    after = searcher.backend.stats()
    datastore = {
        "contexts_mode": after.meta.contexts,
        "contexts_encoded": max(after.contexts - held_before, 0),
        "contexts_held": after.contexts,
        "articles_encoded": after.encoded_articles,
        "articles": after.articles,
        "estimated_eager_contexts": after.estimated_contexts,
    }
    m = after.meta
    store = {"mask_policy": m.mask_policy, "store_dtype": m.store_dtype, "max_length": m.max_length}
    meta = {**run, "facts": len(facts), "no_article_wrong": no_article_wrong, "store": store}
    meta["datastore"] = datastore
    meta["unavailable_models"] = [m for m in MODELS if m not in models]
    # Every fact left out of the averages, by reason (also per relation in the scores).
    dropped: Counter[str] = Counter()
    for s in scores.corpora:
        dropped.update(s.skipped)
    meta["dropped"] = dict(sorted(dropped.items()))
    if gates:
        lines = [done[f.key] for f in facts]
        meta["adaptive"] = adaptive_summary(lines, gates, config.gate, no_article_wrong)
    meta["confidence"] = confidence_summary([done[f.key] for f in facts], searcher)
    report = write_report(scores, out_dir, meta)
    return EvalResult(scores, report, path, len(facts), len(todo), resumed, datastore)


def _rank_batch(
    searcher: Searcher, batch: Sequence[Prepared], config: Config, allowed: Candidates | None
) -> list[dict[str, Any]]:
    """One checkpoint line per fact: rank of the first gold id per model, and each model's top words."""
    top = max(KS)
    # Special tokens are never answers (as in query's rankings); LAMA's vocabulary narrows further.
    answerable = Candidates(searcher.answerable)
    allowed = answerable if allowed is None else allowed & answerable
    questions = [p.question for p in batch]
    # Every fact retrieves, so that BERT-kNN is scored on all; the gates are applied afterwards from
    # the signals recorded here, each fact's IR and kNN time telling what a gate saves.
    results = searcher.score_batch(questions, config.replace(gate="none"))
    heads = [s.p_bert for s in results if s.p_bert is not None]
    p_bert = np.stack(heads) if heads and len(heads) == len(results) else None
    signals: dict[str, list[float | None]] = {
        "popularity": searcher.gate_signal("popularity", questions, p_bert)
    }
    if p_bert is not None:
        for name, values in confidence(p_bert, searcher.answerable).items():
            signals[name] = values.tolist()
    lines = []
    for j, (item, scored) in enumerate(zip(batch, results)):
        hits, nb = scored.hits, scored.neighbors
        dists = {"bert": scored.p_bert, "knn": scored.p_knn, "bert_knn": scored.p}
        # A model without an MLM head has no p_BERT: its BERT column is left out, not scored as wrong.
        found = {m: searcher.ranked(p, scored, top, allowed) for m, p in dists.items() if p is not None}
        ranked = {m: ids for m, (ids, _) in found.items()}
        ranks = {
            m: next((i for i, t in enumerate(ids, 1) if t in item.gold), None) for m, ids in ranked.items()
        }
        words = searcher.words(sorted({v for ids in ranked.values() for v in ids}), nb)
        extra = {
            "articles": [h.title for h in hits or []],
            "neighbors": len(nb),
            "top": {m: [words[i][0] for i in ids] for m, ids in ranked.items()},
            # Rounded: a batch of other shape moves the last bits, and a resumed run must write equal lines.
            "signals": {name: _rounded(values[j]) for name, values in signals.items()},
            "seconds": scored.seconds,
        }
        if len(nb):  # what BERT-kNN's answer's confidence is read from, for the report and eval calibrate
            ids, probs = found["bert_knn"]
            best = [float(x) for x in probs[:2]] + [0.0, 0.0]
            top_id = ids[0] if ids else None
            kinds = searcher.kind_signals(top_id, scored, None if top_id is None else words[top_id][0])
            hard = searcher.hardness(scored)
            said = signals_of(top_id, best[0], best[1], nb, scored.coverage, kinds, hard)
            conf = judge(said, False, searcher.confidence_fit)
            extra["confidence"] = None if conf is None else {"p": conf.p, "level": conf.level}
            extra["confidence_signals"] = signals_json(said)
        lines.append(_line(item.fact, ranks, NO_ARTICLE if len(nb) == 0 else None, extra))
    return lines


def confidence_summary(lines: Sequence[Mapping[str, Any]], searcher: Searcher) -> dict[str, Any] | None:
    """ECE, AUROC and P@1 per band of BERT-kNN's answers' ``p`` under the searcher's confidence fit (the
    report's Confidence section and reliability.png); None without an answer that has neighbours."""
    rows = from_lines(lines)
    if not rows:
        return None
    fit = searcher.confidence_fit
    p = fit.probability([r.signals for r in rows])
    about = fit.about
    out = {
        "fit": f"{about.get('model', 'unknown model')}, {about.get('stored', 'shipped with the package')}",
        "fit_name": searcher.fit_name,
    }
    return {**out, **summary(rows, p, fit), "reliability": reliability(p, [r.hit for r in rows])}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def _line(
    fact: Fact, ranks: dict[str, int | None], skipped: str | None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One checkpoint line: the FactResult fields, then what helps to read the errors."""
    result = FactResult(fact.corpus, fact.relation, fact.uuid, ranks, skipped, fact.popularity)
    return {
        "key": fact.key,
        **asdict(result),
        "question": fact.question,
        "answers": list(fact.answers),
        **(extra or {}),
    }


def _fact_result(line: dict[str, Any], gates: Mapping[str, Mapping[str, float]] | None = None) -> FactResult:
    """A checkpoint line's result, with an adaptive model's rank per gate: BERT-kNN's where it retrieves."""
    ranks = dict(line.get("ranks") or {})
    if ranks:
        for signal, thresholds in (gates or {}).items():
            go = _retrieves(line, signal, thresholds)
            ranks[ADAPTIVE + signal] = ranks.get("bert_knn") if go else ranks.get("bert")
    return FactResult(
        line["corpus"],
        line["relation"],
        line["uuid"],
        ranks,
        line.get("skipped"),
        line.get("popularity"),
    )


def _retrieves(line: Mapping[str, Any], signal: str, thresholds: Mapping[str, float]) -> bool:
    value = (line.get("signals") or {}).get(signal)
    return retrieves(signal, value, threshold_for(thresholds, line["relation"]))


def adaptive_summary(
    lines: Sequence[Mapping[str, Any]],
    gates: Mapping[str, Mapping[str, float]],
    chosen: str,
    no_article_wrong: bool = False,
) -> dict[str, Any]:
    """Per gate: its thresholds, the share of scored facts that retrieve (overall and per relation,
    PopQA's Figure 10) and the IR + kNN time those that do not would save.

    Returns:
        signal -> {"chosen", "retrieved", "facts", "seconds_retrieval", "seconds_saved", "relations":
        {relation: {"threshold", "retrieved", "facts"}}}.
    """
    counted = {None, NO_ARTICLE} if no_article_wrong else {None}
    scored = [line for line in lines if line.get("ranks") and line.get("skipped") in counted]
    out: dict[str, Any] = {}
    for signal, thresholds in gates.items():
        go = [_retrieves(line, signal, thresholds) for line in scored]
        relations: dict[str, list[bool]] = {}
        for line, g in zip(scored, go):
            relations.setdefault(line["relation"], []).append(g)
        seconds = [float(line.get("seconds") or 0.0) for line in scored]
        out[signal] = {
            "chosen": signal == chosen,
            "facts": len(scored),
            "retrieved": float(np.mean(go)) if go else None,
            "seconds_retrieval": sum(seconds),
            "seconds_saved": sum(t for t, g in zip(seconds, go) if not g),
            "relations": {
                relation: {
                    "threshold": threshold_for(thresholds, relation),
                    "retrieved": float(np.mean(flags)),
                    "facts": len(flags),
                }
                for relation, flags in relations.items()
            },
        }
    return out


def _append(out: Any, lines: list[dict[str, Any]]) -> None:
    """Append whole lines and force them to disk, so a crash loses at most the batch being computed."""
    if lines:
        out.write("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
        out.flush()
        os.fsync(out.fileno())


def available_models(searcher: Searcher) -> tuple[str, ...]:
    """The rankings the searcher's model gives: all of ``MODELS``, or no "bert" without an MLM head."""
    return MODELS if searcher.encoder.has_head else tuple(m for m in MODELS if m != "bert")


def _run_settings(
    searcher: Searcher, config: Config, allowed: Candidates | None, models: Sequence[str]
) -> dict[str, Any]:
    return {
        "model": searcher.encoder.model_name,
        "layer": searcher.encoder.layer,
        "backend": searcher.config.backend,
        "index": str(searcher.config.index),
        # Evidence is not scored, so a run with other evidence settings may resume this one.
        "settings": {k: v for k, v in config.method_settings().items() if k != "evidence"},
        "common_vocab": None if allowed is None else int(allowed.mask.sum()) + len(allowed.words or ()),
        "models": list(models),
    }


def _differences(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between two runs' settings, one "name was X, now Y" each, named as the flags are."""

    def flat(run: Mapping[str, Any]) -> dict[str, Any]:
        settings = {flag_name(k): v for k, v in run.get("settings", {}).items()}
        return {**{k: v for k, v in run.items() if k != "settings"}, **settings}

    old, new = flat(before), flat(now)
    return [
        f"{name} was {json.dumps(old.get(name))}, now {json.dumps(new.get(name))}"
        for name in sorted(set(old) | set(new))
        if old.get(name) != new.get(name)
    ]


def _open_checkpoint(out_dir: Path, run: dict[str, Any], resume: bool) -> dict[str, dict[str, Any]]:
    """The checkpoint lines already written for ``run``, by fact key; a torn last line is cut off."""
    path, run_path = out_dir / CHECKPOINT, out_dir / RUN_FILE
    if resume and path.exists() and run_path.exists():
        previous = json.loads(run_path.read_text(encoding="utf-8"))
        changed = _differences(previous, json.loads(json.dumps(run)))
        if changed:
            raise ConfigError(
                f"{out_dir} holds results of a run with other settings ({'; '.join(changed)});"
                " pass --no-resume to start over there, or use another --out"
            )
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with path.open("r+b") as handle:  # a crash mid-write left a partial line: drop it
                handle.truncate(end)
        try:
            lines = [json.loads(text) for text in data[:end].decode("utf-8").splitlines() if text.strip()]
        except ValueError as exc:
            raise InputFormatError(f"{path} is damaged ({exc}); delete it or pass --no-resume") from exc
        return {line["key"]: line for line in lines}
    path.unlink(missing_ok=True)
    run_path.write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")
    return {}
