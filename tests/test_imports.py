"""The import graph of rlhfkit/: no cycles, no import up docs/architecture.md's layers, the leaves stay leaves, and
no module imports TRL (read from the source, and tried in an interpreter where TRL cannot be imported).

The graph is read from the source with ast, imports inside functions included: a late import hides a cycle
from Python, not from a reader. Edges: ``import a.b.c`` and ``from a.b import c`` (c a submodule) point at
that module only; ``from a.b import name`` points at a.b. A submodule's implicit import of its parent package
is not an edge (every module would otherwise depend on its package's __init__).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rlhfkit"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """Every module `name` imports, made absolute; `from a import b` names a.b when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            out += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    return out


def import_graph() -> dict[str, set[str]]:
    """rlhfkit module -> the rlhfkit modules it imports."""
    modules = _sources()
    return {
        name: {target for target in _imports(name, path, modules) if target in modules and target != name}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _third_party(name: str) -> list[str]:
    """Top-level modules outside the standard library and rlhfkit that module `name` imports."""
    modules = _sources()
    tops = {target.split(".")[0] for target in _imports(name, modules[name], modules)}
    return sorted(t for t in tops if t and t != "__future__" and t != "rlhfkit" and t not in sys.stdlib_module_names)


def test_graph_sees_late_and_relative_imports():
    graph = import_graph()
    assert "rlhfkit.tracking.rundir" in graph["rlhfkit.tracking.logger"]
    assert "rlhfkit.tasks.base" in graph["rlhfkit.tasks.sort"]  # from .base import ...
    assert "rlhfkit.metrics.registry" in graph["rlhfkit.trainers.ppo.trainer"]  # from rlhfkit.metrics import registry
    assert "rlhfkit.trainers.ppo" in graph["rlhfkit"]  # inside the package's __getattr__


def test_no_import_cycles():
    graph = import_graph()
    cycles = _cycles(graph)
    described = [
        ", ".join(sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)) for component in cycles
    ]
    assert not cycles, "import cycles in rlhfkit/:\n" + "\n".join(described)


def test_leaves_import_nothing_above_them():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("rlhfkit.ops"):
            assert all(t.startswith("rlhfkit.ops") for t in targets), (name, targets)
    for leaf in ("rlhfkit.metrics.registry", "rlhfkit.tracking.rundir"):
        assert not graph[leaf], (leaf, graph[leaf])
    assert not _third_party("rlhfkit.metrics.registry")
    # The run directory's format is read while a config is parsed: of the third-party packages only its lock's.
    assert _third_party("rlhfkit.tracking.rundir") == ["filelock"]
    # The health rules run in `rlhfkit doctor` and in tests without torch: stdlib plus the metric registry.
    assert graph["rlhfkit.health.rules"] <= {"rlhfkit.metrics.registry"}
    assert not _third_party("rlhfkit.health.rules")


def layers() -> dict[str, int]:
    """docs/architecture.md's table: package or module -> its layer (0 the lowest)."""
    text = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    out = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 3 and cells[1].isdigit():
            out.update({name: int(cells[1]) for name in re.findall(r"`([\w.]+)`", cells[2])})
    return out


def layer_of(module: str, table: dict[str, int]) -> str:
    """The table's entry that holds `module`: itself, or the longest package containing it."""
    candidates = [name for name in table if module == name or module.startswith(name + ".")]
    assert candidates, f"{module} is in no row of docs/architecture.md's table: add it to one"
    return max(candidates, key=len)


def test_no_module_imports_a_layer_above_its_own():
    table, graph = layers(), import_graph()
    assert len(table) >= 20  # the parse found the table
    upward = []
    for module, targets in graph.items():
        own = layer_of(module, table)
        for target in targets:
            other = layer_of(target, table)
            if table[other] > table[own]:
                upward.append(f"{module} (layer {table[own]}) imports {target} (layer {table[other]})")
    assert not upward, "imports that go up docs/architecture.md's layers:\n" + "\n".join(sorted(upward))


def test_errors_import_only_the_standard_library():
    assert not import_graph()["rlhfkit.errors"]
    assert not _third_party("rlhfkit.errors")


def test_every_exception_class_lives_in_errors():
    """docs/architecture.md: every exception is in rlhfkit/errors.py, so no module imports a heavier one to name an
    error. A class counts as an exception when a base is one of Python's or errors.py's exception classes."""
    import builtins

    import rlhfkit.errors as errors

    exception_names = {name for name, value in vars(builtins).items() if isinstance(value, type)}
    exception_names = {n for n in exception_names if issubclass(getattr(builtins, n), BaseException)}
    exception_names |= {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)}
    outside = []
    for name, path in _sources().items():
        if name == "rlhfkit.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if bases & exception_names:
                    outside.append(f"{name}.{node.name}")
    assert not outside, f"exception classes outside rlhfkit/errors.py: {outside}"


# --- TRL is a test and docs dependency, never rlhfkit's ------------------------------------------------------------------


def _trl_imports(path: Path, root: Path = ROOT.parent) -> list[str]:
    """`import trl...` and `from trl... import` statements of one file, at any level (inside functions too), as
    "path:line: statement"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name == "trl" or name.startswith("trl.") for name in names):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_of_rlhfkit_imports_trl():
    """rlhfkit runs without TRL installed: what it knows of TRL is recorded (config/trl_recorded.py), and whatever
    reads TRL itself lives outside the package (docs/trl_defaults.py, bench/health/run_trl.py, the tests)."""
    offenders = [hit for path in sorted(ROOT.rglob("*.py")) for hit in _trl_imports(path)]
    assert not offenders, "rlhfkit/ imports TRL:\n" + "\n".join(offenders)


def test_the_trl_scan_sees_late_and_dotted_imports(tmp_path):
    source = tmp_path / "rlhfkit" / "m.py"
    source.parent.mkdir()
    source.write_text(
        "import trlx\nfrom .trl import a\n\ndef f():\n    import trl.trainer\n    from trl.scripts import b\n"
    )
    hits = [hit.split(": ", 1)[1] for hit in _trl_imports(source, tmp_path)]
    assert hits == ["import trl.trainer", "from trl.scripts import b"]


@pytest.mark.slow
def test_every_module_of_rlhfkit_imports_without_trl():
    """Each module of rlhfkit/ imports in a fresh interpreter in which TRL cannot be imported (as where it is not
    installed); the __main__ modules are imported as the packages they run."""
    names = [name for name in _sources() if not name.endswith(".__main__")]
    program = (
        "import importlib, sys\n"
        "sys.modules['trl'] = None  # `import trl` and `import trl.x` now raise ImportError\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "assert sys.modules['trl'] is None\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT.parent))
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=ROOT.parent)
    assert result.returncode == 0, result.stderr[-3000:]
