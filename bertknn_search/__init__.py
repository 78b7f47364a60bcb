"""bertknn-search: cloze question answering with BERT-kNN (Kassner & Schütze, 2020)."""

import os

from bertknn_search import interrupts

if interrupts.started_as_cli():  # a Ctrl-C during the CLI's imports ends in its clean line, not a traceback
    interrupts.note_from_start()

# OpenMP threads that wait for work spin on their core by default; beside another busy process on the
# same cores (an ingest beside a server, two ingests) that made each several times slower. Sleeping
# waits cost little alone. libgomp reads this when torch loads it, so it is set before any torch import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bertknn_search.config import Config

__all__ = ["Config"]
__version__ = "0.1.0"
