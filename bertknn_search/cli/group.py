"""The main group's behaviour: library errors as one line (exit 1), Ctrl-C and SIGTERM as what was kept
and how to resume (exit 130 and 143)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import click

from bertknn_search import interrupts
from bertknn_search.errors import BertKnnError, Terminated
from bertknn_search.output import counted

RESUME_HINT = "nothing half-written is kept: run the same command again to resume"


def interrupted_line(exc: KeyboardInterrupt) -> str:
    """What Ctrl-C or SIGTERM left: what was kept, and how to go on."""
    how = "terminated" if _terminated(exc) else "interrupted"
    kept = getattr(exc, "kept", None)
    if kept is None:
        return f"{how}; {RESUME_HINT}"
    what = f"kept {counted(kept, 'article')} already written" if kept else "nothing was written yet"
    return f"{how}; {what}; {RESUME_HINT}"


def _terminated(exc: KeyboardInterrupt) -> bool:
    """Whether a stop came from SIGTERM (``Terminated``, or an interrupt that a run re-raised marked so)."""
    return isinstance(exc, Terminated) or bool(getattr(exc, "terminated", False))


class Group(click.Group):
    """Turns library errors into one-line messages (exit 1), Ctrl-C and SIGTERM into what was kept and
    how to resume (exit 130 and 143)."""

    process = False  # whether main() runs as the program itself, not in a test's CliRunner (see _leave)

    def main(self, args: Any = None, *rest: Any, **extra: Any) -> Any:
        # The console script calls main() with no arguments; CliRunner always passes a list.
        self.process = args is None
        return super().main(args, *rest, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        previous = None
        try:
            interrupts.startup_over()  # raises a Ctrl-C that came during the imports
            previous = _terminate_as_interrupt()
            return super().invoke(ctx)
        except BertKnnError as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt as exc:
            click.echo(f"\n{interrupted_line(exc)}", err=True)
            sys.exit(143 if _terminated(exc) else 130)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def defer_interrupts() -> None:
    """For the rest of the current command: Ctrl-C and SIGTERM stop the run at its next safe point, never
    inside a native library's callback (``interrupts``); the command's context ends the deferral, and a
    signal that came after the last safe point is raised then (a late Ctrl-C still exits 130)."""
    click.get_current_context().with_resource(interrupts.deferred())


def _terminate_as_interrupt() -> Any:
    """SIGTERM raises ``Terminated`` in the main thread: a run stops as on Ctrl-C, its worker processes
    and files closed, instead of dying with semaphores left behind. Returns the handler it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminate(signum: int, frame: Any) -> None:
        raise Terminated

    return signal.signal(signal.SIGTERM, terminate)
