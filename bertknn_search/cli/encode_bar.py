"""A progress bar on stderr for a lazy index's encoding, so a cold question never waits in silence."""

from __future__ import annotations

from tqdm import tqdm

from bertknn_search.records import EncodeProgress

# Units per second however slow (tqdm's default turns to "12.5s/ contexts" below one a second).
ENCODE_BAR = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}]"


class EncodeBar:
    """``EncodeHooks.progress`` for a terminal: one bar per encoding call, closed when it completes.

    It reads "encoding 1,024 of 8,951 contexts of 'Albert Einstein'" with tqdm's rate and time left.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar: tqdm | None = None

    def __call__(self, progress: EncodeProgress) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            names = ", ".join(repr(t) for t in progress.titles[:3])
            more = f" and {len(progress.titles) - 3} more" if len(progress.titles) > 3 else ""
            of = f" of {progress.total:,}" if progress.total > progress.todo else ""
            self._bar = tqdm(
                total=progress.todo,
                desc=f"encoding {progress.todo:,}{of} contexts of {names}{more}",
                unit=" contexts",
                bar_format=ENCODE_BAR,
                dynamic_ncols=True,
                leave=False,
                disable=None,  # a terminal only: piped or captured stderr stays clean
            )
        self._bar.update(progress.done - self._bar.n)
        if progress.done >= progress.todo:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
