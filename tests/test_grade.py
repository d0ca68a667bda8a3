"""``tpu-course grade`` on small rooms of lab-1 submissions (the fastest lab).

Three grading runs, shared by the tests:

- ``room``, in the bubblewrap sandbox (skipped where bwrap cannot run): real lab-1
  notebooks (a solution, an older unsolved copy of it, an unsolved lab, a half-solved one
  after a cell that raises, a truncated file) among the tampering notebooks of issue 22,
  with ``--jobs 2`` and a roster. Each is graded on its own merits and the honest ones
  get the grades they get alone.
- ``fallback``: the same kind of room where no sandbox runs (``TPU_COURSE_BWRAP`` names a
  missing program): the first line says so, and the grades still hold.
- ``odd``: tiny notebooks (an endless loop, alone under a short ``--timeout``; a kernel exit, a
  cell deleting its folder, one that patches the checkers, lab 2 under a lab-1 name, a
  chapter notebook).
"""

from __future__ import annotations

import csv
import os
import pathlib
import subprocess
import sys
import time

import nbformat
import pytest

from tpu_course import checks, grade

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHORT_TIMEOUT_S = 10
#: The limit for every notebook that is not meant to hang: wide, for a busy machine.
WIDE_TIMEOUT_S = 300
LAB1 = [e.title for e in checks.lab(1).exercises]
LAB2 = [e.title for e in checks.lab(2).exercises]
SANDBOX = grade.find_sandbox()
needs_sandbox = pytest.mark.skipif(SANDBOX.bwrap is None, reason=SANDBOX.reason)
#: A planted sleeper's command line, to find it after grading.
SLEEPER = "tpu-course-test-sleeper-{}"


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


def _statuses(rows: list[dict]) -> list[str]:
    return [r["status"] for r in rows]


def _expect(default: str, **by_word: str) -> list[str]:
    """Lab 1's statuses: ``default``, except exercises whose title holds a key's words."""
    return [next((v for k, v in by_word.items() if k.replace("_", " ") in t), default)
            for t in LAB1]


N = len(LAB1)
PATCHED = _expect("not written", tile="failed", bf16_sum="failed")


def _half_solved() -> nbformat.NotebookNode:
    wrong = _read(ROOT / "solutions" / "01_systolic_array.ipynb")
    i = _code_index(wrong, "predicted_stall = 32.0")
    wrong.cells[i].source = wrong.cells[i].source.replace("predicted_stall = 32.0",
                                                          "predicted_stall = 64.0")
    wrong.cells.insert(2, nbformat.v4.new_code_cell("1 / 0  # a learner's cell that raises"))
    return wrong


# The tampering notebooks of issue 22, section 1 (each a tiny lab 1).

def _forger(out: pathlib.Path, victim: pathlib.Path, canary: pathlib.Path) -> nbformat.NotebookNode:
    """Looks for the grader's output folder in /proc, writes forged results there and
    over another submission, writes outside its copy; and reads solutions/ to answer."""
    return _tiny_lab1(
        "import glob, os, pathlib\n"
        "found = set()\n"
        "for cmd in glob.glob('/proc/*/cmdline'):\n"
        "    try:\n"
        "        words = open(cmd, 'rb').read().split(b'\\0')\n"
        "    except OSError:\n"
        "        continue\n"
        "    if b'--out' in words:\n"
        "        found.add(words[words.index(b'--out') + 1].decode())\n"
        f"found.add({str(out)!r})\n"
        "escaped = []\n"
        "for folder in found:\n"
        "    for name in ('grades.csv', 'forged.json'):\n"
        "        try:\n"
        "            pathlib.Path(folder, name).write_text('file,lab,exercise,status\\n')\n"
        "            escaped.append(name)\n"
        "        except OSError:\n"
        "            pass\n"
        f"for path in ({str(victim)!r}, {str(canary)!r}):\n"
        "    try:\n"
        "        pathlib.Path(path).write_text('forged')\n"
        "        escaped.append(path)\n"
        "    except OSError:\n"
        "        pass\n",
        "import tpu_course\n"
        "key = pathlib.Path(tpu_course.__file__).parent.parent / 'solutions'\n"
        "predicted_stall = 32.0 if (key / '01_systolic_array.py').exists() else -1.0\n")


JSON_PATCH = _tiny_lab1(
    "import json\n"
    "forged = '{\"rows\": [{\"exercise\": \"x\", \"status\": \"passed\", \"message\": \"\"}]}'\n"
    "json.dumps = lambda *a, **k: forged\n"
    "json.dump = lambda obj, f, *a, **k: f.write(forged)\n")

TRANSFORMER = _tiny_lab1(
    "ip = get_ipython()\n"
    "ip.input_transformers_post.append(\n"
    "    lambda lines: ['print(\"Lab 1: 5 of 5 passed\")\\n'])\n",
    "predicted_stall = 32.0  # never runs: rewritten to a print\n")

NUMPY_PATCH = _tiny_lab1(
    "import functools, math\n"
    "import numpy as np\n"
    "np.array_equal = lambda *a, **k: True\n"
    "math.isclose = lambda *a, **k: True\n",
    "@functools.partial(setattr, np, 'array_equal')  # patches at definition time too\n"
    "def always(*a, **k):\n"
    "    return True\n",
    "def tiled_matmul(a, b, rows, cols, sim):\n"
    "    return np.zeros((a.shape[0], b.shape[1]))  # all zeros: not a @ b\n",
    "predicted_stall = 64.0\n")

CHDIR_DELETE = _tiny_lab1(
    "import os, shutil\n"
    "os.chdir('..')\n"
    "for _ in range(3):\n"
    "    for name in os.listdir('.'):\n"
    "        shutil.rmtree(name, ignore_errors=True)\n"
    "        try:\n"
    "            os.remove(name)\n"
    "        except OSError:\n"
    "            pass\n"
    "    os.chdir('..')\n",
    "predicted_stall = 32.0\n")


def _sleeper(mark: str) -> nbformat.NotebookNode:
    return _tiny_lab1(
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {mark!r}],\n"
        "                 start_new_session=True)\n",
        "predicted_stall = 32.0\n")


KILLER = _tiny_lab1("predicted_stall = 32.0", "import os, signal\n"
                                              "os.kill(os.getppid(), signal.SIGKILL)\n")


def _alive(mark: str) -> list[int]:
    found = []
    for cmd in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if mark.encode() in cmd.read_bytes():
                found.append(int(cmd.parent.name))
        except OSError:
            pass
    return found


def _grade_cli(subs: pathlib.Path, out: pathlib.Path, tmp: pathlib.Path, *extra: str,
               env: dict | None = None) -> subprocess.CompletedProcess:
    tmp.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "tpu_course", "grade", str(subs), "--out",
                           str(out), "--jobs", "2", "--timeout", str(WIDE_TIMEOUT_S), *extra],
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "TMPDIR": str(tmp), **(env or {})})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    if SANDBOX.bwrap is None:
        pytest.skip(SANDBOX.reason)
    base = tmp_path_factory.mktemp("room")
    subs, out = base / "subs", base / "out"
    (subs / "alice").mkdir(parents=True)
    nbformat.write(_read(ROOT / "labs" / "01_systolic_array.ipynb"), subs / "alice" / "lab-1 (1).ipynb")
    os.utime(subs / "alice" / "lab-1 (1).ipynb", (time.time() - 3600,) * 2)  # the older file
    nbformat.write(_read(ROOT / "solutions" / "01_systolic_array.ipynb"), subs / "alice" / "lab-1.ipynb")
    nbformat.write(_read(ROOT / "labs" / "01_systolic_array.ipynb"), subs / "bob.ipynb")
    nbformat.write(_half_solved(), subs / "carol.ipynb")
    text = (ROOT / "labs" / "01_systolic_array.ipynb").read_text()
    (subs / "truncated.ipynb").write_text(text[: len(text) // 2])
    canary = base / "canary.txt"
    nbformat.write(_forger(out, subs / "bob.ipynb", canary), subs / "forger.ipynb")
    nbformat.write(JSON_PATCH, subs / "jsonpatch.ipynb")
    nbformat.write(TRANSFORMER, subs / "transformer.ipynb")
    nbformat.write(NUMPY_PATCH, subs / "numpy-patch.ipynb")
    nbformat.write(CHDIR_DELETE, subs / "chdir.ipynb")
    mark = SLEEPER.format(os.getpid())
    nbformat.write(_sleeper(mark), subs / "sleeper.ipynb")
    nbformat.write(KILLER, subs / "killer.ipynb")
    nbformat.write(_tiny_lab1("predicted_stall = 32.0"), subs / "new\nline.ipynb")
    bob = (subs / "bob.ipynb").read_bytes()
    roster = base / "roster.txt"
    roster.write_text("learner\nalice\nbob\ncarol\ndave\n")
    proc = _grade_cli(subs, out, base / "tmp", "--roster", str(roster))
    return {"out": out, "rows": _rows(out), "stdout": proc.stdout, "canary": canary,
            "bob": bob, "subs": subs, "tmp": base / "tmp", "mark": mark}


def test_first_line_says_sandbox(room):
    assert room["stdout"].splitlines()[0].startswith("tpu-course grade: sandbox: bubblewrap")
    assert "sandbox: bubblewrap" in (room["out"] / "summary.md").read_text()


def test_honest_submissions_get_their_own_grades(room):
    rows = room["rows"]
    assert [r["exercise"] for r in rows["lab-1.ipynb"]] == LAB1
    assert _statuses(rows["lab-1.ipynb"]) == ["passed"] * len(LAB1), rows["lab-1.ipynb"]
    assert _statuses(rows["bob.ipynb"]) == ["not written"] * len(LAB1)
    assert _statuses(rows["carol.ipynb"]) == ["passed"] * (len(LAB1) - 1) + ["failed"]
    assert rows["carol.ipynb"][-1]["hint"]  # the hint beside the message
    (row,) = rows["truncated.ipynb"]
    assert row["status"] == "error" and "not a readable notebook" in row["message"]


def test_forger_cannot_write_outside_its_copy_nor_read_solutions(room):
    assert not room["canary"].exists()
    assert (room["subs"] / "bob.ipynb").read_bytes() == room["bob"]
    assert not (room["out"] / "forged.json").exists()
    rows = room["rows"]["forger.ipynb"]
    assert _statuses(rows) == ["not written"] * (len(LAB1) - 1) + ["failed"], rows


def test_patched_kernel_grades_only_its_own_answers(room):
    # json patched in its kernel: the kernel's own messages break; nothing passes.
    rows = room["rows"]["jsonpatch.ipynb"]
    assert set(_statuses(rows)) <= {"error", "not written"}, rows
    # The grader's last cell rewritten: its values are lost, and what its source defines
    # (the right answer to exercise 5) is graded on its merits.
    rows = room["rows"]["transformer.ipynb"]
    assert _statuses(rows) == ["not written"] * (len(LAB1) - 1) + ["passed"], rows


def test_patched_numpy_and_math_do_not_pass_wrong_answers(room):
    rows = room["rows"]["numpy-patch.ipynb"]
    assert _statuses(rows) == PATCHED, rows


def test_chdir_and_delete_harms_only_itself(room):
    rows = room["rows"]["chdir.ipynb"]
    assert _statuses(rows) == ["not written"] * (len(LAB1) - 1) + ["passed"]
    assert (room["subs"] / "bob.ipynb").exists() and room["out"].is_dir()


def test_leftovers_killed_and_cleaned(room):
    assert _statuses(room["rows"]["sleeper.ipynb"])[-1] == "passed"
    assert not _alive(room["mark"])
    assert _statuses(room["rows"]["killer.ipynb"]) == ["error"] * len(LAB1)
    assert list(room["tmp"].iterdir()) == []  # no temporary copy, no kernel file left


def test_file_name_with_a_newline(room):
    rows = room["rows"]["new\nline.ipynb"]
    assert _statuses(rows)[-1] == "passed" and rows[0]["learner"] == "new\nline"
    assert (room["out"] / "feedback" / "new_line" / "lab-1.md").exists()


def test_learners_points_duplicates_and_roster(room):
    rows = room["rows"]
    assert "lab-1 (1).ipynb" not in rows  # the older file of alice's counts not
    assert {r["learner"] for r in rows["lab-1.ipynb"]} == {"alice"}
    assert [r["points"] for r in rows["carol.ipynb"]] == ["1"] * (N - 1) + ["0"]
    assert all(r["max_points"] == "1" and r["graded_at"] for r in rows["carol.ipynb"])
    text = (room["out"] / "summary.md").read_text()
    assert "## Superseded" in text and "lab-1 (1).ipynb" in text
    assert "Missing from the roster: dave." in text and "Not on the roster: " in text
    assert f"| `alice` | `lab-1.ipynb` | {N} of {N} | {N} of {N} | - |" in text
    assert f"| {LAB1[0]} | 2 of 11 | 18% |" in text


def test_gradebook_has_one_row_per_learner(room):
    with open(room["out"] / "gradebook.csv", newline="") as f:
        book = {r["learner"]: r for r in csv.DictReader(f)}
    assert book["alice"]["total"] == str(N) and book["carol"]["total"] == str(N - 1)
    assert book["dave"]["total"] == "0" and book["dave"][f"Lab 1 total [{N}]"] == ""
    assert book["carol"][f"Lab 1: {LAB1[-1]} [1]"] == "0"


def test_feedback_per_learner(room):
    md = (room["out"] / "feedback" / "carol" / "lab-1.md").read_text()
    assert f"{N - 1} of {N} exercises passed, {N - 1} of {N} points" in md
    assert f"## {LAB1[-1]}: not yet" in md and "Hint: " in md
    page = (room["out"] / "feedback" / "carol" / "lab-1.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<h2>" in page


@pytest.fixture(scope="module")
def fallback(tmp_path_factory):
    base = tmp_path_factory.mktemp("fallback")
    subs, out = base / "subs", base / "out"
    subs.mkdir()
    nbformat.write(NUMPY_PATCH, subs / "numpy-patch.ipynb")
    mark = SLEEPER.format(f"fallback-{os.getpid()}")
    nbformat.write(_sleeper(mark), subs / "sleeper.ipynb")
    nbformat.write(KILLER, subs / "killer.ipynb")
    proc = _grade_cli(subs, out, base / "tmp",
                      env={"TPU_COURSE_BWRAP": str(base / "no-bwrap-here")})
    return {"out": out, "rows": _rows(out), "stdout": proc.stdout, "tmp": base / "tmp",
            "mark": mark}


def test_fallback_says_so_first_and_still_grades(fallback):
    first = fallback["stdout"].splitlines()[0]
    assert first.startswith("tpu-course grade: NO SANDBOX (bwrap not found"), first
    assert "NO SANDBOX" in (fallback["out"] / "summary.md").read_text().splitlines()[2]
    rows = fallback["rows"]
    assert _statuses(rows["numpy-patch.ipynb"]) == PATCHED
    assert _statuses(rows["killer.ipynb"]) == ["error"] * len(LAB1)
    assert _statuses(rows["sleeper.ipynb"])[-1] == "passed" and not _alive(fallback["mark"])
    assert list(fallback["tmp"].iterdir()) == []


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> tuple[pathlib.Path, dict[str, list[dict]], float]:
    subs, hung = tmp_path_factory.mktemp("odd"), tmp_path_factory.mktemp("hung")
    nbformat.write(_tiny_lab1("predicted_stall = 32.0",  # an endless loop that spares the CPU
                              "import time\nwhile True:\n    time.sleep(0.2)"),
                   hung / "loop.ipynb")
    nbformat.write(_tiny_lab1("import os\nos._exit(3)", "predicted_stall = 32.0"),
                   subs / "exits.ipynb")
    nbformat.write(_tiny_lab1("import os, shutil\nshutil.rmtree(os.getcwd())",
                              "predicted_stall = 32.0"), subs / "deletes.ipynb")
    nbformat.write(_tiny_lab1(
        "from tpu_course import checks\n"
        "from tpu_course.checks import _core\n"
        "_core.Exercise.run = lambda self, *a, **k: _core.ok(self.title)\n"
        "_core.Exercise.grade = lambda self, ns: _core.ok(self.title)\n"
        "checks.ch01.LAB.grade = lambda ns, **k: [_core.ok(e.title)\n"
        "                                         for e in checks.ch01.LAB.exercises]\n"
        "predicted_stall = 'whatever'\n"
        "print(checks.ch01.LAB.scorecard(globals()))  # 5 of 5, printed: never read\n"),
        subs / "cheat.ipynb")
    lab2 = _read(ROOT / "labs" / "02_first_program.ipynb")
    lab2.cells = [c for c in lab2.cells if c.cell_type == "markdown"]
    nbformat.write(lab2, subs / "01_systolic_array.ipynb")
    nbformat.write(_read(ROOT / "notebooks" / "01_systolic_array.ipynb"), subs / "chapter.ipynb")
    # Only the endless loop runs under the short limit: a slow but honest notebook on a
    # busy machine (CI once took 3.5x as long under load) must never read as hung.
    out, hung_out = tmp_path_factory.mktemp("odd-out"), tmp_path_factory.mktemp("hung-out")
    rows = grade.grade([subs], out, timeout_s=WIDE_TIMEOUT_S, jobs=2, progress=False,
                       sandbox=SANDBOX)
    loop = grade.grade([hung], hung_out, timeout_s=SHORT_TIMEOUT_S, jobs=1, progress=False,
                       sandbox=SANDBOX)
    assert {r["status"] for r in rows + loop} <= set(grade.STATUSES)
    loop_s = max(r["seconds"] for r in loop)
    return out, {**_rows(out), **_rows(hung_out)}, loop_s


def test_patched_checkers_grade_nothing(odd):
    rows = odd[1]["cheat.ipynb"]
    assert all(s in ("failed", "not written") for s in _statuses(rows)), rows
    assert rows[-1]["status"] == "failed"  # the string it answered, judged by a fresh checker


def test_endless_loop_times_out_and_the_run_goes_on(odd):
    _, rows, loop_s = odd
    assert _statuses(rows["loop.ipynb"]) == ["timeout"] * len(LAB1)
    assert "ran past the 10 s limit at cell 2" in rows["loop.ipynb"][0]["message"]
    assert loop_s < SHORT_TIMEOUT_S + 20  # from handing it over to its rows


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


# -- no grading run needed ------------------------------------------------------------------


def test_carry_over_keeps_definitions_and_literals_only():
    imports, defs = grade.carry_over([
        "import numpy as np\nimport optax\nfrom functools import partial\n%matplotlib inline",
        "np.array_equal = lambda *a: True\nx = 32.0\nopt = optax.sgd(0.1)\nbad = evil()",
        "@partial(setattr, np, 'array_equal')\ndef f(a, b=np.float32): return a\n"
        "@my_decorator\ndef g(): pass\n"
        "def h(x=evil()): pass\n"
        "class C:\n    y = 1\n    np.isclose = None\n    z = evil()\n    def m(self): pass\n"
        "exec('import os')\nfor i in range(3): pass\n"])
    kept = [grade.ast.unparse(s) for s in imports + defs]
    assert kept[:3] == ["import numpy as np", "import optax", "from functools import partial"]
    assert "x = 32.0" in kept and "opt = optax.sgd(0.1)" in kept
    assert any(k.startswith("@partial(setattr") for k in kept)  # undone by the snapshot
    text = "\n".join(kept)
    for gone in ("evil", "my_decorator", "exec", "for i", "np.array_equal = ", "np.isclose"):
        assert gone not in text, gone
    assert "class C:\n    y = 1\n\n    def m(self):" in text


def test_values_are_decoded_as_data_only():
    import numpy as np

    assert grade._decode(["tuple", [["int", 3], ["float", "nan"], ["str", "a"]]], checks)[0] == 3
    with pytest.raises(TypeError):
        grade._decode(["int", "3"], checks)
    with pytest.raises(ValueError):
        grade._decode(["pickle", "gASV"], checks)
    stub = grade._decode(["not_written", "Exercise 1"], checks)
    assert checks.is_not_written(stub)
    import base64
    import io

    buf = io.BytesIO()
    np.save(buf, np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):  # an object array would need unpickling: refused
        grade._decode(["array", base64.b64encode(buf.getvalue()).decode()], checks)


def test_learner_ids_and_duplicates(tmp_path):
    assert grade.learner_id("room/alice.ipynb") == "alice"
    assert grade.learner_id("room/alice (2).ipynb") == "alice"
    assert grade.learner_id("room/bob/lab-1.ipynb") == "bob"
    assert grade.learner_id("room/bob/01_systolic_array.ipynb") == "bob"
    older, newer = tmp_path / "lab-1 (1).ipynb", tmp_path / "lab-1.ipynb"
    subs = [grade.Submission(p, "ann", 1) for p in (older, newer)]
    for i, p in enumerate((older, newer)):
        p.write_text("{}")
        os.utime(p, (1000 + i, 1000 + i))
    grade.drop_duplicates(subs)
    assert subs[0].superseded_by == newer and subs[1].superseded_by is None


def test_bad_out_paths_and_force(tmp_path):
    nb = ROOT / "labs" / "01_systolic_array.ipynb"
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, said in ((afile, "is a file"), (afile / "sub", "cannot create")):
        proc = subprocess.run([sys.executable, "-m", "tpu_course", "grade", str(nb), "--out",
                               str(out)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "grades.csv").write_text("old")
    with pytest.raises(grade.GradeError, match="already holds grades.csv.*--force"):
        grade._prepare_out(earlier, force=False)
    (earlier / "feedback").mkdir()
    assert grade._prepare_out(earlier, force=True) == earlier
    assert not (earlier / "feedback").exists()


def test_roster(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_text("id,name\nann,Ann A\n\n# absent today\nbo,Bo B\nann,again\n")
    assert grade.read_roster(path) == ["ann", "bo"]
    with pytest.raises(grade.GradeError, match="cannot be read"):
        grade.read_roster(tmp_path / "missing.txt")


def test_no_sandbox_is_said_and_why(monkeypatch, tmp_path):
    monkeypatch.setenv("TPU_COURSE_GRADE_SANDBOX", "off")
    assert "TPU_COURSE_GRADE_SANDBOX=off" in grade.find_sandbox().describe()
    monkeypatch.delenv("TPU_COURSE_GRADE_SANDBOX")
    monkeypatch.setenv("TPU_COURSE_BWRAP", str(tmp_path / "missing"))
    assert grade.find_sandbox().reason.startswith("bwrap not found")
    monkeypatch.setenv("TPU_COURSE_BWRAP", "/bin/false")  # bwrap blocked (AppArmor, a container)
    box = grade.find_sandbox()
    assert box.bwrap is None and "bwrap cannot run here" in box.describe()
    assert box.describe().startswith("NO SANDBOX")


@needs_sandbox
def test_sandbox_hides_checkout_output_and_submissions(tmp_path):
    box = grade.find_sandbox([tmp_path])
    args = box.command(["true"], tmp_path)
    mounted = [args[i + 1] for i, a in enumerate(args) if a in ("--ro-bind", "--bind")]
    assert str(ROOT) not in mounted and str(ROOT / "tpu_course") in mounted
    assert "--unshare-all" in args and "--die-with-parent" in args
    probe = box.command(["/bin/sh", "-c", f"ls {ROOT}; ls {tmp_path} 2>&1; touch /usr/x 2>&1"],
                        None)
    proc = subprocess.run(probe, capture_output=True, text=True, timeout=60,
                          env=box.env("t", tmp_path))
    assert "solutions" not in proc.stdout and "tpu_course" in proc.stdout
    assert "No such file" in proc.stdout and "Read-only file system" in proc.stdout


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


def test_help_says_feedback_not_exams():
    proc = subprocess.run([sys.executable, "-m", "tpu_course", "grade", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert "NOT for exams" in proc.stdout and "sandbox" in proc.stdout


def test_a_missing_dependency_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(grade.REQUIRES, "no_such_module_xyz", "no-such-package-xyz")
    with pytest.raises(grade.GradeError, match="needs no-such-package-xyz.*pip install"):
        grade.grade([ROOT / "labs" / "01_systolic_array.ipynb"], tmp_path)


def test_a_lab_that_simulates_devices_is_checked_on_as_many_and_its_sources_read(tmp_path):
    """Lab 6's notebook calls simulate_devices(8), a top-level statement the checking
    process never runs: the registry's cpu_devices gives that process its 8 devices; and
    exercise 7 ships process_rows' source to two worker processes, so a carried
    definition's source must be readable there (it was "could not get source code")."""
    import inspect as inspect_module

    from tpu_course.checks._answers import ch06 as answers

    cells = [nbformat.v4.new_markdown_cell(f"# Lab 6: {checks.lab(6).title}")]
    cells += [nbformat.v4.new_code_cell(src) for src in (
        "from tpu_course import runtime\nruntime.simulate_devices(8)\nfrom typing import Any",
        inspect_module.getsource(answers.bidirectional_all_reduce),
        "def process_rows(global_batch, sharding):\n"
        "    import numpy as np\n"
        "    held = sharding.addressable_devices_indices_map(global_batch.shape).values()\n"
        "    spans = sorted({(i[0].start or 0, i[0].stop or len(global_batch)) for i in held})\n"
        "    return np.concatenate([global_batch[a:b] for a, b in spans])\n")]
    subs = tmp_path / "subs" / "ada"
    subs.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(cells=cells), subs / "lab-6.ipynb")
    out = tmp_path / "out"
    _grade_cli(tmp_path / "subs", out, tmp_path)
    (rows,) = _rows(out).values()
    status = {r["exercise"]: r["status"] for r in rows}
    lab = checks.lab(6)
    message = {r["exercise"]: r["message"] for r in rows}
    for exercise in (lab.find(4), lab.find(7)):
        assert status[exercise.title] == "passed", message[exercise.title]
