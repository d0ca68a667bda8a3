"""Every hand-kept list of the project's parts matches the files it lists.

A module added without its registry entry (``tpu_course.transfer`` once raised
``AttributeError``), a chapter missing from the README, a lab without its checker: each
fails here with the names that differ.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import tpu_course
from tpu_course import checks, hardware

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tpu_course"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _modules() -> set[str]:
    """tpu_course's modules and subpackages, as the files have them."""
    files = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    return files | packages


def _section(title: str) -> str:
    """The README text from the heading ``title`` to the next heading of that level."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def test_lazy_submodules_are_the_package_files():
    assert set(tpu_course._SUBMODULES) == _modules() - {"__main__"}
    for name in tpu_course._SUBMODULES:  # each one loads through the package attribute
        assert getattr(tpu_course, name) is importlib.import_module(f"tpu_course.{name}")


def test_readme_package_table_names_every_module():
    table = [line for line in _section("Package").splitlines() if line.startswith("|")][2:]
    named = {n for line in table for n in re.findall(r"`([\w]+)`", line.split("|")[2])}
    named -= {"doctor"}  # the command __main__ provides, named beside it
    assert named == _modules()
    # parts of a package are named package.part (train.step, hlo.text): a package whose
    # parts the table names has every part named, and nothing else
    parts = {n for line in table for n in re.findall(r"`(\w+\.\w+)`", line.split("|")[2])}
    packages = {n.split(".")[0] for n in parts}
    files = {f"{pkg}.{p.stem}" for pkg in packages for p in (PACKAGE / pkg).glob("*.py")
             if p.stem != "__init__"}
    assert parts == files
    assert {"train", "hlo"} <= packages


def test_every_module_has_its_test_file():
    """CONTRIBUTING's "one module per concept with its test": tests/test_<module>.py
    (the ``checks`` package: tests/test_engine.py and one file per lab)."""
    own = {"checks": "engine"}
    missing = sorted(m for m in _modules() - {"__main__"}
                     if not (ROOT / "tests" / f"test_{own.get(m, m)}.py").exists())
    assert not missing, f"modules without tests/test_<module>.py: {missing}"


def test_labs_are_the_checker_files_and_the_chapters():
    files = {p.stem for p in (PACKAGE / "checks").glob("ch[0-9][0-9].py")}
    assert set(checks.LABS) == files
    chapters = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    assert [f"ch{c[:2]}" for c in chapters] == list(checks.LABS)
    for folder in ("solutions", "labs"):
        assert sorted(p.stem for p in (ROOT / folder).glob("[0-9][0-9]_*.py")) == chapters, folder


def test_preflight_has_one_row_per_chapter():
    """A new chapter gets its preflight row (CONTRIBUTING, "Where a new thing goes"):
    ``preflight.CHAPTERS`` is the notebooks' chapter numbers, each with its ``_chN``."""
    from tpu_course import preflight

    numbers = tuple(int(p.stem[:2]) for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")))
    assert preflight.CHAPTERS == numbers
    missing = [n for n in numbers if not callable(getattr(preflight, f"_ch{n}", None))]
    assert not missing, f"chapters without a preflight check: {missing}"


def test_readme_chapter_table_lists_every_notebook_lab_and_solution():
    chapters = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    for folder in ("notebooks", "labs", "solutions"):
        linked = sorted(set(re.findall(rf"/blob/main/{folder}/(\d\d_\w+)\.ipynb", README)))
        assert linked == chapters, folder


def test_every_compile_only_generation_is_a_tpu_row():
    """hlo's targets come from the hardware table: no second list of generations."""
    from tpu_course.hlo import aot

    assert set(aot.VERIFIED_TOPOLOGIES) <= {c.name for c in hardware.CHIPS.values()
                                            if c.kind == "tpu"}
    assert aot.valid_topologies() == [f"{c.name}:{s}" for c in hardware.CHIPS.values()
                                      for s in c.compile_only_topologies]


def test_the_pure_layer_imports_no_jax():
    """CONTRIBUTING's pure layer: importing it never imports JAX."""
    import subprocess
    import sys

    pure = ("hardware", "systolic", "roofline", "comms", "plans", "costs", "hlo.text")
    code = ("import sys\n" + "".join(f"import tpu_course.{m}\n" for m in pure)
            + "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    assert out == "[]"
