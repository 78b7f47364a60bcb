"""Config: every setting of the method and the product in one frozen dataclass."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertknn_search.errors import ConfigError

# The single-wordpiece policies are the paper's datastore; the whole-word ones make every word an answer.
MASK_POLICIES = ("single-wordpiece", "single-wordpiece-no-stopwords", "whole-word", "whole-word-no-stopwords")
STORE_DTYPES = ("float16", "int8")
DISTANCES = ("squared-l2", "l2")
BACKENDS = ("embedded", "opensearch", "elasticsearch")
CONTEXT_MODES = ("eager", "lazy")
# The encoder's arithmetic; "auto" picks per machine (placement.choose_precision) and an index records
# the one its contexts were encoded in.
PRECISIONS = ("auto", "fp32", "bf16", "int8")
# Which code runs the encoder: "torch" (plain torch, BERT checkpoints), "transformers" (any checkpoint, the
# reference), or "auto": plain torch where it can run the checkpoint (encoding.runtime.choose_runtime).
RUNTIMES = ("auto", "torch", "transformers")
# Adaptive retrieval (Mallen et al. 2023): which signal decides whether a question retrieves at all.
GATES = ("none", "popularity", "top1", "entropy")
# Evidence shown for an answer: the nearest neighbours, or picked by information gain (Banerjee et al.).
EVIDENCE_MODES = ("diverse", "nearest")
# Masked sentences (or questions) per forward pass: a GPU needs big batches to be busy, a CPU does not.
CPU_BATCH = 128
GPU_BATCH = 1024
# Anytime answers: contexts a question encodes before it answers, on a lazy index whose articles are not
# yet encoded (the rest later). On a CPU the seconds below are the bound that counts; this one only keeps
# a fast CPU's first answer in check. It was 64: on held-out T-REx facts (bench_batch_budget, MiniLM,
# cold lazy index) that cap cost 3 points of P@1 against the seconds alone (13.2 against 16.2; exact
# 17.7), whose partial answers held up to 343 contexts. On a GPU an article of 64k contexts is whole
# within the budget: answers there are exact.
CPU_BUDGET = 1024
GPU_BUDGET = 65_536
# On a CPU a question also stops encoding this many seconds after its floor (lazy.FLOOR_ROWS, which no
# clock cuts), each question of a batch its own: 64 BERT-base contexts took 2 s on a CPU with AVX512-BF16
# but 4.7-5 s in fp32 on this project's 2-core machine (13.8 contexts/s). See bench_first_answer and
# docs/lazy.md (a budget per question).
CPU_BUDGET_S = 2.4
# A budget of seconds alone (``--budget-s`` without ``--budget``) ranks every missing context, best first.
UNBOUNDED = 1 << 30

# Wikipedia's own cap on a page's wikitext (2 MiB). The readers hold no article past it (its XML text,
# JSONL line, WikiExtractor <doc> body or parquet text) and skip one that is longer, so what a corpus
# file expands to, however it was compressed, never decides the memory an ingest takes.
MAX_ARTICLE_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class Config:
    """All settings. Defaults are the paper's values (Kassner & Schütze 2020, appendix C).

    The paper's symbols: N = ``n_articles``, k = ``k``, l = ``temperature``, λ = ``lam``.
    """

    # The method.
    model: str = "bert-base-uncased"
    layer: int = 11
    n_articles: int = 3
    k: int = 128
    temperature: float = 6.0
    lam: float = 0.3
    # The reference code tuned l=6 on FAISS IndexFlatL2 output, which is the squared distance.
    distance: str = "squared-l2"
    use_ir: bool = True
    mask_policy: str = "single-wordpiece"
    max_length: int = 512
    # "lazy": ingest stores text and the IR index only; an article's contexts are encoded the first
    # time a query's IR step picks it, and kept (up to ``cache_size`` bytes, least recently used out).
    contexts: str = "lazy"
    cache_size: int | None = None
    # A new eager index made for the no-IR search: OpenSearch builds an HNSW graph over every context
    # (approximate, and its cost at every write); without it --no-ir scans every context exactly.
    no_ir_graph: bool = False
    # Adaptive retrieval: "none" always retrieves; "popularity" (the subject's page views, Mallen et al.
    # 2023), "top1" (BERT's top-1 probability) or "entropy" (of p_BERT) decide per question whether IR
    # and kNN run at all. Thresholds are (signal, relation, value) triples learned by ``eval grid``;
    # relation "*" applies to questions of any other relation or of none.
    gate: str = "none"
    gate_thresholds: tuple[tuple[str, str, float], ...] = ()
    evidence: str = "diverse"
    # Anytime answers on a lazy index: contexts encoded per question before it answers (None: the
    # device's default, see budget_for); ``exact`` encodes every missing context of its articles first.
    budget: int | None = None
    # ... and seconds a question may spend encoding after its floor (None: the device's default, see
    # budget_seconds_for); whichever of the two comes first ends its encoding.
    budget_s: float | None = None
    exact: bool = False
    # Rank only answers of the kind most of the neighbours hold (year, number, month, word...;
    # query/answer_kinds.py); off by default: see docs/evaluation.md#confidence for its measured effect.
    same_kind: bool = False

    # Where the index lives.
    backend: str = "embedded"
    index: Path = Path("bertknn-index")
    opensearch_url: str | None = None
    opensearch_user: str | None = None
    opensearch_password: str | None = field(default=None, repr=False)
    opensearch_ca: Path | None = None
    # Verifying TLS certificates and the index name prefix apply to whichever engine is used.
    opensearch_verify: bool = True
    opensearch_prefix: str = "bertknn"
    elasticsearch_url: str | None = None
    elasticsearch_user: str | None = None
    elasticsearch_password: str | None = field(default=None, repr=False)
    elasticsearch_ca: Path | None = None
    store_dtype: str = "float16"

    # How the work runs.
    device: str = "auto"
    precision: str = "auto"
    runtime: str = "auto"
    batch_size: int | None = None  # None: CPU_BATCH on a CPU, GPU_BATCH on a GPU (see batch_for)
    top: int = 10
    max_article_bytes: int = MAX_ARTICLE_BYTES  # what ``ingest wiki`` and ``add`` read of one article

    def batch_for(self, device_type: str) -> int:
        """The batch size to use on a torch device of type ``device_type`` ("cpu", "cuda", ...)."""
        if self.batch_size is not None:
            return self.batch_size
        return GPU_BATCH if device_type == "cuda" else CPU_BATCH

    def budget_for(self, device_type: str) -> int | None:
        """Contexts a question may encode before it answers on ``device_type``; None: all (exact)."""
        if self.exact:
            return None
        if self.budget is not None:
            return self.budget
        if self.budget_s is not None:
            return UNBOUNDED
        return GPU_BUDGET if device_type == "cuda" else CPU_BUDGET

    def budget_seconds_for(self, device_type: str) -> float | None:
        """Seconds a question may spend encoding before it answers on ``device_type``; None: no bound.

        A budget of contexts given alone (``--budget``) is that many contexts, whatever they take.
        """
        if self.exact:
            return None
        if self.budget_s is not None:
            return self.budget_s
        if self.budget is not None or device_type == "cuda":
            return None
        return CPU_BUDGET_S

    def __post_init__(self) -> None:
        checks = [
            (self.layer >= 1, f"--layer must be >= 1, got {self.layer}"),
            (self.n_articles >= 1, f"--n-articles must be >= 1, got {self.n_articles}"),
            (self.k >= 1, f"-k must be >= 1, got {self.k}"),
            (
                math.isfinite(self.temperature) and self.temperature > 0,
                f"--temperature must be a finite number > 0, got {self.temperature}",
            ),
            (0.0 <= self.lam <= 1.0, f"--lambda must be in [0, 1], got {self.lam}"),
            (self.top >= 1, f"--top must be >= 1, got {self.top}"),
            (
                self.batch_size is None or self.batch_size >= 1,
                f"--batch-size must be >= 1, got {self.batch_size}",
            ),
            (self.budget is None or self.budget >= 1, f"--budget must be >= 1 context, got {self.budget}"),
            (
                self.budget_s is None or 0 < self.budget_s <= 86_400,
                f"--budget-s must be more than 0 and at most 86400 seconds, got {self.budget_s}",
            ),
            (self.max_length >= 8, f"--max-length must be >= 8, got {self.max_length}"),
            (
                self.max_article_bytes >= 1,
                f"--max-article-bytes must be more than 0 bytes, got {self.max_article_bytes}",
            ),
            (self.distance in DISTANCES, f"distance must be one of {DISTANCES}, got {self.distance!r}"),
            (self.mask_policy in MASK_POLICIES, f"mask policy must be one of {MASK_POLICIES}"),
            (self.store_dtype in STORE_DTYPES, f"store dtype must be one of {STORE_DTYPES}"),
            (self.contexts in CONTEXT_MODES, f"--contexts must be one of {CONTEXT_MODES}"),
            (self.precision in PRECISIONS, f"--precision must be one of {PRECISIONS}"),
            (self.runtime in RUNTIMES, f"--runtime must be one of {RUNTIMES}, got {self.runtime!r}"),
            (
                self.cache_size is None or self.cache_size > 0,
                f"--cache-size must be > 0 bytes, got {self.cache_size}",
            ),
            (self.backend in BACKENDS, f"--backend must be one of {BACKENDS}, got {self.backend!r}"),
            (self.gate in GATES, f"--gate must be one of {GATES}, got {self.gate!r}"),
            (self.evidence in EVIDENCE_MODES, f"--evidence must be one of {EVIDENCE_MODES}"),
            (
                all(len(t) == 3 and t[0] in GATES[1:] for t in self.gate_thresholds),
                f"gate thresholds must be (signal, relation, value) with a signal of {GATES[1:]}",
            ),
            (
                all(len(t) == 3 and math.isfinite(t[2]) for t in self.gate_thresholds),
                f"gate thresholds must be finite numbers, got {[t[2] for t in self.gate_thresholds]}",
            ),
            (
                self.gate == "none" or any(t[0] == self.gate for t in self.gate_thresholds),
                f"--gate {self.gate} has no thresholds: learn them with 'eval grid' and pass its"
                " --settings file, or give --gate-threshold",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def replace(self, **changes: Any) -> Config:
        """Return a copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Build a Config from ``BERTKNN_*``/``OPENSEARCH_*`` variables, then ``overrides`` (flags win).

        ``None`` overrides are ignored so that unset CLI flags fall back to the environment.
        """
        values = {name: value for name, (value, _) in env_settings(environ).items()}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def method_settings(self) -> dict[str, Any]:
        """The query-time settings a tuned settings file may set (see ``read_settings_file``)."""
        return {name: getattr(self, name) for name in TUNABLE}

    def with_gate_threshold(self, gate: str, threshold: float) -> Config:
        """A copy with ``gate`` on, using ``threshold`` for every relation (``--gate-threshold``)."""
        if gate == "none":
            raise ConfigError("--gate-threshold needs --gate popularity, top1 or entropy")
        kept = tuple(t for t in self.gate_thresholds if t[0] != gate)
        return self.replace(gate=gate, gate_thresholds=(*kept, (gate, "*", float(threshold))))

    def thresholds(self, signal: str) -> dict[str, float]:
        """Relation -> threshold of gate ``signal`` ("*": any other relation)."""
        return {relation: value for name, relation, value in self.gate_thresholds if name == signal}

    def with_settings_file(self, path: Path) -> Config:
        """Apply a JSON file of tuned settings (as written by ``eval grid``)."""
        return self.replace(**read_settings_file(path))


# The settings a tuned file (from ``eval grid``) may set, with their JSON types.
TUNABLE: dict[str, type] = {
    "n_articles": int,
    "k": int,
    "temperature": float,
    "lam": float,
    "distance": str,
    "use_ir": bool,
    "gate": str,
    "gate_thresholds": dict,
    "evidence": str,
    "budget": int,
    "budget_s": float,
    "exact": bool,
}

# Flags whose name is not the field's with dashes.
FLAGS = {"lam": "--lambda", "k": "-k", "use_ir": "--no-ir", "opensearch_verify": "--insecure"}

# Settings-file keys are the flag names without dashes; each maps to (field, negated): "no-ir": true is
# use_ir false. The field names (which eval grid wrote before) are accepted as well.
SETTINGS_FLAGS: dict[str, tuple[str, bool]] = {
    "n-articles": ("n_articles", False),
    "k": ("k", False),
    "temperature": ("temperature", False),
    "lambda": ("lam", False),
    "distance": ("distance", False),
    "no-ir": ("use_ir", True),
    "gate": ("gate", False),
    "gate-thresholds": ("gate_thresholds", False),
    "evidence": ("evidence", False),
    "budget": ("budget", False),
    "budget-s": ("budget_s", False),
    "exact": ("exact", False),
}
SETTINGS_KEYS = {**SETTINGS_FLAGS, **{name: (name, False) for name in TUNABLE}}


def flag_name(field_name: str) -> str:
    """The command-line flag that sets Config field ``field_name`` (for messages)."""
    return FLAGS.get(field_name, "--" + field_name.replace("_", "-"))


def finite(value: float, what: str) -> float:
    """``value`` as a float when it is a finite number: NaN and ±inf pass range checks (NaN compares false
    with every bound) and JSON parsers (Python's reads ``NaN`` and ``Infinity``), then break the method.

    Raises:
        ConfigError: NaN or infinite, naming ``what``.
    """
    try:
        number = float(value)
    except OverflowError:  # an int past float's range, such as a JSON 1 followed by 400 zeros
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{what} must be a finite number, got {value}")
    return number


def _switch(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"must be true or false, got {text!r}")


# Environment variable -> (Config field, parser). A flag wins over its variable.
ENV_VARS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "BERTKNN_INDEX": ("index", Path),
    "BERTKNN_BACKEND": ("backend", str),
    "BERTKNN_MODEL": ("model", str),
    "BERTKNN_DEVICE": ("device", str),
    "OPENSEARCH_URL": ("opensearch_url", str),
    "OPENSEARCH_USER": ("opensearch_user", str),
    "OPENSEARCH_PASSWORD": ("opensearch_password", str),
    "OPENSEARCH_CA": ("opensearch_ca", Path),
    "OPENSEARCH_VERIFY": ("opensearch_verify", _switch),
    "ELASTICSEARCH_URL": ("elasticsearch_url", str),
    "ELASTICSEARCH_USER": ("elasticsearch_user", str),
    "ELASTICSEARCH_PASSWORD": ("elasticsearch_password", str),
    "ELASTICSEARCH_CA": ("elasticsearch_ca", Path),
    "ELASTICSEARCH_VERIFY": ("opensearch_verify", _switch),
}


def env_settings(environ: Mapping[str, str] | None = None) -> dict[str, tuple[Any, str]]:
    """The Config fields the environment sets: field -> (value, the variable that set it).

    Raises:
        ConfigError: a variable holds a value its setting cannot take.
    """
    env = os.environ if environ is None else environ
    found = {}
    for var, (name, parse) in ENV_VARS.items():
        if env.get(var):
            try:
                found[name] = (parse(env[var]), var)
            except ValueError as exc:
                raise ConfigError(f"{var} {exc}") from None
    return found


def read_settings_file(path: Path) -> dict[str, Any]:
    """The Config fields a tuned settings file sets (keys may be flag names such as ``lambda``).

    Raises:
        ConfigError: the file cannot be read, is not a JSON object, has unknown keys, gives one setting
            twice (``lambda`` and ``lam``), or a value of the wrong JSON type.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read settings file {path}: {exc}") from exc
    allowed = ", ".join(SETTINGS_FLAGS)
    if not isinstance(data, dict):
        raise ConfigError(f"settings file {path} must hold a JSON object of settings ({allowed})")
    unknown = set(data) - set(SETTINGS_KEYS)
    if unknown:
        raise ConfigError(f"settings file {path} has unknown keys {sorted(unknown)}; allowed: {allowed}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        name, negated = SETTINGS_KEYS[key]
        kind = TUNABLE[name]
        # 6 is a fine float, but "12" or 2.5 are not a k, and true (an int in Python) is only a bool.
        accepted = (int, float) if kind is float else (kind,)
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, accepted):
            raise ConfigError(
                f"settings file {path}: {key} must be a JSON {kind.__name__}, got {json.dumps(value)}"
            )
        if kind is float:
            finite(value, f"settings file {path}: {key}")
        if name in values:
            raise ConfigError(f"settings file {path} sets {name} twice; keep one of its keys")
        values[name] = (not value) if negated else value
    if "gate_thresholds" in values:
        values["gate_thresholds"] = thresholds_from_json(values["gate_thresholds"], str(path))
    return values


def thresholds_from_json(data: Mapping[str, Any], where: str) -> tuple[tuple[str, str, float], ...]:
    """``{"popularity": {"P19": 7.1, "*": 6.0}, ...}`` -> sorted (signal, relation, value) triples.

    Raises:
        ConfigError: an unknown signal, or a value that is not a number.
    """
    triples = []
    for signal, by_relation in data.items():
        if signal not in GATES[1:] or not isinstance(by_relation, dict):
            raise ConfigError(
                f"{where}: gate-thresholds maps a signal ({', '.join(GATES[1:])}) to {{relation: threshold}},"
                f" got {signal!r}"
            )
        for relation, value in by_relation.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{where}: gate threshold {signal}/{relation} must be a number")
            triples.append(
                (signal, str(relation), finite(value, f"{where}: gate threshold {signal}/{relation}"))
            )
    return tuple(sorted(triples))


def thresholds_to_json(triples: tuple[tuple[str, str, float], ...]) -> dict[str, dict[str, float]]:
    """The settings-file spelling of ``Config.gate_thresholds``."""
    out: dict[str, dict[str, float]] = {}
    for signal, relation, value in triples:
        out.setdefault(signal, {})[relation] = value
    return out


def settings_file_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Config field -> value, as a settings file spells it (the flag names: ``lambda``, ``no-ir``)."""
    out = {}
    for key, (name, negated) in SETTINGS_FLAGS.items():
        if name in values:
            out[key] = (not values[name]) if negated else values[name]
    if "gate-thresholds" in out:
        out["gate-thresholds"] = thresholds_to_json(out["gate-thresholds"])
    return out
