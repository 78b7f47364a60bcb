"""Head detection: whether a checkpoint holds a masked-LM head, from its config and weight names.

A model without one (a sentence encoder such as all-MiniLM-L6-v2) still gives kNN keys; BERT-kNN is then
kNN alone, and every front end says so instead of ranking with a randomly initialised head.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from bertknn_search.encoding.model_lookup import config_path

# Architectures whose checkpoints carry a masked-LM head (``BertForPreTraining`` holds BERT's as well).
# Any other named architecture (``BertModel``, ``BertForSequenceClassification``) has none.
MLM_ARCHITECTURE_MARKS = ("MaskedLM", "ForPreTraining")
# Weight names of masked-LM heads (BERT and ALBERT's ``predictions``, RoBERTa's ``lm_head``, DistilBERT's
# ``vocab_projector``), for telling from a checkpoint's file alone whether it holds one.
HEAD_WEIGHT_MARKS = ("cls.predictions.", "lm_head.", "predictions.", "vocab_projector.", "vocab_transform.")


def architectures_have_head(architectures: Sequence[str] | None) -> bool | None:
    """What a config's ``architectures`` say of an MLM head: True, False, or None when it names none."""
    if not architectures:
        return None
    return any(mark in name for name in architectures for mark in MLM_ARCHITECTURE_MARKS)


def model_has_head(name: str) -> bool | None:
    """Whether model ``name``'s files on disk hold a masked-LM head, read without loading it (for ``stats``).

    The config's ``architectures`` decide a "no"; a "yes" is checked against the weight names in a
    safetensors file when there is one (a ``BertForMaskedLM`` config over encoder-only weights is a no).

    Returns:
        True or False; None when the config is not on disk here or names no architecture.
    """
    config = config_path(name)
    if config is None:
        return None
    try:
        verdict = architectures_have_head(json.loads(config.read_text(encoding="utf-8")).get("architectures"))
    except (OSError, ValueError, AttributeError):
        return None
    weights = config.parent / "model.safetensors"
    if verdict and weights.is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(weights), framework="numpy") as handle:
                keys = list(handle.keys())
        except (OSError, ValueError, RuntimeError):
            return verdict
        return any(mark in key for key in keys for mark in HEAD_WEIGHT_MARKS)
    return verdict


def no_head_line(model: str, why: str) -> str:
    """The one line said when a model without an MLM head is loaded."""
    return (
        f"model {model} has no masked-LM head ({why}): answers are kNN alone"
        " (docs/reproducing.md#real-weights)"
    )
