"""Ingest progress on stderr: articles (of the total when known), contexts while encoded, an estimate."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from bertknn_search import progress_lines
from bertknn_search.ingest.readers import InputMeter

_KNOWN = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} articles [{elapsed}<{remaining}{postfix}]"
_UNKNOWN = "{desc}: {n_fmt} articles [{elapsed}{postfix}]"
_BYTES = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}B/{total_fmt}B read [{elapsed}<{remaining}{postfix}]"


class Progress:
    """What a running ingest shows; nothing at all when disabled.

    The bar counts articles read. Its rates and context count move with every encoder batch, so a
    chunk of many contexts (one huge article) still shows progress while it is encoded. After the
    second chunk that had contexts to encode (the first one also loads the model), one line estimates
    the time left, or the time per 1,000 articles when the total is not known.

    Without a total of articles (no ``--limit``) but with the input's size (``meter``), the bar runs over
    the bytes of the input read, so it has a total and an estimate from the start. A lazy ingest encodes
    nothing: its bar counts articles and text, not contexts.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        device: str,
        enabled: bool,
        meter: InputMeter | None = None,
        lazy: bool = False,
        started: float | None = None,
    ) -> None:
        self._device = device
        self._enabled = enabled
        self._meter = meter if not total and meter is not None and meter.total else None
        self._lazy = lazy
        self._articles = 0
        self._chars = 0
        self._bar = tqdm(
            desc=label,
            total=total or (self._meter.total if self._meter else None),
            disable=not enabled,
            dynamic_ncols=True,
            file=progress_lines.stream(),
            bar_format=_KNOWN if total else (_BYTES if self._meter else _UNKNOWN),
            unit_scale=self._meter is not None,
        )
        self._total = total
        # From when the run began (its first chunk is read before the bar exists): rates stay honest.
        self._started = time.perf_counter() if started is None else started
        self._contexts = 0  # encoded in finished chunks
        self._chunk = (0, 0)  # contexts encoded so far and in all, of the chunk being encoded
        self._written = 0  # articles encoded
        self._window: tuple[float, int] | None = None  # when the estimate's window opened, contexts then
        self._estimated = False

    def on(self, device: str) -> None:
        """Where the contexts are encoded, once known (the bar is shown before the model's libraries load)."""
        self._device = device

    def write(self, line: str) -> None:
        """A line on stderr above the bar, which is drawn again below it."""
        self._bar.write(line, file=sys.stderr)

    def start_chunk(self, contexts: int) -> None:
        """A chunk of ``contexts`` masked rows starts being encoded."""
        self._chunk = (0, contexts)
        self._show()

    def encoded(self, rows: int) -> None:
        """The encoder finished a batch of ``rows`` rows of the current chunk."""
        done, size = self._chunk
        self._chunk = (done + rows, size)
        self._show()

    def end_chunk(self, articles: int, written: int, contexts: int, chars: int = 0) -> None:
        """A chunk is done: ``articles`` read, ``written`` of them stored (``chars`` of text), with
        ``contexts`` contexts encoded."""
        self._chunk = (0, 0)
        self._contexts += contexts
        self._written += written
        self._articles += articles
        self._chars += chars
        if not self._enabled:
            return
        # Shown by _show, with the finished chunk's postfix.
        self._bar.n = self._meter.done if self._meter else self._articles
        self._show()
        if contexts:
            self._maybe_estimate()

    def close(self) -> None:
        self._bar.close()

    def _show(self) -> None:
        if not self._enabled:
            return
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        done, size = self._chunk
        contexts = self._contexts + done
        parts = [f"{self._articles:,} articles"] if self._meter else []
        parts.append(f"{_rate(self._articles / elapsed)} articles/s")
        if self._lazy:
            # Nothing is encoded: what the run does is read, index and store text.
            parts += [f"{self._chars / 1e6:,.1f} MB of text", "contexts encoded on first use"]
        else:
            parts += [f"{contexts:,} contexts", f"{_rate(contexts / elapsed)} contexts/s"]
        if size:
            parts.append(f"encoding {done:,}/{size:,}")
        self._bar.set_postfix_str(", ".join(parts), refresh=True)

    def _maybe_estimate(self) -> None:
        now = time.perf_counter()
        if self._window is None:
            self._window = (now, self._contexts)
            return
        if self._estimated or self._meter is not None:
            return  # the bar over the input's bytes estimates the time left itself
        self._estimated = True
        opened, before = self._window
        rate = (self._contexts - before) / max(now - opened, 1e-9)
        per_article = self._contexts / max(self._written, 1)
        head = f"~{_rate(rate)} contexts/s on {self._device}; about"
        left = max(self._total - self._bar.n, 0) if self._total else 0
        if left:
            line = f"{head} {_duration(left * per_article / rate)} for the remaining {left:,} articles"
        elif self._total:
            return  # all read: nothing left to estimate
        else:
            line = f"{head} {_duration(1000 * per_article / rate)} per 1,000 articles"
        self._bar.write(line, file=sys.stderr)


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _duration(seconds: float) -> str:
    """A rough human duration: the estimate is only good to its first digit or two."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
