"""Searcher: question -> IR -> filtered kNN -> interpolation -> Answer with its evidence."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertknn_search.backends import open_backend
from bertknn_search.backends.base import Backend
from bertknn_search.config import Config
from bertknn_search.encoder import Encoder
from bertknn_search.errors import IndexMismatchError
from bertknn_search.interpolate import interpolate, rank
from bertknn_search.knn import knn_probs
from bertknn_search.records import (
    Answer,
    ArticleHit,
    Evidence,
    EvidenceSentence,
    Neighbors,
    Prediction,
    Question,
)
from bertknn_search.retrieve import retrieve

EVIDENCE_ANSWERS = 3  # top answers that get their supporting sentences shown
EVIDENCE_SENTENCES = 3


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

    @classmethod
    def open(cls, config: Config) -> Searcher:
        """Open the index and load the model that ``config`` names."""
        backend = open_backend(config)
        try:
            encoder = Encoder(config.model, config.layer, config.device, config.max_length)
            return cls(config, backend, encoder)
        except BaseException:
            backend.close()
            raise

    def close(self) -> None:
        self.backend.close()

    # -- stages ------------------------------------------------------------------------------------
    def retrieve(self, question: Question, n: int | None = None) -> list[ArticleHit]:
        """The articles whose contexts are searched (the subject's own article, else BM25 top-N)."""
        return retrieve(self.backend, question, n or self.config.n_articles)

    def encode(self, questions: Sequence[Question]) -> tuple[np.ndarray, np.ndarray]:
        """Query states (B, dim) float32 at ``layer`` and p_BERT (B, V) float32."""
        return self.encoder.query([q.text for q in questions])

    def neighbors(
        self, state: np.ndarray, hits: Sequence[ArticleHit] | None, k: int | None = None
    ) -> Neighbors:
        """Nearest contexts inside ``hits``' articles; ``None`` searches every context (no-IR mode)."""
        k = k or self.config.k
        if hits is None:
            return self.backend.knn(state, k, None)
        if not hits:
            return Neighbors.empty()
        return self.backend.knn(state, k, [h.id for h in hits])

    # -- answers -----------------------------------------------------------------------------------
    def answer(self, question: Question) -> Answer:
        return self.answer_batch([question])[0]

    def answer_batch(self, questions: Sequence[Question]) -> list[Answer]:
        """Answer several questions; the model runs once for the whole batch.

        Raises:
            QuestionError: a question without exactly one [MASK] (checked before any work).
        """
        cfg = self.config
        for q in questions:
            self.encoder.prepare(q.text)  # validate all before spending time on any
        states, p_bert = self.encode(questions)
        answers = []
        for q, state, pb in zip(questions, states, p_bert):
            hits = self.retrieve(q) if cfg.use_ir else None
            nb = self.neighbors(state, hits)
            p_knn = knn_probs(
                nb.distances,
                nb.token_ids,
                self.encoder.vocab_size,
                cfg.temperature,
                cfg.distance == "squared-l2",
            )
            p = interpolate(p_knn, pb, cfg.lam)
            answers.append(
                Answer(
                    question=q.text,
                    subject=q.subject,
                    articles=list(hits or []),
                    bert_knn=self._predictions(p),
                    bert=self._predictions(pb),
                    knn=self._predictions(p_knn),
                    evidence=[],
                    n_neighbors=len(nb),
                )
            )
            answers[-1] = _with_evidence(answers[-1], nb, self.backend)
        return answers

    def _predictions(self, p: np.ndarray) -> list[Prediction]:
        ids, probs = rank(p, self.config.top)
        vocab = self.encoder.vocab
        return [Prediction(vocab[i], int(i), float(pr)) for i, pr in zip(ids, probs)]


def _with_evidence(answer: Answer, nb: Neighbors, backend: Backend) -> Answer:
    """Attach, for each top answer, the nearest stored sentences whose masked word was that answer."""
    picks: list[tuple[str, list[int]]] = []
    for pred in answer.bert_knn[:EVIDENCE_ANSWERS]:
        rows = np.flatnonzero(nb.token_ids == pred.token_id)[:EVIDENCE_SENTENCES].tolist()
        if rows:
            picks.append((pred.word, rows))
    if not picks:
        return answer
    wanted = [r for _, rows in picks for r in rows]
    texts = dict(
        zip(wanted, backend.sentences([(nb.article_ids[r], int(nb.sentence_ids[r])) for r in wanted]))
    )
    titles = backend.titles([nb.article_ids[r] for r in wanted])
    evidence = [
        Evidence(
            word,
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
            ],
        )
        for word, rows in picks
    ]
    return Answer(**{**answer.__dict__, "evidence": evidence})
