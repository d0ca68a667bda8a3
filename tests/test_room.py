"""The room around the grades: who handed each file in, the roster and its sections, the
gradebooks an LMS imports, and the limits one run of ``tpu-course grade`` enforces.

Most tests build notebooks and rows in memory (nothing runs); one grading run, without a
sandbox, grades four tiny lab-1 notebooks: one that holds more memory than ``--memory``,
one that starts more processes than ``--processes``, one that writes a file larger than
``--file-size`` and one handed in with an id.
"""

from __future__ import annotations

import csv
import datetime
import os
import pathlib
import time

import nbformat
import pytest

from tpu_course import checks, grade, room
from tpu_course.checks import engine

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)

LAB1 = [e.title for e in checks.lab(1).exercises]
N = len(LAB1)


def _lab1(*sources: str, hand: tuple | None = None) -> nbformat.NotebookNode:
    """A tiny lab-1 notebook; ``hand=(id, iso time[, lab])`` adds a hand-in output."""
    cells = [nbformat.v4.new_markdown_cell("# Lab 1: The systolic array")]
    cells += [nbformat.v4.new_code_cell(s) for s in sources]
    if hand:
        cell = nbformat.v4.new_code_cell("checks.hand_in(checks.ch01.LAB, MY_ID)")
        record = {"learner": hand[0], "handed_in": hand[1],
                  "lab": hand[2] if len(hand) > 2 else 1}
        cell.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": "handed in"},
                                               metadata={"tpu_course": record})]
        cells.append(cell)
    return nbformat.v4.new_notebook(cells=cells)


def _subs(tmp_path: pathlib.Path, files: dict[str, nbformat.NotebookNode | None],
          roster: room.Roster | None = None, rooms=None) -> dict[str, grade.Submission]:
    """Write ``files`` under tmp_path (in order, one second apart: later is newer), read
    them as the grader does, assign ids and drop duplicates."""
    paths = []
    for i, (name, nb) in enumerate(files.items()):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb or _lab1(), path)
        os.utime(path, (1000 + i, 1000 + i))
        paths.append(path)
    subs = [grade.read_submission(p) for p in paths]
    room.assign(subs, roster, rooms if rooms is not None else [tmp_path])
    room.drop_duplicates(subs)
    return {str(s.path.relative_to(tmp_path)): s for s in subs}


# -- the hand-in cell --------------------------------------------------------------------------


def test_hand_in_records_id_lab_and_time_in_output_metadata(monkeypatch, capsys):
    import IPython
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display",
                        lambda data, raw, metadata: shown.append((data, metadata)))
    monkeypatch.delenv(engine.HAND_IN_ENV, raising=False)
    assert checks.hand_in(checks.lab(1), "") is None  # no id: says how, records nothing
    assert "MY_ID" in capsys.readouterr().out and not shown
    checks.hand_in(checks.lab(1), "a" * 200)
    assert "not a usable id" in capsys.readouterr().out and not shown
    monkeypatch.setenv(engine.HAND_IN_ENV, "ada@uni.edu")
    checks.hand_in(checks.lab(1))
    checks.hand_in(1, " ada ")
    (first, meta), (second, _) = shown
    record = meta["tpu_course"]
    assert record["learner"] == "ada@uni.edu" and record["lab"] == 1
    assert datetime.datetime.fromisoformat(record["handed_in"]).tzinfo is not None
    assert first[engine.HAND_IN_TYPE] == record
    assert "File > Download" in first["text/plain"] and "Kaggle" in first["text/plain"]
    assert second[engine.HAND_IN_TYPE]["learner"] == "ada"


def test_the_newest_record_of_the_lab_counts():
    nb = _lab1(hand=("ada", "2026-03-01T10:00:00+00:00"))
    nb.cells += _lab1(hand=("bob", "2026-03-01T09:00:00Z")).cells[1:]  # older
    nb.cells += _lab1(hand=("cy", "2026-03-02T09:00:00Z", 3)).cells[1:]  # another lab
    assert room.hand_in_record(nb, 1)[0] == "ada"
    assert room.hand_in_record(nb, 3)[0] == "cy"
    assert room.hand_in_record(_lab1(), 1) is None
    data_only = _lab1(hand=("dee", "2026-03-01T10:00:00Z"))  # metadata lost, data kept
    out = data_only.cells[-1].outputs[0]
    out.data[engine.HAND_IN_TYPE], out.metadata = dict(out.metadata["tpu_course"]), {}
    assert room.hand_in_record(data_only, 1)[0] == "dee"


# -- who a file belongs to ---------------------------------------------------------------------


def test_ids_from_names_keep_folders_and_downloads_apart(tmp_path):
    subs = _subs(tmp_path, {
        "section1/ada/lab-1.ipynb": None, "section2/ada/lab-1.ipynb": None,
        "01_systolic_array (1).ipynb": None, "01_systolic_array (2).ipynb": None,
        "Copy of 01_systolic_array.ipynb": None,
        "ben.ipynb": None, "ben_.ipynb": None, "ada (1).ipynb": None,
        "carol/lab-1 (1).ipynb": None, "carol/lab-1.ipynb": None,  # one learner's folder
        "submitted/dan/lab1/01_systolic_array.ipynb": None})  # nbgrader's layout
    ids = {k: s.learner for k, s in subs.items()}
    assert ids["section1/ada/lab-1.ipynb"] == "section1/ada"
    assert ids["section2/ada/lab-1.ipynb"] == "section2/ada"
    downloads = [ids[k] for k in ("01_systolic_array (1).ipynb", "01_systolic_array (2).ipynb",
                                  "Copy of 01_systolic_array.ipynb")]
    assert len(set(downloads)) == 3
    assert len({ids["ben.ipynb"], ids["ben_.ipynb"], ids["ada (1).ipynb"]}) == 3
    assert ids["carol/lab-1.ipynb"] == ids["carol/lab-1 (1).ipynb"] == "carol"
    assert subs["carol/lab-1 (1).ipynb"].superseded_by == subs["carol/lab-1.ipynb"].path
    assert ids["submitted/dan/lab1/01_systolic_array.ipynb"] == "dan"
    assert all(s.id_from == room.FROM_NAME for s in subs.values())
    counted = [s for s in subs.values() if s.superseded_by is None]
    assert len(counted) == len(subs) - 1  # only carol's older file gives way
    assert len({room.safe_name(s.learner) for s in counted}) == len(counted)


def test_hand_in_ids_decide_who_and_which_file_counts(tmp_path):
    later, earlier = "2026-03-01T10:00:00+00:00", "2026-03-01T09:00:00+00:00"
    subs = _subs(tmp_path, {
        # the newer stored time counts, whatever the files' own times say
        "01_systolic_array (2).ipynb": _lab1(hand=("zoe", later)),
        "01_systolic_array (1).ipynb": _lab1(hand=("zoe", earlier)),
        # someone else's empty lab saved as "ada (1)": another id, replaces nothing
        "ada.ipynb": _lab1(hand=("ada", earlier)),
        "ada (1).ipynb": _lab1(hand=("eve", later)),
        # a file named only, of an id that handed in too: the handed-in file counts
        "room2/zoe.ipynb": None,
        # an e-mail on the roster, in another case: that learner
        "x.ipynb": _lab1(hand=("Bob@Uni.Edu", later))},
        roster=room.Roster([room.Person("bob", "Bob", "B", "bob@uni.edu"),
                            room.Person("zoe")]))
    assert subs["01_systolic_array (1).ipynb"].superseded_by == \
        subs["01_systolic_array (2).ipynb"].path
    assert subs["01_systolic_array (2).ipynb"].superseded_by is None
    assert subs["ada.ipynb"].superseded_by is None and subs["ada (1).ipynb"].superseded_by is None
    assert (subs["ada.ipynb"].learner, subs["ada (1).ipynb"].learner) == ("ada", "eve")
    assert subs["room2/zoe.ipynb"].learner == "zoe"
    assert subs["room2/zoe.ipynb"].superseded_by == subs["01_systolic_array (2).ipynb"].path
    assert subs["x.ipynb"].learner == "bob" and subs["x.ipynb"].id_from == room.FROM_HAND_IN
    text = room.summary([], subs=list(subs.values()))
    assert "01_systolic_array (1).ipynb" in text and "2026-03-01T09:00:00+00:00" in text
    assert "## Ids taken from file names" in text and "room2/zoe.ipynb" in text


# -- the roster ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "id,name,section,email\nada,\"Lovelace, Ada\",A,ada@x.org\nbob,Bob B,B,\n",
    "Email,Section,Name,ID\nada@x.org,A,\"Lovelace, Ada\",ada\n,B,Bob B,bob\n",
    "ada,\"Lovelace, Ada\",A,ada@x.org\nbob,Bob B,B\n",  # no header
])
def test_roster_csv_with_or_without_header(tmp_path, text):
    path = tmp_path / "roster.csv"
    path.write_text(text)
    people = room.Roster.read(path)
    assert people.ids() == ["ada", "bob"]
    assert people.get("ada") == room.Person("ada", "Lovelace, Ada", "A", "ada@x.org")
    assert people.get("bob").section == "B" and people.find("ADA@x.org") == "ada"


def test_roster_of_one_id_a_line_and_bad_rosters(tmp_path):
    path = tmp_path / "roster.txt"
    path.write_text("learner\n# a comment\nalice\n\nbob\nalice\n")
    assert room.Roster.read(path).ids() == ["alice", "bob"]
    path.write_text("\n# nobody\n")
    with pytest.raises(room.RosterError, match="holds no learner id"):
        room.Roster.read(path)
    with pytest.raises(room.RosterError, match="cannot be read"):
        room.Roster.read(tmp_path / "missing.csv")


# -- what is written -------------------------------------------------------------------------


def _rows(learner: str, passed: int, lab: int = 1, seconds: float = 5.0) -> list[dict]:
    exercises = checks.lab(lab).exercises
    return [{"file": f"/room/{learner}.ipynb", "learner": learner, "lab": lab,
             "exercise": e.title, "status": "passed" if i < passed else "failed",
             "points": 1 if i < passed else 0, "max_points": 1, "message": "m", "hint": "",
             "graded_at": "2026-03-01T10:00:00+00:00", "seconds": seconds, "peak_gb": 0.2,
             "id_from": room.FROM_HAND_IN} for i, e in enumerate(exercises)]


ROSTER = room.Roster([room.Person("ada", "Lovelace, Ada", "S1", "ada@x.org"),
                      room.Person("=cmd", "Eve Formula", "S2", "@eve"),
                      room.Person("bob", "Bob Byte", "S1", "bob@x.org")])
ROWS = [*_rows("ada", N), *_rows("=cmd", 2, seconds=9.0), *_rows("walk-in", 1, seconds=7.0)]


def _csv(path: pathlib.Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_canvas_moodle_and_nbgrader_exports(tmp_path):
    title = checks.lab(1).title
    room.write_canvas(tmp_path / "canvas.csv", ROWS, ROSTER)
    canvas = _csv(tmp_path / "canvas.csv")
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                         f"Lab 1: {title}"]
    assert canvas[1][0].strip() == "Points Possible" and canvas[1][5] == str(N)
    by = {r[2]: r for r in canvas[2:]}
    assert by["ada"] == ["Lovelace, Ada", "", "ada", "ada@x.org", "S1", str(N)]
    assert by["bob"][5] == ""  # on the roster, nothing handed in: left as it is in Canvas
    assert by["'=cmd"][3] == "'@eve" and by["walk-in"][5] == "1"

    room.write_moodle(tmp_path / "moodle.csv", ROWS, ROSTER)
    moodle = _csv(tmp_path / "moodle.csv")
    assert moodle[0][:4] == ["ID number", "Email address", "Full name", "Group"]
    assert moodle[1] == ["ada", "ada@x.org", "Lovelace, Ada", "S1", str(N)]

    room.write_nbgrader(tmp_path / "nbgrader.csv", ROWS, ROSTER,
                        {("ada", 1): "2026-03-01T10:00:00+00:00"})
    nbg = _csv(tmp_path / "nbgrader.csv")
    assert tuple(nbg[0]) == room.NBGRADER_COLUMNS
    rows = {r[3]: dict(zip(nbg[0], r)) for r in nbg[1:]}
    assert set(rows) == {"ada", "'=cmd", "bob", "walk-in"}  # one per learner and lab
    assert rows["ada"]["assignment"] == "lab-1" and rows["ada"]["max_score"] == f"{N:.1f}"
    assert (rows["ada"]["last_name"], rows["ada"]["first_name"]) == ("Lovelace", "Ada")
    assert rows["ada"]["timestamp"] and rows["bob"]["timestamp"] == ""
    assert rows["bob"]["score"] == "0.0" and rows["ada"]["raw_score"] == f"{N:.1f}"


def test_every_csv_field_is_safe_from_formulas(tmp_path):
    rows = [{**r, "message": "=HYPERLINK(1)", "hint": "+1", "file": "\t" + r["file"]} for r in ROWS]
    room.write_gradebook(tmp_path / "gradebook.csv", rows, ROSTER)
    room.write_canvas(tmp_path / "canvas.csv", rows, ROSTER)
    room.write_moodle(tmp_path / "moodle.csv", rows, ROSTER)
    room.write_nbgrader(tmp_path / "nbgrader.csv", rows, ROSTER, {})
    room.write_csv(tmp_path / "grades.csv", grade.COLUMNS,
                   ([r.get(c, "") for c in grade.COLUMNS] for r in rows))
    for name in ("gradebook", "canvas", "moodle", "nbgrader", "grades"):
        for line in _csv(tmp_path / f"{name}.csv"):
            assert not [f for f in line if f[:1] in ("=", "+", "-", "@", "\t", "\r")], (name, line)
    back = grade._read_rows(tmp_path / "grades.csv")
    assert {r["learner"] for r in back} == {"ada", "=cmd", "walk-in"}
    assert back[0]["message"] == "=HYPERLINK(1)"


def test_summary_keeps_sections_apart_and_times_each_lab():
    text = room.summary(ROWS, roster=ROSTER)
    s1, s2 = text.index("### S1 (section)"), text.index("### S2 (section)")
    rest = text.index("### Not on the roster")
    assert s1 < text.index("`ada`") < s2 < text.index("`=cmd`") < rest < text.index("`walk-in`")
    assert "On the roster, no submission: bob." in text[s1:s2]
    assert "On the roster, no submission: none." in text[s2:rest]
    assert "| 1 | 3 | 7 | 9 | 21 | 0.20 GB |" in text  # mean 7 s over 3 submissions
    plain = room.summary(ROWS, roster=room.Roster([room.Person("ada"), room.Person("zed")]))
    assert "On the roster, no submission: zed." in plain and "(section)" not in plain


def test_feedback_folders_are_distinct_per_id(tmp_path):
    rows = [*_rows("ben", 1), *_rows("ben_", N), *_rows("../up", 0)]
    for r, who in zip(rows[::N], ("ben", "ben_", "../up")):
        assert r["learner"] == who
    room.write_feedback(tmp_path, rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["..%2Fup", "ben", "ben_"]
    assert "1 of 6" in (tmp_path / "ben" / "lab-1.md").read_text()
    assert f"{N} of {N}" in (tmp_path / "ben_" / "lab-1.md").read_text()


def test_resume_leaves_out_a_file_whose_rows_stop_short(tmp_path):
    path = tmp_path / "grades.csv"
    rows = [*_rows("ada", N), *_rows("bob", 1)[:2],
            {"file": "/room/pipe.ipynb", "learner": "pipe", "lab": "", "exercise": "",
             "status": "error", "message": "a named pipe"}]
    room.write_csv(path, grade.COLUMNS, ([r.get(c, "") for c in grade.COLUMNS] for r in rows))
    with open(path, "a") as f:
        f.write("/room/cut.ipynb,cut,1,Exer")  # a crash mid-row
    back = grade._read_rows(path)
    assert {r["learner"] for r in back} == {"ada", "pipe"}


def test_fair_memory_share_and_limits_said():
    one, four = grade.Limits.fair(1), grade.Limits.fair(4)
    assert one.memory_bytes >= 4 * four.memory_bytes > 0
    assert grade.Limits.fair(4, memory_bytes=int(2e9)).memory_bytes == int(2e9)
    assert "2.0 GB memory" in grade.Limits(memory_bytes=int(2e9)).describe()


# -- one grading run: the limits and a handed-in notebook ------------------------------------

HOG = _lab1("import numpy as np, time\n"
            "held = np.ones(600 * 2**20 // 8)  # 600 MB, every page touched\n"
            "time.sleep(30)\n", "predicted_stall = 32.0")
FORKS = _lab1("import subprocess, sys\n"
              "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "        for _ in range(6)]\n"
              "import time; time.sleep(30)\n", "predicted_stall = 32.0")
BIG_FILE = _lab1("try:\n"
                 "    open('big.bin', 'wb').write(bytes(3 * 2**20))\n"
                 "except OSError as err:\n"
                 "    said = err\n"
                 "    raise\n", "predicted_stall = 64.0")
HANDED = _lab1("predicted_stall = 32.0", hand=("ada@x.org", "2026-03-01T10:00:00+00:00"))


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    base = tmp_path_factory.mktemp("limited")
    subs, out = base / "subs", base / "out"
    subs.mkdir()
    for name, nb in (("hog", HOG), ("forks", FORKS), ("bigfile", BIG_FILE),
                     ("01_systolic_array (1)", HANDED)):
        nbformat.write(nb, subs / f"{name}.ipynb")
    roster = base / "roster.csv"
    roster.write_text("id,name,section,email\nada,\"Lovelace, Ada\",S1,ada@x.org\n")
    began = time.monotonic()
    rows = grade.grade([subs], out, timeout_s=120, jobs=2, progress=False, roster=roster,
                       sandbox=grade.Sandbox(None, "test"), memory_gb=0.4, processes=5,
                       file_size_gb=0.002)
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(pathlib.Path(r["file"]).stem, []).append(r)
    return by, out, time.monotonic() - began


def test_memory_over_the_limit_is_a_row_that_says_so(limited):
    by, _, seconds = limited
    rows = by["hog"]
    assert {r["status"] for r in rows} == {"error"}, rows
    assert "memory limit" in rows[0]["message"] and "--memory" in rows[0]["message"]
    assert 0.4 <= rows[0]["peak_gb"] < 1.0  # stopped soon after it passed the limit
    assert rows[0]["seconds"] < 25 and seconds < 90  # not left to sleep its 30 s


def test_processes_and_file_size_limits_are_named(limited):
    by = limited[0]
    assert "process limit" in by["forks"][0]["message"], by["forks"]
    last = by["bigfile"][-1]
    assert last["status"] == "failed" and "file-size limit" in last["message"], last


def test_a_handed_in_notebook_is_its_learner_in_every_export(limited):
    by, out, _ = limited
    assert {r["learner"] for r in by["01_systolic_array (1)"]} == {"ada"}
    assert by["01_systolic_array (1)"][-1]["status"] == "passed"
    canvas = _csv(out / "canvas.csv")
    assert ["Lovelace, Ada", "", "ada", "ada@x.org", "S1", "1"] in canvas
    text = (out / "summary.md").read_text()
    assert "## Grading time per lab" in text and "### S1 (section)" in text
    assert "Ids: 1 from hand-in cells, 3 from file names" in text
    assert (out / "feedback" / "ada" / "lab-1.md").exists()
    again = grade.grade([out.parent / "subs"], out, resume=True, progress=False,
                        sandbox=grade.Sandbox(None, "test"))
    assert len(again) == 4 * N  # nothing graded twice


def test_an_interrupted_run_says_it_is_partial(tmp_path):
    grade.write_results(tmp_path, ROWS, [], grade.Sandbox(None, "test"), grade.Limits(), 3.0,
                        ROSTER, partial=True)
    text = (tmp_path / "summary.md").read_text()
    assert text.splitlines()[2].startswith("**PARTIAL") and "--resume" in text
    assert {p.name for p in tmp_path.iterdir()} >= {
        "grades.csv", "gradebook.csv", "canvas.csv", "moodle.csv", "nbgrader.csv", "feedback"}
    assert not list(tmp_path.glob("*.tmp"))
