"""Plain records that flow between the stages: corpus -> contexts -> store; question -> answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy only where an empty block is made: `query --server` and --help never import it
    import numpy as np


@dataclass(frozen=True)
class Article:
    """One article of the corpus. ``id`` is stable across re-ingests (the dump's page id)."""

    id: str
    title: str
    text: str
    popularity: float | None = None  # page views or any count of interest (PopQA's s_pop), if known


@dataclass(frozen=True)
class ContextBlock:
    """All contexts of one article, as parallel arrays (one row per masked word occurrence).

    Attributes:
        sentences: the article's sentences, in order; rows point into it.
        vectors: (n, dim) float16, hidden state of ``layer`` at the mask.
        token_ids: (n,) int32, the masked wordpiece (the kNN value).
        sentence_ids: (n,) int32, index into ``sentences``.
        starts, ends: (n,) int32, character span of the word inside its sentence.
    """

    sentences: list[str]
    vectors: np.ndarray
    token_ids: np.ndarray
    sentence_ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @classmethod
    def empty(cls, dim: int, sentences: list[str] | None = None) -> ContextBlock:
        import numpy as np

        ints = np.zeros(0, dtype=np.int32)
        return cls(
            sentences or [], np.zeros((0, dim), np.float16), ints, ints.copy(), ints.copy(), ints.copy()
        )


@dataclass(frozen=True)
class EncodedArticle:
    """An article with its contexts, ready to be written by a backend in one atomic step.

    ``contexts`` is None when a lazy index stores the text alone; they are encoded on first use.
    A *part* (``rows`` set) holds some of the article's contexts: a lazy index encodes a long article's
    contexts in the order a question needs them and stores each part as it is encoded.
    """

    article: Article
    contexts: ContextBlock | None
    fingerprint: str  # hash of the text and the encoding settings: equal means nothing to redo
    # A part: the row number (in ``make_rows`` order over the whole article) of each of the block's
    # contexts, and how many contexts the whole article has. None: the block is every context.
    rows: np.ndarray | None = None
    total: int | None = None


@dataclass(frozen=True)
class Coverage:
    """How many of an article's contexts are stored: a question over part of one says so."""

    encoded: int
    total: int

    @property
    def complete(self) -> bool:
        return self.encoded >= self.total


@dataclass(frozen=True)
class Focus:
    """A question a lazy index encodes for: its text (with [MASK]), subject and the articles it searches."""

    question: str
    subject: str | None
    article_ids: tuple[str, ...]


@dataclass(frozen=True)
class EncodeProgress:
    """Where a lazy index's encoding stands, for a progress bar: ``done`` of ``todo`` contexts now."""

    done: int
    todo: int
    titles: tuple[str, ...]  # the articles being encoded
    seconds: float
    total: int = 0  # contexts those articles have in all


@dataclass(frozen=True)
class EncodeHooks:
    """What a front end lets a lazy index's encoding do between encoder steps.

    Attributes:
        between: called between steps; the server answers questions that arrived meanwhile here, and
            raises to stop a cold encode when it shuts down (what is encoded by then is stored).
        progress: told after each step.
    """

    between: Callable[[], None] | None = None
    progress: Callable[[EncodeProgress], None] | None = None


@dataclass(frozen=True)
class EncodePlan:
    """What a batch of questions asks of a lazy index before it answers.

    Attributes:
        focus: the questions, each with the articles it searches.
        budget: contexts encoded per question before answering, those most useful to it first;
            None: every context of its articles (an exact answer).
        seconds: with a budget, the seconds of encoding each question gets after its articles' floor
            (``lazy.FLOOR_ROWS``), questions in turn, even if its budget is not spent (a budget of
            seconds); None: no clock.
    """

    focus: tuple[Focus, ...] = ()
    budget: int | None = None
    hooks: EncodeHooks = field(default_factory=EncodeHooks)
    seconds: float | None = None


@dataclass(frozen=True)
class PendingArticle:
    """An article of a lazy index whose contexts are not all stored, as the store hands it out.

    Attributes:
        done: sorted row numbers already stored (empty when none is).
        sentences: the article's sentences as split when its first part was stored; None before.
    """

    article: Article
    fingerprint: str
    done: np.ndarray
    sentences: list[str] | None = None


@dataclass(frozen=True)
class IndexMeta:
    """What an index was built with; every open checks it against the Config."""

    model: str
    layer: int
    dim: int
    vocab_size: int
    mask_policy: str
    store_dtype: str = "float16"
    max_length: int = 512  # the model input limit the contexts were windowed to
    contexts: str = "eager"  # "lazy": contexts are encoded the first time a query needs an article
    precision: str = "fp32"  # what the contexts are encoded in (fp32, bf16, int8); never mixed in one index
    splitter: str = ""  # the sentence splitter and its release (ingest.sentences.SPLITTER); "": not recorded
    # Made for the no-IR search (``ingest --no-ir-graph``): OpenSearch builds an HNSW graph over every
    # context; the other backends have none to build and search every context exactly, as without it.
    no_ir_graph: bool = False


@dataclass(frozen=True)
class IndexStats:
    """What an index holds."""

    backend: str
    location: str
    articles: int
    sentences: int
    contexts: int
    bytes_on_disk: int
    meta: IndexMeta
    encoded_articles: int = 0  # articles whose contexts are stored (all of them in an eager index)
    context_bytes: int = 0  # bytes the stored contexts take (vectors, values, positions, sentences)
    # Contexts an eager index of the same articles would hold: exact when eager, else extrapolated from
    # the encoded articles' contexts per character of text (0 until one is encoded).
    estimated_contexts: int = 0
    # Articles whose contexts are partly stored (a lazy index answering before an article is encoded to
    # its end), and the contexts those parts hold (counted in ``contexts`` too).
    partial_articles: int = 0
    partial_contexts: int = 0
    model_max_length: int | None = None  # the model's own input limit, where its config is on disk here
    # Whether the index's model has a masked-LM head (None: its files are not on disk here to tell).
    mlm_head: bool | None = None
    # The index holds a graph that --no-ir searches (approximate); without one it scans every context.
    no_ir_graph: bool = False
    # Which confidence fit answers use (``confidence.describe_fit``): stored with the index or shipped.
    confidence_fit: str | None = None

    @property
    def encoded_whole(self) -> bool:
        """Whether every article's contexts are stored to its end: the index then holds what an eager
        index of its articles holds, and a search of every context (no IR) can be answered."""
        return self.encoded_articles >= self.articles and not self.partial_articles


@dataclass(frozen=True)
class ArticleHit:
    """An article returned by the IR step."""

    id: str
    title: str
    score: float
    popularity: float | None = None  # the article's, where the index holds one


@dataclass(frozen=True)
class SubjectArticles:
    """A subject's articles (``Backend.subject_articles``), with the titles closest to it where asked.

    Attributes:
        articles: the subject's own articles (score infinity), else the BM25 top n.
        closest_from: the closest titles (``closest``), or how to get them when first read: an engine
            asks them with its next request, the kNN search (``engines/subject_search``).
    """

    articles: list[ArticleHit]
    closest_from: list[ArticleHit] | Callable[[], list[ArticleHit]] | None = None

    @cached_property
    def closest(self) -> list[ArticleHit] | None:
        """Where the subject is no title and closest titles were asked for, up to that many titles
        holding the first of its ``title_patterns`` that any title holds; None otherwise. Read after
        the question's kNN search, it costs an engine no request of its own."""
        found = self.closest_from
        return found() if callable(found) else found


@dataclass(frozen=True)
class Neighbors:
    """The k nearest stored contexts of one query vector, nearest first.

    Attributes:
        distances: (k,) float32, squared L2 distances.
        token_ids: (k,) int64, the value of each neighbour: as stored (a word of several wordpieces by
            its 31-bit hash), then keyed by the Searcher (``Searcher.resolve_words``).
        article_ids: the article of each neighbour.
        sentence_ids, starts, ends: (k,) int32, where to find the sentence and the word.
        vectors: (k, dim) float32 stored keys, where the backend returns them (the embedded one
            does); evidence by information gain needs them, and encodes the sentences again otherwise.
    """

    distances: np.ndarray
    token_ids: np.ndarray
    article_ids: list[str]
    sentence_ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    vectors: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.distances.shape[0])

    @classmethod
    def empty(cls) -> Neighbors:
        import numpy as np

        ints = np.zeros(0, dtype=np.int32)
        return cls(np.zeros(0, np.float32), np.zeros(0, np.int64), [], ints, ints.copy(), ints.copy())


@dataclass(frozen=True)
class Question:
    """A cloze question with exactly one [MASK]; ``subject`` picks the IR query for KB facts.

    ``popularity`` (the subject's page views) and ``relation`` feed the adaptive-retrieval gate; without
    a popularity the gate looks up the subject's own article's in the index.
    """

    text: str
    subject: str | None = None
    popularity: float | None = None
    relation: str | None = None
    # Words whose supporting sentences the answer shows, whether or not they rank among the top answers.
    evidence_for: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prediction:
    """One ranked answer word with its probability.

    Attributes:
        word: the word as the tokenizer normalises it (lowercased by an uncased model).
        token_id: its value: the wordpiece id, or for a word of several wordpieces the negative key
            of its wordpieces (``values.word_key``; up to 19 digits, beyond a JavaScript number's 2^53).
        prob: its probability.
        pieces: the wordpieces of a word of several; empty for a word of one.
    """

    word: str
    token_id: int
    prob: float
    pieces: tuple[str, ...] = ()


@dataclass(frozen=True)
class EvidenceSentence:
    """A stored context that voted for an answer."""

    article_id: str
    title: str
    sentence: str
    start: int
    end: int
    distance: float


@dataclass(frozen=True)
class Evidence:
    """The sentences that voted for one of the top answers, nearest first."""

    word: str
    sentences: list[EvidenceSentence] = field(default_factory=list)


@dataclass(frozen=True)
class WordEvidence:
    """The sentences that voted for a word the question asked about (``query --evidence-for``), ranked
    among the top answers or not.

    Attributes:
        word: the word as asked.
        sentences: chosen as the top answers' are (``--evidence``); empty when no neighbour holds it.
        votes: how many of the question's neighbours hold it.
        answerable: whether it can be an answer on this index at all: one wordpiece of the model's
            vocabulary, or on a whole-word index one word.
    """

    word: str
    sentences: list[EvidenceSentence] = field(default_factory=list)
    votes: int = 0
    answerable: bool = True


@dataclass(frozen=True)
class SplitWord:
    """A word that stands where the question has [MASK] in a searched sentence, but is several wordpieces.

    Answers are single wordpieces of the model's vocabulary, so such a word (often the one the question
    is after: "Ulm" is ``ul ##m`` in BERT's uncased vocabulary) can never be one; saying so tells a user
    why the answer they expected is missing.
    """

    word: str
    pieces: list[str]
    article_id: str
    title: str


@dataclass(frozen=True)
class Confidence:
    """How sure an answer is (``confidence.assess``; what the bands mean: docs/evaluation.md#confidence).

    Attributes:
        level: "high", "medium" or "low": bands of ``p`` (never "high" on a single vote).
        p: the estimated probability, in [0, 1], that the top answer is right (without neighbours:
            BERT's top-1 probability).
        votes: neighbours that hold the top answer.
        neighbours: neighbours the answer had.
        kind, neighbours_kind: the top answer's kind (year, number, month, punctuation, word) and the
            kind most of the neighbours' kNN probability holds; None without neighbours. An answer whose
            kind differs is never "high" (``query.answer_kinds``).
        fit: which confidence fit gave ``p`` (``stored:<path>`` or ``shipped:<file>``).
    """

    level: str
    p: float
    votes: int = 0
    neighbours: int = 0
    kind: str | None = None
    neighbours_kind: str | None = None
    fit: str | None = None


@dataclass(frozen=True)
class Answer:
    """What a query returns: the three rankings, the articles used and the evidence.

    ``bert`` is None and ``bert_available`` False for a model without an MLM head: there is no BERT
    ranking, and ``bert_knn`` is the kNN ranking (λ=1).
    """

    question: str
    subject: str | None
    articles: list[ArticleHit]
    bert_knn: list[Prediction]
    bert: list[Prediction] | None
    knn: list[Prediction]
    evidence: list[Evidence]
    n_neighbors: int
    bert_available: bool = True
    gate: GateDecision | None = None  # None: no gate, the question retrieved
    # Per article searched, how many of its contexts the answer could see (a lazy index); {}: all of
    # them (an eager index).
    coverage: dict[str, Coverage] = field(default_factory=dict)
    split_words: list[SplitWord] = field(default_factory=list)
    # A subject that is no title in the index (BM25 searched it instead): titles that hold it or its
    # longest word, for the next try. None: the subject was a title, or there was none.
    closest_titles: list[str] | None = None
    # The sentences behind the question's ``evidence_for`` words, in their order.
    evidence_for: list[WordEvidence] = field(default_factory=list)
    # How sure the answer is; None only where no answer was computed (no neighbours and no MLM head).
    confidence: Confidence | None = None

    @property
    def partial(self) -> bool:
        """Whether the answer was computed over part of an article's contexts."""
        return any(not c.complete for c in self.coverage.values())


@dataclass(frozen=True)
class GateDecision:
    """Why a question did or did not retrieve.

    Attributes:
        signal: "popularity" (natural log of page views), "top1" or "entropy".
        value: the question's signal; None when unknown (no popularity anywhere: it retrieves).
        threshold: the threshold applied (the relation's, else the "*" one); None when there is none.
        retrieve: whether IR and kNN ran.
    """

    signal: str
    value: float | None
    threshold: float | None
    retrieve: bool
