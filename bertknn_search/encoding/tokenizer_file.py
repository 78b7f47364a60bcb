"""A checkpoint's tokenizer.json run by the ``tokenizers`` library, with the calls this project makes of
transformers' fast tokenizer (which wraps the same library, so the ids, offsets and words are the same).

Used with the plain-torch runtime (``bert_torch``): importing transformers' tokenizer classes costs a warm
question about a second; ``tokenizers`` a tenth of it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SPECIAL_NAMES = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# BERT's, for a checkpoint whose tokenizer files name none.
DEFAULT_SPECIALS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


class Encoded(dict[str, Any]):
    """``input_ids`` (and ``offset_mapping`` when asked) of one text or of several, and ``word_ids(i)``."""

    def __init__(self, encodings: Sequence[Any], single: bool, offsets: bool) -> None:
        pick = (lambda values: values[0]) if single else (lambda values: values)
        super().__init__(input_ids=pick([e.ids for e in encodings]))
        if offsets:
            self["offset_mapping"] = pick([e.offsets for e in encodings])
        self._encodings = encodings

    def word_ids(self, index: int = 0) -> list[int | None]:
        return list(self._encodings[index].word_ids)


class FileTokenizer:
    """transformers' fast-tokenizer interface, as far as this project uses it, over ``tokenizer.json``."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # A tokenizer.json may carry its own truncation and padding (all-MiniLM-L6-v2's: 128); transformers
        # turns both off unless a call asks, and so does this.
        self._tok.no_truncation()
        self._tok.no_padding()
        names = _special_tokens(folder)
        self.unk_token, self.sep_token, self.pad_token = (
            names["unk_token"],
            names["sep_token"],
            names["pad_token"],
        )
        self.cls_token, self.mask_token = names["cls_token"], names["mask_token"]
        self.model_max_length = _model_max_length(folder)
        found = (self._tok.token_to_id(names[name]) for name in SPECIAL_NAMES)
        self.all_special_ids = list(dict.fromkeys(i for i in found if i is not None))

    def _id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id(self.unk_token)

    @property
    def sep_token_id(self) -> int | None:
        return self._id(self.sep_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    @property
    def cls_token_id(self) -> int | None:
        return self._id(self.cls_token)

    @property
    def mask_token_id(self) -> int | None:
        return self._id(self.mask_token)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=False))

    def __call__(
        self,
        text: str | Sequence[str],
        add_special_tokens: bool = True,
        truncation: bool = False,
        return_offsets_mapping: bool = False,
    ) -> Encoded:
        if truncation:
            raise ValueError("FileTokenizer does not truncate: the encoder windows or refuses long input")
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        encodings = self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        return Encoded(encodings, single, return_offsets_mapping)

    def tokenize(self, text: str) -> list[str]:
        return list(self._tok.encode(text, add_special_tokens=False).tokens)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tok.get_vocab(with_added_tokens=True))

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        if isinstance(tokens, str):
            found = self._id(tokens)
            return found if found is not None else int(self.unk_token_id or 0)
        return [int(self.convert_tokens_to_ids(t)) for t in tokens]  # type: ignore[arg-type]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        if isinstance(ids, int):
            return str(self._tok.id_to_token(ids))
        return [str(self._tok.id_to_token(int(i))) for i in ids]

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        decoder = self._tok.decoder
        return decoder.decode(list(tokens)) if decoder is not None else " ".join(tokens)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _special_tokens(folder: Path) -> dict[str, str]:
    """The special tokens' strings, as transformers reads them: tokenizer_config.json, then
    special_tokens_map.json, then BERT's."""
    names = dict(DEFAULT_SPECIALS)
    for source in ("special_tokens_map.json", "tokenizer_config.json"):
        for key, value in _read_json(folder / source).items():
            if key in SPECIAL_NAMES:
                content = value.get("content") if isinstance(value, dict) else value
                if isinstance(content, str):
                    names[key] = content
    return names


def _model_max_length(folder: Path) -> int:
    value = _read_json(folder / "tokenizer_config.json").get("model_max_length")
    return int(value) if isinstance(value, (int, float)) else int(1e30)
