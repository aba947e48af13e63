"""Issue 12's rules for the tree, rechecked on every run since later stops keep moving code:
no import cycles between `lanner` modules, no import inside a function without a comment
saying why, docs/design.md's folder map names every package folder (and only real ones), the
README says what a new user tripped over, no tracked file names a machine path or runs a
module by its pre-`lanner` name, and each command loads only what its install brings."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
TOPS = CONFIG["package-dir"]                 # {"lanner": "engine", ...}


def modules() -> dict[str, Path]:
    """Every module of the distribution by its import name."""
    out = {}
    for package in CONFIG["packages"]:
        top = max((t for t in TOPS if package == t or package.startswith(t + ".")), key=len)
        folder = ROOT / TOPS[top] / Path(*package[len(top):].split(".")[1:])
        for path in folder.glob("*.py"):
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out


def _under_type_checking(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _function_of(node: ast.AST, parents: dict) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def imports(name: str, path: Path):
    """(import node, [lanner modules it names], the function it is in or None) for each import
    outside `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or _under_type_checking(node, parents):
            continue
        if isinstance(node, ast.Import):
            named = [a.name for a in node.names]
        else:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            named = [module] + [f"{module}.{a.name}" for a in node.names]
        yield node, [n for n in named if n.startswith("lanner")], _function_of(node, parents)


def test_no_import_cycles():
    mods = modules()
    graph = {name: set() for name in mods}
    for name, path in mods.items():
        for _, named, function in imports(name, path):
            if function is None:
                graph[name] |= {n for n in named if n in mods and n != name}
    # a cycle is a path that comes back to where it began: depth-first, colouring nodes
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            assert cycle is None, " -> ".join(cycle)


def says_why(lines: list[str], lineno: int) -> bool:
    """A comment on the import's line or on the run of import and comment lines above it."""
    i = lineno - 1
    while i >= 0 and (lines[i].lstrip().startswith(("import ", "from ", "#")) or i == lineno - 1):
        if "#" in lines[i]:
            return True
        i -= 1
    return False


def test_every_import_inside_a_function_says_why():
    """A comment at the import (one comment may head a run of imports), or the function's
    docstring saying what it loads."""
    missing = []
    for name, path in modules().items():
        lines = path.read_text().split("\n")
        for node, _, function in imports(name, path):
            if function is not None and not says_why(lines, node.lineno) \
                    and "load" not in (ast.get_docstring(function) or ""):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not missing, "imports inside a function without a comment saying why:\n" + "\n".join(missing)


def folder_map() -> list[str]:
    """The folders in the first column of docs/design.md's "Where the code lives" table."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Where the code lives", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w/]+/)`", section, re.M)


def test_the_design_folder_map_names_every_package_folder():
    named = set(folder_map())
    for folder in named:
        assert (ROOT / folder).is_dir(), f"docs/design.md names {folder}, which is not a folder"
    folders = {f"{TOPS[top]}/" for top in TOPS}
    for package in CONFIG["packages"]:
        top = max((t for t in TOPS if package == t or package.startswith(t + ".")), key=len)
        rest = package[len(top):].split(".")[1:]
        if len(rest) == 1:                  # a layer: engine/queues/, perf/scenarios/ ...
            folders.add(f"{TOPS[top]}/{rest[0]}/")
    folders -= {"engine/", "perf/scenarios/"}   # the root of the map and a tool suite's insides
    assert folders - named == set(), "package folders missing from docs/design.md's folder map"


def test_the_readme_says_what_a_new_user_tripped_over():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "binary protocol is not supported" in text
    assert "flags are not stored" in text
    assert re.search(r"put <q> \[expiry_ms\]:` blocks \(the expiry is in \*\*milliseconds\*\*", text)
    for doc in re.findall(r"\]\((docs/[\w.]+)\)", text):
        assert (ROOT / doc).is_file(), doc
    assert {"docs/design.md", "docs/formats.md", "docs/compatibility.md"} <= set(
        re.findall(r"\]\((docs/[\w.]+)\)", text))


# a path on a developer's machine; the old top-level names in a `python -m` (issue 12's rename)
MACHINE_PATH = re.compile(r"/(work|home|root)/")
OLD_MODULE_RUN = re.compile(r"python3? -m (engine|protocols|perf)\b")


def test_no_tracked_file_names_a_machine_path_or_an_old_module():
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    offenders = []
    for rel in tracked.stdout.decode().split("\0"):
        path = ROOT / rel
        if not rel or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue                      # binary: images, compiled modules
        for rule in (MACHINE_PATH, OLD_MODULE_RUN):
            offenders += [f"{rel}: {m.group(0)}" for m in rule.finditer(text)]
    assert not offenders, offenders


def _closure(extras: list[str]) -> set[str]:
    """The distributions `pip install .[extras]` brings: lanner's requirements (and those of the
    extras), then theirs, recursively."""
    from packaging.requirements import Requirement      # pip's own dependency; tests only
    from packaging.utils import canonicalize_name
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]
    seen: set[str] = set()
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            pass                          # not installed here: the import check below says so
    return seen


def _loaded(code: str) -> set[str]:
    """Top-level modules a fresh interpreter holds after `code`, less those it starts with (this
    machine's site hooks)."""
    show = "\nimport sys; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    run = [subprocess.run([sys.executable, "-c", c + show], cwd=ROOT, capture_output=True, text=True,
                          timeout=120) for c in ("", code)]
    assert run[1].returncode == 0, run[1].stderr[-2000:]
    return set(run[1].stdout.split()) - set(run[0].stdout.split())


SERVER = """
import pkgutil, importlib, lanner
for m in pkgutil.walk_packages(lanner.__path__, "lanner."):
    if not m.name.startswith(("lanner.spark", "lanner.perf", "lanner.protocols")) or m.name == "lanner.protocols":
        importlib.import_module(m.name)
import lanner.protocols
for m in pkgutil.walk_packages(lanner.protocols.__path__, "lanner.protocols."):
    importlib.import_module(m.name)
"""
PERF = """
import lanner.perf.__main__
from lanner.perf import scenarios
for name in scenarios.MODULES:
    scenarios.load(name)
"""


@pytest.mark.parametrize("code, extras", [(SERVER, []), (PERF, ["perf"])], ids=["lanner", "lanner-perf"])
def test_each_command_imports_only_what_its_install_brings(code, extras):
    """`pip install .` must give a working `lanner`, and `pip install .[perf]` (perf/README.md) a
    working `lanner-perf`, every scenario included: each third-party module they load comes from
    a distribution those requirements bring."""
    from packaging.utils import canonicalize_name
    owners = importlib.metadata.packages_distributions()
    brought = _closure(extras)
    stray = {m: owners[m] for m in _loaded(code) - {"lanner"} if m in owners
             and not {canonicalize_name(d) for d in owners[m]} & brought}
    assert not stray, f"loaded, but not brought by `pip install .[{','.join(extras)}]`: {stray}"
