"""Labs come from solutions, twins stay in sync, every notebook starts the same way."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import nbformat
import pytest

from tools import notebooks

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_strip_solutions_keeps_indent_and_names_the_exercise():
    src = ("def tile(a, b):\n"
           "    ### BEGIN SOLUTION Exercise 2 (tiling)\n"
           "    out = a @ b\n"
           "    return out\n"
           "    ### END SOLUTION\n"
           "check(tile)")
    lab = notebooks.strip_solutions(src)
    assert "a @ b" not in lab
    assert '    raise NotImplementedError("Exercise 2 (tiling): write your code here")' in lab
    assert lab.endswith("check(tile)")


@pytest.mark.parametrize("src,msg", [
    ("### BEGIN SOLUTION\nx = 1\n", "without an END"),
    ("x = 1\n### END SOLUTION\n", "without a BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "nested"),
])
def test_unbalanced_markers_are_errors(src, msg):
    with pytest.raises(ValueError, match=msg):
        notebooks.strip_solutions(src)


def test_lab_from_solution_drops_solution_cells_and_outputs():
    code = nbformat.v4.new_code_cell("### BEGIN SOLUTION Ex 1\ny = 2\n### END SOLUTION")
    code.outputs = [nbformat.v4.new_output("stream", text="2")]
    code.execution_count = 3
    hidden = nbformat.v4.new_markdown_cell("The answer is 2 because ...")
    hidden.metadata["tags"] = ["solution"]
    title = nbformat.v4.new_markdown_cell("# Lab 1 (solution): systolic arrays")
    imp = nbformat.v4.new_code_cell("from tpu_course.checks import NotWritten")
    lab = notebooks.lab_from_solution(_nb(title, imp, code, hidden))
    assert [c.cell_type for c in lab.cells] == ["markdown", "code", "code"]
    assert lab.cells[0].source == "# Lab 1: systolic arrays"
    assert lab.cells[2].outputs == [] and lab.cells[2].execution_count is None
    assert "y = 2" not in lab.cells[2].source


def test_setup_cell_installs_nothing_and_starts_no_jax_when_the_package_is_present():
    code = notebooks.SETUP_CELL + "\nprint('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert notebooks.REPOSITORY in notebooks.SETUP_CELL


def test_repository_is_consistent_everywhere():
    """The Colab links, the setup cell and pyproject's URL come from one setting."""
    pyproject = (notebooks.ROOT / "pyproject.toml").read_text()
    assert f"https://github.com/{notebooks.REPOSITORY}" in pyproject


def test_course_has_no_drift():
    """Twins in sync, labs equal to what `make labs` writes, setup cells, README links."""
    problems = notebooks.check()
    assert problems == [], "\n".join(problems)


def test_every_lab_has_stubs_and_no_solution_markers():
    labs = sorted((notebooks.ROOT / "labs").glob("*.ipynb"))
    for lab in labs:
        text = lab.read_text()
        assert "### BEGIN SOLUTION" not in text, lab.name
        assert "NotImplementedError" in text, f"{lab.name} has no exercise"


def test_top_level_stubs_leave_not_written_values_and_function_stubs():
    src = ("### BEGIN SOLUTION Exercise 3 (predict)\n"
           "flops, bytes_ = 2 * 8, 4 * 8\n"
           "def ai(f: float, b: float) -> float:\n"
           "    return f / b\n"
           "### END SOLUTION\n"
           "check(flops, bytes_, ai)")
    lab = notebooks.strip_solutions(src)
    assert 'flops = NotWritten("Exercise 3 (predict)")' in lab
    assert 'bytes_ = NotWritten("Exercise 3 (predict)")' in lab
    assert "def ai(f: float, b: float) -> float:" in lab and "f / b" not in lab
    ns = {"NotWritten": __import__("tpu_course.checks", fromlist=["NotWritten"]).NotWritten}
    exec(lab.replace("check(flops, bytes_, ai)", ""), ns)  # an unsolved cell does not raise
    with pytest.raises(NotImplementedError):
        ns["ai"](1.0, 2.0)


def test_a_lab_with_value_stubs_must_import_not_written():
    code = nbformat.v4.new_code_cell("### BEGIN SOLUTION Ex 1\ny = 2\n### END SOLUTION")
    with pytest.raises(ValueError, match="import"):
        notebooks.lab_from_solution(_nb(code))
    imp = nbformat.v4.new_code_cell("from tpu_course.checks import NotWritten, ch01")
    assert notebooks.lab_from_solution(_nb(imp, code)).cells[1].source.endswith('NotWritten("Ex 1")')


def test_same_code_cells_must_equal_the_package_source(tmp_path):
    import inspect

    from tpu_course import checks

    good = "# Same code as tpu_course.checks.is_not_written\n" + inspect.getsource(checks.is_not_written)
    bad = good.replace("isinstance", "type")
    for name, src in (("good", good), ("bad", bad)):
        nbformat.write(_nb(nbformat.v4.new_code_cell(src)), tmp_path / f"{name}.ipynb")
    assert notebooks.same_code_problems(tmp_path / "good.ipynb") == []
    problems = notebooks.same_code_problems(tmp_path / "bad.ipynb")
    assert len(problems) == 1 and "differs from tpu_course.checks.is_not_written" in problems[0]


def test_labs_refuse_a_solution_whose_ipynb_is_older_than_its_twin(tmp_path, monkeypatch):
    """`make labs` reads solutions/*.ipynb: a twin edited without a rebuild must stop it."""
    import shutil

    (tmp_path / "solutions").mkdir()
    (tmp_path / "labs").mkdir()
    for suffix in (".ipynb", ".py"):
        shutil.copy(notebooks.ROOT / "solutions" / f"01_systolic_array{suffix}",
                    tmp_path / "solutions" / f"01_systolic_array{suffix}")
    monkeypatch.setattr(notebooks, "ROOT", tmp_path)
    assert notebooks.write_labs() == []  # in sync: the lab is written
    assert (tmp_path / "labs" / "01_systolic_array.ipynb").exists()
    twin = tmp_path / "solutions" / "01_systolic_array.py"
    twin.write_text(twin.read_text() + "\n# %%\nprint('edited, not rebuilt')\n")
    (tmp_path / "labs" / "01_systolic_array.ipynb").unlink()
    problems = notebooks.write_labs()
    assert len(problems) == 1 and "rebuild the solution first" in problems[0]
    assert not (tmp_path / "labs" / "01_systolic_array.ipynb").exists()


@pytest.mark.stack_independent
def test_no_cell_source_holds_a_control_character():
    """A "\\a" of "\\approx" once became a BEL in a twin: Jupyter then shows "pprox" and the
    site a math error. Outputs may keep ANSI colour codes; sources may not."""
    import re

    control = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
    root = pathlib.Path(__file__).resolve().parent.parent
    found = []
    for folder in ("notebooks", "solutions", "labs"):
        for path in sorted((root / folder).glob("[0-9][0-9]_*")):
            if path.suffix == ".py":
                sources = [path.read_text(encoding="utf-8")]
            elif path.suffix == ".ipynb":
                nb = json.loads(path.read_text(encoding="utf-8"))
                sources = ["".join(c["source"]) for c in nb["cells"]]
            else:
                continue
            found += [f"{path.name}: {m.group()!r}" for s in sources
                      for m in control.finditer(s)]
    assert not found, found


#: The widest notebook line (CONTRIBUTING: the website's code column and Colab's default
#: width show about 88 characters; wider lines scroll sideways and shrink a slide).
LINE_WIDTH = 88


def _wide_lines(path: pathlib.Path) -> list[str]:
    """``file cell N line M (L ch, where)`` for each code line and each plain-text output
    line (a stream or a text/plain result shown as text; not an image, not the text/plain
    stand-in of a result that has HTML) wider than LINE_WIDTH. The setup cell too: it is
    folded on Colab and hidden on the site, but opened it must read well."""
    import re

    ansi = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    found = []
    for i, cell in code:
        texts = [("code", "".join(cell["source"]))]
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if out["output_type"] == "stream":
                texts.append(("output", "".join(out["text"])))
            elif "text/plain" in data and not {"text/html", "image/png"} & set(data):
                texts.append(("output", "".join(data["text/plain"])))
        for where, text in texts:
            for n, line in enumerate(ansi.sub("", text).splitlines(), 1):
                if len(line) > LINE_WIDTH:
                    found.append(f"{path.parent.name}/{path.name} cell {i} line {n} "
                                 f"({len(line)} ch, {where}): {line[:60]}")
    return found


def test_notebook_lines_fit_the_page(tmp_path):
    """Every code line and printed text line of every committed notebook, lab and
    solution is at most 88 characters."""
    nb = _nb(nbformat.v4.new_markdown_cell("m" * 100),  # markdown wraps: not checked
             nbformat.v4.new_code_cell("y = 1\n" + "z" * 89))
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="ok\n" + "o" * 89),
                           nbformat.v4.new_output("display_data", data={
                               "text/plain": "p" * 99, "text/html": "<b>wraps</b>"})]
    planted = tmp_path / "notebooks" / "99_x.ipynb"
    planted.parent.mkdir()
    nbformat.write(nb, planted)
    assert _wide_lines(planted) == [  # the check itself finds what it should, and only that
        f"notebooks/99_x.ipynb cell 1 line 2 (89 ch, code): {'z' * 60}",
        f"notebooks/99_x.ipynb cell 1 line 2 (89 ch, output): {'o' * 60}"]

    root = pathlib.Path(__file__).resolve().parent.parent
    wide = [w for folder in ("notebooks", "labs", "solutions")
            for path in sorted((root / folder).glob("[0-9][0-9]_*.ipynb"))
            for w in _wide_lines(path)]
    assert not wide, f"{len(wide)} lines over {LINE_WIDTH} characters:\n" + "\n".join(wide)
