"""What the documentation points at exists: every test that README.md, the speedup registry and the docstrings of
the workflow's Python (scripts/, pipeline/, rfdetr_coco_pipeline.hooks/, bench/) name is a test file in tests/ and, where a
function is named, a test function defined in it (parametrized where a parameter is named); and README's Layout
draws every top-level entry git tracks, and only paths that exist."""

from __future__ import annotations

import ast
import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rfdetr_coco_pipeline.hooks import SPEEDUPS
from tests.helpers.workflow import REPO

README = (REPO / "README.md").read_text()
DOCUMENTED = ("scripts", "pipeline", "rfdetr_coco_pipeline.hooks", "bench")
# `tests/test_x.py`, `test_x.py::test_name` or `tests/test_x.py::test_name[param]`
REFERENCE = re.compile(r"(?<![\w./])(?:tests/)?(test_\w+\.py)(?:::(test_\w+)(?:\[([^\]\s`]+)\])?)?")


def docstrings(path: Path) -> Iterator[str]:
    """The docstrings of a module, its classes and its functions."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if text := ast.get_docstring(node):
                yield text


def references() -> Iterator[tuple[str, re.Match[str]]]:
    """(where, the reference) for each test reference of README.md, the registry and the docstrings."""
    for match in REFERENCE.finditer(README):
        yield "README.md", match
    for speedup in SPEEDUPS:
        match = REFERENCE.fullmatch(speedup.test)
        assert match, f"SPEEDUPS[{speedup.name}].test is not a tests/test_*.py::test_name reference: {speedup.test}"
        yield f"SPEEDUPS[{speedup.name}].test", match
    for folder in DOCUMENTED:
        for path in sorted((REPO / folder).rglob("*.py")):
            for text in docstrings(path):
                for match in REFERENCE.finditer(text):
                    yield str(path.relative_to(REPO)), match


@functools.cache
def functions_in(file: str) -> dict[str, ast.FunctionDef] | None:
    """The test functions defined in tests/`file`, by name; None when there is no such file."""
    path = REPO / "tests" / file
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text())
    return {
        node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


def is_parametrized(function: ast.FunctionDef) -> bool:
    return any("parametrize" in ast.unparse(decorator) for decorator in function.decorator_list)


def test_every_test_the_docs_name_exists():
    found = list(references())
    assert len(found) > 50  # the README's tables alone name more
    broken = []
    for where, match in found:
        file, name, parameter = match.groups()
        functions = functions_in(file)
        if functions is None:
            broken.append(f"{where}: {match[0]}: there is no tests/{file}")
        elif name and name not in functions:
            broken.append(f"{where}: {match[0]}: tests/{file} defines no {name}")
        elif parameter and not is_parametrized(functions[name]):
            broken.append(f"{where}: {match[0]}: {name} is not parametrized")
    assert broken == [], "\n".join(broken)


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
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: git ls-files cannot say what is tracked")
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    tracked = {path.split("/", 1)[0] for path in listed.splitlines()}
    paths = layout_paths()
    drawn = {path.split("/", 1)[0] for path in paths}
    assert tracked - drawn == set(), f"README's Layout does not draw {sorted(tracked - drawn)}"
    assert drawn - tracked == set(), f"README's Layout draws {sorted(drawn - tracked)}, which git does not track"
    concrete = [path for path in paths if "<" not in path]  # rules/<stage>.smk and kin stand for several
    assert [path for path in concrete if not (REPO / path).exists()] == []


def test_the_stage_modules_import_no_other_stage_and_the_shared_packages_import_no_stage():
    """README's Layout: scripts/ holds the stages, which share code only through pipeline/ and rfdetr_coco_pipeline.hooks/."""
    offending = []
    for package in ("scripts", "pipeline", "rfdetr_coco_pipeline.hooks"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                offending += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[0] == "scripts"]
    assert offending == []


BENCHMARKS = (REPO / "BENCHMARKS.md").read_text()
# `BENCHMARKS.md "Each lever"` or `BENCHMARKS.md, "Tools"`: a section of it, named by the start of its heading
BENCHMARKS_SECTION = re.compile(r'BENCHMARKS\.md,? "([^"]+)"')
TEXT_FILES = ("README.md", "config.yaml", "Snakefile", "rules/*.smk", *(f"{folder}/**/*.py" for folder in DOCUMENTED))


def test_every_benchmarks_section_the_docs_and_code_name_is_a_heading_of_it():
    headings = [line.lstrip("#").strip() for line in BENCHMARKS.splitlines() if line.startswith("#")]
    named = [
        (str(path.relative_to(REPO)), match[1])
        for pattern in TEXT_FILES
        for path in sorted(REPO.glob(pattern))
        for match in BENCHMARKS_SECTION.finditer(path.read_text())
    ]
    assert len(named) >= 5  # README alone names more
    missing = [f"{where}: {section!r}" for where, section in named if not any(h.startswith(section) for h in headings)]
    assert missing == [], f"BENCHMARKS.md has no such heading: {missing}"


def test_every_results_folder_benchmarks_names_exists_and_every_speedup_has_its_lever_row():
    folders = set(re.findall(r"`(\d{4}-\d{2}-\d{2}[\w-]*)/`", BENCHMARKS))
    assert len(folders) > 10
    assert sorted(f for f in folders if not (REPO / "bench" / "results" / f).is_dir()) == []
    levers = BENCHMARKS.split("\n## Each lever\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in levers.splitlines() if line.startswith("| `")]
    assert [s.name for s in SPEEDUPS if not any(f"`{s.name}`" in row.split(" | ")[0] for row in rows)] == []
