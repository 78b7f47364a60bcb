"""`make test` ends with why tests were skipped, one line per reason (issue 43: `23 skipped` said none)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import skip_reasons


def skipped(reason: str) -> SimpleNamespace:
    return SimpleNamespace(longrepr=("tests/test_x.py", 3, f"Skipped: {reason}"))


def test_skips_are_counted_by_reason_most_first() -> None:
    data = "shared data not found at /x/shared/data: real-data tests skipped"
    reports = [skipped(data), skipped("no Java 17 here"), skipped(data)]
    assert skip_reasons(reports) == [f"2 skipped: {data}", "1 skipped: no Java 17 here"]
    assert skip_reasons([]) == []
