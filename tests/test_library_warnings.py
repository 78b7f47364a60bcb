"""Library warnings a user cannot act on stay off stderr; the one that matters is said once, in our words."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# What an ingest may print on stderr: the encoder line, the progress bar and its time estimate.
OWN_LINES = ("encoder: ", "ingest: ", "~")


def test_a_long_sentence_is_windowed_without_the_tokenizers_warning(tiny_model: Path, tmp_path: Path) -> None:
    # The tokenizer knows the model's limit, as a real checkpoint's does; it warns on any longer input.
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    settings = model / "tokenizer_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "model_max_length": 64}))
    long_sentence = " ".join(["Zorblat was born in Quenton and"] * 20) + " Mirvane was born in Quenton."
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "1", "title": "Zorblat", "text": long_sentence},
        {"id": "2", "title": "Mirvane", "text": "Mirvane was born in Quenton."},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    command = [sys.executable, "-m", "bertknn_search", "ingest", "wiki", str(corpus), "--model", str(model)]
    command += [
        "--index",
        str(tmp_path / "idx"),
        "--device",
        "cpu",
        "--max-length",
        "64",
        "--contexts",
        "eager",
    ]
    env = {**os.environ, "COLUMNS": "120"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stderr.replace("\r", "\n").splitlines() if line.strip()]
    # The bar comes first (a lazy ingest shows it within a second), then the encoder's line.
    assert any(line.startswith("encoder: ") for line in lines[:3])
    # Not "Token indices sequence length is longer than the specified maximum sequence length ...".
    strays = [line for line in lines if not line.startswith(OWN_LINES)]
    assert not strays, strays
    assert "Token indices" not in done.stderr
    assert done.stdout.startswith("ingested 2 articles")
    assert "; 1 sentence longer than --max-length (64 tokens) encoded as windows" in done.stdout
