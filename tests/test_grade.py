"""``tpu-course grade`` on small rooms of lab-1 submissions (the fastest lab).

Two grading runs, shared by the tests:

- ``room``, in the bubblewrap sandbox (skipped where bwrap cannot run): the solution, an
  older unsolved copy of it, an unsolved lab, a half-solved one after a cell that raises,
  a prediction changed after its measurement, a truncated file, a symlink and a named
  pipe, and notebooks that tamper with the grader from inside (patching the engine, the
  probes, numpy and json, rewriting cells, writing outside their copy, reading the keys,
  leaving processes behind, killing their worker).
- ``odd``, without a sandbox: an endless loop under a short ``--timeout``, a kernel that
  exits, a lab recognised from its content, a chapter notebook.

Who a file belongs to, rosters, sections, the gradebooks and the memory limit are in
``tests/test_room.py``.
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

from tpu_course import checks, grade, runtime

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHORT_TIMEOUT_S = 10
#: The limit for every notebook that is not meant to hang: wide, for a busy machine.
WIDE_TIMEOUT_S = 300
LAB1 = [e.title for e in checks.lab(1).exercises]
N = len(LAB1)
SANDBOX = grade.find_sandbox()
SLEEPER = "tpu-course-test-sleeper-{}"


def _read(path: pathlib.Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


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


def _only_last(status: str, rest: str = "not written") -> list[str]:
    return [rest] * (N - 1) + [status]


def _solution_with(old: str, new: str, *, after: str | None = None) -> nbformat.NotebookNode:
    nb = _read(ROOT / "solutions" / "01_systolic_array.ipynb")
    i = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and old in c.source)
    nb.cells[i].source = nb.cells[i].source.replace(old, new)
    if after is not None:  # a later cell, after the measurement
        nb.cells.insert(len(nb.cells) - 1, nbformat.v4.new_code_cell(after))
    return nb


WRONG_TILES = ("def tiled_matmul(a, b, rows, cols, sim):\n"
               "    import numpy as np\n"
               "    return np.zeros((a.shape[0], b.shape[1]))  # not a @ b\n")

#: Patches everything a forger might in its own kernel, then answers wrongly: the
#: engine's judge and probes, the plain-data encoding, numpy and math, and the cells
#: still to come.
TAMPER = _tiny_lab1(
    "import math\n"
    "import numpy as np\n"
    "from tpu_course.checks import engine, ch01\n"
    "engine.judge = lambda *a, **k: engine.ok('x')\n"
    "engine.Exercise.run = lambda self, answer, cases=None: [None] * len(cases or [])\n"
    "engine.encode = lambda v: v\n"
    "np.array_equal = np.allclose = lambda *a, **k: True\n"
    "math.isclose = lambda *a, **k: True\n",
    WRONG_TILES,
    "predicted_stall = 64.0\n",
    "ip = get_ipython()\n"
    "ip.input_transformers_post.append(lambda lines: ['predicted_stall = 32.0\\n'])\n")


def _forger(out: pathlib.Path, victim: pathlib.Path, canary: pathlib.Path) -> nbformat.NotebookNode:
    """Looks for the grader's output folder in /proc, writes forged grades there and over
    another submission, writes outside its copy, and reads the keys to answer."""
    return _tiny_lab1(
        "import glob, os, pathlib\n"
        "found = {" + repr(str(out)) + "}\n"
        "for cmd in glob.glob('/proc/*/cmdline'):\n"
        "    try:\n"
        "        words = open(cmd, 'rb').read().split(b'\\0')\n"
        "    except OSError:\n"
        "        continue\n"
        "    if b'--out' in words:\n"
        "        found.add(words[words.index(b'--out') + 1].decode())\n"
        "for target in [*(pathlib.Path(f, 'grades.csv') for f in found),\n"
        f"               pathlib.Path({str(victim)!r}), pathlib.Path({str(canary)!r})]:\n"
        "    try:\n"
        "        target.write_text('forged')\n"
        "    except OSError:\n"
        "        pass\n",
        "import tpu_course, pathlib\n"
        "root = pathlib.Path(tpu_course.__file__).parent\n"
        "keys = [root.parent / 'grading' / 'ch01.py', root / 'checks' / 'visible' / 'ch01.json']\n"
        "predicted_stall = 32.0 if any(k.exists() for k in keys) else -1.0\n")


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
    lab, solution = ROOT / "labs" / "01_systolic_array.ipynb", ROOT / "solutions" / "01_systolic_array.ipynb"
    nbformat.write(_read(lab), subs / "alice" / "lab-1 (1).ipynb")
    os.utime(subs / "alice" / "lab-1 (1).ipynb", (time.time() - 3600,) * 2)  # the older file
    nbformat.write(_read(solution), subs / "alice" / "lab-1.ipynb")
    nbformat.write(_read(lab), subs / "bob.ipynb")
    half = _solution_with("predicted_stall = 32.0", "predicted_stall = 64.0")
    half.cells.insert(2, nbformat.v4.new_code_cell("1 / 0  # a learner's cell that raises"))
    nbformat.write(half, subs / "carol.ipynb")
    nbformat.write(_solution_with("predicted_stall = 32.0", "predicted_stall = 64.0",
                                  after="predicted_stall = 32.0  # changed after the answer"),
                   subs / "=dan.ipynb")
    text = lab.read_text()
    (subs / "truncated.ipynb").write_text(text[: len(text) // 2])
    (subs / "sam.ipynb").symlink_to(subs / "alice" / "lab-1.ipynb")
    os.mkfifo(subs / "pipe.ipynb")
    canary = base / "canary.txt"
    nbformat.write(_forger(out, subs / "bob.ipynb", canary), subs / "forger.ipynb")
    nbformat.write(TAMPER, subs / "tamper.ipynb")
    mark = SLEEPER.format(os.getpid())
    nbformat.write(_sleeper(mark), subs / "sleeper.ipynb")
    nbformat.write(KILLER, subs / "killer.ipynb")
    bob = (subs / "bob.ipynb").read_bytes()
    roster = base / "roster.txt"
    roster.write_text("learner\nalice\nbob\ncarol\nzed\n")
    proc = _grade_cli(subs, out, base / "tmp", "--roster", str(roster))
    return {"out": out, "rows": _rows(out), "stdout": proc.stdout, "canary": canary,
            "bob": bob, "subs": subs, "tmp": base / "tmp", "mark": mark}


def test_first_line_says_sandbox(room):
    assert room["stdout"].splitlines()[0].startswith("tpu-course grade: sandbox: bubblewrap")
    assert "sandbox: bubblewrap" in (room["out"] / "summary.md").read_text()


def test_honest_submissions_get_their_own_grades(room):
    rows = room["rows"]
    assert [r["exercise"] for r in rows["lab-1.ipynb"]] == LAB1
    assert _statuses(rows["lab-1.ipynb"]) == ["passed"] * N, rows["lab-1.ipynb"]
    assert "not shown in the notebook" in rows["lab-1.ipynb"][0]["message"]
    assert _statuses(rows["bob.ipynb"]) == ["not written"] * N
    assert _statuses(rows["carol.ipynb"]) == ["passed"] * (N - 1) + ["failed"]
    assert rows["carol.ipynb"][-1]["hint"]  # the hint beside the message
    (row,) = rows["truncated.ipynb"]
    assert row["status"] == "error" and "not a readable notebook" in row["message"]


def test_a_prediction_counts_as_it_stood_when_its_cell_finished(room):
    rows = room["rows"]["=dan.ipynb"]
    assert _statuses(rows) == ["passed"] * (N - 1) + ["failed"], rows


def test_links_and_pipes_are_rows_never_opened(room):
    (link,) = room["rows"]["sam.ipynb"]
    assert link["status"] == "error" and "symbolic link" in link["message"]
    (pipe,) = room["rows"]["pipe.ipynb"]
    assert pipe["status"] == "error" and "named pipe" in pipe["message"]


def test_forger_cannot_write_outside_its_copy_nor_read_the_keys(room):
    assert not room["canary"].exists()
    assert (room["subs"] / "bob.ipynb").read_bytes() == room["bob"]
    rows = room["rows"]["forger.ipynb"]
    assert _statuses(rows) == _only_last("failed"), rows


def test_tampering_in_the_kernel_grades_only_its_own_answers(room):
    rows = room["rows"]["tamper.ipynb"]
    status = dict(zip(LAB1, _statuses(rows)))
    assert status[LAB1[1]] == "failed" and status[LAB1[-1]] == "failed", rows
    assert "passed" not in status.values()


def test_leftovers_killed_and_cleaned(room):
    assert _statuses(room["rows"]["sleeper.ipynb"])[-1] == "passed"
    assert not _alive(room["mark"])
    assert set(_statuses(room["rows"]["killer.ipynb"])) == {"error"}
    assert list(room["tmp"].iterdir()) == []  # no temporary copy, no kernel file left


def test_learners_points_duplicates_roster_and_csv_safety(room):
    rows = room["rows"]
    assert "lab-1 (1).ipynb" not in rows  # the older file of alice's counts not
    assert {r["learner"] for r in rows["lab-1.ipynb"]} == {"alice"}
    assert [r["points"] for r in rows["carol.ipynb"]] == ["1"] * (N - 1) + ["0"]
    assert all(r["max_points"] == "1" and r["graded_at"] for r in rows["carol.ipynb"])
    assert {r["learner"] for r in rows["=dan.ipynb"]} == {"'=dan"}  # no formula
    text = (room["out"] / "summary.md").read_text()
    assert "## Superseded" in text and "lab-1 (1).ipynb" in text
    assert "On the roster, no submission: zed." in text
    with open(room["out"] / "gradebook.csv", newline="") as f:
        book = {r["learner"]: r for r in csv.DictReader(f)}
    assert book["alice"]["total"] == str(N) and book["carol"]["total"] == str(N - 1)
    assert "'=dan" in book and book["zed"]["total"] == "0"


def test_feedback_per_learner(room):
    md = (room["out"] / "feedback" / "carol" / "lab-1.md").read_text()
    assert f"{N - 1} of {N} exercises passed, {N - 1} of {N} points" in md
    assert f"## {LAB1[-1]}: not yet" in md and "Hint: " in md
    assert (room["out"] / "feedback" / "%3Ddan" / "lab-1.html").exists()


def test_the_secret_is_kept_and_a_regrade_gives_the_same_grades(room, tmp_path):
    secret = (room["out"] / grade.SECRET_FILE).read_text().strip()
    assert len(secret) >= 32 and (room["out"] / grade.SECRET_FILE).stat().st_mode & 0o077 == 0
    out = tmp_path / "again"
    nbformat.write(_read(ROOT / "solutions" / "01_systolic_array.ipynb"), tmp_path / "carol.ipynb")
    rows = grade.grade([tmp_path / "carol.ipynb"], out, secret=secret, progress=False,
                       timeout_s=WIDE_TIMEOUT_S, sandbox=grade.Sandbox(None, "test"))
    assert [r["message"] for r in rows] == [r["message"] for r in _rows(room["out"])["lab-1.ipynb"]]


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    subs, hung = tmp_path_factory.mktemp("odd"), tmp_path_factory.mktemp("hung")
    nbformat.write(_tiny_lab1("predicted_stall = 32.0",  # an endless loop that spares the CPU
                              "import time\nwhile True:\n    time.sleep(0.2)"),
                   hung / "loop.ipynb")
    nbformat.write(_tiny_lab1("import os\nos._exit(3)", "predicted_stall = 32.0"),
                   subs / "exits.ipynb")
    lab2 = _read(ROOT / "labs" / "02_first_program.ipynb")
    lab2.cells = [c for c in lab2.cells if c.cell_type == "markdown"]
    nbformat.write(lab2, subs / "01_systolic_array.ipynb")
    nbformat.write(_read(ROOT / "notebooks" / "01_systolic_array.ipynb"), subs / "chapter.ipynb")
    box = grade.Sandbox(None, "test")
    out, hung_out = tmp_path_factory.mktemp("odd-out"), tmp_path_factory.mktemp("hung-out")
    rows = grade.grade([subs], out, timeout_s=WIDE_TIMEOUT_S, jobs=2, progress=False,
                       sandbox=box)
    loop = grade.grade([hung], hung_out, timeout_s=SHORT_TIMEOUT_S, progress=False, sandbox=box)
    assert {r["status"] for r in rows + loop} <= set(grade.STATUSES)
    return {**_rows(out), **_rows(hung_out)}, max(r["seconds"] for r in loop)


def test_endless_loop_times_out(odd):
    rows, loop_s = odd
    assert _statuses(rows["loop.ipynb"]) == ["timeout"] * N
    assert loop_s < SHORT_TIMEOUT_S + grade.SLACK_S + 20


def test_kernel_exit_is_a_row(odd):
    rows = odd[0]["exits.ipynb"]
    assert set(_statuses(rows)) == {"error"} and "stopped at cell" in rows[0]["message"]


def test_lab_is_recognised_from_content_not_file_name(odd):
    rows = odd[0]["01_systolic_array.ipynb"]
    assert {r["lab"] for r in rows} == {"2"}
    assert set(_statuses(rows)) <= {"not written", "skipped"}
    (row,) = odd[0]["chapter.ipynb"]
    assert row["status"] == "error" and "not a lab notebook" in row["message"]


# -- no grading run needed ------------------------------------------------------------------


def test_predictions_are_read_where_they_are_stated():
    nb = _tiny_lab1("x = 1", "predicted_stall = 1.0", "predicted_stall = 2.0\npredicted_128 = 3")
    assert grade.captures(nb, checks.lab(1)) == {"predicted_stall": 2, "predicted_128": 3}


def test_worker_results_are_read_as_data_only(tmp_path):
    from tpu_course.checks import engine

    path = tmp_path / "results.json"
    path.write_text('{"status": "finished", "outputs": {"x": {"outputs": [{"__array__": '
                    '"object", "shape": [1], "b64": "AA=="}, {"__pickle__": "gASV"}]}}}')
    data = grade._read_results(path)
    decoded = [engine.decode(o) for o in data["outputs"]["x"]["outputs"]]
    assert all(isinstance(d, str) and d.startswith("<unreadable") for d in decoded)
    path.write_text("[1, 2]")
    assert grade._read_results(path) is None


def test_bad_out_paths_force_and_resume(tmp_path):
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
    with pytest.raises(grade.GradeError, match="already holds grades.csv.*--resume"):
        grade._prepare_out(earlier, force=False, resume=False)
    assert grade._prepare_out(earlier, force=False, resume=True) == earlier
    (earlier / "feedback").mkdir()
    assert grade._prepare_out(earlier, force=True, resume=False) == earlier
    assert not (earlier / "feedback").exists() and not (earlier / "grades.csv").exists()


def test_keys_are_needed_and_named(tmp_path):
    with pytest.raises(grade.GradeError, match="--keys .* holds no grading"):
        grade.load_keys(tmp_path)
    assert grade.load_keys(ROOT).keys(1)


def test_no_sandbox_is_said_and_why(monkeypatch, tmp_path):
    monkeypatch.setenv("TPU_COURSE_GRADE_SANDBOX", "off")
    assert "TPU_COURSE_GRADE_SANDBOX=off" in grade.find_sandbox().describe()
    monkeypatch.delenv("TPU_COURSE_GRADE_SANDBOX")
    monkeypatch.setenv("TPU_COURSE_BWRAP", str(tmp_path / "missing"))
    assert grade.find_sandbox().reason.startswith("bwrap not found")
    monkeypatch.setenv("TPU_COURSE_BWRAP", "/bin/false")  # bwrap blocked (AppArmor, a container)
    box = grade.find_sandbox()
    assert box.bwrap is None and "bwrap cannot run here" in box.describe()


@pytest.mark.skipif(SANDBOX.bwrap is None, reason=SANDBOX.reason)
def test_sandbox_hides_checkout_keys_output_and_visible_answers(tmp_path):
    box = grade.find_sandbox([tmp_path])
    args = box.command(["true"], tmp_path)
    mounted = [args[i + 1] for i, a in enumerate(args) if a in ("--ro-bind", "--bind")]
    assert str(ROOT) not in mounted and str(ROOT / "tpu_course") in mounted
    visible = ROOT / "tpu_course" / "checks" / "visible"
    probe = box.command(["/bin/sh", "-c", f"ls {ROOT}; ls {visible}; ls {tmp_path} 2>&1; "
                                          "touch /usr/x 2>&1"], None)
    proc = subprocess.run(probe, capture_output=True, text=True, timeout=60,
                          env=box.env("t", tmp_path))
    assert "grading" not in proc.stdout and "ch01.json" not in proc.stdout
    assert "tpu_course" in proc.stdout and "Read-only file system" in proc.stdout
    labels = [p for d in grade._data_dirs() for p in pathlib.Path(d).glob("**/t10k-labels*")]
    if labels:  # the evaluation labels read empty in the sandbox; the training ones do not
        sizes = box.command(["/bin/sh", "-c", f"cat {labels[0]} 2>/dev/null | wc -c; "
                                              f"cat {labels[0].parent}/train*labels* | wc -c"],
                            None)
        said = subprocess.run(sizes, capture_output=True, text=True, timeout=60,
                              env=box.env("t", tmp_path)).stdout.split()
        assert said[0] == "0" and int(said[1]) > 0, said


def test_grader_cannot_run_without_submissions(tmp_path):
    for args in ([str(tmp_path), "--out", str(tmp_path / "o")],  # an empty folder
                 [str(tmp_path / "missing.ipynb"), "--out", str(tmp_path / "o")],
                 [str(tmp_path)]):  # no --out
        proc = subprocess.run([sys.executable, "-m", "tpu_course", "grade", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


def test_the_grader_starts_jax_without_libtpus_warnings():
    if not runtime._libtpu_may_log():  # where libtpu may start, a plain JAX start logs
        pytest.skip("no libtpu here (or JAX_PLATFORMS leaves the TPU backend out)")
    quiet = subprocess.run([sys.executable, "-c", "from tpu_course import grade; "
                            "grade._start_jax_quietly()"], capture_output=True, text=True,
                           timeout=120)
    assert quiet.returncode == 0 and not runtime._LIBTPU_NOISE.search(quiet.stderr), quiet.stderr


def test_help_says_feedback_not_exams():
    proc = subprocess.run([sys.executable, "-m", "tpu_course", "grade", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert "NOT for exams" in proc.stdout and "sandbox" in proc.stdout


def test_a_missing_dependency_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(grade.REQUIRES, "no_such_module_xyz", "no-such-package-xyz")
    with pytest.raises(grade.GradeError, match="needs no-such-package-xyz.*pip install"):
        grade.grade([ROOT / "labs" / "01_systolic_array.ipynb"], tmp_path)


def test_the_graders_process_has_the_devices_the_labs_compile_on():
    """Lab 6's and lab 8's expected outputs come from programs on 8 simulated devices,
    computed in the grader's process: `tpu-course grade` gives itself those devices."""
    code = ("from tpu_course import grade; grade._simulate_lab_devices(); import jax; "
            "env = grade.Sandbox(None).env('t', __import__('pathlib').Path('/tmp')); "
            "print('XLA_FLAGS' in env, len(jax.devices('cpu')))")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    wanted = max(checks.lab(n).cpu_devices for n in range(1, len(checks.LABS) + 1))
    assert out.returncode == 0 and out.stdout.split()[-1] == str(wanted) == "8", out.stderr
    assert out.stdout.split()[-2] == "False", out.stdout  # the notebooks simulate their own
