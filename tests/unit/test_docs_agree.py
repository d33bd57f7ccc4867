"""The docs say what the code does: names they quote exist, and lists they give are complete.

Each test reads the Markdown of docs/, README.md, charts/reversi/README.md and CHANGELOG.md (and
the chart's NOTES.txt where it names values or targets) and holds one kind of name equal to its
one source (docs/development.md#tests lists them for readers):

- metrics: what :mod:`reversi.metrics` registers (read from prometheus_client's registry) against
  the table of docs/operations.md#metrics (names, types, labels), and every ``reversi_*`` series
  the docs name;
- alerts: ``charts/reversi/files/alerts/reversi.rules.yaml`` against the sections of
  docs/operations.md#alerts, and each alert's ``runbook_url`` against its own section's anchor;
- chart values: every value the docs name (``metrics.port``, ``--set a.b=...``) is a key of
  ``charts/reversi/values.yaml``, and every key there is in the table of docs/operations.md#values;
- programs: every command and option of ``kubectl reversi`` the docs show is in click's tree of
  :data:`reversi.cli.main.cli`, and every command and option of the tree is in the README's
  table; the same for the options of ``reversi-operator``, ``reversi-admission``,
  ``reversi-devcluster``, ``reversi-gateway`` and ``reversi-crdgen``;
- ``make <target>`` is a target of the Makefile; a repository path exists; every link leads to a
  file and heading, every ``docs/<page>.md#<anchor>`` that code, tests and docs cite names a
  heading (anchors made the way GitHub makes them) or an ``<a id>``; every page of docs/ is
  reached from the README;
- ``<fullname>-x`` is a name the chart's templates make; every ``helm upgrade`` resets then
  reuses values; running the operator by hand installs the roles for agents and people;
- ``REVERSI_*`` variables exist, with the defaults of their settings models; condition reasons
  and types are :mod:`reversi.conditions`'; the kinds table is the CRDs'; the suite's times are
  quoted from docs/development.md#times only.

A failure names the file, the line and the difference. Fix the docs, not this test; where the
code is wrong, fix the code.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import inspect
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import click
import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
README = ROOT / "README.md"
VALUES = ROOT / "charts" / "reversi" / "values.yaml"
NOTES = ROOT / "charts" / "reversi" / "templates" / "NOTES.txt"
ALERT_RULES = ROOT / "charts" / "reversi" / "files" / "alerts" / "reversi.rules.yaml"
MAKEFILE = ROOT / "Makefile"

#: the modules that register Prometheus metrics; a module of the package that imports
#: prometheus_client and is not here fails test_every_module_with_metrics_is_read
METRIC_MODULES = ("reversi.metrics",)

#: ``reversi_*`` words of the docs that are not metrics, each with the file that defines it (the
#: test checks the file still does, so this list cannot outlive what it excuses)
NOT_METRICS = {
    "reversi_devcluster": "devcluster/pyproject.toml",  # the local control plane's package
    "reversi_archive_schema": "operator/reversi/adapters/archive.py",  # the archive's tables in PostgreSQL
    "reversi_runs": "operator/reversi/adapters/archive.py",
    "reversi_steps": "operator/reversi/adapters/archive.py",
    "reversi_requests": "operator/reversi/adapters/archive.py",
    "reversi_actions": "operator/reversi/adapters/archive.py",
}

#: dotted names in the docs whose first part is a top-level key of values.yaml but that are not
#: chart values, each with the file that defines it and the text there that does
NOT_VALUES = {
    # the test operator's admission pool (OperatorProcess.admission)
    "operator.admission": ("devcluster/reversi_devcluster/localop.py", "self.admission = (AdmissionPool("),
}

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r'<a (?:id|name)="([^"]+)"')
INLINE_CODE = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)\1", re.DOTALL)
METRIC_WORD = re.compile(r"(?<![\w/.$-])reversi_[a-z0-9_]*[a-z0-9]")
ALERT_WORD = re.compile(r"\bReversi[A-Z][A-Za-z]+\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s*^$\[\]]+)\)")
VALUE_PATH = re.compile(r"[A-Za-z]\w*(?:\.(?:[A-Za-z]\w*|\*))+")
SET_FLAG = re.compile(r"--set(?:-string|-json|-file)?[ =]([A-Za-z][\w.]*)=")
#: ``make <target>`` where a shell command starts (after ``;``, ``&&``, ``|``, ``(`` or variables)
SHELL_MAKE = re.compile(r"(?:^|[;&|(])\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*make((?:\s+[A-Z_]+=\S*)*)\s+([a-z][\w.-]*)")
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".json", ".txt", ".tpl", ".toml", ".sh", ".sql", ".lua", ".cfg")


# ----- reading Markdown --------------------------------------------------------------------------


def doc_files() -> list[Path]:
    """The Markdown the project publishes: docs/ (field references included), the README, the
    chart's README and the changelog."""
    docs = sorted((ROOT / "docs").rglob("*.md"))
    return [*docs, README, ROOT / "charts" / "reversi" / "README.md", ROOT / "CHANGELOG.md"]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@dataclass(frozen=True)
class Code:
    """A piece of code in a doc: an inline span, or a logical line of a fenced block (lines that
    end in ``\\`` joined). ``line`` is where it starts (1-based)."""

    path: Path
    line: int
    text: str
    fenced: bool

    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


def without_fences(text: str) -> str:
    """``text`` with every fenced block's lines blanked (line numbers kept)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def code_of(path: Path) -> list[Code]:
    """Every inline code span and every logical line of a fenced block of a Markdown file."""
    text = path.read_text()
    pieces: list[Code] = []
    fenced, pending, start = False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        pieces.append(Code(path, start, pending + line, True))
        pending = ""
    prose = without_fences(text)
    for match in INLINE_CODE.finditer(prose):
        pieces.append(Code(path, prose.count("\n", 0, match.start()) + 1, match.group(2).replace("\n", " "), False))
    return pieces


@cache
def all_code() -> tuple[Code, ...]:
    return tuple(piece for path in doc_files() for piece in code_of(path))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lowercase, every character
    that is not a letter, digit, ``_``, ``-`` or space dropped, spaces made ``-``."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a Markdown file: its headings' (a repeated one gets ``-1``, ``-2``...) and
    its ``<a id="...">``."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in without_fences(path.read_text()).splitlines():
        found.update(EXPLICIT_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading:
            anchor = github_anchor(heading.group(2))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return frozenset(found)


def section(path: Path, heading: str) -> str:
    """The text under the heading ``heading`` (without its ``#``s) up to the next heading of the
    same or a higher level."""
    lines = path.read_text().splitlines()
    for index, line in enumerate(lines):
        match = HEADING.match(line)
        if match and match.group(2) == heading:
            level = len(match.group(1))
            end = next((j for j in range(index + 1, len(lines))
                        if (m := HEADING.match(lines[j])) and len(m.group(1)) <= level
                        and not FENCE.match(lines[j])), len(lines))
            return "\n".join(lines[index + 1:end])
    raise AssertionError(f"{rel(path)} has no heading {heading!r}")


def split_row(line: str) -> list[str]:
    """The cells of a Markdown table row; ``\\|`` stays inside its cell."""
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [cell.strip() for cell in cells]


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table of ``text``: its header cells and its body rows."""
    found: list[tuple[list[str], list[list[str]]]] = []
    inside = False
    for line in text.splitlines():
        if not line.startswith("|"):
            inside = False
            continue
        cells = split_row(line)
        if not inside:
            found.append((cells, []))
            inside = True
        elif not set(line.replace(" ", "")) <= set("|-:"):
            found[-1][1].append(cells)
    return found


def table_rows(text: str, first_header: str) -> list[list[str]]:
    """The body rows of every table in ``text`` whose first header cell is ``first_header``."""
    return [row for header, rows in tables(text) if header[0] == first_header for row in rows]


def spans(cell: str) -> list[str]:
    return [m.group(2) for m in INLINE_CODE.finditer(cell)]


# ----- metrics ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    name: str  # as the docs write it: a counter with _total
    kind: str  # counter, gauge, histogram
    labels: frozenset[str]

    def series(self) -> set[str]:
        """The names of the series Prometheus scrapes of it."""
        if self.kind == "histogram":
            return {self.name + suffix for suffix in ("", "_bucket", "_sum", "_count")}
        return {self.name}


def metric_holders(module) -> Iterator[object]:
    """One instance of each class of ``module`` that takes a ``registry``, each on a registry of
    its own."""
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ == module.__name__ and "registry" in inspect.signature(cls).parameters:
            yield cls(registry=CollectorRegistry())


@cache
def code_metrics() -> dict[str, Metric]:
    """Every ``reversi_*`` metric the code registers, by its documented name."""
    found: dict[str, Metric] = {}
    for module in map(importlib.import_module, METRIC_MODULES):
        for holder in metric_holders(module):
            for wrapper in vars(holder).values():
                # a custom collector (computed at each scrape) describes its families, labels included
                if getattr(wrapper, "_labelnames", None) is None and hasattr(wrapper, "describe") \
                        and hasattr(wrapper, "collect"):
                    for family in wrapper.describe():
                        found[family.name] = Metric(family.name, family.type, frozenset(family._labelnames))
                    continue
                # the label names of a metric with no child yet are only on the wrapper
                labels = getattr(wrapper, "_labelnames", None)
                if labels is None or not hasattr(wrapper, "collect"):
                    continue
                for family in wrapper.collect():
                    name = family.name + ("_total" if family.type == "counter" else "")
                    found[name] = Metric(name, family.type, frozenset(labels))
    for family in REGISTRY.collect():  # any metric a module registers on prometheus_client's own
        if family.name.startswith("reversi_"):
            name = family.name + ("_total" if family.type == "counter" else "")
            found.setdefault(name, Metric(name, family.type, frozenset()))
    return found


def test_every_module_with_metrics_is_read():
    """A module of the package that imports prometheus_client defines metrics: it is in
    METRIC_MODULES, so its metrics are held to the docs."""
    package = ROOT / "operator" / "reversi"
    importing = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name.split(".")[0] == "prometheus_client" for name in names):
                module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
                importing.add(module.removesuffix(".__init__"))
    assert importing <= set(METRIC_MODULES), (
        f"these modules import prometheus_client but their metrics are not checked against the docs: "
        f"{sorted(importing - set(METRIC_MODULES))}; add them to METRIC_MODULES")
    assert code_metrics(), "no metric found: the modules of METRIC_MODULES register none"


def documented_metrics() -> dict[str, tuple[str, frozenset[str], str]]:
    """The metric tables of the docs: name -> (type, labels, where)."""
    out: dict[str, tuple[str, frozenset[str], str]] = {}
    for path in doc_files():
        for cells in table_rows(path.read_text(), "metric"):
            names = spans(cells[0])
            assert len(names) == 1 and len(cells) >= 3, \
                f"{rel(path)}: a metric row does not read `name` | type | labels: {cells}"
            labels = frozenset(label.strip() for label in cells[2].split(",") if label.strip())
            out[names[0]] = (cells[1], labels, rel(path))
    return out


def test_the_metric_tables_list_every_metric_with_its_type_and_labels():
    code, docs = code_metrics(), documented_metrics()
    missing = sorted(set(code) - set(docs))
    unknown = sorted(set(docs) - set(code))
    assert not missing, f"metrics the code registers that no metric table of the docs lists: {missing}"
    assert not unknown, f"metrics a table lists that the code does not register: {unknown}"
    wrong = [f"{name}: docs say {kind} with labels {sorted(labels)} ({where}), the code registers "
             f"a {code[name].kind} with labels {sorted(code[name].labels)}"
             for name, (kind, labels, where) in sorted(docs.items())
             if (kind, labels) != (code[name].kind, code[name].labels)]
    assert not wrong, "\n".join(wrong)


def test_every_metric_the_docs_name_exists():
    series = {name: metric for metric in code_metrics().values() for name in metric.series()}
    for word, source in NOT_METRICS.items():
        assert word in (ROOT / source).read_text(), f"NOT_METRICS: {source} no longer defines {word}: drop it"
    unknown = []
    for path in doc_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for word in METRIC_WORD.findall(line):
                if word not in series and word not in NOT_METRICS:
                    unknown.append(f"{rel(path)}:{number}: {word}")
    assert not unknown, "the docs name metrics the code does not register:\n" + "\n".join(unknown)


# ----- alerts -------------------------------------------------------------------------------------


def alert_rules() -> dict[str, dict]:
    rules = yaml.safe_load(ALERT_RULES.read_text())
    return {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule}


def test_the_alert_sections_are_the_alerts_of_the_rules_file():
    """docs/operations.md#alerts has one section per alert of the rules file, and no other."""
    documented = {m.group(2) for line in section(OPERATIONS, "Alerts").splitlines()
                  if (m := HEADING.match(line)) and len(m.group(1)) == 3 and ALERT_WORD.fullmatch(m.group(2))}
    rules = set(alert_rules())
    assert documented == rules, (
        f"alerts without a section in docs/operations.md#alerts: {sorted(rules - documented)}; "
        f"sections of alerts the rules file does not have: {sorted(documented - rules)}")


def test_each_runbook_url_leads_to_its_alerts_section():
    wrong = []
    for name, rule in alert_rules().items():
        url = (rule.get("annotations") or {}).get("runbook_url", "")
        page, _, anchor = url.partition("#")
        if not page.endswith("/docs/operations.md") or anchor not in anchors(OPERATIONS):
            wrong.append(f"{name}: runbook_url {url!r} names no heading of docs/operations.md")
        elif anchor != github_anchor(name):
            wrong.append(f"{name}: runbook_url leads to #{anchor}, not to its own section #{github_anchor(name)}")
    assert not wrong, "\n".join(wrong)


def test_every_alert_the_docs_name_exists():
    rules = set(alert_rules())
    unknown = [f"{rel(path)}:{number}: {word}" for path in doc_files()
               for number, line in enumerate(path.read_text().splitlines(), 1)
               for word in ALERT_WORD.findall(line) if word not in rules]
    assert not unknown, "the docs name alerts the rules file does not have:\n" + "\n".join(unknown)


def test_every_kubectl_reversi_command_the_alerts_print_exists():
    wrong = [f"{name}: {problem}" for name, rule in alert_rules().items()
             for text in (rule.get("annotations") or {}).values()
             for words in invocations(text) for problem in check_invocation(words)]
    assert not wrong, "the alerts' annotations print kubectl reversi commands click does not have:\n" + "\n".join(wrong)


# ----- chart values -------------------------------------------------------------------------------


@cache
def values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def value_exists(path: str) -> bool:
    """Whether ``a.b.c`` is a key of values.yaml (``a.b.*``: ``a.b`` has keys)."""
    node: object = values()
    for part in path.split("."):
        if node == {}:
            return True  # a map of the user's own keys (labels, annotations, toolMap): any key goes
        if part == "*":
            return isinstance(node, dict) and bool(node)
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def value_leaves(node: dict, prefix: str = "") -> Iterator[str]:
    for key, child in node.items():
        path = f"{prefix}{key}"
        if isinstance(child, dict) and child:
            yield from value_leaves(child, path + ".")
        else:
            yield path


def named_values() -> Iterator[tuple[str, str]]:
    """``(where, path)`` of every chart value the docs name: a code span that is a dotted path
    (maybe ``=value`` or ``: value`` after it) starting with a top-level key, and every ``--set``."""
    top = set(values())
    for piece in all_code():
        head = re.split(r"[=:\s]", piece.text.strip(), maxsplit=1)[0]
        if (VALUE_PATH.fullmatch(head) and head.split(".")[0] in top and not head.endswith(FILE_SUFFIXES)
                and head not in NOT_VALUES):
            yield piece.where(), head
        for match in SET_FLAG.finditer(piece.text):
            yield piece.where(), match.group(1)
    for number, line in enumerate(NOTES.read_text().splitlines(), 1):
        for match in re.finditer(r"\.Values\.([\w.]+)", line):
            yield f"{rel(NOTES)}:{number}", match.group(1)


def test_every_value_the_docs_name_is_in_values_yaml():
    for name, (source, proof) in NOT_VALUES.items():
        assert proof in (ROOT / source).read_text(), f"NOT_VALUES: {source} no longer has {proof!r}: drop {name}"
    unknown = sorted({f"{where}: {path}" for where, path in named_values() if not value_exists(path)})
    assert not unknown, "the docs name chart values values.yaml does not have:\n" + "\n".join(unknown)


def values_table_paths() -> set[str]:
    """The keys the table of docs/operations.md#values documents: ``a.b``, ``.c`` (a sibling of
    the cell's first key), ``a.*`` (everything under ``a``)."""
    documented = set()
    for cells in table_rows(section(OPERATIONS, "Values"), "key"):
        parent = ""
        for span in spans(cells[0]):
            if span.startswith("."):
                documented.add(parent + span)
            else:
                documented.add(span)
                parent = span.rsplit(".", 1)[0] if "." in span else ""
    return documented


def test_the_values_table_lists_every_value():
    documented = values_table_paths()
    unknown = sorted(path for path in documented if not value_exists(path))
    assert not unknown, f"docs/operations.md#values lists keys values.yaml does not have: {unknown}"
    covered = {path.removesuffix(".*") for path in documented}
    missing = [leaf for leaf in value_leaves(values())
               if not any(leaf == path or leaf.startswith(path + ".") for path in covered)]
    assert not missing, f"values.yaml keys missing from the table of docs/operations.md#values: {missing}"


# ----- kubectl reversi ----------------------------------------------------------------------------


def cli_root() -> click.Group:
    from reversi.cli.main import cli

    return cli


def options(command: click.Command) -> dict[str, click.Option]:
    """Every spelling of every option of ``command`` (``-h``/``--help`` included)."""
    out = {name: param for param in command.params if isinstance(param, click.Option)
           for name in (*param.opts, *param.secondary_opts)}
    help_option = command.get_help_option(click.Context(command, info_name="kubectl reversi"))
    if help_option is not None:
        out.update(dict.fromkeys(help_option.opts, help_option))
    return out


def takes_value(option: click.Option, word: str) -> bool:
    return not option.is_flag and not option.count and "=" not in word


def is_placeholder(word: str) -> bool:
    """A word of a usage line that stands for a value: RUN, <run>, N, ..., a quoted or $ value."""
    return bool(re.fullmatch(r"[A-Z][A-Z_|]*|<[^>]*>.*|\.\.\.|…|[\"'$].*", word))


#: where a shell command starts: the start, or after ``;``, ``&``, ``|``, ``(``, and variables
COMMAND_START = r"(?:^|(?<=[;&|(]))\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"


def invocations(text: str, program: str = "kubectl reversi") -> Iterator[list[str]]:
    """The words after each ``program`` in a piece of code, up to the end of its shell command
    (``|``, ``;``, ``&&``, ``#``, ``)``); usage brackets dropped, ``\\|`` (an alternative, in a
    table) read as a space. ``kubectl reversi`` (also ``kubectl-reversi``) counts wherever it
    is; another program only where a command starts (``reversi-operator`` is a Lease's name too)."""
    text = text.replace("\\|", " ")
    name = re.escape(program).replace("\\ ", "[ -]")
    start = r"(?<![\w/.:=\"'-])" if program == "kubectl reversi" else COMMAND_START
    for match in re.finditer(rf"{start}{name}(?![\w:.=-])", text, re.MULTILINE):
        rest = re.split(r"\s#|\||;|&&|\)|`|\$\(", text[match.end():], maxsplit=1)[0]
        rest = re.sub(r"[\[\]]|\.\.\.|…", " ", rest)
        try:
            words = shlex.split(rest)
        except ValueError:
            words = rest.split()
        yield words


def check_invocation(words: list[str], root: click.Command | None = None,
                     program: str = "kubectl reversi") -> list[str]:
    """What in one invocation's words the click command ``root`` (``kubectl reversi``'s tree by
    default) does not have."""
    command: click.Command = root or cli_root()
    path = [program]
    problems = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word.startswith("-") and len(word) > 1:
            option = options(command).get(word.split("=", 1)[0])
            if option is None:
                problems.append(f"{' '.join(path)} has no option {word.split('=', 1)[0]}")
            elif takes_value(option, word):
                index += 1
            continue
        if isinstance(command, click.Group):
            sub = command.commands.get(word)
            if sub is not None:
                command = sub
                path.append(word)
            elif not is_placeholder(word):
                problems.append(f"{' '.join(path)} has no command {word!r}")
                break
    return problems


def test_every_kubectl_reversi_command_and_option_the_docs_name_exists():
    wrong = [f"{piece.where()}: {problem} (in `{piece.text.strip()}`)"
             for piece in all_code() for words in invocations(piece.text) for problem in check_invocation(words)]
    assert not wrong, "the docs name kubectl reversi commands or options click does not have:\n" + "\n".join(wrong)


#: the project's other programs built on click: name -> (module, attribute)
CLICK_PROGRAMS = {
    "reversi-operator": ("reversi.entrypoints.operator", "main"),
    "reversi-admission": ("reversi.entrypoints.admission", "main"),
    "reversi-devcluster": ("reversi_devcluster.cli", "cli"),
}
#: those built on argparse: name -> a call that prints their --help; and the options after which
#: the rest of the line is another program's (argparse.REMAINDER)
ARGPARSE_PROGRAMS = {
    "reversi-gateway": lambda: importlib.import_module("reversi.gateway.main").parse(["--help"]),
    "reversi-crdgen": lambda: importlib.import_module("reversi.crdgen").main(["--help"]),
}
REMAINDER_OPTIONS = {"--upstream-command"}


def argparse_options(program: str) -> frozenset[str]:
    """The options ``program --help`` lists."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
        ARGPARSE_PROGRAMS[program]()
    return frozenset(re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", printed.getvalue()))


def test_every_option_of_the_projects_other_programs_the_docs_name_exists():
    """``reversi-operator``, ``reversi-admission``, ``reversi-devcluster``, ``reversi-gateway`` and
    ``reversi-crdgen`` in the docs: each subcommand and option exists."""
    wrong = []
    for program, (module, attribute) in CLICK_PROGRAMS.items():
        root = getattr(importlib.import_module(module), attribute)
        wrong += [f"{piece.where()}: {problem}" for piece in all_code()
                  for words in invocations(piece.text, program) for problem in check_invocation(words, root, program)]
    for program in ARGPARSE_PROGRAMS:
        known = argparse_options(program)
        for piece in all_code():
            for words in invocations(piece.text, program):
                for word in words:
                    if word in REMAINDER_OPTIONS:
                        break
                    if word.startswith("-") and word.split("=", 1)[0] not in known:
                        wrong.append(f"{piece.where()}: {program} has no option {word.split('=', 1)[0]}")
    assert not wrong, "the docs name options or commands the project's programs do not have:\n" + "\n".join(wrong)


CommandPath = tuple[tuple[str, ...], click.Command]


def command_paths(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[CommandPath]:
    """Every command of the tree that is not a group, with its path."""
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            if not sub.hidden:
                yield from command_paths(sub, (*path, name))
    else:
        yield path, command


def readme_command_rows() -> list[tuple[set[tuple[str, ...]], str]]:
    """The README's table of every command: each row's command paths (from its first cell's code
    spans, ``kubectl reversi`` optional) and the row's whole text."""
    tree = cli_root()
    rows = []
    for cells in table_rows(section(README, "Every `kubectl reversi` command"), "command"):
        paths = set()
        for span in spans(cells[0]):
            words = re.sub(r"^kubectl reversi\s+", "", span).split()
            command, path = tree, []
            while isinstance(command, click.Group) and words and words[0] in command.commands:
                command = command.commands[words.pop(0)]
                path.append(command.name or "")
            paths.add(tuple(path))
        rows.append((paths, " | ".join(cells)))
    return rows


def mentions(text: str, option: click.Option) -> bool:
    names = (*option.opts, *option.secondary_opts)
    return any(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) for name in names)


def test_the_readme_lists_every_command_and_its_options():
    """README.md's "Every kubectl reversi command" has a row for each command of the tree, and
    each option of the command that is not hidden is in its row, or in the text under the table
    (options every command takes)."""
    readme = section(README, "Every `kubectl reversi` command")
    below = "\n".join(line for line in readme.splitlines() if not line.startswith("|"))
    rows = readme_command_rows()
    problems = []
    for path, command in command_paths(cli_root()):
        texts = [text for paths, text in rows if path in paths]
        if not texts:
            problems.append(f"kubectl reversi {' '.join(path)} has no row")
            continue
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not mentions(texts[0] + "\n" + below, param):
                names = "/".join((*param.opts, *param.secondary_opts))
                problems.append(f"kubectl reversi {' '.join(path)}: option {names} is not in its row")
    assert not problems, "README.md's table of kubectl reversi commands is not the click tree:\n" + "\n".join(problems)


# ----- make ---------------------------------------------------------------------------------------


@cache
def make_targets() -> frozenset[str]:
    targets = set()
    for line in MAKEFILE.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][\w.-]*(?:[ \t]+[A-Za-z0-9][\w.-]*)*)[ \t]*:(?!=)", line)
        if match:
            targets.update(match.group(1).split())
    return frozenset(targets)


def test_every_make_target_the_docs_name_exists():
    unknown = []
    notes = [Code(NOTES, number, line, True) for number, line in enumerate(NOTES.read_text().splitlines(), 1)]
    for piece in [*all_code(), *notes]:
        for match in SHELL_MAKE.finditer(piece.text):
            if match.group(2) not in make_targets():
                unknown.append(f"{piece.where()}: make {match.group(2)}")
    assert not unknown, "the docs name make targets the Makefile does not have:\n" + "\n".join(unknown)


# ----- links and citations ------------------------------------------------------------------------


def broken_link(source: Path, target: str) -> str | None:
    """Why the link ``target`` of ``source`` leads nowhere, or None."""
    if re.match(r"[a-z]+:", target):
        return None  # https:, mailto:
    file, _, anchor = target.partition("#")
    path = (source.parent / file).resolve() if file else source
    if not path.exists():
        return f"{file} does not exist"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"{rel(path)} has no heading #{anchor}"
    return None


def test_every_link_of_the_docs_leads_somewhere():
    broken = []
    for path in doc_files():
        prose = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), without_fences(path.read_text()))
        for number, line in enumerate(prose.splitlines(), 1):
            for target in LINK.findall(line):
                reason = broken_link(path, target)
                if reason:
                    broken.append(f"{rel(path)}:{number}: ({target}): {reason}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("tree", ["operator", "devcluster", "tests", "charts", "demo", "benchmarks", "Makefile", "docs",
                                  "README.md", "CHANGELOG.md"])
def test_every_docs_anchor_the_project_cites_exists(tree):
    """Code, tests and docs cite rules as ``docs/<page>.md#<anchor>``: each names a heading."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", tree], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    broken = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in (".pyc", ".png", ".gz"):
            continue
        text = path.read_text(errors="replace")
        # a citation wrapped at its hyphen: over two string literals, docstring or comment lines
        text = re.sub(r"(docs/[\w/-]+\.md#[\w-]*-)[\"']?[ \t]*\n[ \t]*(?:#:?[ \t]*)?[\"']?", r"\1", text)
        for match in re.finditer(r"docs/((?:reference/)?[\w-]+\.md)#([\w-]+)", text):
            page = ROOT / "docs" / match.group(1)
            if not page.exists() or match.group(2) not in anchors(page):
                line = text.count("\n", 0, match.start()) + 1
                broken.append(f"{name}:{line}: {match.group(0)}")
    assert not broken, "citations of docs anchors that name no heading:\n" + "\n".join(sorted(set(broken)))


# ----- the chart's objects, paths, commands -------------------------------------------------------

#: how a template names an object after ``<fullname>``: ``{{ include "reversi.fullname" . }}-x``,
#: ``{{ $fullname }}-x`` or ``printf "%s-x" (include "reversi.fullname" ...)``
TEMPLATE_NAME = re.compile(r'(?:include "reversi\.fullname" [.$] \}\}|\$fullname \}\})-([a-z][\w-]*[a-z0-9])'
                           r'|printf "%s-([a-z][\w-]*[a-z0-9])" \(include "reversi\.fullname"')
TOP_DIRS = ("operator/", "devcluster/", "charts/", "tests/", "docs/", "demo/", "benchmarks/", "crds/", ".ci/")


def test_every_object_the_docs_name_after_the_release_is_one_the_chart_makes():
    """``<fullname>-x`` in the docs is a name the templates make; the chart names objects after
    ``<fullname>`` (reversi.fullname), never after the bare release name."""
    templates = [path for path in (ROOT / "charts" / "reversi" / "templates").rglob("*") if path.is_file()]
    made = {suffix for path in templates for match in TEMPLATE_NAME.finditer(path.read_text())
            for suffix in match.groups() if suffix}
    wrong = []
    for path in doc_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            wrong += [f"{rel(path)}:{number}: {m.group(0)}: the chart names objects <fullname>-..., "
                      f"the release name alone is not <fullname>" for m in re.finditer(r"<release>-[a-z-]+", line)]
            wrong += [f"{rel(path)}:{number}: <fullname>-{name}: no template makes it"
                      for name in re.findall(r"<fullname>-([a-z][a-z-]*[a-z])", line) if name not in made]
    assert not wrong, "\n".join(wrong)


def test_every_helm_upgrade_resets_then_reuses_values():
    """``--reuse-values`` keeps the old release's defaults for values a new chart adds or changes;
    every upgrade the docs show uses ``--reset-then-reuse-values`` (docs/operations.md#upgrading)."""
    wrong = [f"{piece.where()}: {piece.text.strip()}" for piece in all_code()
             if "helm upgrade" in piece.text and re.search(r"--reuse-values\b", piece.text)]
    assert not wrong, "helm upgrade with --reuse-values instead of --reset-then-reuse-values:\n" + "\n".join(wrong)


def test_every_repository_path_the_docs_name_exists():
    missing = []
    for piece in all_code():
        for word in re.split(r"[\s()`,;]+", piece.text):
            path = re.split(r"::|:\d|#", word.rstrip(".:"), maxsplit=1)[0]
            if path.startswith(TOP_DIRS) and not re.search(r"[<>*{}$]", path) and not (ROOT / path).exists():
                missing.append(f"{piece.where()}: {path}")
    assert not missing, "the docs name files of the repository that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_running_the_operator_by_hand_installs_the_roles_of_agents_and_people():
    """The chart's roles for agents and people (the templates under ``rbac.userRoles``) are not
    the operator's: run by hand, without the chart, they are installed by the commands of
    docs/development.md#running-the-operator-by-hand too."""
    user_templates = sorted(path.name for path in (ROOT / "charts" / "reversi" / "templates").glob("*.yaml")
                            if ".Values.rbac.userRoles" in path.read_text().split("\n", 1)[0])
    assert user_templates, "no template is gated by rbac.userRoles any more: update this test"
    commands = "\n".join(piece.text for piece in code_of(ROOT / "docs" / "development.md") if piece.fenced)
    by_hand = section(ROOT / "docs" / "development.md", "Running the operator by hand")
    missing = [name for name in user_templates
               if f"templates/{name}" not in by_hand or f"templates/{name}" not in commands]
    assert not missing, f"docs/development.md#running-the-operator-by-hand does not install {missing}"


# ----- settings -----------------------------------------------------------------------------------

#: the settings models, read from the environment (pydantic-settings): module, class
SETTINGS = (("reversi.settings", "OperatorSettings"), ("reversi.gateway.settings", "GatewaySettings"),
            ("reversi_devcluster.cluster", "ClusterSettings"))
ENV_WORD = re.compile(r"\bREVERSI_[A-Z0-9_]*[A-Z0-9]\b")


@cache
def settings_defaults() -> dict[str, object]:
    """Every environment variable of a settings model, with its default."""
    out: dict[str, object] = {}
    for module, name in SETTINGS:
        model = getattr(importlib.import_module(module), name)
        prefix = model.model_config.get("env_prefix", "")
        for field, info in model.model_fields.items():
            out[(prefix + field).upper()] = info.default
    return out


@cache
def code_text() -> str:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "operator", "devcluster",
                            "tests", "demo", "benchmarks", "charts", ".ci", "Makefile"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return "\n".join((ROOT / name).read_text(errors="replace") for name in files
                     if (ROOT / name).is_file() and not name.endswith((".pyc", ".png", ".gz")))


def same_default(written: str, default: object) -> bool | None:
    """Whether a default the docs write (``4``, ``2 s``, ``100ms``) is the model's; None when
    there is nothing to compare (no plain default, or words)."""
    written = written.strip().strip("`")
    number = re.match(r"(\d+(?:\.\d+)?)(?:\s*s)?$", written)
    if isinstance(default, bool) or default is None:
        return None
    if isinstance(default, (int, float)) and number:
        return float(number.group(1)) == float(default)
    if isinstance(default, str) and re.fullmatch(r"[\w./-]+", written):
        return written == default
    return None


def written_defaults(text: str) -> Iterator[tuple[str, str]]:
    """``(variable, default)`` as a doc writes them: ```REVERSI_X` (4``, and the rows of tables
    with a ``default`` column and a ``variable`` or ``env`` column (``a``, ``b`` | ``1, 2``)."""
    for line in text.splitlines():
        yield from re.findall(r"`(REVERSI_[A-Z0-9_]+)`\s*\((\d+(?:\.\d+)?(?:\s*s\b)?)", line)
    for header, rows in tables(text):
        if "default" not in header or not {"variable", "env"} & set(header):
            continue
        column = header.index("variable" if "variable" in header else "env")
        for cells in rows:
            envs, written = spans(cells[column]), [v.strip() for v in cells[header.index("default")].split(",")]
            if len(envs) == len(written):
                yield from zip(envs, written, strict=True)


def test_every_setting_the_docs_name_exists_with_its_default():
    """An environment variable the docs name is a field of a settings model or read by the code;
    where the docs give its default, it is the model's."""
    defaults, code = settings_defaults(), code_text()
    wrong = []
    for path in doc_files():
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            wrong += [f"{rel(path)}:{number}: {env} is no setting and nothing in the code reads it"
                      for env in ENV_WORD.findall(line) if env not in defaults and env not in code]
        wrong += [f"{rel(path)}: {env} written with the default {value}: the model's is {defaults[env]!r}"
                  for env, value in written_defaults(text)
                  if env in defaults and same_default(value, defaults[env]) is False]
    assert not wrong, "\n".join(wrong)


# ----- the suite's times --------------------------------------------------------------------------

DURATION = re.compile(r"\b(\d+(?:[.,]\d+)?)(?:-\d+)?\s*(s|min|minutes|hours?)\b")


def figures(text: str) -> set[tuple[str, str]]:
    """The durations of ``text`` as ``(number, unit)``, minutes as ``min``."""
    return {(m.group(1), "min" if m.group(2).startswith("min") else m.group(2)) for m in DURATION.finditer(text)}


def test_the_suites_times_are_quoted_from_one_place():
    """How long ``make test``, ``make e2e`` and ``.ci/run`` take is written in one place,
    docs/development.md#times (the last measured run and the budgets). Elsewhere, a duration next
    to one of their names is one that section gives (or the docs link there instead)."""
    development = ROOT / "docs" / "development.md"
    times = section(development, "Times")
    known = figures(times)
    assert ("12", "min") in known, "docs/development.md#times no longer gives make test's budget: update this test"
    wrong = []
    for path in doc_files():
        text = path.read_text()
        if path == development:
            text = text.replace(times, "\n" * times.count("\n"))
        for number, line in enumerate(text.splitlines(), 1):
            for suite in re.finditer(r"`(make test|make e2e|\.ci/run)`", line):
                near = line[max(0, suite.start() - 30):suite.end() + 30]  # a duration this close is its time
                if figures(near) - known:
                    wrong.append(f"{rel(path)}:{number}: ...{near}... ({sorted(figures(near) - known)})")
    assert not wrong, ("times of the suite that docs/development.md#times does not give (quote it, or link "
                       "there):\n" + "\n".join(wrong))


def test_every_page_of_the_docs_is_reachable_from_the_readme():
    """A page nobody links to is a page nobody reads: every Markdown file under docs/ is reached
    from README.md by following links."""
    seen, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for target in LINK.findall(INLINE_CODE.sub(" ", without_fences(page.read_text()))):
            file = target.partition("#")[0]
            path = (page.parent / file).resolve() if file and not re.match(r"[a-z]+:", file) else None
            if path and path.suffix == ".md" and path.exists() and path not in seen:
                seen.add(path)
                todo.append(path)
    orphans = sorted(rel(path) for path in (ROOT / "docs").rglob("*.md") if path.resolve() not in seen)
    assert not orphans, f"pages of docs/ no link from README.md leads to: {orphans}"


def test_the_kinds_table_is_the_crds():
    """docs/concepts.md's table of kinds has each CRD of crds/ with its scope and short name."""
    crds = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())["spec"]
        scope = {"Namespaced": "namespace", "Cluster": "cluster"}[spec["scope"]]
        crds[spec["names"]["kind"]] = (scope, ", ".join(f"`{name}`" for name in spec["names"].get("shortNames", [])))
    rows = table_rows((ROOT / "docs" / "concepts.md").read_text(), "kind")
    documented = {cells[0]: (cells[1], cells[2]) for cells in rows}
    assert documented == crds, f"docs/concepts.md's kinds (scope, short names) {documented} are not the CRDs' {crds}"


#: reasons the docs give that are not Reversi's conditions', with the file that writes them
NOT_CONDITION_REASONS = {
    "NodeAgentRestarted": "devcluster/reversi_devcluster/nodeagent.py",  # a pod's, written by the node agent
}
REASON_WORDS = re.compile(r"\breasons?:?(?: is| of| are)? ((?:`[A-Z][A-Za-z]+`(?:,? (?:or |and )?|, )?)+)")
CONDITION_TYPE_WORD = re.compile(r"`([A-Z][A-Za-z]+)=(?:True|False|Unknown)`")


def test_every_condition_type_and_reason_the_docs_name_is_reversis():
    """``reason `X``` and ```Type=True``` in the docs name a reason and a type of the closed set
    of :mod:`reversi.conditions`."""
    from reversi import conditions

    for word, source in NOT_CONDITION_REASONS.items():
        assert word in (ROOT / source).read_text(), f"NOT_CONDITION_REASONS: {source} no longer writes {word}: drop it"
    wrong = []
    for path in doc_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            named = [word for match in REASON_WORDS.finditer(line) for word in re.findall(r"`(\w+)`", match.group(1))]
            wrong += [f"{rel(path)}:{number}: reason {word}" for word in named
                      if word not in conditions.REASONS and word not in NOT_CONDITION_REASONS]
            wrong += [f"{rel(path)}:{number}: condition type {word}" for word in CONDITION_TYPE_WORD.findall(line)
                      if word not in conditions.TYPES]
    assert not wrong, "the docs name condition reasons or types reversi.conditions does not have:\n" + "\n".join(wrong)


def test_the_steps_metric_lists_every_bucket():
    """The row of ``reversi_rollback_steps_total`` lists the values of its ``bucket`` label:
    :data:`reversi.metrics.BUCKETS`, the report's buckets in snake case."""
    from reversi.metrics import BUCKETS

    rows = [cells for path in doc_files() for cells in table_rows(path.read_text(), "metric")
            if spans(cells[0]) == ["reversi_rollback_steps_total"]]
    assert len(rows) == 1, "docs/operations.md#metrics has no single row of reversi_rollback_steps_total"
    listed = [word.strip() for word in rows[0][3].split(":", 1)[-1].split(",")]
    assert listed == list(BUCKETS), f"the row lists the buckets {listed}, reversi.metrics.BUCKETS are {BUCKETS}"
