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


def test_importing_the_package_leaves_the_import_system_as_it_was():
    """No finder, no hook: ``import tpu_course`` adds nothing to ``sys.meta_path`` or
    ``sys.path_hooks`` (checked in a fresh interpreter, where the package is not loaded)."""
    import subprocess
    import sys

    code = ("import sys; before = (list(sys.meta_path), list(sys.path_hooks)); "
            "import tpu_course; print(before == (list(sys.meta_path), list(sys.path_hooks)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_old_names_are_gone_not_served():
    """The old names (CHANGELOG.md lists them with their homes) are plain missing names:
    no module keeps a ``__getattr__`` or a table that answers for them."""
    import importlib

    for name in ("train_step", "kernels", "aot"):
        assert not (ROOT / "tpu_course" / f"{name}.py").exists()
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"tpu_course.{name}")
    assert not hasattr(tpu_course, "MOVED")
    for path in (ROOT / "tpu_course").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name)}
        assert "MOVED" not in names, path
        if path.name != "__init__.py":  # a package's __init__ may load its parts lazily
            assert "__getattr__" not in names, path


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
