"""``tpu-course grade`` on a small room of lab-1 submissions (the fastest lab).

Two grading runs, shared by the tests: real lab-1 notebooks (the solution, the unsolved
lab, a planted wrong answer after a cell that raises, a truncated file) with ``--jobs 2``;
and small notebooks with a short ``--timeout`` (an endless loop, a kernel exit, a cell
deleting its folder, one that patches the checkers to always pass, lab 2's notebook
under a lab-1 file name, a notebook that is not a lab).
"""

from __future__ import annotations

import csv
import pathlib
import subprocess
import sys

import nbformat
import pytest

from tpu_course import checks, grade

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHORT_TIMEOUT_S = 10
LAB1 = [e.title for e in checks.lab(1).exercises]
LAB2 = [e.title for e in checks.lab(2).exercises]


def _read(path: pathlib.Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _code_index(nb: nbformat.NotebookNode, text: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and text in c.source)


def _tiny_lab1(*sources: str) -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_markdown_cell("# Lab 1: The systolic array")]
    return nbformat.v4.new_notebook(cells=cells + [nbformat.v4.new_code_cell(s) for s in sources])


def _rows(out: pathlib.Path) -> dict[str, list[dict]]:
    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    by_file: dict[str, list[dict]] = {}
    for r in rows:
        by_file.setdefault(pathlib.Path(r["file"]).name, []).append(r)
    return by_file


@pytest.fixture(scope="module")
def room(tmp_path_factory) -> tuple[pathlib.Path, dict[str, list[dict]]]:
    subs = tmp_path_factory.mktemp("subs")
    solution = _read(ROOT / "solutions" / "01_systolic_array.ipynb")
    # Learners rename files: nothing below is called after its lab.
    nbformat.write(solution, subs / "notebook (3).ipynb")
    nbformat.write(_read(ROOT / "labs" / "01_systolic_array.ipynb"), subs / "mine.ipynb")
    wrong = _read(ROOT / "solutions" / "01_systolic_array.ipynb")
    i = _code_index(wrong, "predicted_stall = 32.0")
    wrong.cells[i].source = wrong.cells[i].source.replace("predicted_stall = 32.0",
                                                          "predicted_stall = 64.0")
    wrong.cells.insert(2, nbformat.v4.new_code_cell("1 / 0  # a learner's cell that raises"))
    nbformat.write(wrong, subs / "wrong.ipynb")
    text = (ROOT / "labs" / "01_systolic_array.ipynb").read_text()
    (subs / "truncated.ipynb").write_text(text[: len(text) // 2])
    out = tmp_path_factory.mktemp("out")
    proc = subprocess.run([sys.executable, "-m", "tpu_course", "grade", str(subs), "--out",
                           str(out), "--jobs", "2", "--timeout", "300"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, _rows(out)


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> tuple[pathlib.Path, dict[str, list[dict]], float]:
    subs = tmp_path_factory.mktemp("odd")
    nbformat.write(_tiny_lab1("predicted_stall = 32.0",  # an endless loop that spares the CPU
                              "import time\nwhile True:\n    time.sleep(0.2)"),
                   subs / "loop.ipynb")
    nbformat.write(_tiny_lab1("import os\nos._exit(3)", "predicted_stall = 32.0"),
                   subs / "exits.ipynb")
    nbformat.write(_tiny_lab1("import os, shutil\nshutil.rmtree(os.getcwd())",
                              "predicted_stall = 32.0"), subs / "deletes.ipynb")
    nbformat.write(_tiny_lab1(
        "from tpu_course import checks\n"
        "from tpu_course.checks import _core\n"
        "_core.Exercise.run = lambda self, *a, **k: _core.ok(self.title)\n"
        "_core.Exercise.grade = lambda self, ns: _core.ok(self.title)\n"
        "checks.ch01.LAB.grade = lambda ns: [_core.ok(e.title)\n"
        "                                    for e in checks.ch01.LAB.exercises]\n"
        "predicted_stall = 'whatever'\n"
        "print(checks.ch01.LAB.scorecard(globals()))  # 5 of 5, printed: never read\n"),
        subs / "cheat.ipynb")
    lab2 = _read(ROOT / "labs" / "02_first_program.ipynb")
    lab2.cells = [c for c in lab2.cells if c.cell_type == "markdown"]
    nbformat.write(lab2, subs / "01_systolic_array.ipynb")
    nbformat.write(_read(ROOT / "notebooks" / "01_systolic_array.ipynb"), subs / "chapter.ipynb")
    out = tmp_path_factory.mktemp("odd-out")
    rows = grade.grade([subs], out, timeout_s=SHORT_TIMEOUT_S, jobs=2, progress=False)
    assert {r["status"] for r in rows} <= set(grade.STATUSES)
    loop_s = max(r["seconds"] for r in rows if r["file"].endswith("loop.ipynb"))
    return out, _rows(out), loop_s


def _statuses(rows: list[dict]) -> list[str]:
    return [r["status"] for r in rows]


def test_solution_passes_everything(room):
    rows = room[1]["notebook (3).ipynb"]
    assert [r["exercise"] for r in rows] == LAB1 and {r["lab"] for r in rows} == {"1"}
    assert _statuses(rows) == ["passed"] * len(LAB1), rows


def test_unsolved_lab_is_all_not_written(room):
    assert _statuses(room[1]["mine.ipynb"]) == ["not written"] * len(LAB1)


def test_wrong_answer_fails_only_its_exercise_despite_a_raising_cell(room):
    rows = room[1]["wrong.ipynb"]
    assert _statuses(rows) == ["passed"] * (len(LAB1) - 1) + ["failed"], rows


def test_patched_checkers_grade_nothing(odd):
    rows = odd[1]["cheat.ipynb"]
    assert all(s in ("failed", "not written") for s in _statuses(rows)), rows
    assert rows[-1]["status"] == "failed"  # the string it answered, judged by a fresh checker


def test_truncated_file_is_an_error_row(room):
    (row,) = room[1]["truncated.ipynb"]
    assert row["status"] == "error" and "not a readable notebook" in row["message"]


def test_summary_totals_and_room_share(room):
    text = (room[0] / "summary.md").read_text()
    assert "## Lab 1: The systolic array (3 submission(s))" in text
    assert f"| {LAB1[-1]} | 1 of 3 | 33% |" in text  # only the solution passed exercise 5
    assert f"| {LAB1[0]} | 2 of 3 | 67% |" in text
    assert "| 5 of 5 | - |" in text and "truncated.ipynb" in text.split("## Not graded")[1]


def test_endless_loop_times_out_and_the_run_goes_on(odd):
    _, rows, loop_s = odd
    assert _statuses(rows["loop.ipynb"]) == ["timeout"] * len(LAB1)
    assert "ran past the 10 s limit at cell 2" in rows["loop.ipynb"][0]["message"]
    assert loop_s < SHORT_TIMEOUT_S + 15  # from handing it to a worker to its rows


def test_kernel_exit_and_deleted_folder(odd):
    rows = odd[1]
    assert _statuses(rows["exits.ipynb"]) == ["error"] * len(LAB1)
    assert "kernel died at cell 1" in rows["exits.ipynb"][0]["message"]
    # Its own folder deleted, the notebook still runs on and is graded.
    assert _statuses(rows["deletes.ipynb"]) == ["not written"] * (len(LAB1) - 1) + ["passed"]


def test_lab_is_recognised_from_content_not_file_name(odd):
    rows = odd[1]["01_systolic_array.ipynb"]
    assert {r["lab"] for r in rows} == {"2"} and [r["exercise"] for r in rows] == LAB2
    assert set(_statuses(rows)) <= {"not written", "skipped"}
    (row,) = odd[1]["chapter.ipynb"]
    assert row["status"] == "error" and "not a lab notebook" in row["message"]


def test_grader_cannot_run_without_submissions(tmp_path):
    for args in ([str(tmp_path), "--out", str(tmp_path / "o")],  # an empty folder
                 [str(tmp_path / "missing.ipynb"), "--out", str(tmp_path / "o")],
                 [str(tmp_path)]):  # no --out
        proc = subprocess.run([sys.executable, "-m", "tpu_course", "grade", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
    with pytest.raises(grade.GradeError, match="no .ipynb submissions"):
        grade.find_submissions([tmp_path])


def test_a_missing_dependency_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(grade.REQUIRES, "no_such_module_xyz", "no-such-package-xyz")
    with pytest.raises(grade.GradeError, match="needs no-such-package-xyz.*pip install"):
        grade.grade([ROOT / "labs" / "01_systolic_array.ipynb"], tmp_path)
