"""The package's layers: each folder imports only the layers beneath it (and itself); and
beside the package, the benchmarks and the tests share only ``models/``.

Every import is checked, including imports inside functions and under
``TYPE_CHECKING``: a deferred import that climbs a layer is still a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "amp_rewrite"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors"}),
    frozenset({"ir"}),
    frozenset({"inputs"}),
    frozenset({"policy"}),
    frozenset({"runtime"}),
    frozenset({"numerics"}),
    frozenset({"rewrite", "autodiff"}),  # siblings: neither imports the other
    frozenset({"training"}),
    frozenset({"workflows"}),
    frozenset({"cli"}),
)
"""Lowest first. The package root (its public API) and ``__main__`` may import anything."""

NARROWER = {"inputs": frozenset({"errors", "ir"}), "autodiff": frozenset({"errors", "ir"})}
"""Layers that import less than everything beneath them."""

RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _layer(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0] if parts[0] in RANK else None


def _imported_modules(path: Path):
    """Each module an import names (``from m import n``: ``m`` and ``m.n``), and its line."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}: relative import (use amp_rewrite.<layer>...): line {node.lineno}")
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        yield from ((name, node.lineno) for name in names)


def _imported_layers(path: Path):
    for name, line in _imported_modules(path):
        parts = name.split(".")
        if parts[0] == "amp_rewrite" and len(parts) > 1 and parts[1] in RANK:
            yield parts[1], line


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if _layer(p) is not None)


def test_every_module_belongs_to_a_layer():
    loose = [p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__", "errors")]
    assert not loose, f"modules outside every layer folder: {loose}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(RANK), f"folders missing from LAYERS: {folders - set(RANK)}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down(path: Path):
    own = _layer(path)
    allowed = NARROWER.get(own)
    for target, line in _imported_layers(path):
        if target == own:
            continue
        if allowed is not None:
            assert target in allowed, f"{own} may import only {sorted(allowed)}; line {line} imports {target}"
        assert RANK[target] < RANK[own], f"{own} (layer {RANK[own]}) imports {target} (layer {RANK[target]}) " \
                                         f"at line {line}"


RUNS_NOTHING = {"rewrite": ("amp_rewrite.runtime", "onnxruntime")}
"""Layers that run no model, and the modules they must not import even where the layers beneath
allow it: the rewrite judges the measurements its callers hand it (``rewrite.measuring``)."""


@pytest.mark.parametrize("layer", sorted(RUNS_NOTHING))
def test_a_layer_that_runs_nothing_imports_no_runtime(layer: str):
    """``rewrite/`` imports nothing that runs ONNX Runtime: not ``amp_rewrite.runtime``, not
    ``onnxruntime``, not in a function, not under ``TYPE_CHECKING``."""
    forbidden = RUNS_NOTHING[layer]
    found = [f"{path.relative_to(PACKAGE)}:{line} imports {name}"
             for path in sorted((PACKAGE / layer).rglob("*.py"))
             for name, line in _imported_modules(path)
             if any(name == f or name.startswith(f"{f}.") for f in forbidden)]
    assert not found, "\n".join(found)


RUNS_ONNXRUNTIME = "runtime"
"""The one layer that imports ``onnxruntime``: the layers above reach ONNX Runtime through it (a
session, a step's session, the installed registry), the layers beneath read its tables as data."""


def test_onnxruntime_is_imported_in_runtime_only():
    found = [f"{path.relative_to(PACKAGE)}:{line} imports {name}"
             for path in _modules() if _layer(path) != RUNS_ONNXRUNTIME
             for name, line in _imported_modules(path) if name == "onnxruntime" or name.startswith("onnxruntime.")]
    assert not found, "\n".join(found)


ROOMS = {"training": (frozenset({"spec", "adapters"}), frozenset({"graph"}), frozenset({"preflight"}),
                      frozenset({"options"}), frozenset({"step"}), frozenset({"runner"}))}
"""Rooms inside a layer, lowest first: each module imports only the rooms beneath its own (and its
own). ``training``: the step's interface and the model adapters; the step graph's pieces; the
checks made before a build; the step's options; the builder; the runner."""


def _room(path: Path) -> tuple[str, str] | None:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[0] in ROOMS and len(parts) > 1 and parts[1] != "__init__":
        return parts[0], parts[1]
    return None


@pytest.mark.parametrize("path", [p for p in _modules() if _room(p)], ids=lambda p: str(p.relative_to(PACKAGE)))
def test_rooms_import_only_the_rooms_beneath_them(path: Path):
    layer, own = _room(path)  # type: ignore[misc]
    rank = {room: at for at, rooms in enumerate(ROOMS[layer]) for room in rooms}
    assert own in rank, f"{path.relative_to(PACKAGE)}: a room missing from ROOMS[{layer!r}]"
    for name, line in _imported_modules(path):
        parts = name.split(".")
        if parts[:2] == ["amp_rewrite", layer] and len(parts) > 2 and parts[2] != own:
            assert parts[2] in rank and rank[parts[2]] < rank[own], \
                f"{own} (room {rank[own]}) imports {parts[2]} at line {line}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_itself_back():
    """No import cycle between the package's modules, counting deferred imports and those under
    ``TYPE_CHECKING``: ``from pkg import mod`` is an import of ``pkg.mod`` where that is a module."""
    import networkx as nx

    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph.add_edges_from((name, t) for t in targets if t in modules and t != name)
    cycles = sorted(nx.simple_cycles(graph), key=len)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles[:10])


MAX_MODULE_LINES, MAX_CLASS_LINES = 600, 250


def test_no_module_or_class_is_too_long_to_read():
    long = []
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text()
        if source.count("\n") > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(PACKAGE)}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1 if isinstance(node, ast.ClassDef) else 0
            if lines > MAX_CLASS_LINES:
                long.append(f"{path.relative_to(PACKAGE)}: class {node.name}, {lines} lines")
    assert not long, "\n".join(long)


def test_the_runtime_check_sees_deferred_and_type_checking_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from amp_rewrite.runtime import ranges\n\n\ndef f():\n    import onnxruntime as ort\n")
    names = [(name, line) for name, line in _imported_modules(module)
             if name.startswith(RUNS_NOTHING["rewrite"])]
    assert names == [("amp_rewrite.runtime", 3), ("amp_rewrite.runtime.ranges", 3), ("onnxruntime", 7)]


def test_the_rewrite_layer_loads_no_runtime():
    """Nor through the layers beneath it: every module under ``rewrite/`` imported, neither
    ``amp_rewrite.runtime`` nor ONNX Runtime is loaded."""
    code = ("import pkgutil, importlib, sys, amp_rewrite.rewrite as r\n"
            "for m in pkgutil.walk_packages(r.__path__, 'amp_rewrite.rewrite.'): importlib.import_module(m.name)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('amp_rewrite.runtime', 'onnxruntime'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_the_check_catches_an_upward_import(tmp_path):
    """The walker sees an import inside a function (the old convert -> validate -> check -> convert cycle)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from amp_rewrite.workflows.convert import convert\n")
    assert list(_imported_layers(module)) == [("workflows", 2), ("workflows", 2)]


ROOT = PACKAGE.parent
APART = {"benchmarks": frozenset({"tests"}), "tests": frozenset({"benchmarks"}),
         "models": frozenset({"tests", "benchmarks"})}
"""Folders beside the package, and the folders each must not import: what the benchmarks and the
tests share is in ``models/``, which imports neither."""


def _top_level_imports(path: Path):
    """Each absolute import's top-level name and line (a relative one stays in its own folder)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level:
            yield node.module.split(".")[0], node.lineno
        elif isinstance(node, ast.Import):
            yield from ((alias.name.split(".")[0], node.lineno) for alias in node.names)


def test_benchmarks_and_tests_do_not_import_each_other():
    crossings = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                 for folder, forbidden in APART.items()
                 for path in sorted((ROOT / folder).rglob("*.py"))
                 if not path.is_relative_to(ROOT / "benchmarks" / "work")  # the benchmarks' output
                 for name, line in _top_level_imports(path) if name in forbidden]
    assert not crossings, "\n".join(crossings)


def test_the_walker_sees_deferred_imports_and_leaves_relative_ones(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import benchmarks.run\nfrom . import helpers\n\n\ndef f():\n    from tests.x import y\n")
    assert sorted(_top_level_imports(module)) == [("benchmarks", 1), ("tests", 6)]
