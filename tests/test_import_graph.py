"""The package's and the tools' import graphs have no cycle.

Every import counts, also one inside a function (a cycle that only bites at call time is
still two modules that each need the other); imports under ``if TYPE_CHECKING:`` do not.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import tpu_course

pytestmark = pytest.mark.stack_independent

ROOT = pathlib.Path(__file__).resolve().parent.parent


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: pathlib.Path, package: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports (anywhere but TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path)
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.split(".")
                parent = parent if is_package else parent[:-1]
                parent = parent[:len(parent) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            for alias in node.names:
                found.add(f"{base}.{alias.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    # "from tpu_course import hlo" names the module tpu_course.hlo; a name that is not a
    # module counts as its module. A package's own submodules are not a cycle with it.
    out = set()
    for name in found:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != here and name.startswith(package):
            out.add(name)
    return out


def graph(package: str) -> dict[str, set[str]]:
    folder = ROOT / package
    paths = [p for p in folder.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {module_name(p) for p in paths}
    edges = {module_name(p): imports_of(p, package, modules) for p in paths}
    # a package's __init__ importing its own submodules (its public face) is not a cycle
    for name, deps in edges.items():
        deps -= {d for d in deps if d.startswith(name + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return groups


def test_the_cycle_finder_finds_a_cycle_and_ignores_a_chain():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("package", ["tpu_course", "tools"])
def test_no_import_cycle(package):
    found = cycles(graph(package))
    assert not found, f"modules that import each other (break each): {found}"


def test_a_moved_name_says_where_it_lives_now_instead_of_serving_it():
    """No module re-exports another's names: learners' older notebooks get the new home."""
    from tpu_course import comms, parallel

    for module, name, home in ((comms, "training_cost", "tpu_course.costs"),
                               (comms, "collective_bytes", "tpu_course.plans"),
                               (parallel, "launch_local", "tpu_course.multihost")):
        with pytest.raises(AttributeError, match=f"moved to {home}"):
            getattr(module, name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        comms.nothing  # noqa: B018


@pytest.mark.parametrize("old, home", sorted(tpu_course.MOVED.items()))
def test_a_module_that_moved_into_a_package_names_its_new_home(old, home):
    """``from tpu_course import train_step`` (a saved notebook) says where it went."""
    import importlib

    assert not (ROOT / "tpu_course" / f"{old}.py").exists()
    with pytest.raises(ImportError, match=f"tpu_course.{old} moved to {home}"):
        exec(f"from tpu_course import {old}", {})
    with pytest.raises(ImportError, match=f"moved to {home}"):
        importlib.import_module(f"tpu_course.{old}")
    with pytest.raises(AttributeError, match=f"moved to {home}"):
        getattr(tpu_course, old)
    assert not hasattr(tpu_course, old)
    assert importlib.import_module(home).__name__ == home


def test_a_renamed_module_says_its_new_name():
    """``kernels`` held no kernels: it is ``pallas_tools`` (the Pallas helpers) now, and a
    saved notebook's ``kernels.compile_verdict`` is told what to write instead."""
    with pytest.raises(ImportError, match=r"tpu_course\.kernels moved to tpu_course\."
                                          r"pallas_tools: use `from tpu_course import "
                                          r"pallas_tools`, then pallas_tools\.X"):
        exec("from tpu_course import kernels", {})
    assert "kernels" not in tpu_course._SUBMODULES


def test_no_module_uses_another_modules_private_names():
    """``models._widths`` from ``train.config`` was one: a name used across modules is
    public (within one package, such as ``checks`` with its ``_core`` and ``_answers``, the
    parts may share private names)."""
    root = ROOT / "tpu_course"
    found = []
    for path in sorted(root.rglob("*.py")):
        here = module_name(path)
        package = here if path.name == "__init__.py" else here.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tpu_course"):
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and not (node.module + ".").startswith(package + "."):
                        found.append(f"{path.name}:{node.lineno}: {node.module}.{alias.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (aliases[node.value.id] + ".").startswith(package + ".")):
                found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not found, found
