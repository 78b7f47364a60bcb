"""Maven, as this project runs it: the engines' jars (``nodes.jars``) and the models' jars (``models.get``).

One way to run it: from Maven Central alone (``maven-settings.xml`` mirrors every repository there), into
Maven's own repository under $HOME, with progress said the same way for both (a bar on a terminal, else a
line every 10 s, then what was fetched and how long it took) and one-line errors. Nothing here imports the
rest of the package.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

FETCH_EVERY_S = 10.0  # without a terminal, how often a fetch says how far it is
# Maven's "Downloaded from central: URL (1.2 MB at 3.4 MB/s)", "[INFO] "-prefixed in batch mode (-B)
DOWNLOADED = re.compile(r"^(?:\[INFO\] )?Downloaded from .*\((\d+(?:\.\d+)?) (B|kB|KB|MB|GB) at ")
UNIT = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000**2, "GB": 1000**3}
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"  # the version the poms use
Say = Callable[[str], None]


class MavenError(Exception):
    """Maven is missing or could not fetch; the message is one line that says what to do."""


def settings() -> bytes:
    """The settings every run uses: every repository a pom names is read from Maven Central only."""
    return files("bertknn_search").joinpath("maven-settings.xml").read_bytes()


def maven_repository() -> Path:
    """Maven's own copy of what it fetched, under the HOME this user has ($HOME, not the account's
    home that Maven would read from the password database)."""
    return Path.home() / ".m2" / "repository"


def artifact_path(coordinates: str, extension: str = "jar") -> Path:
    """Where ``group:artifact:version`` lies in Maven's repository once fetched."""
    group, artifact, version = coordinates.split(":")
    folder = maven_repository().joinpath(*group.split("."), artifact, version)
    return folder / f"{artifact}-{version}.{extension}"


def find_mvn(what: str) -> str:
    """The ``mvn`` on PATH.

    Raises:
        MavenError: none, saying what it is needed for (``what``: "the engine's jars").
    """
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(
            f"Maven ('mvn') is needed once to fetch {what} from Maven Central;"
            " install it (e.g. 'apt-get install maven') and run the command again"
        )
    return mvn


def run(
    args: list[str], work: Path, what: str, say: Say, progress: bool = True, watch: Path | None = None
) -> None:
    """Run ``mvn -B -s <settings> ARGS`` in ``work`` (which gets the settings file), saying progress.

    Args:
        what: what is fetched, for the messages ("the OpenSearch jars").
        progress: a bar on a terminal (else a line every 10 s) while Maven downloads.
        watch: a folder a single large download grows in (Maven says a file's size only once it is
            done): its growth is the progress meanwhile.

    Raises:
        MavenError: Maven is missing or failed (Maven Central unreachable, a bad checksum, ...).
    """
    mvn = find_mvn(what)
    work.mkdir(parents=True, exist_ok=True)
    (work / "maven-settings.xml").write_bytes(settings())
    command = [
        mvn, "-B", "-s", str(work / "maven-settings.xml"), f"-Dmaven.repo.local={maven_repository()}", *args
    ]  # fmt: skip
    report = _Progress(say, progress)
    stop = threading.Event()
    watcher = None
    if watch is not None:
        watcher = threading.Thread(target=_watch, args=(watch, report, stop), daemon=True)
        watcher.start()
    lines: list[str] = []
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            match = DOWNLOADED.match(line)
            if match is not None:
                report.done(float(match.group(1)) * UNIT[match.group(2)])
        code = proc.wait()
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
        report.close()
    if code != 0:
        errors = [ln for ln in lines if "ERROR" in ln] or lines or ["no output"]
        raise MavenError(
            f"Maven could not fetch {what}: {errors[0].strip()[:300]}"
            " (Maven Central must be reachable; run again to retry)"
        )
    say(
        f"fetched {report.count} files, {report.size / 1e6:.1f} MB in {report.took:.0f} s"
        " (what Maven's own copy held already is not counted)"
    )


class _Progress:
    """Downloads so far, shown as a bar on a terminal or as a line every ``FETCH_EVERY_S`` seconds."""

    def __init__(self, say: Say, progress: bool) -> None:
        self.say = say
        self.count, self.size, self.growing = 0, 0.0, 0.0
        self.started = self.last = time.monotonic()
        self.lock = threading.Lock()
        self.bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(desc="fetched", unit="B", unit_scale=True, file=sys.stderr)

    @property
    def took(self) -> float:
        return time.monotonic() - self.started

    def done(self, size: float) -> None:
        """A file Maven finished downloading (its partial growth, if watched, is replaced by its size)."""
        with self.lock:
            self.count, self.size, self.growing = self.count + 1, self.size + size, 0.0
            self._show()

    def grew(self, size: float) -> None:
        """How far the watched file is."""
        with self.lock:
            self.growing = size
            self._show()

    def _show(self) -> None:
        total = self.size + self.growing
        if self.bar is not None:
            self.bar.update(total - self.bar.n)
        elif time.monotonic() - self.last >= FETCH_EVERY_S:
            self.last = time.monotonic()
            self.say(f"fetched {self.count} files, {total / 1e6:.1f} MB so far")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _watch(folder: Path, report: _Progress, stop: threading.Event) -> None:
    """Report the bytes of the files that appear in ``folder`` (Maven's partial download) until ``stop``."""
    before = _sizes(folder)
    while not stop.wait(1.0):
        now = _sizes(folder)
        grown = sum(size for name, size in now.items() if name not in before)
        if grown >= 1e6:  # a download, not the small records Maven writes beside the files
            report.grew(grown)


def _sizes(folder: Path) -> dict[str, int]:
    try:
        return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
    except OSError:
        return {}
