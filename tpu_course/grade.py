"""``tpu-course grade SUBMISSION... --out DIR``: grade a room's submitted lab notebooks.

Each submission (a ``.ipynb`` file, or a folder searched for them) is recognised from
its content, never its file name: the notebook's ``tpu_course.lab`` metadata when it has
one, else its ``# Lab N`` title, else the lab checkers its cells call. The learner is
the submission's path. Each notebook is then:

1. copied into a fresh temporary folder (the submission itself is never changed) and
   executed there on a fresh kernel, in its own worker process, with errors allowed (a
   learner's failing cell does not stop later exercises from being graded) and one
   time limit for the whole notebook (``--timeout``, default 600 s);
2. graded by the grader itself: one last cell, added by the grader, removes every
   ``tpu_course.checks`` module from ``sys.modules``, imports the course's checkers fresh
   and runs the lab registry's ``Lab.grade`` on the kernel's namespace. A notebook that
   redefined or patched a checker therefore grades nothing of its own, and what the
   learner's cells printed (their own scorecards) is never read.

Results go to ``DIR/grades.csv`` (``file, lab, exercise, status, message``; status one
of ``passed``, ``failed``, ``not written``, ``skipped``, ``error``, ``timeout``) and
``DIR/summary.md`` (per lab, each learner's total and the share of the room that passed
each exercise). A malformed file, a notebook that is not a lab, an infinite loop, a cell
that deletes its folder or exits the kernel: each is a row with its status and message,
and grading goes on. The exit status is 0 when grading ran, whatever the learners
scored, and 2 when the grader could not run (no submissions, bad arguments, a missing
dependency, named).

Learner code is untrusted, and this is workshop feedback, **not a security sandbox**:
each notebook runs in its own process, temporary folder and time limit, but with the
grading user's permissions, files and network. Do not use it to grade exams.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import os
import pathlib
import queue
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterable, Sequence

from tpu_course import errors

STATUSES = ("passed", "failed", "not written", "skipped", "error", "timeout")
COLUMNS = ("file", "lab", "exercise", "status", "message")
DEFAULT_TIMEOUT_S = 600.0
#: Seconds the grader's own cell may take after the learner's cells (checkers compile).
GRADER_CELL_S = 120.0
#: What grading needs beyond the course package, import name -> pip name.
REQUIRES = {"nbformat": "nbformat", "nbclient": "nbclient", "ipykernel": "ipykernel"}

_TITLE = re.compile(r"^\s*#+\s*Lab\s+(\d+)\b", re.IGNORECASE | re.MULTILINE)
_CALLS = re.compile(r"\bchecks\s*\.\s*(?:ch0*(\d+)\b|lab\(\s*(\d+)\s*\))")


class GradeError(errors.CourseValueError):
    """The grader cannot run (no submissions, bad arguments, a missing dependency)."""


# -- finding and recognising submissions --------------------------------------------------


def find_submissions(paths: Iterable[str | os.PathLike]) -> list[pathlib.Path]:
    """The ``.ipynb`` files named or found (recursively) in the folders named, in order.

    Raises:
        GradeError: a path does not exist, or nothing was found.
    """
    found: list[pathlib.Path] = []
    for raw in paths:
        path = pathlib.Path(raw)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb")
                            if ".ipynb_checkpoints" not in p.parts)
        elif path.is_file():
            found.append(path)
        else:
            raise GradeError(f"submission {str(path)!r} does not exist: give .ipynb files or "
                             "folders that hold them")
    unique = list(dict.fromkeys(found))
    if not unique:
        raise GradeError(f"no .ipynb submissions found in {[str(p) for p in paths]}")
    return unique


def identify_lab(nb: Any) -> int | None:
    """The lab a notebook is, from its content: metadata, then its title, then the
    checkers it calls; None when it is not a lab notebook."""
    from tpu_course import checks

    def valid(n: Any) -> int | None:
        try:
            n = int(n)
        except (TypeError, ValueError):
            return None
        return n if 1 <= n <= len(checks.LABS) else None

    meta = (nb.get("metadata") or {}).get("tpu_course") or {}
    if isinstance(meta, dict) and valid(meta.get("lab")):
        return valid(meta.get("lab"))
    cells = nb.get("cells") or []
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            match = _TITLE.search(_source(cell))
            if match and valid(match.group(1)):
                return valid(match.group(1))
    counts: dict[int, int] = {}
    for cell in cells:
        if cell.get("cell_type") == "code":
            for m in _CALLS.finditer(_source(cell)):
                n = valid(m.group(1) or m.group(2))
                if n:
                    counts[n] = counts.get(n, 0) + 1
    return max(counts, key=counts.get) if counts else None


def _source(cell: Any) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


# -- the grader's own cell ----------------------------------------------------------------

# Runs last, in the learner's kernel. Fresh checkers: every tpu_course.checks module is
# dropped from sys.modules and imported again, so nothing the notebook redefined or
# patched in them is used. NotWritten stubs made by the old module become the fresh
# module's, so an unwritten exercise is still "not written".
_GRADER_CELL = '''
def _tpu_course_grader(lab_number, marker):
    import importlib, json, sys
    for name in [m for m in list(sys.modules)
                 if m == "tpu_course.checks" or m.startswith("tpu_course.checks.")]:
        del sys.modules[name]
    checks = importlib.import_module("tpu_course.checks")
    namespace = dict(globals())
    for key, value in list(namespace.items()):
        kind = type(value)
        if kind.__name__ == "NotWritten" and kind.__module__.startswith("tpu_course.checks"):
            namespace[key] = checks.NotWritten(object.__getattribute__(value, "exercise"))
    lab = checks.lab(lab_number)
    rows = [{"exercise": r.exercise, "status": r.status, "message": r.message}
            for r in lab.grade(namespace)]
    sys.stdout.write(marker + json.dumps({"title": lab.title, "rows": rows}) + "\\n")
    sys.stdout.flush()
_tpu_course_grader(@LAB@, "@MARKER@")
'''


def _lab_exercises(number: int) -> tuple[str, list[str]]:
    from tpu_course import checks

    lab = checks.lab(number)
    return lab.title, [e.title for e in lab.exercises]


def _rows_for_all(file: str, number: int, status: str, message: str) -> list[dict]:
    """One row per exercise of lab ``number``, all with the same status (a run that ended
    before the grader could grade)."""
    _, titles = _lab_exercises(number)
    return [{"file": file, "lab": number, "exercise": t, "status": status, "message": message}
            for t in titles]


def _cell_name(nb: Any, index: int) -> str:
    first = next((ln.strip() for ln in _source(nb.cells[index]).splitlines() if ln.strip()), "")
    return f"cell {index} ({first[:60]!r})" if first else f"cell {index}"


def grade_notebook(path: str | os.PathLike, timeout_s: float = DEFAULT_TIMEOUT_S,
                   file: str | None = None) -> list[dict]:
    """Grade one submission in this process (the worker): its rows of ``grades.csv``.

    Never raises for anything the submission does; the rows say what happened.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    path = pathlib.Path(path)
    file = file or str(path)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as err:  # noqa: BLE001 - any unreadable file is a row, not a crash
        said = str(err).strip().splitlines()
        return [{"file": file, "lab": "", "exercise": "", "status": "error",
                 "message": _one_line(f"not a readable notebook ({type(err).__name__}: "
                                      f"{said[0][:120] if said else ''}): ask for the .ipynb "
                                      "again (File > Download > .ipynb)")}]
    number = identify_lab(nb)
    if number is None:
        return [{"file": file, "lab": "", "exercise": "", "status": "error",
                 "message": "not a lab notebook: no tpu_course lab metadata, no '# Lab N' "
                            "title and no call to a lab's checkers"}]
    marker = f"@@tpu-course-grade-{secrets.token_hex(8)}@@"
    grader = nbformat.v4.new_code_cell(
        _GRADER_CELL.replace("@LAB@", str(number)).replace("@MARKER@", marker))
    nb.cells.append(grader)
    package_root = str(pathlib.Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="tpu-course-grade-"))
    try:
        shutil.copy2(path, workdir / "submission.ipynb")
        client = NotebookClient(nb, timeout=max(1, int(timeout_s)), kernel_name="python3",
                                allow_errors=True, interrupt_on_timeout=False,
                                resources={"metadata": {"path": str(workdir)}})
        deadline = time.monotonic() + timeout_s
        index = -1
        try:
            with client.setup_kernel():
                for index, cell in enumerate(nb.cells[:-1]):
                    if cell.cell_type != "code":
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CellTimeoutError(f"no time left at cell {index}")
                    client.timeout = max(1, int(left + 0.999))
                    client.execute_cell(cell, index)
                index = len(nb.cells) - 1
                client.timeout = int(max(GRADER_CELL_S, deadline - time.monotonic()))
                client.execute_cell(grader, index)
        except CellTimeoutError:
            if index == len(nb.cells) - 1:
                message = (f"the checkers ran past {client.timeout} s on this notebook's "
                           "answers: a function that never returns?")
            else:
                message = (f"the notebook ran past the {timeout_s:g} s limit at "
                           f"{_cell_name(nb, index)}: an endless loop, or too slow")
            return _rows_for_all(file, number, "timeout", message)
        except DeadKernelError:
            return _rows_for_all(file, number, "error",
                                 f"the kernel died at {_cell_name(nb, index)} (it exits the "
                                 "kernel, or crashed it): nothing could be graded")
        except Exception as err:  # noqa: BLE001 - e.g. the kernel could not start
            return _rows_for_all(file, number, "error",
                                 f"the notebook could not be run: {type(err).__name__}: "
                                 f"{str(err)[:200]}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = None
    for out in grader.get("outputs", []):
        if out.get("output_type") == "stream":
            for line in out.get("text", "").splitlines():
                if line.startswith(marker):
                    result = json.loads(line[len(marker):])
    if result is None:
        said = next((f"{o.get('ename')}: {o.get('evalue', '')[:200]}"
                     for o in grader.get("outputs", []) if o.get("output_type") == "error"),
                    "it printed no result")
        return _rows_for_all(file, number, "error",
                             f"the grader could not check this notebook's answers ({said}): "
                             "the notebook may have broken the tpu_course package in its kernel")
    return [{"file": file, "lab": number, "exercise": row["exercise"], "status": row["status"],
             "message": _one_line(row["message"])} for row in result["rows"]]


def _one_line(text: str, limit: int = 400) -> str:
    """A message on one line (a CSV cell, a Markdown table cell), at most ``limit`` long."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# -- the room -----------------------------------------------------------------------------


def _worker_command(results: pathlib.Path, timeout_s: float) -> list[str]:
    return [sys.executable, "-m", "tpu_course.grade", "--worker-loop", "--results", str(results),
            "--timeout", str(timeout_s)]


def _serve(jobs: "queue.Queue[tuple[int, pathlib.Path]]", timeout_s: float,
           done: dict[int, list[dict]], progress: bool) -> None:
    """One grading worker process, fed submissions from ``jobs`` until it is empty.

    The worker (``--worker-loop``) reads ``index<TAB>path`` lines and writes each
    submission's rows to ``<results>/<index>.json``; it is one process for many
    submissions (importing nbformat and nbclient costs seconds), while each submission
    runs on its own fresh kernel. A worker that dies or overruns is replaced.
    """
    env = dict(os.environ)
    package_root = str(pathlib.Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    backstop = timeout_s + GRADER_CELL_S + 60
    with tempfile.TemporaryDirectory(prefix="tpu-course-grader-") as tmp:
        results = pathlib.Path(tmp)
        proc = None
        stderr = open(results / "worker.stderr", "w+")
        try:
            while True:
                try:
                    index, path = jobs.get_nowait()
                except queue.Empty:
                    return
                if proc is None or proc.poll() is not None:
                    proc = subprocess.Popen(_worker_command(results, timeout_s), env=env,
                                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                            stderr=stderr, text=True)
                start = time.monotonic()
                target = results / f"{index}.json"
                try:
                    proc.stdin.write(f"{index}\t{path}\n")
                    proc.stdin.flush()
                except OSError:
                    pass  # the worker is gone: reported below
                rows = None
                while rows is None:
                    if target.exists():
                        rows = json.loads(target.read_text())
                    elif proc.poll() is not None:
                        stderr.seek(0)
                        tail = " | ".join(stderr.read().strip().splitlines()[-3:])
                        rows = [{"file": str(path), "lab": "", "exercise": "", "status": "error",
                                 "message": _one_line(f"the grader's worker failed (exit code "
                                                      f"{proc.returncode}): {tail}")}]
                    elif time.monotonic() - start > backstop:
                        proc.kill()
                        proc.wait()
                        rows = [{"file": str(path), "lab": "", "exercise": "",
                                 "status": "timeout",
                                 "message": f"the grader's worker did not finish in "
                                            f"{backstop:g} s"}]
                    else:
                        time.sleep(0.05)
                seconds = time.monotonic() - start
                for row in rows:
                    row["seconds"] = round(seconds, 1)
                done[index] = rows
                if progress:
                    passed = sum(r["status"] == "passed" for r in rows)
                    print(f"  {path}: {passed} of {len(rows)} passed ("
                          f"{', '.join(sorted({r['status'] for r in rows}))}; {seconds:.0f} s)",
                          flush=True)
        finally:
            if proc is not None and proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            stderr.close()


def _worker_loop(results: pathlib.Path, timeout_s: float) -> int:
    """The worker's side of :func:`_serve`: grade each submission named on stdin."""
    for line in sys.stdin:
        index, _, path = line.rstrip("\n").partition("\t")
        rows = grade_notebook(path, timeout_s)
        part = results / f"{index}.part"
        part.write_text(json.dumps(rows))
        part.rename(results / f"{index}.json")  # atomic: the parent never reads half a file
    return 0


def missing_dependencies() -> list[str]:
    """The pip names of what grading needs and this Python lacks."""
    return [pip for mod, pip in REQUIRES.items() if importlib.util.find_spec(mod) is None]


def grade(submissions: Iterable[str | os.PathLike], out: str | os.PathLike, *,
          timeout_s: float = DEFAULT_TIMEOUT_S, jobs: int = 1, progress: bool = True) -> list[dict]:
    """Grade every submission, write ``out/grades.csv`` and ``out/summary.md``; the rows.

    Raises:
        GradeError: no submissions, bad ``timeout_s``/``jobs``, or a missing dependency.
    """
    timeout_s = errors.check_number("timeout_s", timeout_s, low=0, low_open=True, where="grade")
    jobs = errors.check_int("jobs", jobs, low=1, where="grade")
    missing = missing_dependencies()
    if missing:
        raise GradeError(f"grading needs {', '.join(missing)}, which this Python "
                         f"({sys.executable}) lacks: pip install {' '.join(missing)}")
    paths = find_submissions(submissions)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    todo: queue.Queue = queue.Queue()
    for item in enumerate(paths):
        todo.put(item)
    done: dict[int, list[dict]] = {}
    threads = [threading.Thread(target=_serve, args=(todo, timeout_s, done, progress))
               for _ in range(min(jobs, len(paths)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = [r for i in range(len(paths)) for r in done[i]]
    with open(out / "grades.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({c: r.get(c, "") for c in COLUMNS} for r in rows)
    (out / "summary.md").write_text(summary(rows, timeout_s, time.perf_counter() - start))
    return rows


def summary(rows: Sequence[dict], timeout_s: float, seconds: float) -> str:
    """The Markdown summary: per lab, each learner's total and each exercise's pass share."""
    files = list(dict.fromkeys(r["file"] for r in rows))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Lab grades", "",
             f"{len(files)} submission(s) graded on {now} in {seconds:.0f} s (limit "
             f"{timeout_s:g} s per notebook). Every row is in `grades.csv`.", ""]
    labs = sorted({r["lab"] for r in rows if r["lab"] != ""})
    for number in labs:
        title, titles = _lab_exercises(int(number))
        lab_rows = [r for r in rows if r["lab"] == number]
        learners = list(dict.fromkeys(r["file"] for r in lab_rows))
        lines += [f"## Lab {number}: {title} ({len(learners)} submission(s))", "",
                  "| Learner | Passed | Not passed |", "|---|---|---|"]
        for learner in learners:
            mine = [r for r in lab_rows if r["file"] == learner]
            passed = sum(r["status"] == "passed" for r in mine)
            gradable = sum(r["status"] != "skipped" for r in mine)
            others = {}
            for r in mine:
                if r["status"] != "passed":
                    others[r["status"]] = others.get(r["status"], 0) + 1
            rest = ", ".join(f"{n} {s}" for s, n in others.items()) or "-"
            lines.append(f"| `{learner}` | {passed} of {gradable} | {rest} |")
        lines += ["", "| Exercise | Passed | Share of the room |", "|---|---|---|"]
        for t in titles:
            these = [r for r in lab_rows if r["exercise"] == t]
            passed = sum(r["status"] == "passed" for r in these)
            share = f"{100 * passed / len(these):.0f}%" if these else "-"
            lines.append(f"| {t} | {passed} of {len(these)} | {share} |")
        lines.append("")
    ungraded = [r for r in rows if r["lab"] == ""]
    if ungraded:
        lines += ["## Not graded", "", "| File | Status | Why |", "|---|---|---|"]
        lines += [f"| `{r['file']}` | {r['status']} | {_one_line(r['message']).replace('|', '/')} |"
                  for r in ungraded]
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``tpu-course grade``; exit 0 when grading ran, 2 when it could not."""
    parser = argparse.ArgumentParser(prog="tpu-course grade",
                                     description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("submissions", nargs="*", metavar="SUBMISSION",
                        help=".ipynb files or folders of them")
    parser.add_argument("--out", metavar="DIR", help="where grades.csv and summary.md go")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="time limit per notebook (default %(default)g)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="notebooks graded at once (default 1)")
    parser.add_argument("--worker-loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_loop:  # the grader's worker process (see _serve)
        return _worker_loop(pathlib.Path(args.results), args.timeout)
    if not args.submissions:
        parser.error("give at least one SUBMISSION (.ipynb files or folders)")
    if not args.out:
        parser.error("--out DIR is required: where grades.csv and summary.md go")
    try:
        rows = grade(args.submissions, args.out, timeout_s=args.timeout, jobs=args.jobs)
    except (GradeError, errors.CourseError, ValueError, TypeError) as err:
        print(f"tpu-course grade: {err}", file=sys.stderr)
        return 2
    files = len({r["file"] for r in rows})
    print(f"graded {files} submission(s): {args.out}/grades.csv, {args.out}/summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
