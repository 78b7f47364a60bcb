"""Request bodies of the HTTP API, checked by pydantic: unknown fields and wrong types are a 4xx."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bertknn_search.config import Config, thresholds_from_json
from bertknn_search.query.evidence_words import MAX_EVIDENCE_FOR, MAX_EVIDENCE_WORD
from bertknn_search.server.wire import MAX_QUESTIONS

# Bounds: a request may not make the server do unbounded work or hold unbounded memory. These hold for
# every request; a request without a lifting token is held to the lower ``limits.RequestLimits``.
MAX_QUESTION_CHARS = 10_000  # far past any model's limit; longer is refused before tokenising
MAX_ARTICLES = 10_000  # per add request; the body limit usually binds first


class Strict(BaseModel):
    # Python's JSON parser reads NaN, Infinity and -Infinity, which pass every range check (NaN compares
    # false with the bounds) and then switch retrieval off or empty a distribution: refused as 422.
    # strict: a value of another JSON type is refused, not converted ("exact": "yes", "k": "5", "k": true,
    # "k": 5.0 are 422), as the settings file refuses them; an integer is still a number for a float.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, strict=True)


EvidenceWords = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_EVIDENCE_WORD)]] | None,
    Field(
        None,
        max_length=MAX_EVIDENCE_FOR,
        description="Words whose neighbours' sentences the answer shows (its 'evidence_for'), whether or"
        " not they rank among the top answers.",
    ),
]


class QuestionIn(Strict):
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="With one [MASK].")
    subject: str | None = Field(None, max_length=1000, description="The fact's subject, if any.")
    popularity: float | None = Field(None, ge=0.0, description="Subject page views (gate).")
    relation: str | None = Field(None, max_length=200, description="Relation (gate threshold).")
    evidence_for: EvidenceWords = None


METHOD_FIELDS = (
    "top",
    "k",
    "n_articles",
    "lam",
    "temperature",
    "distance",
    "gate",
    "evidence",
    "budget",
    "budget_s",
    "exact",
)


class MethodOverrides(Strict):
    """The method options of ``query``, by their flag names; each replaces the server's default."""

    top: int | None = Field(None, ge=1, le=1000, description="Answers per ranking.")
    k: int | None = Field(None, ge=1, le=100_000, description="Neighbours.")
    n_articles: int | None = Field(None, alias="n-articles", ge=1, le=1000, description="Articles searched.")
    lam: float | None = Field(None, alias="lambda", ge=0.0, le=1.0, description="Weight of kNN.")
    temperature: float | None = Field(None, gt=0.0, description="The paper's l.")
    distance: Literal["squared-l2", "l2"] | None = Field(None, description="d in exp(-d/l).")
    no_ir: bool | None = Field(None, alias="no-ir", description="Search every context (the ablation).")
    gate: Literal["none", "popularity", "top1", "entropy"] | None = Field(
        None, description="Adaptive retrieval: which signal decides whether to retrieve."
    )
    gate_threshold: float | None = Field(None, alias="gate-threshold", description="One threshold for all.")
    gate_thresholds: dict[str, dict[str, float]] | None = Field(
        None, alias="gate-thresholds", description="signal -> relation -> threshold, as 'eval grid' writes."
    )
    evidence: Literal["diverse", "nearest"] | None = Field(None, description="Evidence by information gain.")
    budget: int | None = Field(
        None, ge=1, le=10_000_000, description="Lazy index: contexts a question encodes before it answers."
    )
    budget_s: float | None = Field(
        None,
        alias="budget-s",
        gt=0.0,
        le=86_400.0,
        description="Lazy index: seconds a question encodes before it answers (with or without a budget).",
    )
    exact: bool | None = Field(None, description="Lazy index: encode every missing context first.")

    def apply(self, config: Config) -> Config:
        """``config`` with the given overrides (Config checks the combination again)."""
        changes: dict[str, Any] = {n: getattr(self, n) for n in METHOD_FIELDS if getattr(self, n) is not None}
        if self.no_ir is not None:
            changes["use_ir"] = not self.no_ir
        if self.gate_thresholds is not None:
            changes["gate_thresholds"] = thresholds_from_json(self.gate_thresholds, "request")
        if self.gate_threshold is not None:
            gate = changes.pop("gate", config.gate)
            return config.replace(**changes).with_gate_threshold(gate, self.gate_threshold)
        return config.replace(**changes) if changes else config


class QueryRequest(MethodOverrides):
    """One question (``question``, ``subject``) or several (``questions``), with optional overrides."""

    question: str | None = Field(None, min_length=1, max_length=MAX_QUESTION_CHARS)
    subject: str | None = Field(None, max_length=1000)
    questions: list[QuestionIn] | None = Field(None, min_length=1, max_length=MAX_QUESTIONS)
    evidence_for: EvidenceWords = None

    @model_validator(mode="after")
    def _one_form(self) -> QueryRequest:
        if (self.question is None) == (self.questions is None):
            raise ValueError("give either 'question' (with an optional 'subject') or 'questions', not both")
        for name in ("subject", "evidence_for"):
            if self.questions is not None and getattr(self, name) is not None:
                raise ValueError(f"'{name}' goes inside each item of 'questions'")
        return self

    def items(self) -> list[QuestionIn]:
        if self.questions is not None:
            return self.questions
        return [
            QuestionIn(question=self.question or "", subject=self.subject, evidence_for=self.evidence_for)
        ]


class ArticleIn(Strict):
    id: str = Field(min_length=1, max_length=200, description="Stable id; an id stored already is replaced.")
    title: str = Field(min_length=1, max_length=1000)
    text: str = Field(min_length=1)  # at most the server's max_article_bytes (checked by the route: 413)

    @field_validator("text")
    @classmethod
    def _has_text(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("the article has no text; add text or drop it")
        return text


class ArticlesRequest(Strict):
    articles: list[ArticleIn] = Field(min_length=1, max_length=MAX_ARTICLES)
