"""``tpu-course grade SUBMISSION... --out DIR``: grade a room's lab notebooks, for feedback.

**Grading is for workshop feedback, not for exams.** What it contains and what it does not
is said plainly below; read it before you rely on a grade.

Each submission (a ``.ipynb`` file, or a folder searched for them) is recognised from its
content, never its file name: the notebook's ``tpu_course.lab`` metadata, else its
``# Lab N`` title, else the lab checkers its cells call. The learner is the file's stem
(``alice.ipynb``), or its folder when the file is named after the lab
(``alice/lab-1.ipynb``, ``alice/01_systolic_array.ipynb``); several files of one learner
and lab (``lab-1.ipynb``, ``lab-1 (1).ipynb``) count once, the newest. Each notebook is then
graded in two steps, each a fresh process that the grader owns:

1. **Run** (for its outputs): a copy in a fresh temporary folder runs on a fresh kernel
   (nbclient), with errors allowed and one time limit (``--timeout``, default 600 s). A
   last cell writes the notebook's plain data values (numbers, strings, tuples, lists,
   dicts, numpy and JAX arrays; nothing else) as tagged JSON.
2. **Check**: a second, fresh process with pristine numpy, math and json runs none of the
   learner's top-level statements. From the submission (the grader's own reading of it) it
   carries over only imports, ``def`` and ``class`` blocks and assignments of literals or
   of library calls with plain arguments (``optimizer = optax.sgd(0.1)``); then the data
   values of step 1, decoded as data (``json``, ``np.load(allow_pickle=False)``); then it
   imports the course's checkers fresh and runs ``Lab.grade`` with hidden inputs seeded per
   learner and lab (a regrade gives the same grades). Its verdicts come back on its own
   stdout pipe, tagged with a one-time token; anything else it prints goes to stderr.

With bubblewrap (``bwrap``: Debian's ``bubblewrap``) both steps run in a sandbox: their own
PID namespace (the grader, the other submissions' processes and every command line are
invisible), no network (loopback only, for the kernel), the file system read-only except
the submission's own temporary copy and a private ``/tmp`` (HOME, JAX and matplotlib caches
go there), the course data (``TPU_COURSE_DATA``, Fashion-MNIST, the data cache) read-only;
the other submissions, the output folder and the course checkout (``solutions/``) are not
mounted, only the installed ``tpu_course`` package. Every process of a submission dies
with its sandbox. Where no sandbox can run (no ``bwrap``, macOS, a container that blocks
user namespaces, ``TPU_COURSE_GRADE_SANDBOX=off``) the first line of output and
``summary.md`` say so, and grading goes on unsandboxed: the verdicts still come back only
through the grader's pipes, and processes a submission left behind are killed, but the
learner's code runs as you, with your files and network.

What it protects against: a notebook that patches the checkers, numpy, math or json,
rewrites the grader's cells (IPython input transformers), prints or writes its own
verdicts, reads ``solutions/``, or writes outside its copy (sandboxed); a notebook that
loops, exits its kernel, crashes or deletes its folder (a row with the reason; the run
goes on). What it does not: the checker calls the learner's functions, so a function that
patches things *while it is being checked* can still fool that one check of that notebook
(never another learner's: each check is its own process). Use an exam system for exams.

Results: ``DIR/grades.csv`` (one row per exercise: ``file, learner, lab, exercise, status,
points, max_points, message, hint, graded_at``; status one of ``passed``, ``failed``,
``not written``, ``skipped``, ``error``, ``timeout``), ``DIR/gradebook.csv`` (one row per
learner: each exercise's points and the total, for a gradebook import), ``DIR/summary.md``
(per lab each learner's total, each exercise's pass share, superseded duplicates, learners
of ``--roster`` with no submission) and ``DIR/feedback/LEARNER/lab-N.md`` (and ``.html``):
each exercise's status, message and hint, ready to hand back. The exit status is 0 when
grading ran, whatever the learners scored, and 2 when it could not (named).
"""

from __future__ import annotations

import __future__
import argparse
import ast
import base64
import builtins
import csv
import dataclasses
import datetime
import glob
import html
import importlib
import importlib.util
import inspect
import linecache
import io
import json
import os
import pathlib
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterable, Sequence

from tpu_course import errors

STATUSES = ("passed", "failed", "not written", "skipped", "error", "timeout")
COLUMNS = ("file", "learner", "lab", "exercise", "status", "points", "max_points", "message",
           "hint", "graded_at")
DEFAULT_TIMEOUT_S = 600.0
#: Seconds the checking step may take (the checkers compile, lab 5's evaluates a model).
CHECK_S = 180.0
#: Seconds for starting the kernel and writing the values, beyond ``--timeout``.
SLACK_S = 90.0
#: What grading needs beyond the course package, import name -> pip name.
REQUIRES = {"nbformat": "nbformat", "nbclient": "nbclient", "ipykernel": "ipykernel"}
#: Where the sandbox shows the submission's copy (its only writable folder besides /tmp).
SANDBOX_WORK = "/tmp/submission"
#: Plain data the run step hands over: at most this many bytes of encoded values.
VALUES_BUDGET = 64 * 2**20

_TITLE = re.compile(r"^\s*#+\s*Lab\s+(\d+)\b", re.IGNORECASE | re.MULTILINE)
_CALLS = re.compile(r"\bchecks\s*\.\s*(?:ch0*(\d+)\b|lab\(\s*(\d+)\s*\))")
_MARKER = "@@tpu-course-grade@@"


class GradeError(errors.CourseValueError):
    """The grader cannot run (no submissions, bad arguments, a missing dependency)."""


# -- finding and recognising submissions --------------------------------------------------


def find_submissions(paths: Iterable[str | os.PathLike]) -> list[pathlib.Path]:
    """The ``.ipynb`` files named or found (recursively) in the folders named, in order.

    Raises:
        GradeError: a path does not exist, or nothing was found.
    """
    paths = list(paths)
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


_LAB_NAME = re.compile(r"^(lab[\s_-]*\d+|\d\d_[a-z0-9_]+)$", re.IGNORECASE)


def learner_id(path: str | os.PathLike) -> str:
    """Who handed ``path`` in: the file's stem without a copy suffix (``alice (1)`` is
    ``alice``), or the folder's name when the file is named after a lab
    (``alice/lab-1.ipynb``, ``alice/01_systolic_array.ipynb``).

    >>> learner_id("room/alice (1).ipynb"), learner_id("room/bob/lab-3 (2).ipynb")
    ('alice', 'bob')
    >>> learner_id("submitted/carol/lab1/01_systolic_array.ipynb")  # nbgrader's layout
    'carol'
    """
    path = pathlib.Path(os.path.abspath(path))
    stem = path.stem.strip()
    bare = re.sub(r"\s*\(\d+\)$|[\s_-]*copy\d*$", "", stem, flags=re.IGNORECASE).strip()
    if (_LAB_NAME.match(bare) or _LAB_NAME.match(stem)) and path.parent.name:
        folder = path.parent
        if _LAB_NAME.match(folder.name) and folder.parent.name:  # nbgrader: STUDENT/lab1/
            folder = folder.parent
        return folder.name
    return bare or stem


@dataclasses.dataclass
class Submission:
    """One file handed in: who, which lab, and its parsed notebook (None: unreadable)."""

    path: pathlib.Path
    learner: str
    lab: int | None = None
    nb: Any = None
    problem: str = ""  # why it cannot be graded (unreadable, not a lab)
    superseded_by: pathlib.Path | None = None


def read_submission(path: pathlib.Path) -> Submission:
    """Parse ``path`` (on the grader's side: nothing of it runs) and recognise its lab."""
    import nbformat

    sub = Submission(path, learner_id(path))
    try:
        sub.nb = nbformat.read(path, as_version=4)
    except Exception as err:  # noqa: BLE001 - any unreadable file is a row, not a crash
        said = str(err).strip().splitlines()
        sub.problem = _one_line(f"not a readable notebook ({type(err).__name__}: "
                                f"{said[0][:120] if said else ''}): ask for the .ipynb again "
                                "(File > Download > .ipynb)")
        return sub
    sub.lab = identify_lab(sub.nb)
    if sub.lab is None:
        sub.problem = ("not a lab notebook: no tpu_course lab metadata, no '# Lab N' title and "
                       "no call to a lab's checkers")
    return sub


def drop_duplicates(subs: Sequence[Submission]) -> None:
    """Mark all but the newest file of each learner and lab as superseded (in place)."""
    newest: dict[tuple[str, int], Submission] = {}
    for sub in subs:
        if sub.lab is None:
            continue
        key = (sub.learner, sub.lab)
        other = newest.get(key)
        if other is None or sub.path.stat().st_mtime >= other.path.stat().st_mtime:
            if other is not None:
                other.superseded_by = sub.path
            newest[key] = sub
        else:
            sub.superseded_by = other.path
    for sub in subs:  # a chain (a < b < c): everyone points at the one that counts
        if sub.superseded_by is not None:
            sub.superseded_by = newest[(sub.learner, sub.lab)].path


# -- the sandbox ---------------------------------------------------------------------------

#: System folders every Python process needs, mounted read-only in the sandbox.
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
#: Accelerators the kernel may use (TPU, GPU), passed through when they exist.
_DEVICES = ("/dev/accel*", "/dev/vfio", "/dev/nvidia*", "/dev/dri")
#: Environment variables a submission's processes see (the rest of yours stays out).
_PASS_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")
_PASS_PREFIXES = ("TPU_COURSE_", "JAX_", "XLA_", "TPU_", "TF_CPP_")


def _package_dir() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parent


def _checkout() -> pathlib.Path | None:
    """The course's source checkout, when the package is imported from one (editable)."""
    root = _package_dir().parent
    return root if (root / "pyproject.toml").exists() or (root / "solutions").exists() else None


def _data_dirs() -> list[str]:
    """The course data a lab reads, mounted read-only."""
    dirs = [p for p in os.environ.get("TPU_COURSE_DATA", "").split(os.pathsep) if p]
    dirs.append(os.environ.get("TPU_COURSE_CACHE")
                or str(pathlib.Path.home() / ".cache" / "tpu_course"))
    dirs.append("/usr/share/datasets/fashion-mnist")
    return [os.path.abspath(os.path.expanduser(d)) for d in dirs if os.path.isdir(
        os.path.expanduser(d))]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@dataclasses.dataclass
class Sandbox:
    """How a submission's processes are started: in bubblewrap, or (``bwrap`` None) not."""

    bwrap: str | None
    reason: str = ""  # why there is no sandbox
    hidden: tuple[str, ...] = ()  # folders to hide if a mounted folder holds them

    def describe(self) -> str:
        """One line for the output's first line and ``summary.md``."""
        if self.bwrap:
            return ("sandbox: bubblewrap (own PID namespace, no network, read-only files "
                    "except the submission's copy; submissions, output and checkout hidden)")
        return (f"NO SANDBOX ({self.reason}): learners' code runs as you, with your files and "
                "network; verdicts still come back only through the grader's pipes. "
                "Install Debian's bubblewrap for a sandbox. For feedback, not exams")

    def mounts(self) -> list[str]:
        """bwrap's mount arguments: system and Python read-only, checkout and output hidden."""
        keep = [d for d in _SYSTEM if os.path.lexists(d)]
        checkout = _checkout()
        extra = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                 os.path.dirname(os.path.realpath(sys.executable))}
        extra |= {p for p in sys.path if p and os.path.exists(p)}
        cwd = os.getcwd()
        for path in sorted(os.path.abspath(p) for p in extra):
            if path in (cwd, str(checkout)) or any(_under(path, k) for k in keep):
                continue
            keep = [k for k in keep if not _under(k, path)] + [path]
        args = []
        for path in keep:
            if os.path.islink(path) and path in _SYSTEM:  # merged /usr: /bin -> usr/bin
                args += ["--symlink", os.readlink(path), path]
            else:
                args += ["--ro-bind", path, path]
        hide = [h for h in (*self.hidden, str(checkout) if checkout else "")
                if h and any(_under(h, k) for k in keep) and h not in keep]
        for h in hide:
            args += ["--tmpfs", h]
        again = [k for k in keep if any(_under(k, h) for h in hide)]
        for path in [*again, str(_package_dir()), *_data_dirs()]:
            args += ["--ro-bind", path, path]
        for pattern in _DEVICES:
            for dev in glob.glob(pattern):
                args += ["--dev-bind-try", dev, dev]
        return args

    def command(self, argv: list[str], work: pathlib.Path | None) -> list[str]:
        """``argv`` wrapped in bwrap (or as it is, without a sandbox)."""
        if not self.bwrap:
            return argv
        args = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session",
                "--proc", "/proc", "--dev", "/dev", "--ro-bind-try", "/sys", "/sys",
                "--tmpfs", "/tmp", *self.mounts()]
        if work is not None:
            args += ["--bind", str(work), SANDBOX_WORK, "--chdir", SANDBOX_WORK]
        else:
            args += ["--chdir", "/tmp"]
        return [*args, "--", *argv]

    def env(self, token: str, private: pathlib.Path) -> dict[str, str]:
        """The environment of a submission's processes: a few of yours, private folders."""
        env = {k: v for k, v in os.environ.items()
               if k in _PASS_ENV or k.startswith(_PASS_PREFIXES)}
        tmp = "/tmp" if self.bwrap else str(private / "tmp")
        if not self.bwrap:
            os.makedirs(tmp, exist_ok=True)
            env["HOME"] = os.environ.get("HOME", tmp)
        else:
            env["HOME"] = "/tmp/home"
            cache = os.environ.get("TPU_COURSE_CACHE") or str(
                pathlib.Path.home() / ".cache" / "tpu_course")
            env["TPU_COURSE_CACHE"] = os.path.abspath(os.path.expanduser(cache))
        env.update(TMPDIR=tmp, MPLCONFIGDIR=f"{tmp}/mpl", XDG_CACHE_HOME=f"{tmp}/cache",
                   JUPYTER_RUNTIME_DIR=f"{tmp}/jupyter", IPYTHONDIR=f"{tmp}/ipython",
                   PYTHONDONTWRITEBYTECODE="1", TPU_COURSE_GRADE_TOKEN=token)
        return env


def find_sandbox(hidden: Iterable[str | os.PathLike] = ()) -> Sandbox:
    """bubblewrap when it runs here (``TPU_COURSE_BWRAP`` names another binary), else a
    :class:`Sandbox` without one that says why (``TPU_COURSE_GRADE_SANDBOX=off``: none)."""
    hidden = tuple(os.path.abspath(h) for h in hidden)
    if os.environ.get("TPU_COURSE_GRADE_SANDBOX", "").lower() in ("off", "0", "no"):
        return Sandbox(None, "turned off by TPU_COURSE_GRADE_SANDBOX=off", hidden)
    if not sys.platform.startswith("linux"):
        return Sandbox(None, f"bubblewrap needs Linux, this is {sys.platform}", hidden)
    bwrap = os.environ.get("TPU_COURSE_BWRAP") or shutil.which("bwrap")
    if not bwrap or not os.path.exists(bwrap):
        return Sandbox(None, f"bwrap not found ({bwrap or 'not on PATH'}): apt-get install "
                             "bubblewrap", hidden)
    sandbox = Sandbox(bwrap, "", hidden)
    probe = sandbox.command([sys.executable, "-c", "import tpu_course, nbclient"], None)
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=60,
                              env=sandbox.env("probe", pathlib.Path("/tmp")))
        said = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    except (OSError, subprocess.TimeoutExpired) as err:
        proc, said = None, f"{type(err).__name__}: {err}"
    if proc is None or proc.returncode != 0:
        return Sandbox(None, f"bwrap cannot run here: {said[:160]}", hidden)
    return sandbox


def _kill_leftovers(token: str) -> None:
    """Kill every process that still carries this submission's token (setsid'd ones too)."""
    needle = f"TPU_COURSE_GRADE_TOKEN={token}".encode()
    for environ in glob.glob("/proc/[0-9]*/environ"):
        pid = int(environ.split("/")[2])
        try:
            with open(environ, "rb") as f:
                if needle in f.read().split(b"\0") and pid != os.getpid():
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _spawn(sandbox: Sandbox, mode: str, job: dict, private: pathlib.Path,
           work: pathlib.Path | None, limit_s: float) -> tuple[Any, str, bool]:
    """Run ``python -m tpu_course.grade MODE`` for one submission: (the last tagged JSON it
    printed or None, the tail of its stderr, whether it ran past ``limit_s``)."""
    token = secrets.token_hex(8)
    argv = [sys.executable, "-m", "tpu_course.grade", mode]
    err_path = private / f"{mode[2:]}.stderr"
    marker = job.get("nonce", _MARKER)
    timed_out = False
    with open(err_path, "w+b") as err, tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(sandbox.command(argv, work), stdin=subprocess.PIPE,
                                    stdout=out if mode == "--run" else subprocess.PIPE,
                                    stderr=err, env=sandbox.env(token, private),
                                    cwd=work or private, start_new_session=True)
        except OSError as e:
            return None, f"could not start: {e}", False
        try:
            said, _ = proc.communicate(json.dumps(job).encode(), timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out, said = True, b""
        except OSError:  # it closed stdin early: read what it said below
            said = b""
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            _kill_leftovers(token)
        if mode == "--run":
            size = out.seek(0, io.SEEK_END)
            out.seek(max(0, size - 2 * VALUES_BUDGET))
            said = out.read()
        err.seek(0, io.SEEK_END)
        err.seek(max(0, err.tell() - 4000))
        tail = " | ".join(err.read().decode(errors="replace").strip().splitlines()[-3:])
    result = None
    for line in (said or b"").decode(errors="replace").splitlines():
        if line.startswith(marker):
            try:
                result = json.loads(line[len(marker):])
            except ValueError:
                result = None
    return result, tail, timed_out


# -- step 1, inside the sandbox: run the notebook and hand over its plain data -----------

# Runs last, in the learner's kernel: writes every plain data value of the notebook as
# tagged JSON. Whatever a notebook does to this cell only changes its own values: they
# are data, decoded as data, and the checking step never runs this kernel's objects.
_EXPORT_CELL = '''
def _tpu_course_export(names, path, budget):
    import base64, io, json, sys
    numpy = sys.modules.get("numpy")
    jax = sys.modules.get("jax")
    left = [budget]
    def enc(v, depth=0):
        t = type(v)
        if depth > 30:
            raise ValueError("too deep")
        if v is None:
            return ["none"]
        if t in (bool, int, str):
            return [t.__name__, v]
        if t is float:
            return ["float", repr(v)]
        if t is complex:
            return ["complex", [repr(v.real), repr(v.imag)]]
        if t in (tuple, list, set, frozenset):
            return [t.__name__, [enc(x, depth + 1) for x in v]]
        if t is dict:
            return ["dict", [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]]
        if t.__name__ == "NotWritten" and t.__module__.startswith("tpu_course.checks"):
            return ["not_written", str(object.__getattribute__(v, "exercise"))]
        tag = "array"
        if jax is not None and isinstance(v, jax.Array):
            tag, v = "jax_array", numpy.asarray(v)
        if numpy is not None and isinstance(v, numpy.generic):
            return enc(v.item(), depth)
        if numpy is not None and type(v) is numpy.ndarray and v.dtype.kind in "biufc":
            if v.nbytes > left[0]:
                raise ValueError("too big")
            left[0] -= v.nbytes
            buf = io.BytesIO()
            numpy.save(buf, v, allow_pickle=False)
            return [tag, base64.b64encode(buf.getvalue()).decode()]
        if numpy is not None and type(v) is numpy.ndarray and v.dtype.kind == "V":
            return enc(v.astype(numpy.float32), depth)  # bfloat16 and friends
        raise TypeError(t.__name__)
    g = globals()
    skip = {"In", "Out", "exit", "quit", "get_ipython"}
    order = [n for n in names if n in g] + sorted(n for n in g if n not in names)
    values = {}
    for name in order:
        if name.startswith("_") or name in skip:
            continue
        try:
            values[name] = enc(g[name])
        except Exception:
            pass
    predictions = []  # what LAB.predict recorded (and locked) in this kernel, as data
    core = sys.modules.get("tpu_course.checks._core")
    for (lab, title), p in dict(getattr(core, "_PREDICTIONS", None) or {}).items():
        try:
            predictions.append([int(lab), str(title), {str(k): enc(v) for k, v in
                                                       p.values.items()}, bool(p.locked)])
        except Exception:
            pass
    with open(path, "w") as f:
        json.dump({"values": values, "predictions": predictions}, f)
_tpu_course_export(@NAMES@, @PATH@, @BUDGET@)
del _tpu_course_export
'''


def _cell_name(nb: Any, index: int) -> str:
    first = next((ln.strip() for ln in _source(nb.cells[index]).splitlines() if ln.strip()), "")
    return f"cell {index} ({first[:60]!r})" if first else f"cell {index}"


def _run_main() -> int:
    """``--run`` (inside the sandbox): run the notebook, print its outcome and values."""
    # jsonschema's optional URI checker builds a grammar on import (seconds per
    # notebook on a busy machine); notebooks need no URI validation.
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    job = json.loads(sys.stdin.read())
    timeout_s = float(job["timeout"])
    nb = nbformat.read(job["notebook"], as_version=4)
    values_path = os.path.join(tempfile.mkdtemp(prefix="values-"), "values.json")
    export = nbformat.v4.new_code_cell(
        _EXPORT_CELL.replace("@NAMES@", repr(list(job["names"])))
        .replace("@PATH@", repr(values_path)).replace("@BUDGET@", str(VALUES_BUDGET)))
    nb.cells.append(export)
    client = NotebookClient(nb, timeout=max(1, int(timeout_s)), kernel_name="python3",
                            allow_errors=True, interrupt_on_timeout=False,
                            shutdown_kernel="immediate",  # its sandbox goes next anyway
                            resources={"metadata": {"path": os.getcwd()}})
    deadline = time.monotonic() + timeout_s
    index = -1
    result: dict[str, Any] = {"outcome": "ran", "message": "", "values": {}}
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
            client.timeout = 60
            client.execute_cell(export, index)
    except CellTimeoutError:
        where = ("while handing over its values" if index == len(nb.cells) - 1
                 else f"at {_cell_name(nb, index)}")
        result = {"outcome": "timeout", "message": f"the notebook ran past the "
                  f"{timeout_s:g} s limit {where}: an endless loop, or too slow"}
    except DeadKernelError:
        result = {"outcome": "error", "message": f"the kernel died at {_cell_name(nb, index)} "
                  "(it exits the kernel, or crashed it): nothing could be graded"}
    except Exception as err:  # noqa: BLE001 - e.g. the kernel could not start
        result = {"outcome": "error", "message": f"the notebook could not be run: "
                  f"{type(err).__name__}: {str(err)[:200]}"}
    if result["outcome"] == "ran":
        try:
            if os.path.getsize(values_path) <= 2 * VALUES_BUDGET:
                with open(values_path) as f:
                    result.update(json.load(f))
        except (OSError, ValueError, TypeError):
            pass  # no values: names the checker needs are "not written"
    sys.stdout.write(_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


# -- step 2, inside a second sandbox: carry over definitions, then check ------------------

#: Libraries whose calls a carried assignment, default or decorator may make.
CALLABLE_ROOTS = frozenset({"numpy", "jax", "optax", "flax", "ml_dtypes", "math", "functools"})


class _Carry:
    """Decides which top-level statements of a notebook the checking process runs."""

    def __init__(self) -> None:
        self.imported: dict[str, str] = {}  # name -> the module it came from

    def rooted(self, node: ast.AST) -> str | None:
        """The module a dotted name (``jnp.float32``) starts from; None if not imported."""
        while isinstance(node, ast.Attribute):
            if node.attr.startswith("__"):
                return None
            node = node.value
        return self.imported.get(node.id) if isinstance(node, ast.Name) else None

    def safe(self, node: ast.AST | None) -> bool:
        """An expression whose evaluation runs none of the learner's code."""
        if node is None or isinstance(node, (ast.Constant, ast.Name)):
            return True
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return all(self.safe(e) for e in node.elts)
        if isinstance(node, ast.Dict):
            return all(k is not None and self.safe(k) for k in node.keys) and all(
                self.safe(v) for v in node.values)
        if isinstance(node, (ast.UnaryOp, ast.BinOp)):  # arithmetic on constants only
            return all(isinstance(n, (ast.Constant, ast.UnaryOp, ast.BinOp, ast.operator,
                                      ast.unaryop, ast.expr_context))
                       for n in ast.walk(node))
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            return self.rooted(node.value if isinstance(node, ast.Subscript) else node) \
                is not None and (not isinstance(node, ast.Subscript) or self.safe(node.slice))
        if isinstance(node, ast.Call):
            root = self.rooted(node.func)
            return (root is not None and root.split(".")[0] in CALLABLE_ROOTS
                    and all(self.safe(a.value if isinstance(a, ast.Starred) else a)
                            for a in node.args)
                    and all(self.safe(k.value) for k in node.keywords))
        return False

    def function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        args = node.args
        return (all(self.decorator(d) for d in node.decorator_list)
                and all(self.safe(d) for d in [*args.defaults, *args.kw_defaults]))

    def decorator(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.imported or node.id in ("staticmethod", "classmethod",
                                                            "property")
        return (self.rooted(node) is not None) if isinstance(node, ast.Attribute) \
            else isinstance(node, ast.Call) and self.safe(node)

    def klass(self, node: ast.ClassDef) -> ast.ClassDef | None:
        if not (all(self.decorator(d) for d in node.decorator_list)
                and all(isinstance(b, ast.Name) or self.rooted(b) for b in node.bases)
                and all(isinstance(k.value, ast.Name) or self.rooted(k.value)
                        for k in node.keywords)):
            return None
        body = [s for s in (self.statement(s) for s in node.body) if s is not None]
        node.body = body or [ast.Pass()]
        return node

    def statement(self, node: ast.stmt) -> ast.stmt | None:
        """``node`` as the checking process may run it, or None to leave it out."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node if self.function(node) else None
        if isinstance(node, ast.ClassDef):
            return self.klass(node)
        if isinstance(node, ast.Pass) or (isinstance(node, ast.Expr)
                                          and isinstance(node.value, ast.Constant)):
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = all(isinstance(t, ast.Name) or (isinstance(t, ast.Tuple) and all(
                isinstance(e, ast.Name) for e in t.elts)) for t in targets)
            return node if names and self.safe(node.value) else None
        return None

    def split(self, sources: Sequence[str]) -> tuple[list[ast.stmt], list[ast.stmt]]:
        """(the imports, the definitions) of the notebook's code cells, in order."""
        try:
            from IPython.core.inputtransformer2 import TransformerManager

            to_python = TransformerManager().transform_cell  # magics -> plain calls
        except ImportError:
            to_python = str
        trees = []
        for src in sources:
            try:
                trees.append(ast.parse(to_python(src)))
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue  # a cell that does not parse defines nothing
        imports = [n for t in trees for n in t.body
                   if isinstance(n, (ast.Import, ast.ImportFrom)) and getattr(
                       n, "module", "") != "__future__" and not getattr(n, "level", 0)]
        for node in imports:
            for alias in node.names:
                if isinstance(node, ast.Import):
                    self.imported[(alias.asname or alias.name).split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0])
                elif alias.name != "*":
                    self.imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        kept = [self.statement(n) for t in trees for n in t.body
                if not isinstance(n, (ast.Import, ast.ImportFrom))]
        return imports, [k for k in kept if k is not None]


def carry_over(sources: Sequence[str]) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """Of a notebook's code cells, the imports and the definitions the checking process
    runs: ``def`` and ``class`` blocks (their decorators and defaults only names, literals or
    library calls), assignments of literals and of library calls with plain arguments.

    >>> imports, defs = carry_over(["import numpy as np\\nnp.array_equal = lambda *a: True",
    ...                             "x = 32.0\\ny = np.zeros(3)\\nz = f()\\ndef f(): return 1"])
    >>> [ast.unparse(s) for s in imports + defs]
    ['import numpy as np', 'x = 32.0', 'y = np.zeros(3)', 'def f():\\n    return 1']
    """
    return _Carry().split(sources)


def _decode(value: Any, checks: Any) -> Any:
    """A value the run step encoded, rebuilt as plain data (never unpickled)."""
    tag, *rest = value
    data = rest[0] if rest else None
    if tag == "none":
        return None
    if tag in ("bool", "int", "str"):
        if type(data).__name__ != tag:
            raise TypeError(tag)
        return data
    if tag == "float":
        return float(data)
    if tag == "complex":
        return complex(float(data[0]), float(data[1]))
    if tag in ("tuple", "list", "set", "frozenset"):
        return {"tuple": tuple, "list": list, "set": set, "frozenset": frozenset}[tag](
            _decode(x, checks) for x in data)
    if tag == "dict":
        return {_decode(k, checks): _decode(v, checks) for k, v in data}
    if tag == "not_written":
        return checks.NotWritten(str(data))
    if tag in ("array", "jax_array"):
        import numpy

        array = numpy.load(io.BytesIO(base64.b64decode(data)), allow_pickle=False)
        if tag == "jax_array":
            import jax.numpy as jnp

            return jnp.asarray(array)
        return array
    raise ValueError(f"unknown tag {tag!r}")


def _module_dicts() -> dict[str, dict[str, Any]]:
    return {name: dict(vars(m)) for name, m in list(sys.modules.items())
            if m is not None and hasattr(m, "__dict__")}


def _restore(snapshot: dict[str, dict[str, Any]]) -> None:
    """Undo what definitions changed in the modules imported before them."""
    for name, saved in snapshot.items():
        module = sys.modules.get(name)
        if module is None:
            continue
        now = vars(module)
        for key, value in saved.items():
            if now.get(key, saved) is not value:
                now[key] = value


def _no_dumping() -> None:
    """Linux: other processes of this user cannot read this one's memory or pipes."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _check_main() -> int:
    """``--check`` (inside a fresh sandbox): grade the carried definitions and values."""
    job = json.loads(sys.stdin.read())
    verdicts = os.fdopen(os.dup(1), "w")  # the grader's pipe, for the verdicts only
    os.dup2(2, 1)  # whatever else runs here prints to stderr
    _no_dumping()
    import math  # noqa: F401 - pristine before any learner definition runs
    import numpy  # noqa: F401

    from tpu_course import checks as registry, runtime

    devices = registry.lab(int(job["lab"])).cpu_devices
    if devices > 1:  # what the notebook's simulate_devices did, before JAX starts here
        runtime.simulate_devices(devices)
    imports, definitions = carry_over(job["sources"])
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    snapshot: dict[str, dict[str, Any]] = {}
    for node in [*imports, None, *definitions]:
        if node is None:  # imports done: what definitions change in modules gets undone
            snapshot = _module_dicts()
            continue
        try:  # each definition under a file name inspect can read its source from
            source = ast.unparse(node) + "\n"
            name = f"<notebook definition {len(linecache.cache)}>"
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
            code = compile(source, name, "exec",
                           flags=__future__.annotations.compiler_flag, dont_inherit=True)
            exec(code, namespace)  # noqa: S102 - imports and definitions only
        except BaseException:  # noqa: BLE001 - a failed definition is simply absent
            pass
    _restore(snapshot)
    for name in [m for m in sys.modules if m == "tpu_course.checks"
                 or m.startswith("tpu_course.checks.")]:
        del sys.modules[name]
    checks = importlib.import_module("tpu_course.checks")
    for name, value in job["values"].items():
        try:
            namespace[name] = _decode(value, checks)
        except Exception:  # noqa: BLE001 - a value that is not data is left out
            pass
    core = sys.modules["tpu_course.checks._core"]
    for lab, title, values, locked in job.get("predictions", []):
        try:  # the predictions the kernel recorded, so that a locked one is what is graded
            core._PREDICTIONS[(int(lab), str(title))] = core._Prediction(
                {str(k): _decode(v, checks) for k, v in values.items()}, locked=bool(locked))
        except Exception:  # noqa: BLE001 - not data, or the registry keeps them otherwise
            pass
    lab = checks.lab(int(job["lab"]))
    seeded = "seed" in inspect.signature(lab.grade).parameters
    results = lab.grade(namespace, seed=job["seed"]) if seeded else lab.grade(namespace)
    rows = [{"exercise": r.exercise, "status": r.status, "message": str(r.message),
             "hint": str(getattr(r, "hint", "") or "")} for r in results]
    verdicts.write(job["nonce"] + json.dumps(rows) + "\n")
    verdicts.flush()
    os._exit(0)  # no exit handlers a definition may have registered


# -- one submission, on the grader's side --------------------------------------------------


def _exercises(number: int) -> tuple[str, list[Any]]:
    from tpu_course import checks

    lab = checks.lab(number)
    return lab.title, list(lab.exercises)


def _points(exercise: Any) -> int:
    return int(getattr(exercise, "points", 1))  # the registry's points= (default 1)


def _seed(learner: str, number: int) -> int | None:
    from tpu_course import checks

    seed = getattr(checks, "grading_seed", None)
    return seed(learner, number) if seed else None


def grade_submission(sub: Submission, sandbox: Sandbox,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> list[dict]:
    """Grade one submission (run, then check, each in a sandbox): its rows of grades.csv.

    Never raises for anything the submission does; the rows say what happened.
    """
    base = {"file": str(sub.path), "learner": sub.learner, "lab": sub.lab or ""}
    if sub.problem:
        return [{**base, "exercise": "", "status": "error", "message": sub.problem}]
    _, exercises = _exercises(sub.lab)

    def every(status: str, message: str) -> list[dict]:
        return [{**base, "exercise": e.title, "status": status, "points": 0,
                 "max_points": _points(e), "message": _one_line(message), "hint": ""}
                for e in exercises]

    private = pathlib.Path(tempfile.mkdtemp(prefix="tpu-course-grade-"))
    try:
        work = private / "work"
        work.mkdir()
        shutil.copyfile(sub.path, work / "submission.ipynb")
        names = [n for e in exercises for n in e.names]
        notebook = (f"{SANDBOX_WORK}/submission.ipynb" if sandbox.bwrap
                    else str(work / "submission.ipynb"))
        ran, tail, late = _spawn(sandbox, "--run", {"notebook": notebook, "timeout": timeout_s,
                                                    "names": names},
                                 private, work, timeout_s + SLACK_S)
        if late:
            return every("timeout", f"the notebook ran past the {timeout_s:g} s limit (and "
                                    "the kernel did not stop): an endless loop, or too slow")
        if not isinstance(ran, dict) or ran.get("outcome") not in ("ran", "timeout", "error"):
            return every("error", f"the notebook could not be run: {tail or 'no result'}")
        if ran["outcome"] != "ran":
            return every(ran["outcome"], str(ran.get("message", "")))
        code = [_source(c) for c in sub.nb.cells if c.get("cell_type") == "code"]
        job = {"lab": sub.lab, "seed": _seed(sub.learner, sub.lab), "sources": code,
               "values": ran.get("values") if isinstance(ran.get("values"), dict) else {},
               "predictions": ran.get("predictions") if isinstance(ran.get("predictions"),
                                                                   list) else [],
               "nonce": f"@@{secrets.token_hex(16)}@@"}
        checked, tail, late = _spawn(sandbox, "--check", job, private, None, CHECK_S)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    if late:
        return every("timeout", f"checking this notebook's answers ran past {CHECK_S:g} s: "
                                "a function that never returns?")
    if not isinstance(checked, list):
        return every("error", f"the checkers could not grade this notebook's answers: "
                              f"{tail or 'no result'}")
    verdicts = {r.get("exercise"): r for r in checked if isinstance(r, dict)}
    rows = []
    for e in exercises:
        r = verdicts.get(e.title, {})
        status = r.get("status") if r.get("status") in STATUSES else "error"
        rows.append({**base, "exercise": e.title, "status": status,
                     "points": _points(e) if status == "passed" else 0,
                     "max_points": _points(e),
                     "message": _one_line(r.get("message", "the checker gave no verdict")),
                     "hint": _one_line(r.get("hint", ""))})
    return rows


def _one_line(text: Any, limit: int = 400) -> str:
    """A message on one line (a CSV cell, a Markdown table cell), at most ``limit`` long."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# -- the room ------------------------------------------------------------------------------


def missing_dependencies() -> list[str]:
    """The pip names of what grading needs and this Python lacks."""
    return [pip for mod, pip in REQUIRES.items() if importlib.util.find_spec(mod) is None]


def _prepare_out(out: str | os.PathLike, force: bool) -> pathlib.Path:
    """The output folder, created; refuses a file, an uncreatable folder, or earlier grades
    without ``force``."""
    out = pathlib.Path(out)
    if out.exists() and not out.is_dir():
        raise GradeError(f"--out {str(out)!r} is a file, not a folder: name a folder for "
                         "grades.csv, summary.md and the feedback")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise GradeError(f"--out {str(out)!r}: cannot create this folder ({err.strerror}): "
                         "name one you can write to") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise GradeError(f"--out {str(out)!r}: this folder is not writable")
    if (out / "grades.csv").exists():
        if not force:
            raise GradeError(f"--out {str(out)!r} already holds grades.csv from an earlier run:"
                             " give --force to replace it, or another --out folder")
        shutil.rmtree(out / "feedback", ignore_errors=True)
    return out


def read_roster(path: str | os.PathLike) -> list[str]:
    """Learner ids, one a line (or a CSV's first column); blank lines and ``#`` skipped."""
    try:
        lines = pathlib.Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise GradeError(f"--roster {str(path)!r} cannot be read ({err}): give a text file "
                         "with one learner id a line") from None
    ids = [ln.split(",")[0].strip().strip('"') for ln in lines]
    ids = [i for i in ids if i and not i.startswith("#")]
    if ids and ids[0].lower() in ("learner", "id", "name", "student"):
        ids = ids[1:]
    return list(dict.fromkeys(ids))


def grade(submissions: Iterable[str | os.PathLike], out: str | os.PathLike, *,
          timeout_s: float = DEFAULT_TIMEOUT_S, jobs: int = 1, progress: bool = True,
          force: bool = False, roster: str | os.PathLike | None = None,
          sandbox: Sandbox | None = None) -> list[dict]:
    """Grade every submission, write the CSVs, ``summary.md`` and the feedback; the rows.

    Raises:
        GradeError: no submissions, bad arguments or ``out``, or a missing dependency.
    """
    timeout_s = errors.check_number("timeout_s", timeout_s, low=0, low_open=True, where="grade")
    jobs = errors.check_int("jobs", jobs, low=1, where="grade")
    missing = missing_dependencies()
    if missing:
        raise GradeError(f"grading needs {', '.join(missing)}, which this Python "
                         f"({sys.executable}) lacks: pip install {' '.join(missing)}")
    submissions = list(submissions)
    paths = find_submissions(submissions)
    names = read_roster(roster) if roster else None
    out = _prepare_out(out, force)
    hidden = [out, *{p.parent for p in paths}, *submissions]
    sandbox = sandbox or find_sandbox(hidden)
    if progress:
        print(f"tpu-course grade: {sandbox.describe()}", flush=True)
    start = time.perf_counter()
    subs = [read_submission(p) for p in paths]
    drop_duplicates(subs)
    todo: queue.Queue = queue.Queue()
    for i, sub in enumerate(subs):
        if sub.superseded_by is None:
            todo.put((i, sub))
    done: dict[int, list[dict]] = {}

    def serve() -> None:
        while True:
            try:
                i, sub = todo.get_nowait()
            except queue.Empty:
                return
            began = time.monotonic()
            rows = grade_submission(sub, sandbox, timeout_s)
            when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            seconds = time.monotonic() - began
            for row in rows:
                row.update(graded_at=when, seconds=round(seconds, 1))
            done[i] = rows
            if progress:
                passed = sum(r["status"] == "passed" for r in rows)
                print(f"  {_one_line(sub.path)}: {passed} of {len(rows)} passed ("
                      f"{', '.join(sorted({r['status'] for r in rows}))}; {seconds:.0f} s)",
                      flush=True)

    threads = [threading.Thread(target=serve) for _ in range(min(jobs, todo.qsize() or 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = [r for i in sorted(done) for r in done[i]]
    write_results(out, rows, subs, sandbox, timeout_s, time.perf_counter() - start, names)
    return rows


# -- what the grader writes -----------------------------------------------------------------


def write_results(out: pathlib.Path, rows: Sequence[dict], subs: Sequence[Submission],
                  sandbox: Sandbox, timeout_s: float, seconds: float,
                  roster: Sequence[str] | None = None) -> None:
    """``grades.csv``, ``gradebook.csv``, ``summary.md`` and ``feedback/`` in ``out``."""
    with open(out / "grades.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({c: r.get(c, "") for c in COLUMNS} for r in rows)
    write_gradebook(out / "gradebook.csv", rows, roster)
    write_feedback(out / "feedback", rows)
    (out / "summary.md").write_text(summary(rows, timeout_s, seconds, sandbox=sandbox,
                                            superseded=subs, roster=roster))


def _graded(rows: Sequence[dict]) -> list[int]:
    return sorted({int(r["lab"]) for r in rows if r.get("lab") not in ("", None)})


def write_gradebook(path: pathlib.Path, rows: Sequence[dict],
                    roster: Sequence[str] | None = None) -> None:
    """One row per learner: each exercise's points, each lab's total, the total."""
    header, keys = ["learner"], []
    for number in _graded(rows):
        _, exercises = _exercises(number)
        for e in exercises:
            header.append(f"Lab {number}: {e.title} [{_points(e)}]")
            keys.append((number, e.title))
        header.append(f"Lab {number} total [{sum(_points(e) for e in exercises)}]")
        keys.append((number, None))
    header.append("total")
    learners = list(dict.fromkeys([*(roster or []),
                                   *(r["learner"] for r in rows if r.get("lab") != "")]))
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for learner in learners:
            mine = {(int(r["lab"]), r["exercise"]): r for r in rows
                    if r["learner"] == learner and r.get("lab") != ""}
            cells, total = [learner], 0
            for number, title in keys:
                if title is None:
                    got = [r.get("points", 0) or 0 for (n, _), r in mine.items() if n == number]
                    cells.append(sum(got) if got else "")
                    total += sum(got)
                else:
                    cells.append(mine[(number, title)].get("points", 0)
                                 if (number, title) in mine else "")
            writer.writerow([*cells, total])


_MARK = {"passed": "passed", "failed": "not yet", "not written": "not written",
         "skipped": "skipped", "error": "error", "timeout": "timed out"}


def _safe_name(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", text).strip("._") or "learner"


def write_feedback(folder: pathlib.Path, rows: Sequence[dict]) -> None:
    """``folder/LEARNER/lab-N.md`` and ``.html``: each exercise's status, message, hint."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if r.get("lab") != "":
            groups.setdefault((r["learner"], int(r["lab"])), []).append(r)
    for (learner, number), mine in groups.items():
        title, _ = _exercises(number)
        got = sum(r.get("points", 0) or 0 for r in mine)
        most = sum(r.get("max_points", 0) or 0 for r in mine if r["status"] != "skipped")
        passed = sum(r["status"] == "passed" for r in mine)
        gradable = sum(r["status"] != "skipped" for r in mine)
        head = f"Lab {number}: {title}"
        said = (f"Feedback for {learner}, from {pathlib.Path(mine[0]['file']).name} (graded "
                f"{mine[0].get('graded_at', '')}): {passed} of {gradable} exercises passed, "
                f"{got} of {most} points.")
        md = [f"# {head}", "", said, ""]
        page = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(head)}"
                "</title></head><body>", f"<h1>{html.escape(head)}</h1>",
                f"<p>{html.escape(said)}</p>"]
        for r in mine:
            md += [f"## {r['exercise']}: {_MARK[r['status']]}", "", r["message"], ""]
            page += [f"<h2>{html.escape(r['exercise'])}: {_MARK[r['status']]}</h2>",
                     f"<p>{html.escape(r['message'])}</p>"]
            if r.get("hint"):
                md += [f"Hint: {r['hint']}", ""]
                page.append(f"<p><em>Hint:</em> {html.escape(r['hint'])}</p>")
        target = folder / _safe_name(learner)
        target.mkdir(parents=True, exist_ok=True)
        (target / f"lab-{number}.md").write_text("\n".join(md))
        (target / f"lab-{number}.html").write_text("\n".join([*page, "</body></html>", ""]))


def _cell(text: Any) -> str:
    return _one_line(text).replace("|", "/")


def summary(rows: Sequence[dict], timeout_s: float, seconds: float, *,
            sandbox: Sandbox | None = None, superseded: Sequence[Submission] = (),
            roster: Sequence[str] | None = None) -> str:
    """The Markdown summary: per lab, each learner's total and each exercise's pass share."""
    files = list(dict.fromkeys(r["file"] for r in rows))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Lab grades", ""]
    if sandbox is not None:
        lines += [f"**{sandbox.describe()}.**", ""]
    lines += [f"{len(files)} submission(s) graded on {now} in {seconds:.0f} s (limit "
              f"{timeout_s:g} s per notebook). Every row is in `grades.csv`, one row per "
              "learner in `gradebook.csv`, feedback to hand back in `feedback/`.", ""]
    for number in _graded(rows):
        title, exercises = _exercises(number)
        lab_rows = [r for r in rows if r["lab"] != "" and int(r["lab"]) == number]
        learners = list(dict.fromkeys(r["learner"] for r in lab_rows))
        lines += [f"## Lab {number}: {title} ({len(learners)} submission(s))", "",
                  "| Learner | File | Passed | Points | Not passed |", "|---|---|---|---|---|"]
        for learner in learners:
            mine = [r for r in lab_rows if r["learner"] == learner]
            passed = sum(r["status"] == "passed" for r in mine)
            gradable = sum(r["status"] != "skipped" for r in mine)
            got = sum(r.get("points", 0) or 0 for r in mine)
            most = sum(r.get("max_points", 0) or 0 for r in mine if r["status"] != "skipped")
            others: dict[str, int] = {}
            for r in mine:
                if r["status"] != "passed":
                    others[r["status"]] = others.get(r["status"], 0) + 1
            rest = ", ".join(f"{n} {s}" for s, n in others.items()) or "-"
            lines.append(f"| `{_cell(learner)}` | `{_cell(pathlib.Path(mine[0]['file']).name)}`"
                         f" | {passed} of {gradable} | {got} of {most} | {rest} |")
        lines += ["", "| Exercise | Passed | Share of the room |", "|---|---|---|"]
        for e in exercises:
            these = [r for r in lab_rows if r["exercise"] == e.title]
            passed = sum(r["status"] == "passed" for r in these)
            share = f"{100 * passed / len(these):.0f}%" if these else "-"
            lines.append(f"| {e.title} | {passed} of {len(these)} | {share} |")
        if roster:
            absent = [name for name in roster if name not in learners]
            lines += ["", f"Missing from the roster: {', '.join(absent) if absent else 'none'}."]
            unknown = [name for name in learners if name not in roster]
            if unknown:
                lines.append(f"Not on the roster: {', '.join(unknown)}.")
        lines.append("")
    old = [s for s in superseded if s.superseded_by is not None]
    if old:
        lines += ["## Superseded (not graded: the learner's newest file for the lab counts)", "",
                  "| Learner | Lab | File | Counted instead |", "|---|---|---|---|"]
        lines += [f"| `{_cell(s.learner)}` | {s.lab} | `{_cell(s.path)}` | "
                  f"`{_cell(s.superseded_by)}` |" for s in old]
        lines.append("")
    ungraded = [r for r in rows if r["lab"] == ""]
    if ungraded:
        lines += ["## Not graded", "", "| File | Status | Why |", "|---|---|---|"]
        lines += [f"| `{_cell(r['file'])}` | {r['status']} | {_cell(r['message'])} |"
                  for r in ungraded]
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``tpu-course grade``; exit 0 when grading ran, 2 when it could not."""
    parser = argparse.ArgumentParser(
        prog="tpu-course grade", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Grade a room's submitted lab notebooks, for feedback, NOT for exams.",
        epilog="Each notebook runs in a bubblewrap sandbox when `bwrap` runs here (own PID "
               "namespace, no network, read-only files, other submissions, the output and "
               "the course checkout hidden), else unsandboxed, as you: the first line says "
               "which. Checking happens in a fresh process that runs none of the learner's "
               "top-level statements; but the checkers call the learner's functions, which "
               "can still fool their own checks. Details: pydoc tpu_course.grade.")
    parser.add_argument("submissions", nargs="*", metavar="SUBMISSION",
                        help=".ipynb files or folders of them (learner/lab-N.ipynb, alice.ipynb)")
    parser.add_argument("--out", metavar="DIR", help="where grades.csv, gradebook.csv, "
                        "summary.md and feedback/ go")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="time limit per notebook (default %(default)g)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="notebooks graded at once (default 1)")
    parser.add_argument("--roster", metavar="FILE",
                        help="learner ids, one a line: summary.md names who is missing")
    parser.add_argument("--force", action="store_true",
                        help="replace the grades an earlier run left in --out")
    for mode in ("--run", "--check"):  # the two steps, inside the sandbox
        parser.add_argument(mode, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        return _run_main()
    if args.check:
        return _check_main()
    if not args.submissions:
        parser.error("give at least one SUBMISSION (.ipynb files or folders)")
    if not args.out:
        parser.error("--out DIR is required: where grades.csv and summary.md go")
    try:
        rows = grade(args.submissions, args.out, timeout_s=args.timeout, jobs=args.jobs,
                     force=args.force, roster=args.roster)
    except (GradeError, errors.CourseError, ValueError, TypeError, OSError) as err:
        print(f"tpu-course grade: {err}", file=sys.stderr)
        return 2
    files = len({r["file"] for r in rows})
    print(f"graded {files} submission(s): {args.out}/grades.csv, gradebook.csv, summary.md, "
          "feedback/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
