"""docs/serving.md's headless screenshot of the page works as written: run against a live ``serve``, it
exits within its bound and leaves a picture (issue 52: ``chromium --headless --screenshot`` hung)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_server_process import Served, live  # noqa: F401  (the live server, a fixture)

pytestmark = pytest.mark.slow
DOC = Path(__file__).resolve().parents[1] / "docs" / "serving.md"


def documented_command() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("**A screenshot of the page, headless.**") :]
    match = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert match is not None, "docs/serving.md has no command under its screenshot paragraph"
    return match.group(1)


def test_the_documented_screenshot_command_works(live: Served, tmp_path: Path) -> None:  # noqa: F811
    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (make browser)")
    command = documented_command()
    assert "timeout " in command and "127.0.0.1:8000" in command and "page.png" in command
    command = command.replace("http://127.0.0.1:8000", live.url).replace(
        "page.png", str(tmp_path / "page.png")
    )
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    picture = (tmp_path / "page.png").read_bytes()
    assert picture.startswith(b"\x89PNG\r\n\x1a\n") and len(picture) > 10_000
