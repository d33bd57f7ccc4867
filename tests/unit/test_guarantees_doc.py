"""The fault matrix (docs/guarantees.md) names real tests.

Every cell of a fault's table says which test proves it (docs/guarantees.md#how-to-read-the-cells:
``file::function``). A cited file or test function that does not exist is a claim nobody checks, so
this test parses the page, reads each cited test file with ``ast`` and fails, naming the cell, when
a citation points nowhere, or when a cell cites no test and does not say why (``Not yet proven``,
``Unknown: to be checked``, or a row that is ``n/a``). A parametrized case may be cited as
``function[id]``: the function must exist and the id must be written in its file.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUARANTEES = ROOT / "docs" / "guarantees.md"

#: ``tests/x/test_y.py``, optionally ``::name`` (``::Class::name``) and a parametrized ``[id]``
CITATION = re.compile(r"(?P<file>tests/[\w/.-]+?\.py)(?:::(?P<name>[A-Za-z_]\w*(?:::[A-Za-z_]\w*)?)"
                      r"(?:\[(?P<param>[^\]`]*)\])?)?")
#: what a cell says when it cites no test on purpose
NO_TEST_YET = re.compile(r"not yet proven|unknown: to be checked", re.IGNORECASE)
ANCHOR = re.compile(r'<a id="(?P<id>[^"]+)"></a>')


@dataclass(frozen=True)
class Cell:
    """One row's "proven by" cell: ``where`` names it (section, moment), ``report`` is the row's
    "report says" cell (``n/a`` rows prove nothing), ``proof`` the cell's text."""

    where: str
    report: str
    proof: str


@dataclass(frozen=True)
class Citation:
    file: str
    name: str | None
    param: str | None

    def __str__(self) -> str:
        return self.file + (f"::{self.name}" if self.name else "") + (f"[{self.param}]" if self.param else "")


def split_row(line: str) -> list[str]:
    """The cells of a Markdown table row (``| a | b |``)."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def proof_cells(text: str) -> list[Cell]:
    """Every "proven by" cell of the page's tables, named by its section heading and moment."""
    cells: list[Cell] = []
    section = ""
    column: int | None = None
    report_column: int | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            section, column = line.lstrip("#").strip(), None
            continue
        if not line.startswith("|"):
            column = None
            continue
        row = split_row(line)
        lowered = [cell.lower() for cell in row]
        if "proven by" in lowered:
            column, report_column = lowered.index("proven by"), lowered.index("report says")
            continue
        if column is None or set(line.replace(" ", "")) <= set("|-:"):
            continue
        moment = ANCHOR.sub("", row[0]).strip()
        cells.append(Cell(where=f"{section} / {moment}", report=row[report_column] if report_column is not None else "",
                          proof=row[column] if column < len(row) else ""))
    return cells


def citations(text: str) -> list[Citation]:
    return [Citation(m["file"], m["name"], m["param"]) for m in CITATION.finditer(text)]


@cache
def functions_in(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """The test functions of a test file (``name``, ``Class::name``) and every string constant in
    it (where parametrized ids are written)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{item.name}" for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    return frozenset(n for n in names if n.split("::")[-1].startswith("test")), frozenset(strings)


def problems(cells: list[Cell], root: Path = ROOT) -> list[str]:
    """What is wrong with the cells' citations, one line per problem, naming the cell."""
    found: list[str] = []
    for cell in cells:
        cited = citations(cell.proof)
        for c in cited:
            path = root / c.file
            if not path.is_file():
                found.append(f"{cell.where}: cites {c}, but {c.file} does not exist")
                continue
            if c.name is None:
                continue
            names, strings = functions_in(path)
            if c.name not in names:
                found.append(f"{cell.where}: cites {c}, but {c.file} has no test function {c.name}")
            elif c.param is not None and c.param not in strings:
                found.append(f"{cell.where}: cites {c}, but the id {c.param!r} is not written in {c.file}")
        proves = any(c.name for c in cited)
        if not proves and not NO_TEST_YET.search(cell.proof) and not cell.report.lower().startswith("n/a"):
            found.append(f"{cell.where}: cites no test and does not say why (write 'Not yet proven by a test.')")
    return found


# ------------------------------------------------------------------------------ the page


def test_every_cell_of_the_fault_matrix_names_a_test_that_exists():
    """docs/guarantees.md#how-to-read-the-cells: each cell is proven by ``file::function``."""
    cells = proof_cells(GUARANTEES.read_text(encoding="utf-8"))
    assert len(cells) > 50, "the fault tables were not found: did the 'proven by' column change its name?"
    found = problems(cells)
    assert not found, "docs/guarantees.md:\n" + "\n".join(found)


def test_every_test_the_page_cites_outside_the_tables_exists_too():
    text = GUARANTEES.read_text(encoding="utf-8")
    found = problems([Cell(where="docs/guarantees.md", report="n/a", proof=text)])
    assert not found, "\n".join(found)


def test_every_link_of_the_page_goes_to_an_anchor_of_the_page():
    """The overview's cells link to the rows that prove them: a renamed anchor breaks the link."""
    text = GUARANTEES.read_text(encoding="utf-8")
    anchors = {m["id"] for m in ANCHOR.finditer(text)}
    anchors |= {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                for line in text.splitlines() if line.startswith("#")}
    broken = sorted({link for link in re.findall(r"\]\(#([^)]+)\)", text) if link not in anchors})
    assert broken == []


# ------------------------------------------------------------------------------ the check itself


def test_the_check_names_a_cell_whose_test_is_missing(tmp_path):
    """The check can fail: a missing file, a missing function, a missing parametrized id, a cell
    that cites nothing without saying why; an n/a row and a cell that says why pass."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('m', ['first'])\ndef test_a(m):\n    pass\n\n"
        "def helper():\n    pass\n\nclass TestB:\n    def test_c(self):\n        pass\n", encoding="utf-8")
    page = "\n".join([
        "### The thing fails",
        "",
        "| moment | report says | downstream shows | what to do | proven by |",
        "|---|---|---|---|---|",
        "| 1, 3 | n/a | | | |",
        "| <a id=\"x-2\"></a>2. during | failed | | | `tests/test_x.py::test_a`, `tests/test_x.py::TestB::test_c` |",
        "| 2. the id | failed | | | `tests/test_x.py::test_a[first]` |",
        "| 3. a wrong id | failed | | | `tests/test_x.py::test_a[second]` |",
        "| 4. read-back | unknown | | | `tests/test_x.py::test_gone` |",
        "| 4. a helper | unknown | | | `tests/test_x.py::helper` |",
        "| 5. after | unknown | | | `tests/test_y.py::test_a` |",
        "| 5. later | unknown | | | The chaos test. |",
        "| 5. never | unknown | | | Not yet proven by a test. |",
    ])
    cells = proof_cells(page)
    assert [c.where for c in cells][:2] == ["The thing fails / 1, 3", "The thing fails / 2. during"]
    assert problems(cells, tmp_path) == [
        "The thing fails / 3. a wrong id: cites tests/test_x.py::test_a[second], but the id 'second' is not "
        "written in tests/test_x.py",
        "The thing fails / 4. read-back: cites tests/test_x.py::test_gone, but tests/test_x.py has no test "
        "function test_gone",
        "The thing fails / 4. a helper: cites tests/test_x.py::helper, but tests/test_x.py has no test function "
        "helper",
        "The thing fails / 5. after: cites tests/test_y.py::test_a, but tests/test_y.py does not exist",
        "The thing fails / 5. later: cites no test and does not say why (write 'Not yet proven by a test.')",
    ]


@pytest.mark.parametrize("text, expected", [
    ("`tests/unit/test_a.py::test_b`", ["tests/unit/test_a.py::test_b"]),
    ("the `x` fault of `tests/e2e/test_r.py::test_s` (run by `make chaos`)", ["tests/e2e/test_r.py::test_s"]),
    ("`tests/i/test_c.py::test_d[first read-back created]`, `tests/i/test_c.py`",
     ["tests/i/test_c.py::test_d[first read-back created]", "tests/i/test_c.py"]),
])
def test_citations_are_read_in_the_pages_format(text, expected):
    assert [str(c) for c in citations(text)] == expected
