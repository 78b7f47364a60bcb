"""Where stderr is not a terminal (a pipe, a log), progress is a line every few seconds, never tqdm's
frames joined by carriage returns (issue 52: ``ingest`` and ``add`` wrote them into logs)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tqdm import tqdm

from bertknn_search import progress_lines
from bertknn_search.cli import main
from bertknn_search.config import Config


def test_frames_become_lines_at_most_every_few_seconds_and_the_last_one_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [0.0]
    monkeypatch.setattr(progress_lines.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    lines = progress_lines.Lines(out, every_s=10.0)
    with tqdm(total=1000, desc="ingest", file=lines, mininterval=0, miniters=1) as bar:
        for _ in range(1000):
            clock[0] += 0.05  # 50 s in all
            bar.update(1)
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    shown = text.splitlines()
    assert 5 <= len(shown) <= 7, shown  # the first at once, one each 10 s, and the last
    assert shown[0].startswith("ingest:") and "1000/1000" in shown[-1]


def test_stream_is_stderr_itself_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert progress_lines.stream() is terminal
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert isinstance(progress_lines.stream(), progress_lines.Lines)


def test_ingest_and_add_into_a_pipe_write_lines_not_frames(base_config: Config, tmp_path: Path) -> None:
    source = tmp_path / "input.jsonl"
    rows = [{"id": f"a{i}", "title": f"Vell {i}", "text": f"Vell {i} was born in Ostria."} for i in range(40)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = ["--model", base_config.model, "--device", "cpu", "--max-length", "64", "--precision", "fp32"]
    where = ["--index", str(tmp_path / "index")]
    # No --no-progress: CliRunner's stderr is no terminal, as a pipe or a log file is not.
    for command in (["ingest", "wiki", str(source), *model], ["add", str(source)]):
        result = CliRunner().invoke(main, [*command, *where])
        assert result.exit_code == 0, result.output
        assert "\r" not in result.stderr, result.stderr
        progress = [line for line in result.stderr.splitlines() if "articles" in line and "|" in line]
        assert progress, result.stderr  # the bar's text is there, as lines
