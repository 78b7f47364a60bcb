"""bertknn-search: cloze question answering with BERT-kNN (Kassner & Schütze, 2020)."""

from bertknn_search.config import Config

__all__ = ["Config"]
__version__ = "0.1.0"
