"""Searcher: question -> IR -> filtered kNN -> interpolation -> Answer with its evidence."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from bertknn_search.backends import open_backend, searchable
from bertknn_search.backends.base import Backend
from bertknn_search.config import Config
from bertknn_search.encoding.encoder import MASK, Encoder
from bertknn_search.errors import ConfigError, IndexMismatchError, QuestionError
from bertknn_search.query.answer_kinds import KindSignals, KindTable, neighbour_weights
from bertknn_search.query.confidence import FIT_FILE, Fit, assess, fit_and_name, method_of
from bertknn_search.query.evidence import with_evidence
from bertknn_search.query.evidence_words import checked_words
from bertknn_search.query.gates import confidence, decide, log_popularity
from bertknn_search.query.hardness import Hardness, hardness
from bertknn_search.query.interpolate import interpolate, rank
from bertknn_search.query.knn import knn_probs
from bertknn_search.query.neighbour_words import resolve_words
from bertknn_search.query.retrieve import retrieve, retrieve_subject
from bertknn_search.query.split_words import split_words
from bertknn_search.query.word_frequency import zipf
from bertknn_search.records import (
    Answer,
    ArticleHit,
    Coverage,
    EncodeHooks,
    EncodePlan,
    Focus,
    GateDecision,
    Neighbors,
    Prediction,
    Question,
    SubjectArticles,
)
from bertknn_search.textcheck import describe_unencodable, first_unencodable
from bertknn_search.values import MAX_PIECES, Candidates, ValueSpace, WordKeys, is_word, whole_words

_UNUSED = re.compile(r"\[unused\d+\]")
# Sentences of the nearest neighbours read for words that cannot be answers (see split_words): the
# sentence that holds the expected word is near the question, and reading more costs every question.
SPLIT_SCAN = 32
CLOSEST_TITLES = 5  # titles named for a subject that is no title


@dataclass(frozen=True)
class Scored:
    """One question's intermediate results: what was searched, what was found, the three distributions.

    Attributes:
        hits: the articles searched; None in no-IR mode.
        neighbors: the k nearest contexts.
        p_bert: (V,) BERT's distribution; None for a model without an MLM head.
        p_knn, p: distributions over ``space`` (the vocabulary, then the words of several wordpieces
            among the neighbours); p_knn is all zeros without neighbours, p is p_knn without p_BERT.
        space: what the positions of p_knn and p stand for.
        gate: the adaptive-retrieval decision; None when no gate is set (the question retrieved).
        seconds: time spent on this question's IR and kNN (its share of a batch's lazy encoding
            included); 0 when the gate skipped them.
        coverage: per article searched on a lazy index, how many of its contexts were stored when it
            was searched; {} on an eager index.
        closest_titles: the titles closest to a subject that is no title, where ``score_batch`` was
            asked for them (``Backend.subject_articles``); None otherwise.
    """

    hits: list[ArticleHit] | None
    neighbors: Neighbors
    p_bert: np.ndarray | None
    p_knn: np.ndarray
    p: np.ndarray
    space: ValueSpace
    gate: GateDecision | None = None
    seconds: float = 0.0
    coverage: dict[str, Coverage] = field(default_factory=dict)
    closest_titles: list[ArticleHit] | None = None

    @property
    def retrieved(self) -> bool:
        return self.gate is None or self.gate.retrieve


class Searcher:
    """Answers cloze questions with BERT, kNN and BERT-kNN over one index.

    The stages are public so that evaluation can run them once and try many settings.
    """

    def __init__(self, config: Config, backend: Backend, encoder: Encoder) -> None:
        meta = backend.meta()
        if (meta.model, meta.layer, meta.dim) != (encoder.model_name, encoder.layer, encoder.dim):
            raise IndexMismatchError(
                f"index holds {meta.model} layer {meta.layer} (dim {meta.dim}) contexts but the encoder is"
                f" {encoder.model_name} layer {encoder.layer} (dim {encoder.dim}); use the index's model"
            )
        self.config = config
        self.backend = backend
        self.encoder = encoder
        # What a front end lets a lazy index's encoding do: show progress (the CLI), answer others in
        # between (the server).
        self.hooks = EncodeHooks()
        # The pieces behind each key of a word of several wordpieces (see values.py): shared keys are refused.
        self.word_keys = WordKeys()
        # p of an answer's confidence: the fit ``eval calibrate`` stored with the index (read now, so that
        # a bad one is refused at open), else the shipped one for the model and method (on first use).
        self._fit: tuple[Fit, str] | None = None
        if (config.index / FIT_FILE).is_file():
            self._fit = fit_and_name(config.index)
        self._pool: futures.ThreadPoolExecutor | None = None

    @property
    def confidence_fit(self) -> Fit:
        return self._fit_and_name()[0]

    @property
    def fit_name(self) -> str:
        """Which confidence fit answers use: ``stored:<path>`` or ``shipped:<file>``."""
        return self._fit_and_name()[1]

    def _fit_and_name(self) -> tuple[Fit, str]:
        if self._fit is None:
            head = bool(getattr(self.encoder, "has_head", False))
            method = method_of(head, self.config.lam)
            self._fit = fit_and_name(self.config.index, self.encoder.model_name, method)
        return self._fit

    @cached_property
    def kind_table(self) -> KindTable:
        """Each wordpiece's kind (year, number, month, punctuation, word)."""
        return KindTable(self.encoder.vocab)

    def kind_signals(self, top: int | None, scored: Scored, word: str | None = None) -> KindSignals:
        """The top answer's kind against its neighbours' (``answer_kinds``), and how common its
        ``word`` is (``word_frequency``; the text, as a word of several wordpieces is read back)."""
        nb = scored.neighbors
        weights = neighbour_weights(
            nb.distances, self.config.temperature, self.config.distance == "squared-l2"
        )
        found = self.kind_table.signals(top, nb.token_ids, weights, scored.p_bert)
        return found if word is None else dataclasses.replace(found, zipf=zipf(word))

    def hardness(self, scored: Scored) -> Hardness:
        """How hard the question is, whatever its relation (``hardness``), for its confidence."""
        answerable = self.answerable if scored.p_bert is not None else None
        return hardness(scored.p_knn, scored.neighbors.distances, scored.p_bert, answerable)

    def same_kind(self, p: np.ndarray, scored: Scored) -> np.ndarray:
        """``p`` kept to the neighbours' majority kind (``--same-kind``)."""
        nb = scored.neighbors
        weights = neighbour_weights(
            nb.distances, self.config.temperature, self.config.distance == "squared-l2"
        )
        return self.kind_table.same_kind(p, self.kind_table.majority(nb.token_ids, weights))

    @classmethod
    def open(cls, config: Config) -> Searcher:
        """Open the index and load the model that ``config`` names."""
        backend = open_backend(config)
        try:
            # A query is encoded as the index's contexts were, so that its state compares with theirs.
            precision = backend.meta().precision if config.precision == "auto" else config.precision
            encoder = Encoder(
                config.model, config.layer, config.device, config.max_length, precision, config.runtime
            )
            return cls(config, searchable(backend, encoder, config), encoder)
        except BaseException:
            backend.close()
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self.backend.close()

    # -- stages ------------------------------------------------------------------------------------
    def retrieve(self, question: Question, n: int | None = None) -> list[ArticleHit]:
        """The articles whose contexts are searched (the subject's own article, else BM25 top-N)."""
        return retrieve(self.backend, question, n or self.config.n_articles)

    def _retrieve_all(
        self, questions: Sequence[Question], n: int, closest: int
    ) -> tuple[list[SubjectArticles], list[float]]:
        """Each question's articles (with ``closest`` titles, ``retrieve_subject``) and the seconds its IR
        took."""
        found, seconds = [], []
        for q in questions:
            start = time.perf_counter()
            found.append(retrieve_subject(self.backend, q, n, closest))
            seconds.append(time.perf_counter() - start)
        return found, seconds

    def _ir_pool(self) -> futures.ThreadPoolExecutor:
        """One thread for the IR searches that run beside the encoder (``score_batch``)."""
        if self._pool is None:
            self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="retrieve")
        return self._pool

    def encode(self, questions: Sequence[Question]) -> tuple[np.ndarray, np.ndarray | None]:
        """Query states (B, dim) float32 at ``layer`` and p_BERT (B, V) float32 (None: no MLM head)."""
        return self.encoder.query([q.text for q in questions])

    def neighbors(
        self, state: np.ndarray, hits: Sequence[ArticleHit] | None, k: int | None = None
    ) -> Neighbors:
        """Nearest contexts inside ``hits``' articles; ``None`` searches every context (no-IR mode).

        Their values are keys: a word of several wordpieces is keyed by its own wordpieces
        (``resolve_words``).
        """
        k = k or self.config.k
        if hits is None:
            return self.resolve_words(self.backend.knn(state, k, None))
        if not hits:
            return Neighbors.empty()
        return self.resolve_words(self.backend.knn(state, k, [h.id for h in hits]))

    def resolve_words(self, nb: Neighbors) -> Neighbors:
        """``nb`` with each word of several wordpieces keyed by its own wordpieces, read back from its
        sentence (``neighbour_words.resolve_words``); a stored hash two words share stays two words.

        Raises:
            WordCollisionError: two different words have the same 64-bit key (refused, never merged).
        """
        return resolve_words(nb, self.backend, self.encoder.tokenizer, self.word_keys)

    # -- answers -----------------------------------------------------------------------------------
    def answer(self, question: Question) -> Answer:
        return self.answer_batch([question])[0]

    def score_batch(
        self, questions: Sequence[Question], config: Config | None = None, closest_titles: int = 0
    ) -> list[Scored]:
        """The three distributions for each question; the model runs once for the whole batch.

        Args:
            questions: cloze questions, each with exactly one [MASK].
            config: method settings to use instead of the Searcher's (evaluation tries several).
            closest_titles: up to this many titles closest to a subject that is no title, asked with the
                question's IR (one engine request); 0 (evaluation) asks none.

        Raises:
            QuestionError: a question without exactly one [MASK], or a question or subject that is not
                text (checked before any work).
        """
        cfg = config or self.config
        for q in questions:
            self.encoder.prepare(q.text)  # validate all before spending time on any
            bad = None if q.subject is None else first_unencodable(q.subject)
            if bad is not None:
                raise QuestionError(
                    f"the subject is not valid text: {describe_unencodable(q.subject, bad, from_bytes=True)}"
                )
        # Without a gate every question retrieves whatever the encoder says: the IR search runs while the
        # encoder does (on an engine it is a round trip to the node, which the pass then hides).
        early = None
        if cfg.gate == "none" and cfg.use_ir:
            early = self._ir_pool().submit(self._retrieve_all, questions, cfg.n_articles, closest_titles)
        try:
            states, p_bert = self.encode(questions)
        except BaseException:
            if early is not None:
                futures.wait([early])  # no backend call outlives the question
            raise
        gates = decide(cfg, self.gate_signal(cfg.gate, questions, p_bert), [q.relation for q in questions])
        go = [True] * len(questions) if gates is None else [g.retrieve for g in gates]
        # A question the gate stops gets no articles and no neighbours: BERT-kNN is then BERT.
        seconds = [0.0] * len(questions)
        found: list[list[ArticleHit] | None] = []
        # Closest titles are read after the question's kNN search, which an engine asks them with.
        nearest: list[SubjectArticles | None] = [None] * len(questions)
        if early is not None:
            retrieved, seconds = early.result()
            found.extend(r.articles for r in retrieved)
            nearest = list(retrieved)
        else:
            for i, (q, wanted) in enumerate(zip(questions, go)):
                start = time.perf_counter()
                if wanted and cfg.use_ir:
                    r = retrieve_subject(self.backend, q, cfg.n_articles, closest_titles)
                    found.append(r.articles)
                    nearest[i] = r
                else:
                    found.append(None if wanted else [])
                seconds[i] += time.perf_counter() - start
        # One call for the whole batch, so a lazy index encodes what the batch needs in one pass.
        start = time.perf_counter()
        searched = sorted({h.id for hits in found for h in hits or []})
        device = self.encoder.placement.device.type
        # Each question its own budget (of contexts, and of seconds after its floor: lazy.py), so that a
        # batch answers as well as its questions asked one at a time.
        plan = EncodePlan(
            tuple(
                Focus(q.text, q.subject, tuple(h.id for h in hits or [])) for q, hits in zip(questions, found)
            ),
            cfg.budget_for(device),
            self.hooks,
            cfg.budget_seconds_for(device),
        )
        coverage: dict[str, Coverage] = {}
        if searched:  # a batch the gate stopped whole asks nothing of the index
            self.backend.ensure_contexts(searched, plan)
            coverage = self.backend.coverage(searched)
        shared = (time.perf_counter() - start) / max(sum(go), 1)
        scored = []
        rows: Sequence[np.ndarray | None] = p_bert if p_bert is not None else [None] * len(states)
        for i, (state, pb, hits) in enumerate(zip(states, rows, found)):
            start = time.perf_counter()
            nb = self.neighbors(state, hits, cfg.k) if go[i] else Neighbors.empty()
            closest = None if (asked := nearest[i]) is None else asked.closest
            space, p_knn, p = self.distributions(nb, pb, cfg)
            took = seconds[i] + time.perf_counter() - start + shared if go[i] else 0.0
            gate = None if gates is None else gates[i]
            seen = {h.id: coverage[h.id] for h in hits or [] if h.id in coverage}
            scored.append(Scored(hits, nb, pb, p_knn, p, space, gate, took, seen, closest))
        return scored

    def distributions(
        self, nb: Neighbors, p_bert: np.ndarray | None, config: Config
    ) -> tuple[ValueSpace, np.ndarray, np.ndarray]:
        """A question's value space, p_kNN over it from ``nb``, and p mixed with ``p_bert`` (or p_kNN)."""
        space = ValueSpace.of(nb.token_ids, self.encoder.vocab_size)
        squared = config.distance == "squared-l2"
        p_knn = knn_probs(nb.distances, space.index(nb.token_ids), space.size, config.temperature, squared)
        # BERT gives a word of several wordpieces no probability of its own (see docs/method.md).
        return space, p_knn, interpolate(p_knn, None if p_bert is None else space.pad(p_bert), config.lam)

    def gate_signal(
        self, gate: str, questions: Sequence[Question], p_bert: np.ndarray | None
    ) -> list[float | None]:
        """Each question's value of the gate's signal (popularity on PopQA's log scale); [] without a gate.

        Popularity comes from the question (``query --popularity``, PopQA's ``s_pop``), else from the
        subject's own article in the index (a title lookup, no BM25); None when neither has one.
        """
        if gate == "none":
            return [None] * len(questions)
        if gate != "popularity":
            if p_bert is None:
                # A random head's confidence would gate at random: refuse rather than pretend.
                raise ConfigError(
                    f"--gate {gate} needs BERT's distribution, and this model has no masked-LM head; "
                    "use --gate popularity or none"
                )
            return [float(v) for v in confidence(p_bert, self.answerable)[gate]]
        values: list[float | None] = []
        for q in questions:
            popularity = q.popularity
            if popularity is None and q.subject:
                known = [h.popularity for h in self.backend.find_titles(q.subject, self.config.n_articles)]
                popularity = max((p for p in known if p is not None), default=None)
            values.append(log_popularity(popularity))
        return values

    def reencode(self, masked: Sequence[tuple[str, int, int]]) -> np.ndarray:
        """Keys of stored contexts, encoded again from their sentences: (sentence, start, end) -> (n, dim)."""
        texts = [f"{s[:a]}{MASK}{s[b:]}" for s, a, b in masked]
        size = self.config.batch_for(self.encoder.placement.device.type)
        parts = [self.encoder.query(texts[i : i + size])[0] for i in range(0, len(texts), size)]
        return np.concatenate(parts) if parts else np.zeros((0, self.encoder.dim), np.float32)

    def answer_batch(self, questions: Sequence[Question]) -> list[Answer]:
        """Answer several questions: rankings, articles and evidence.

        Raises:
            QuestionError: a question without exactly one [MASK], or with more words in ``evidence_for``
                than ``evidence_words.MAX_EVIDENCE_FOR`` (checked before any work).
        """
        questions = [dataclasses.replace(q, evidence_for=checked_words(q.evidence_for)) for q in questions]
        answers = []
        for q, s in zip(questions, self.score_batch(questions, closest_titles=CLOSEST_TITLES)):
            ranking = self.predictions(self.same_kind(s.p, s) if self.config.same_kind else s.p, s)
            answer = Answer(
                question=q.text,
                subject=q.subject,
                articles=list(s.hits or []),
                bert_knn=ranking,
                bert=None if s.p_bert is None else self.predictions(s.p_bert, s),
                knn=self.predictions(s.p_knn, s),
                evidence=[],
                n_neighbors=len(s.neighbors),
                bert_available=s.p_bert is not None,
                gate=s.gate,
                coverage=s.coverage,
                confidence=assess(
                    ranking,
                    s.neighbors,
                    s.p_bert is not None,
                    s.coverage,
                    self.confidence_fit,
                    self.kind_signals(
                        ranking[0].token_id if ranking else None, s, ranking[0].word if ranking else None
                    ),
                    self.fit_name,
                    self.hardness(s),
                ),
            )
            cfg = self.config
            answer = with_evidence(
                answer,
                s.neighbors,
                self.backend,
                chosen=[(word, self.value(word)) for word in q.evidence_for],
                mode=cfg.evidence,
                temperature=cfg.temperature,
                squared=cfg.distance == "squared-l2",
                reencode=self.reencode,
            )
            answer = self._with_split_words(answer, s.neighbors)
            if s.closest_titles is not None:  # a subject that is no title: BM25 searched it instead
                answer = dataclasses.replace(answer, closest_titles=[h.title for h in s.closest_titles])
            answers.append(answer)
        return answers

    def _with_split_words(self, answer: Answer, nb: Neighbors) -> Answer:
        """``answer`` with the words at [MASK]'s place in its nearest sentences that cannot be answers."""
        if whole_words(self.backend.meta().mask_policy):
            return answer  # every word is an answer here
        refs = list(dict.fromkeys((nb.article_ids[r], int(nb.sentence_ids[r])) for r in range(len(nb))))
        refs = refs[:SPLIT_SCAN]
        if not refs:
            return answer
        texts = self.backend.sentences(refs)
        titles = self.backend.titles(sorted({aid for aid, _ in refs}))
        rows = [(text, aid, titles.get(aid, "")) for text, (aid, _) in zip(texts, refs)]
        found = split_words(answer.question, rows, self.encoder.tokenizer.tokenize, MASK)
        return dataclasses.replace(answer, split_words=found) if found else answer

    @cached_property
    def answerable(self) -> np.ndarray:
        """(V,) bool: ids that may be listed as answers; special tokens never are.

        ``[MASK]``, ``[CLS]``, ``[SEP]``, ``[PAD]``, ``[UNK]`` and ``[unused…]`` are left out of every
        ranking, but the other words keep their probabilities (no renormalisation), as in the paper.
        """
        vocab, tokenizer = self.encoder.vocab, self.encoder.tokenizer
        mask = np.ones(len(vocab), dtype=bool)
        special = {int(i) for i in tokenizer.all_special_ids if 0 <= int(i) < len(vocab)}
        special.update(i for i, word in enumerate(vocab) if _UNUSED.fullmatch(word) or not word)
        mask[sorted(special)] = False
        return mask

    def ranked(
        self, p: np.ndarray, scored: Scored, top: int, allowed: Candidates | None = None
    ) -> tuple[list[int], np.ndarray]:
        """The ``top`` value ids of ``p`` (a distribution over ``scored.space``, or p_BERT's vocabulary).

        ``allowed`` narrows the candidates (default: every answerable id and every word).
        """
        mask = (allowed or Candidates(self.answerable)).over(scored.space)
        positions, probs = rank(p, top, mask[: p.shape[0]])
        return [scored.space.value(int(i)) for i in positions], probs

    def value(self, word: str) -> int | None:
        """The value ``word`` is ranked under in this index: its wordpiece id, or under a whole-word
        policy the key of its wordpieces (``values.word_key``) if it is one word; None if it cannot be
        an answer here.

        Raises:
            WordCollisionError: another word has the same key (refused, never merged).
        """
        tok = self.encoder.tokenizer
        enc = tok(word, add_special_tokens=False)
        ids: list[int] = enc["input_ids"]
        if not ids or tok.unk_token_id in ids:
            return None
        if len(ids) == 1:  # a special token ([MASK], [CLS], ...) is never ranked, so never an answer
            return int(ids[0]) if self.answerable[ids[0]] else None
        one_word = len(set(enc.word_ids())) == 1
        if not whole_words(self.backend.meta().mask_policy) or not one_word or len(ids) > MAX_PIECES:
            return None
        return self.word_keys.ask(ids)

    def predictions(self, p: np.ndarray, scored: Scored) -> list[Prediction]:
        """``p``'s top answers as words: a word of several wordpieces is read from a neighbour's sentence."""
        values, probs = self.ranked(p, scored, self.config.top)
        words = self.words(values, scored.neighbors)
        out = []
        for value, pr in zip(values, probs):
            word, pieces = words[value]
            out.append(Prediction(word, value, float(pr), pieces if len(pieces) > 1 else ()))
        return out

    def words(self, values: Sequence[int], nb: Neighbors) -> dict[int, tuple[str, tuple[str, ...]]]:
        """Each value's word and wordpieces; a word's key is resolved through a neighbour holding it."""
        vocab, tok = self.encoder.vocab, self.encoder.tokenizer
        out = {v: (vocab[v], (vocab[v],)) for v in values if not is_word(v)}
        hashed = [v for v in values if is_word(v)]
        rows = [int(np.flatnonzero(nb.token_ids == v)[0]) for v in hashed]
        texts = self.backend.sentences([(nb.article_ids[r], int(nb.sentence_ids[r])) for r in rows])
        for v, r, text in zip(hashed, rows, texts):
            pieces = tuple(tok.tokenize(text[int(nb.starts[r]) : int(nb.ends[r])]))
            out[v] = (tok.convert_tokens_to_string(list(pieces)), pieces)
        return out
