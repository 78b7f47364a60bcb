"""Rendering: records -> human-readable text or JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bertknn_search.config import settings_file_values
from bertknn_search.records import (
    Answer,
    Coverage,
    EvidenceSentence,
    GateDecision,
    IndexStats,
    Prediction,
    SplitWord,
    WordEvidence,
)


def to_json(record: Any) -> str:
    """One line of JSON for a dataclass record (paths and infinities made JSON-safe)."""
    data = dataclasses.asdict(record)
    if isinstance(record, Answer):
        data["partial"] = record.partial  # derived, but what a client checks first
    if isinstance(record, IndexStats) and record.meta.contexts == "lazy" and not record.estimated_contexts:
        data["estimated_contexts"] = None  # unknown until an article is encoded: 0 would read as "none"
    # NaN is no JSON (a browser's JSON.parse rejects it): a record holding one is a bug to refuse, never
    # a body to send (issue 51.3).
    return json.dumps(_jsonable(data), ensure_ascii=False, allow_nan=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return None  # the subject's own article has no BM25 score
    if hasattr(value, "__fspath__"):
        return str(value)
    return value


def render_answer(answer: Answer, top: int) -> str:
    """The three rankings side by side, the articles searched and the sentences behind the top answers."""
    lines = [f"Q: {answer.question}"]
    if answer.subject:
        lines[0] += f"   (subject: {answer.subject})"
    if answer.gate is not None:
        lines.append(render_gate(answer.gate))
    if answer.gate is not None and not answer.gate.retrieve:
        pass  # the gate line says why nothing was searched
    elif answer.articles:
        titles = [a.title.lower() for a in answer.articles]
        # Two articles may share a title (a subject matches both): their ids tell them apart.
        named = [
            f"{printable(a.title)} (id {a.id})" if titles.count(t) > 1 else printable(a.title)
            for a, t in zip(answer.articles, titles)
        ]
        arts = ", ".join(
            f"{name} [own article]" if math.isinf(a.score) else f"{name} [{a.score:.2f}]"
            for name, a in zip(named, answer.articles)
        )
        lines.append(f"articles: {arts}")
        if answer.partial:
            lines.append(render_coverage(answer))
    elif answer.n_neighbors == 0:
        fallback = "BERT-kNN falls back to BERT" if answer.bert_available else "no answer without BERT"
        lines.append(f"articles: none found; {fallback}")
    if answer.closest_titles is not None:
        lines.append(render_closest_titles(answer.subject or "", answer.closest_titles))
    lines.append(f"neighbours: {answer.n_neighbors}")
    rows = []
    for i in range(top):
        cells = [_cell(ranking, i) for ranking in (answer.bert_knn, answer.bert or [], answer.knn)]
        if not answer.bert_available and i == 0:
            cells[1] = NO_HEAD_CELL
        if not any(cells):
            break
        rows.append(f"{i + 1:>3}  " + "".join(f"{c:<24}" for c in cells))
    if answer.bert_knn or answer.bert or answer.knn:
        lines.append(f"{'#':>3}  {'BERT-kNN':<24}{'BERT':<24}{'kNN':<24}")
        lines += rows
    else:  # no header over no answers: the articles line above says why there is none
        lines.append("answers: none")
    if answer.confidence is not None:
        lines.append(render_confidence(answer))
    if answer.split_words:
        lines.append(render_split_words(answer.split_words))
    shown = [r[:top] for r in (answer.bert_knn, answer.knn)]
    words = {p.word: p.pieces for ranking in shown for p in ranking if p.pieces}
    if words:
        listed = ", ".join(f"{w} ({' '.join(pieces)})" for w, pieces in words.items())
        lines.append(f"whole words of several wordpieces: {listed}")
    for ev in answer.evidence:
        lines.append(f"evidence for {ev.word!r}:")
        lines.extend(_evidence_lines(ev.sentences))
    for chosen in answer.evidence_for:
        lines.append(render_word_evidence(chosen, answer.n_neighbors))
        lines.extend(_evidence_lines(chosen.sentences))
    return "\n".join(line for line in lines if line)


def _evidence_lines(sentences: Sequence[EvidenceSentence]) -> list[str]:
    out = []
    for s in sentences:
        marked = f"{s.sentence[: s.start]}[{s.sentence[s.start : s.end]}]{s.sentence[s.end :]}"
        out.append(f"  - {printable(marked)}  ({printable(s.title)}, d²={s.distance:.2f})")
    return out


def render_word_evidence(chosen: WordEvidence, neighbors: int) -> str:
    """The line over the sentences of a word asked about (``--evidence-for``), or why there are none."""
    word = repr(printable(chosen.word))
    if not chosen.answerable:
        return (
            f"evidence for {word}: none; it cannot be an answer on this index (an answer is one wordpiece"
            " of the model's vocabulary, or one whole word on a whole-word index)"
        )
    if not chosen.votes:
        return f"evidence for {word}: none; no neighbour of the {neighbors:,} holds it"
    verb = "holds" if chosen.votes == 1 else "hold"
    return f"evidence for {word} ({chosen.votes:,} of the {neighbors:,} neighbours {verb} it):"


def render_closest_titles(subject: str, titles: list[str]) -> str:
    """The note for a subject that is no title: BM25 searched it instead; the titles that come closest."""
    note = f"note: subject {printable(subject)!r} is no title in the index, so its words were searched (BM25)"
    if not titles:
        return note + "; no title holds them ('bertknn-search titles PATTERN' lists titles)"
    named = ", ".join(repr(printable(t)) for t in titles)
    return f"{note}; titles that hold them: {named} (give one as --subject)"


def render_split_words(words: list[SplitWord]) -> str:
    """Why an expected answer is missing: the words at [MASK]'s place that are several wordpieces."""
    listed = ", ".join(f"{w.word!r} ({' '.join(w.pieces)}, in {printable(w.title)})" for w in words)
    one = len(words) == 1
    return (
        f"note: {listed} {'stands' if one else 'stand'} where the question has [MASK], but an answer is one"
        f" wordpiece of the model's vocabulary, so {'it cannot be one' if one else 'none of them can be'}"
    )


def render_coverage(answer: Answer) -> str:
    """One line saying that an answer saw only part of its articles' contexts, and how much."""
    titles = {a.id: a.title for a in answer.articles}
    parts = [
        f"{titles.get(aid, aid)!r} {c.encoded:,} of {c.total:,}"
        for aid, c in answer.coverage.items()
        if not c.complete
    ]
    # More contexts change an answer, mostly for the better on LAMA but not always (Lincoln's right
    # partial answer became a wrong exact one; docs/evaluation.md#confidence): no promise either way.
    return (
        f"partial answer: contexts encoded so far of {', '.join(parts)}, the lead first; asking again or"
        " --exact sees more of them, which may change the answer, though not always for the better"
    )


def render_batch_coverage(coverages: Sequence[Mapping[str, Coverage]]) -> str:
    """One line for the answers of several questions on a lazy index: how many were partial, and the
    fewest and median contexts a partial one had of an article (a starved answer shows there); "" when
    no answer searched a lazy index's article."""
    if not any(coverages):
        return ""
    short = [
        min(c.encoded for c in cov.values() if not c.complete)
        for cov in coverages
        if any(not c.complete for c in cov.values())
    ]
    line = f"{len(short):,} of {len(coverages):,} answers partial"
    if not short:
        return f"{line}: every article they searched was encoded whole"
    short.sort()
    return (
        f"{line}: the fewest contexts a partial answer had of an article {short[0]:,}, the median"
        f" {short[len(short) // 2]:,}; asking again, 'warm' or --exact encodes more"
    )


def render_confidence(answer: Answer) -> str:
    """One line: the answer's band, ``p`` (the estimated chance that it is right) and its votes; a low
    one says how to read it."""
    conf = answer.confidence
    if conf is None:
        return ""
    if conf.neighbours and answer.bert_knn:
        verb = "holds" if conf.votes == 1 else "hold"
        word = printable(answer.bert_knn[0].word)
        what = f"{conf.votes:,} of {conf.neighbours:,} neighbours {verb} {word!r}"
        if not conf.votes:  # BERT put it first; its p is BERT's, discounted by what the neighbours saw
            what += ": BERT's answer alone"
    else:
        what = "BERT's top-1 probability; no neighbours"
    line = f"confidence: {conf.level} (p {conf.p:.2f}: {what})"
    if answer.partial:
        line += ", of part of its articles"
    if conf.kind and conf.neighbours_kind and conf.kind != conf.neighbours_kind:
        line += (
            f"; the answer is a {conf.kind} but most neighbours hold a {conf.neighbours_kind}"
            " (--same-kind keeps to their kind)"
        )
    if conf.level == "low":
        line += "; a low-confidence answer is mostly wrong: weigh the other answers and the evidence"
    return line


# The BERT column of a model without an MLM head: marked, never a ranking from a random head.
NO_HEAD_CELL = "n/a (no MLM head)"


def render_gate(gate: GateDecision) -> str:
    """One line: the adaptive-retrieval gate's signal, threshold and decision."""
    names = {"popularity": "log popularity", "top1": "BERT top-1 probability", "entropy": "p_BERT entropy"}
    if gate.value is None:
        return f"gate: {names[gate.signal]} unknown, so retrieved"
    if gate.threshold is None:
        return f"gate: {names[gate.signal]} {gate.value:.3f}, no threshold for it, so retrieved"
    below = gate.value < gate.threshold
    relation = "<" if below else ">="
    verdict = "retrieved" if gate.retrieve else "not retrieved: no IR, no kNN; BERT-kNN is BERT"
    return f"gate: {names[gate.signal]} {gate.value:.3f} {relation} {gate.threshold:.3f}, {verdict}"


def _cell(ranking: list[Prediction], i: int) -> str:
    if i >= len(ranking):
        return ""
    p = ranking[i]
    return f"{p.word[:14]:<15}{p.prob:.4f}"


def render_stats(stats: IndexStats) -> str:
    """One line per value, labelled with the JSON key's words ("max_length" reads "max length")."""
    m = stats.meta
    max_length = str(m.max_length)
    if stats.model_max_length is not None and m.max_length >= stats.model_max_length:
        max_length += " (capped at the model's limit)"
    rows = [
        ("backend", stats.backend),
        ("location", stats.location),
        ("articles", f"{stats.articles:,}"),
        ("sentences", f"{stats.sentences:,}"),
        ("contexts", f"{stats.contexts:,}"),
        ("model", m.model),
        ("layer", str(m.layer)),
        ("dim", str(m.dim)),
        ("vocab size", f"{m.vocab_size:,}"),
        ("mlm head", _head(stats.mlm_head)),
        ("mask policy", m.mask_policy),
        ("store dtype", m.store_dtype),
        ("precision", m.precision),
        ("max length", max_length),
        ("splitter", m.splitter or "not recorded (an index from before it was)"),
        ("bytes on disk", f"{stats.bytes_on_disk:,} ({human_bytes(stats.bytes_on_disk)})"),
    ]
    if stats.contexts:
        rows.append(("bytes per context", f"{stats.bytes_on_disk / stats.contexts:,.0f}"))
    rows.append(("contexts mode", m.contexts))
    if stats.confidence_fit:
        rows.append(("confidence fit", stats.confidence_fit))
    rows.append(("no-IR search", _no_ir(stats)))
    if m.contexts == "lazy":
        rows += [
            ("encoded articles", f"{stats.encoded_articles:,} of {stats.articles:,}"),
            (
                "partly encoded",
                f"{stats.partial_articles:,} article{'s' * (stats.partial_articles != 1)}"
                f" ({stats.partial_contexts:,} contexts so far; questions,"
                " a server's idle time or warm encode the rest)",
            ),
            ("context bytes", f"{stats.context_bytes:,} ({human_bytes(stats.context_bytes)})"),
            ("eager estimate", _estimate(stats.estimated_contexts)),
        ]
    return "\n".join(f"{k:<18}{v}" for k, v in rows)


def _no_ir(stats: IndexStats) -> str:
    if stats.no_ir_graph:
        return "HNSW graph over every context (approximate; made with --no-ir-graph)"
    if stats.meta.no_ir_graph:
        return f"exact scan of every context (made with --no-ir-graph; {stats.backend} builds no graph)"
    return "exact scan of every context (no graph: ingest a new index with --no-ir-graph for one)"


def _head(has_head: bool | None) -> str:
    if has_head is None:
        return "unknown (the model's files are not on disk here)"
    return "yes" if has_head else "no: answers are kNN alone, BERT is n/a"


def _estimate(contexts: int) -> str:
    if not contexts:
        return "unknown until a query encodes an article"
    return f"{contexts:,} contexts if every article were encoded (eager)"


def render_datastore(datastore: Mapping[str, Any]) -> str | None:
    """What an evaluation cost a lazy index: contexts encoded now against an eager index's total.

    None for an eager index, which encodes nothing at evaluation time.
    """
    if datastore["contexts_mode"] != "lazy":
        return None
    held, estimate = datastore["contexts_held"], datastore["estimated_eager_contexts"]
    line = (
        f"contexts: {datastore['contexts_encoded']:,} encoded by this run;"
        f" the index holds {held:,} ({datastore['articles_encoded']:,} of {datastore['articles']:,} articles)"
    )
    if estimate:
        line += f", {held / estimate:.2%} of the ~{estimate:,} an eager index would hold"
    return line


def counted(n: int, noun: str) -> str:
    """``n`` with the noun that agrees with it: "1 article", "2 articles", "0 contexts"."""
    return f"{n:,} {noun if n == 1 else noun + 's'}"


def render_warm(summary: Any) -> str:
    """A warm run in one line: what the input needed, what was encoded now, what the index holds."""
    s = summary
    line = (
        f"warmed {counted(s.articles, 'article')} ({s.encoded_articles:,} encoded now, the rest already"
        f" held): {counted(s.contexts, 'context')} in {s.seconds:.1f} s"
        f" ({s.contexts_per_second:,.0f} contexts/s); the index holds {counted(s.index_contexts, 'context')}"
    )
    if s.estimated_contexts:
        line += f" of ~{s.estimated_contexts:,} an eager index would hold"
    return f"{line} ({s.location})"


def render_titles(listed: Sequence[Any], pattern: str) -> str:
    """``titles``' lines: id, title (control characters escaped) and how much of the article is encoded."""
    if not listed:
        which = f" holding {pattern!r}" if pattern else ""
        return f"no titles{which} in the index"
    width = max(len(t.id) for t in listed)
    lines = []
    for t in listed:
        if t.total:
            held = f"encoded {t.encoded:,} of {t.total:,} contexts"
        elif t.encoded == 0:
            held = "not encoded yet"
        else:
            held = "encoded"
        lines.append(f"{t.id:<{width}}  {printable(t.title)}  ({held})")
    return "\n".join(lines)


def printable(text: str) -> str:
    """``text`` with control characters (a newline in a title) shown as escapes, so that it cannot fake
    lines of the output."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def render_summary(summary: Any, verb: str) -> str:
    """An ingest or add summary in one line, with the words of its JSON keys.

    Args:
        summary: an ``ingest.pipeline.IngestSummary``.
        verb: "ingested" or "added".
    """
    s = summary
    head = (
        f"{verb} {counted(s.articles, 'article')} ({s.replaced:,} replaced, {s.already_stored:,} already"
        f" stored, {s.empty:,} empty skipped, {counted(s.duplicates, 'duplicate id')}):"
    )
    if getattr(s, "contexts_mode", "eager") == "lazy":
        # A lazy run encodes nothing: "0 contexts (0 contexts/s)" would read as if nothing was indexed.
        mb = s.text_chars / 1e6
        line = (
            f"{head} {mb:,.1f} MB of text stored and indexed for IR in {s.seconds:.1f} s"
            f" ({mb / s.seconds if s.seconds > 0 else 0.0:,.1f} MB/s) into {s.location};"
            " contexts are encoded on first use (lazy index)"
        )
    else:
        line = (
            f"{head} {counted(s.sentences, 'sentence')}, {counted(s.contexts, 'context')} in"
            f" {s.seconds:.1f} s ({s.contexts_per_second:,.0f} contexts/s) into {s.location}"
        )
    windowed = getattr(s, "windowed", 0)
    if windowed:
        # Said once, here, instead of the tokenizer's warning in the middle of the progress bar.
        line += (
            f"; {counted(windowed, 'sentence')} longer than --max-length"
            f" ({s.max_length:,} tokens) encoded as windows of that length around each masked word"
        )
    too_large = getattr(s, "too_large", 0)
    if too_large:
        line += f"; {too_large:,} too large skipped (over --max-article-bytes, named above)"
    unparsed = getattr(s, "unparsed", 0)
    if unparsed:
        line += f"; {counted(unparsed, 'page')} the wiki parser could not take stripped plainly (named above)"
    unstorable = getattr(s, "unstorable", 0)
    if unstorable:
        line += f"; {unstorable:,} with an id or title too long to store skipped (named above)"
    return line


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def render_eval_counts(facts: int, scored: int, skipped: Mapping[str, int], resumed: int, out: Path) -> str:
    """What an evaluation read, scored and left out (by reason), and what came from an earlier run."""
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in skipped.items())
    line = f"{facts:,} facts read: {scored:,} scored, {sum(skipped.values()):,} skipped"
    line += f" ({reasons})" if reasons else ""
    if resumed:
        line += f"; {resumed:,} read back from the earlier run in {out} (--no-resume starts over)"
    return f"{line}; report in {out}"


def render_grid(result: Mapping[str, Any], out: Path) -> str:
    """The best setting of ``eval grid``, its P@1 in percent, what it was scored on and how ties went."""
    best = ", ".join(f"{key} {value:g}" for key, value in settings_file_values(result["best"]).items())
    skipped = result.get("skipped", {})
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in skipped.items())
    lines = [
        f"best of {len(result['grid']):,} settings: {best}: BERT-kNN P@1 {100 * result['score']:.1f}%"
        f" on {result['facts']:,} of {result.get('read', result['facts']):,} facts"
        + (f" (skipped: {reasons})" if reasons else ""),
    ]
    if result.get("mlm_head") is False:
        lines.append(
            "the model has no masked-LM head: BERT-kNN is kNN alone, so λ changes nothing and the one written"
            " is only the first of --grid-lambda"
        )
    if result.get("ties", 1) > 1:
        lines.append(
            f"{result['ties']:,} settings tie at this score; the first in grid order was taken"
            " (the values listed first in each --grid-* list)"
        )
    for signal, rows in result.get("gates", {}).items():
        each = [row for relation, row in rows.items() if relation != "*"]
        if not each:
            continue

        def mean(key: str, each: list[dict[str, Any]] = each) -> str:
            return f"{100 * sum(row[key] for row in each) / len(each):.1f}%"

        on = " (turned on)" if result.get("gate") == signal else ""
        retrieved = sum(row["retrieved"] * row["facts"] for row in each) / sum(row["facts"] for row in each)
        lines.append(
            f"gate {signal}{on}: thresholds for {len(each)} relations; dev P@1 adaptive {mean('accuracy')},"
            f" BERT {mean('parametric')}, BERT-kNN {mean('retrieval')}; retrieves {100 * retrieved:.1f}%"
        )
    lines.append(f"wrote {out}; use it with: bertknn-search query --settings {out}")
    return "\n".join(lines)


def eval_json(result: Any) -> str:
    """An evaluation as one JSON line: results.json's numbers, the counts and the report's files.

    Args:
        result: an ``eval.harness.EvalResult``.
    """
    payload = json.loads(result.report["json"].read_text(encoding="utf-8"))
    payload["counts"] = {
        "facts": result.facts,
        "scored": result.scored,
        "skipped": result.skipped,
        "computed": result.computed,
        "resumed": result.resumed,
    }
    files = {**result.report, "facts": result.checkpoint}
    payload["files"] = {name: str(path) for name, path in files.items()}
    return json.dumps(_jsonable(payload), ensure_ascii=False)


def ablation_json(result: Any) -> str:
    """An ablation as one JSON line: the joined table, and per run its counts and report folder.

    Args:
        result: an ``eval.ablate.AblationResult``.
    """
    runs = {
        name: {"out": str(r.checkpoint.parent), "facts": r.facts, "scored": r.scored, "skipped": r.skipped}
        for name, r in result.runs.items()
    }
    files = {name: str(path) for name, path in result.files.items()}
    return json.dumps({**result.comparison.as_dict(), "counts": runs, "files": files}, ensure_ascii=False)


def render_corpus(summary: Any) -> str:
    """What ``eval corpus`` wrote, and the command that ingests it.

    Args:
        summary: an ``eval.evidence.CorpusSummary``.
    """
    s = summary
    relations = ", ".join(s.relations)
    return (
        f"wrote {s.articles:,} articles ({s.sentences:,} evidence sentences of {s.facts:,} facts;"
        f" relations {relations}) to {s.out}\n"
        f"next: bertknn-search ingest wiki {s.out} --model MODEL --index INDEX"
    )
