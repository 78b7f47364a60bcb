"""Docs: every CLI command has help with an example and appears in the README or docs/, and every
section the README once held is still on a page that mkdocs.yml's nav (or the README) reaches."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import ENV_VARS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# The README's sections before the reference moved to docs/ (issue 27, item 8): each must stay a heading
# of the README or of a docs page.
SECTIONS = [
    "Two commands",
    "Using it on Wikipedia with BERT-base",
    "CLI reference",
    "Serving",
    "The method, and the choices made",
    "Adaptive retrieval and evidence",
    "Contexts on demand (lazy datastore)",
    "Cold questions: anytime answers",
    "Backends",
    "OpenSearch and Elasticsearch",  # was "OpenSearch", before the Elasticsearch backend
    "Evaluation",
    "Reproducing the paper",
    "Real weights",
    "Reliability",
    "Performance",
    "Tests",
    "Dependencies and why",
    "Layout",
]


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def documentation() -> str:
    """The README and every docs page: where commands and variables must be documented."""
    return "\n".join(p.read_text(encoding="utf-8") for p in [README, *pages()])


def headings(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def nav_pages() -> list[str]:
    """The files mkdocs.yml's nav names, at any depth."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"

    def walk(item: object) -> list[str]:
        if isinstance(item, str):
            return [item]
        if isinstance(item, dict):
            return [f for v in item.values() for f in walk(v)]
        if isinstance(item, list):
            return [f for v in item for f in walk(v)]
        return []

    return walk(config["nav"])


def commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under ``group``, as the words that name it."""
    found = []
    for name, cmd in group.commands.items():
        found.append((*prefix, name))
        if isinstance(cmd, click.Group):
            found += commands(cmd, (*prefix, name))
    return found


def test_every_command_has_help_with_an_example_and_is_in_the_docs() -> None:
    docs = documentation()
    paths = commands(main)
    assert {" ".join(p) for p in paths} >= {
        "ingest wiki",
        "add",
        "query",
        "stats",
        "eval run",
        "eval grid",
        "demo",
    }
    for path in paths:
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, path
        assert "Example: bertknn-search " in result.output, path
        assert f"bertknn-search {' '.join(path)}" in docs, path


def test_every_environment_variable_is_documented() -> None:
    docs = documentation()
    for var in ENV_VARS:
        assert f"`{var}`" in docs, var


def test_every_section_of_the_old_readme_is_still_a_heading_somewhere() -> None:
    found = headings(README).union(*(headings(p) for p in pages()))
    assert [s for s in SECTIONS if s not in found] == []


def test_every_docs_page_is_in_the_nav_and_linked_from_the_readme() -> None:
    names = [p.name for p in pages()]
    assert "index.md" in names
    nav = nav_pages()
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    assert sorted(nav) == names
    readme = README.read_text(encoding="utf-8")
    assert [n for n in names if n != "index.md" and f"](docs/{n})" not in readme] == []
    # Relative links in the README resolve.
    for target in re.findall(r"\]\(((?!https?://)[^)#]+)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).exists(), target
