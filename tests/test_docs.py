"""What a reader of the documentation relies on: README.md is a front page, every link of the docs leads somewhere,
README's Layout draws the tree git tracks, BENCHMARKS.md's results are where it says, and the code's prose says what
and why, not when or where a figure came from. (That README's commands run is tests/test_readme.py's.)"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.hooks import SPEEDUPS
from tests.helpers.workflow import REPO

README = (REPO / "README.md").read_text()
BENCHMARKS = (REPO / "BENCHMARKS.md").read_text()
DOCS = [REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")  # [text](target)
EVIDENCE_COMMIT = "332fd96"  # the commit BENCHMARKS.md cites for results that left the tree


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)


def in_a_git_checkout() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: git cannot say what is tracked")


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_the_readme_is_a_front_page_that_links_each_detail_in_docs():
    assert len(README) <= 20_000, len(README)
    linked = set(re.findall(r"\(docs/([\w-]+\.md)", README))
    assert linked == {path.name for path in (REPO / "docs").glob("*.md")}  # every page of docs/, one hop away


@pytest.mark.parametrize("page", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_link_of_the_docs_leads_to_a_file_or_heading_that_exists(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"https?://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and anchor not in anchors(file.read_text()):
            broken.append(target)
    assert broken == []


def layout_paths() -> list[str]:
    """The path each line of README's Layout tree names (an indented line's under the last unindented one)."""
    section = README.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    tree = re.search(r"```\n(.*?)```", section, re.S)[1]
    paths, parent = [], ""
    for line in tree.splitlines():
        name = line.split()[0]
        if line.startswith(" "):
            paths.append(f"{parent.rstrip('/')}/{name}")
        else:
            paths.append(name)
            parent = name
    return paths


def test_the_layout_draws_every_top_level_entry_git_tracks_and_only_paths_that_exist():
    in_a_git_checkout()
    tracked = {path.split("/", 1)[0] for path in git("ls-files").stdout.splitlines()}
    paths = layout_paths()
    drawn = {path.split("/", 1)[0] for path in paths}
    assert tracked - drawn == set(), f"README's Layout does not draw {sorted(tracked - drawn)}"
    assert drawn - tracked == set(), f"README's Layout draws {sorted(drawn - tracked)}, which git does not track"
    concrete = [path for path in paths if "<" not in path]  # rules/<stage>.smk and kin stand for several
    assert [path for path in concrete if not (REPO / path).exists()] == []


def test_the_scripts_are_thin_entry_points_that_share_code_only_through_the_package():
    for script in sorted((REPO / "scripts").glob("*.py")):
        tree = ast.parse(script.read_text())
        functions = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
        assert functions == ["main"], script.name
        imported = {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert imported <= {"pathlib", "rfdetr_coco_pipeline"}, (script.name, imported)
    package = REPO / "src" / "rfdetr_coco_pipeline"
    for path in sorted(package.rglob("*.py")):
        modules = [node.module for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)]
        assert not [module for module in modules if module and module.split(".")[0] in ("scripts", "tests", "bench")]


def prose(path: Path) -> Iterator[str]:
    """The comments and docstrings of a Python file."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if text := ast.get_docstring(node):
                yield text


HISTORY = re.compile(r"tests/test_\w+|bench/results|BENCHMARKS\.md|\b20\d\d-\d\d-\d\d\b|\b\d+(\.\d+)? ?(s|ms|h)\b")


def test_the_production_code_says_what_and_why_without_timings_dates_results_or_test_paths():
    found = [
        f"{path.relative_to(REPO)}: {match[0]!r} in {text[:80]!r}"
        for folder in ("src", "scripts")
        for path in sorted((REPO / folder).rglob("*.py"))
        for text in prose(path)
        if (match := HISTORY.search(text))
    ]
    assert found == []


BENCHMARKS_FOLDER = re.compile(r"`(\d{4}-\d{2}-\d{2}[\w-]*)/`")


def test_benchmarks_results_are_in_the_tree_or_at_the_commit_it_cites_and_nothing_else_is_kept():
    in_a_git_checkout()
    results = REPO / "bench" / "results"
    named = set(BENCHMARKS_FOLDER.findall(BENCHMARKS))
    kept = {path.name for path in results.iterdir() if path.is_dir()}
    assert kept and kept <= named, f"bench/results keeps folders BENCHMARKS.md does not name: {sorted(kept - named)}"
    if git("cat-file", "-e", f"{EVIDENCE_COMMIT}^{{commit}}").returncode != 0:
        pytest.skip(f"a shallow checkout without {EVIDENCE_COMMIT}: the cited folders cannot be looked up")
    cited = named - kept
    missing = [f for f in cited if git("cat-file", "-e", f"{EVIDENCE_COMMIT}:bench/results/{f}/NOTES.md").returncode]
    assert missing == [], f"BENCHMARKS.md names results that are neither here nor at {EVIDENCE_COMMIT}"


def test_bench_results_hold_raw_results_only_and_few_of_them():
    files = [path for path in (REPO / "bench" / "results").rglob("*") if path.is_file()]
    assert len(files) <= 250
    assert [path.name for path in files if path.suffix in (".py", ".sh")] == []  # tools live in bench/, tested


def test_every_speedup_has_its_row_in_benchmarks_each_lever():
    levers = BENCHMARKS.split("\n## Each lever\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in levers.splitlines() if line.startswith("| `")]
    assert [s.name for s in SPEEDUPS if not any(f"`{s.name}`" in row.split(" | ")[0] for row in rows)] == []
