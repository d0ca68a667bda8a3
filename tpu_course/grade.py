"""``tpu-course grade SUBMISSION... --out DIR``: grade a room's lab notebooks, for feedback.

**Grading is for workshop feedback, not for exams.** What it protects and what it does
not is said below; read it before you rely on a grade.

Each submission (a ``.ipynb`` file, or a folder searched for them) is recognised from its
content, never its file name: the notebook's ``tpu_course.lab`` metadata, else its
``# Lab N`` title, else the lab checks its cells call. Who handed it in comes from the
notebook too (the hand-in record its last cell stores), the file's path only as a
fallback; :mod:`tpu_course.room` says how, and writes everything but ``grades.csv``. Only
regular files are read: a symlink, a named pipe, a socket or a device gets a row that says
what it is and is never opened.

Grading keeps the learner's code and the checks in different processes:

1. **The worker** (``python -m tpu_course.checks.worker``, in a sandbox) runs the notebook
   on a fresh kernel, cell by cell, with one time limit (``--timeout``). It reads each
   prediction as it stands at the end of the cell that states it (the first cell that
   assigns the name), before any later cell runs. Then it runs each exercise's probe in
   the kernel on the cases the grader sent (the notebook's visible ones and hidden ones
   drawn from the instructor's secret) and writes what the learner's code returned, as
   data (JSON; arrays as raw bytes). The worker's package holds no references, hidden
   cases or mistakes (they live in the repository's ``grading/`` folder, which is never
   mounted there), and the sandbox hides even the visible cases' expected outputs.
2. **The checker** is the grader's own process. It never imports, executes or unpickles
   anything from the submission: it reads the worker's JSON as data, computes the expected
   outputs itself from ``grading/`` (references and instruments, on the same cases) and
   judges them with the exercise's declared comparison and known mistakes.

Hidden cases come from a secret: ``--secret``, or the one stored in ``DIR/.grading-secret``
(created on first use and kept with the grades, so a regrade gives the same grades). With
bubblewrap (``bwrap``: Debian's ``bubblewrap``) the worker runs in its own PID namespace,
with no network, the file system read-only except the submission's own copy and a private
``/tmp``; the other submissions, the output folder and the course checkout are not
mounted, only the installed ``tpu_course`` package and the course data. Where no sandbox
can run (no ``bwrap``, macOS, a container that blocks user namespaces,
``TPU_COURSE_GRADE_SANDBOX=off``) the first line of output and ``summary.md`` say so: the
learner's code then runs as you, with your files and network, and could read the keys.

Limits per submission (:class:`Limits`): wall time over the whole run (``--timeout``, plus
:data:`SLACK_S` for starting the kernel and writing the outputs); memory (``--memory``,
default the machine's memory divided by ``--jobs``) and processes (``--processes``),
enforced by a watchdog that sums the resident memory of, and counts, every process that
carries the submission's token and kills them all when over; the size of any one file
written (``--file-size``, an ``RLIMIT_FSIZE``). The worker's processes are also the first
the kernel's out-of-memory killer picks. A row names the limit that stopped it.

What a determined learner can still do: make their own notebook's checks pass (they are
feedback), and write code that behaves right on every case it is given; that is the
exercise. They can also replace the course's probe functions in their own kernel so that
they report made-up outputs: that passes only where a library computes the answer (a
Pallas kernel replaced by a numpy call). What they cannot do: see a hidden case before
answering, reach the expected outputs or the verdicts, or change a prediction after the
cell that states it.

Results: ``DIR/grades.csv`` (one row per exercise: ``file, learner, lab, exercise, status,
points, max_points, message, hint, graded_at, seconds, peak_gb, id_from``; status one of
``passed``, ``failed``, ``not written``, ``skipped``, ``error``, ``timeout``), appended as
each submission is graded; then ``gradebook.csv``, ``canvas.csv``, ``moodle.csv``,
``nbgrader.csv``, ``summary.md`` and ``feedback/ID/lab-N.md`` (and ``.html``).
``--resume`` goes on from the rows already in ``grades.csv``; Ctrl-C writes what was
graded, marked partial. Every CSV field that a spreadsheet would read as a formula is
neutralised. The exit status is 0 when grading ran, whatever the learners scored, and 2
when it could not (named).
"""

from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import datetime
import glob
import importlib
import importlib.util
import json
import os
import pathlib
import queue
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterable, Sequence

from tpu_course import errors, room
from tpu_course.checks.engine import GRADING_RUN
from tpu_course.room import one_line as _one_line, safe as _safe

STATUSES = ("passed", "failed", "not written", "skipped", "error", "timeout")
COLUMNS = ("file", "learner", "lab", "exercise", "status", "points", "max_points", "message",
           "hint", "graded_at", "seconds", "peak_gb", "id_from")
DEFAULT_TIMEOUT_S = 600.0
#: Seconds for starting the kernel and writing the outputs, beyond ``--timeout``.
SLACK_S = 90.0
#: What grading needs beyond the course package, import name -> pip name.
REQUIRES = {"nbformat": "nbformat", "nbclient": "nbclient", "ipykernel": "ipykernel"}
#: Where the sandbox shows the submission's folder (its only writable one besides /tmp).
SANDBOX_WORK = "/tmp/submission"
#: The worker's results are read up to this size; more is a submission's forgery.
RESULTS_BUDGET = 256 * 2**20
SECRET_FILE = ".grading-secret"

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
    paths = list(paths)
    found: list[pathlib.Path] = []
    for raw in paths:
        path = pathlib.Path(raw)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb")
                            if ".ipynb_checkpoints" not in p.parts and not p.is_dir())
        elif os.path.lexists(path):  # a file, or a link, pipe or device: its row says which
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


@dataclasses.dataclass
class Submission:
    """One file handed in: who, which lab, and its parsed notebook (None: unreadable)."""

    path: pathlib.Path
    learner: str
    lab: int | None = None
    nb: Any = None
    problem: str = ""  # why it cannot be graded (unreadable, not a lab, not a file)
    superseded_by: pathlib.Path | None = None
    id_from: str = room.FROM_NAME  # where ``learner`` came from (room.FROM_HAND_IN)
    handed_in: datetime.datetime | None = None  # the stored hand-in time


#: What a path that is not a regular file is, for its row.
_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a folder"))
#: A notebook larger than this is not read (a lab is well under a megabyte).
MAX_NOTEBOOK_BYTES = 64 * 2**20


def not_a_file(path: pathlib.Path) -> str:
    """Why ``path`` is not read (a symlink, a pipe, a device, too large), or ``""``."""
    try:
        info = os.lstat(path)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return (f"a symbolic link (to {os.readlink(path)!r}), not opened: hand in the "
                "notebook file itself")
    for test, kind in _KINDS:
        if test(info.st_mode):
            return f"{kind}, not a notebook file: not opened"
    if info.st_size > MAX_NOTEBOOK_BYTES:
        return f"{info.st_size / 2**20:.0f} MB, larger than any lab notebook: not read"
    return ""


def read_submission(path: pathlib.Path) -> Submission:
    """Parse ``path`` (on the grader's side: nothing of it runs) and recognise its lab."""
    import nbformat

    sub = Submission(path, path.stem)
    sub.problem = not_a_file(path)
    if sub.problem:
        return sub
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
                       "no call to a lab's checks")
    return sub


# -- the keys ------------------------------------------------------------------------------


def load_keys(where: str | os.PathLike | None = None) -> Any:
    """The ``grading`` package (references, hidden cases, mistakes): from ``where`` (the
    course's repository, or its ``grading`` folder), else from the checkout this package
    runs from. The installed package does not hold it."""
    candidates = [pathlib.Path(where).expanduser()] if where else []
    checkout = _checkout()
    if checkout is not None and not where:
        candidates.append(checkout)
    for root in candidates:
        if root.name == "grading":
            root = root.parent
        if (root / "grading" / "__init__.py").is_file():
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
            return importlib.import_module("grading")
    if importlib.util.find_spec("grading") is not None and not where:
        return importlib.import_module("grading")
    said = f"--keys {str(where)!r} holds no grading/ folder" if where else (
        "the installed package holds no grading keys (on purpose: learners install it)")
    raise GradeError(f"{said}: run the grader from a checkout of the course's repository, "
                     "or give --keys PATH to one")


def read_secret(out: pathlib.Path, given: str | None) -> str:
    """The instructor's secret for hidden cases: ``given``, else ``out/.grading-secret``
    (created on first use, readable by you alone)."""
    path = out / SECRET_FILE
    if given:
        return given
    if path.exists():
        return path.read_text().strip()
    secret = secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def captures(nb: Any, lab: Any) -> dict[str, int]:
    """Each prediction's name -> the index of the first code cell that assigns it at top
    level (where its value is read)."""
    names = {n for e in lab.exercises if e.kind == "predict" for n in e.provides}
    found: dict[str, int] = {}
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse(_source(cell))
        except SyntaxError:
            continue
        for node in tree.body:
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name) and leaf.id in names:
                        found.setdefault(leaf.id, index)
    return found


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
                    "except the submission's copy; submissions, output, checkout and keys "
                    "hidden)")
        return (f"NO SANDBOX ({self.reason}): learners' code runs as you, with your files and "
                "network, and could read the grading keys; verdicts are still made in the "
                "grader's own process. Install Debian's bubblewrap for a sandbox. For "
                "feedback, not exams")

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
        args += ["--tmpfs", str(_package_dir() / "checks" / "visible")]
        for folder in _data_dirs():  # the evaluation labels: a learner never has them
            for labels in sorted(pathlib.Path(folder).glob("**/t10k-labels*")):
                args += ["--ro-bind", "/dev/null", str(labels)]
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
        if _SUBMISSION_XLA_FLAGS is not False:
            env.pop("XLA_FLAGS", None)
            if _SUBMISSION_XLA_FLAGS is not None:
                env["XLA_FLAGS"] = _SUBMISSION_XLA_FLAGS
        tmp = "/tmp" if self.bwrap else str(private / "tmp")
        if not self.bwrap:
            os.makedirs(tmp, exist_ok=True)
            env["HOME"] = os.environ.get("HOME", tmp)
        else:
            env["HOME"] = "/tmp/home"
            cache = os.environ.get("TPU_COURSE_CACHE") or str(
                pathlib.Path.home() / ".cache" / "tpu_course")
            env["TPU_COURSE_CACHE"] = os.path.abspath(os.path.expanduser(cache))
        env.pop("TPU_COURSE_GRADING", None)
        env.update(TMPDIR=tmp, MPLCONFIGDIR=f"{tmp}/mpl", XDG_CACHE_HOME=f"{tmp}/cache",
                   JUPYTER_RUNTIME_DIR=f"{tmp}/jupyter", IPYTHONDIR=f"{tmp}/ipython",
                   PYTHONDONTWRITEBYTECODE="1", **{GRADING_RUN: token},
                   TPU_COURSE_WITHHOLD_TEST_LABELS="1")
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


def _token_entry(token: str) -> bytes:
    """The entry a submission's processes carry in /proc/PID/environ."""
    return f"{GRADING_RUN}={token}".encode()


def _kill_leftovers(token: str) -> None:
    """Kill every process that still carries this submission's token (setsid'd ones too)."""
    needle = _token_entry(token)
    for environ in glob.glob("/proc/[0-9]*/environ"):
        pid = int(environ.split("/")[2])
        try:
            with open(environ, "rb") as f:
                if needle in f.read().split(b"\0") and pid != os.getpid():
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


#: Processes one submission may run at once (worker, kernel, whatever they start).
DEFAULT_PROCESSES = 64
#: The largest file a submission's processes may write (the worker's results included).
DEFAULT_FILE_BYTES = 10**9
#: Seconds between two looks of the watchdog.
WATCH_S = 0.2


def machine_memory() -> int:
    """Bytes of memory this machine (or the container's cgroup, when lower) holds."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = pathlib.Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one submission may use: wall time over the whole run, memory (resident, summed
    over its processes; 0: none), processes at once, and bytes per file written."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_bytes: int = 0
    processes: int = DEFAULT_PROCESSES
    file_bytes: int = DEFAULT_FILE_BYTES

    @classmethod
    def fair(cls, jobs: int = 1, **given: Any) -> "Limits":
        """The machine's memory shared by ``jobs`` submissions at once, unless given."""
        if not given.get("memory_bytes"):
            given["memory_bytes"] = machine_memory() // max(1, jobs)
        return cls(**given)

    def describe(self) -> str:
        memory = f"{self.memory_bytes / 1e9:.1f} GB memory" if self.memory_bytes else \
            "no memory limit"
        return (f"{self.timeout_s:g} s, {memory}, {self.processes} processes, "
                f"{self.file_bytes / 1e9:.1f} GB per file")


#: Starts the worker (and bwrap, when there is one) with the file-size limit set, first in
#: line for the kernel's out-of-memory killer: a new process, so that the grader's threads
#: never run Python code in a forked child.
_LIMITED = """
import os, resource, sys
size = int(sys.argv[1])
if size:
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _limited(argv: list[str], limits: Limits) -> list[str]:
    """``argv`` started under the file-size limit (an ``RLIMIT_FSIZE``, which every
    process it starts inherits)."""
    return [sys.executable, "-c", _LIMITED, str(int(limits.file_bytes)), *argv]


class _Watch:
    """The processes that carry a submission's token: how many, and their resident bytes."""

    def __init__(self, token: str) -> None:
        self.needle = _token_entry(token)
        self.others: set[int] = {os.getpid()}  # processes seen without the token
        self.page = os.sysconf("SC_PAGE_SIZE")

    def look(self) -> tuple[int, int]:
        count = rss = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in self.others:
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    mine = self.needle in f.read().split(b"\0")
                if not mine:
                    self.others.add(int(entry.name))
                    continue
                with open(f"/proc/{entry.name}/statm", "rb") as f:
                    rss += int(f.read().split()[1]) * self.page
                count += 1
            except (OSError, ValueError, IndexError):
                continue
        return count, rss


def _spawn_worker(sandbox: Sandbox, work: pathlib.Path, private: pathlib.Path,
                  limits: Limits) -> tuple[str, str, int]:
    """Run the worker on ``work`` (in the sandbox) under ``limits``: (the tail of its
    stderr, the limit that stopped it or ``""``, the most resident bytes seen). Every
    process it started is killed when it ends."""
    token = secrets.token_hex(8)
    inside = SANDBOX_WORK if sandbox.bwrap else str(work)
    argv = [sys.executable, "-m", "tpu_course.checks.worker", inside]
    stopped, peak = "", 0
    watch = _Watch(token)
    deadline = time.monotonic() + limits.timeout_s + SLACK_S
    with open(private / "worker.stderr", "w+b") as err:
        try:
            proc = subprocess.Popen(_limited(sandbox.command(argv, work), limits),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err, env=sandbox.env(token, private), cwd=work,
                                    start_new_session=True)
        except OSError as e:
            return f"could not start: {e}", "", 0
        try:
            while proc.poll() is None:
                count, rss = watch.look()
                peak = max(peak, rss)
                if limits.memory_bytes and rss > limits.memory_bytes:
                    stopped = "memory"
                elif limits.processes and count > limits.processes:
                    stopped = "processes"
                elif time.monotonic() > deadline:
                    stopped = "time"
                if stopped:
                    break
                try:
                    proc.wait(timeout=WATCH_S)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            _kill_leftovers(token)
        err.seek(0, os.SEEK_END)
        err.seek(max(0, err.tell() - 4000))
        tail = " | ".join(err.read().decode(errors="replace").strip().splitlines()[-3:])
    return tail, stopped, peak


def _read_results(path: pathlib.Path) -> dict | None:
    """The worker's results, as data (JSON only), or None."""
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > RESULTS_BUDGET:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _probe_values(ex: Any, cases: Sequence[Any], captured: dict) -> dict:
    """A prediction's outputs, made here from the values the worker read at the end of the
    cells that state them (plain data: the probe of a value exercise only reads them)."""
    from tpu_course.checks import engine

    if any(n not in captured for n in ex.provides):
        return {"missing": [n for n in ex.provides if n not in captured]}
    answer = {n: engine.decode(captured[n]) for n in ex.provides}
    if any(isinstance(v, engine.Raised) and v.kind == "NotWrittenError" for v in answer.values()):
        return {"not_written": True}
    return {"outputs": [engine.encode(o) for o in ex.run(answer, cases)]}


def grade_submission(sub: Submission, sandbox: Sandbox, keys: Any, secret: str,
                     limits: Limits | None = None) -> list[dict]:
    """Grade one submission: the worker runs it (sandboxed) and writes its outputs; this
    process judges them. Its rows of grades.csv; never raises for anything the submission
    does."""
    from tpu_course import checks
    from tpu_course.checks import engine

    limits = limits or Limits()
    timeout_s = limits.timeout_s
    base = {"file": str(sub.path), "learner": sub.learner, "lab": sub.lab or "",
            "id_from": sub.id_from}
    if sub.problem:
        return [{**base, "exercise": "", "status": "error", "message": sub.problem}]
    lab = checks.lab(sub.lab)
    table = keys.keys(sub.lab)
    verdicts: dict[str, Any] = {}  # a CheckResult, or (status, message) for the whole run
    plan: dict[str, tuple[Any, Any, list]] = {}
    where = captures(sub.nb, lab)
    probes = {}
    for ex in lab.exercises:
        reason = ex.unmet()
        if reason:
            verdicts[ex.title] = engine.skipped(ex.title, reason)
            continue
        key = table.get(engine.short(ex.title), keys.Key())
        cases = keys.cases_for(ex, key, keys.rng_for(secret, sub.learner, sub.lab, ex.title))
        plan[ex.title] = (ex, key, cases)
        probes[ex.title] = {"cases": [{"label": c.label, "args": engine.encode(
            engine.plain(dict(c.args)))} for c in cases],
            "capture": [n for n in ex.provides if n in where],
            "values_only": all(n in where for n in ex.provides)}

    def row(ex: Any, status: str, message: str, hint: str = "") -> dict:
        return {**base, "exercise": ex.title, "status": status,
                "points": ex.points if status == "passed" else 0, "max_points": ex.points,
                "message": _one_line(message), "hint": _one_line(hint)}

    note, problem, peak = "", None, 0
    if probes:
        private = pathlib.Path(tempfile.mkdtemp(prefix="tpu-course-grade-"))
        try:
            work = private / "work"
            work.mkdir()
            shutil.copyfile(sub.path, work / "submission.ipynb")
            (work / "job.json").write_text(json.dumps({
                "lab": sub.lab, "timeout_s": timeout_s, "captures": where, "probes": probes}))
            tail, stopped, peak = _spawn_worker(sandbox, work, private, limits)
            results = _read_results(work / "results.json")
        finally:
            shutil.rmtree(private, ignore_errors=True)
        status = str((results or {}).get("status", ""))
        if stopped == "memory":
            problem = ("error", f"stopped at the memory limit: the notebook's processes held "
                                f"{peak / 1e9:.2f} GB, over the {limits.memory_bytes / 1e9:.2f}"
                                " GB it may use (--memory): a cell keeps too much data")
        elif stopped == "processes":
            problem = ("error", f"stopped at the process limit: the notebook ran more than "
                                f"{limits.processes} processes at once (--processes)")
        elif stopped == "time" or status == "timeout":
            problem = ("timeout", f"the notebook ran past the {timeout_s:g} s limit: an "
                                  "endless loop, or too slow")
        elif results is None:
            problem = ("error", f"the notebook could not be run: {tail or 'no result'}")
        elif status != "finished":
            problem = ("error", f"the notebook's run {status}")
        else:
            problem = None
        said = [str(e) for e in (results or {}).get("errors") or [] if "File too large" in
                str(e) or "Errno 27" in str(e)]
        if said or "File too large" in tail:
            note = (f" A cell wrote a file past the {limits.file_bytes / 1e9:.1f} GB "
                    f"file-size limit (--file-size): {(said or [tail])[0]}")
            if problem is not None:
                problem = (problem[0], problem[1] + note)
        outputs = (results or {}).get("outputs") or {}
        captured = (results or {}).get("captured") or {}
        for title, (ex, key, cases) in plan.items():
            got = outputs.get(title) if isinstance(outputs, dict) else None
            if probes[title]["values_only"] and isinstance(captured, dict):
                got = _probe_values(ex, cases, captured)
            if problem is not None:
                verdicts[title] = problem
            elif not isinstance(got, dict):
                verdicts[title] = engine.fail(title, "the run gave no outputs for it")
            elif got.get("not_written"):
                verdicts[title] = engine.not_written(title)
            elif got.get("missing"):
                names = ", ".join(map(str, got["missing"]))[:200]
                verdicts[title] = engine.not_written(title, f"{names} is not defined")
            else:
                decoded = [engine.decode(o) for o in got.get("outputs", [])] \
                    if isinstance(got.get("outputs"), list) else []
                verdicts[title] = keys.grade(ex, key, decoded, cases)
    rows = []
    base["peak_gb"] = round(peak / 1e9, 2) if probes else ""
    for ex in lab.exercises:
        v = verdicts[ex.title]
        r = row(ex, *v) if isinstance(v, tuple) else row(ex, v.status, v.message, v.hint)
        if probes and note and problem is None and r["status"] not in ("passed", "skipped"):
            r["message"] = _one_line(r["message"] + note)
        rows.append(r)
    return rows


# -- the room ------------------------------------------------------------------------------


def missing_dependencies() -> list[str]:
    """The pip names of what grading needs and this Python lacks."""
    return [pip for mod, pip in REQUIRES.items() if importlib.util.find_spec(mod) is None]


def _prepare_out(out: str | os.PathLike, force: bool, resume: bool) -> pathlib.Path:
    """The output folder, created; refuses a file, an uncreatable folder, or earlier grades
    without ``force`` or ``resume``."""
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
    if (out / "grades.csv").exists() and not resume:
        if not force:
            raise GradeError(f"--out {str(out)!r} already holds grades.csv from an earlier run:"
                             " give --resume to go on from it, --force to replace it, or "
                             "another --out folder")
        shutil.rmtree(out / "feedback", ignore_errors=True)
        (out / "grades.csv").unlink()
    return out


def _read_rows(path: pathlib.Path) -> list[dict]:
    """The complete rows an earlier (perhaps interrupted) run wrote to grades.csv: a file
    whose rows stop short (a run killed as it wrote them) is left out, to grade again."""
    from tpu_course import checks

    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, csv.Error):
        return []
    rows = [{k: room.unsafe(v) if isinstance(v, str) else "" for k, v in r.items() if k}
            for r in rows if r.get("file") and r.get("status")]
    for r in rows:
        for k in ("points", "max_points"):
            try:
                r[k] = int(r.get(k) or 0)
            except ValueError:
                r[k] = 0
    count: dict[str, int] = {}
    for r in rows:
        count[r["file"]] = count.get(r["file"], 0) + 1

    def whole(r: dict) -> bool:
        if r.get("lab") in ("", None):
            return count[r["file"]] == 1
        try:
            return count[r["file"]] == len(checks.lab(r["lab"]).exercises)
        except (ValueError, errors.CourseError):
            return False

    return [r for r in rows if whole(r)]


def _rooms(named: Sequence[str | os.PathLike], paths: Sequence[pathlib.Path]) -> list[str]:
    """The folders that hold a room rather than one learner: those named, and the folder of
    named files when it holds more than one of them."""
    folders = [os.path.abspath(n) for n in named if os.path.isdir(n)]
    parents: dict[str, int] = {}
    for n in named:
        if not os.path.isdir(n):
            parent = os.path.dirname(os.path.abspath(n))
            parents[parent] = parents.get(parent, 0) + 1
    return folders + [p for p, k in parents.items() if k > 1]


def grade(submissions: Iterable[str | os.PathLike], out: str | os.PathLike, *,
          timeout_s: float = DEFAULT_TIMEOUT_S, jobs: int = 1, progress: bool = True,
          force: bool = False, resume: bool = False, roster: str | os.PathLike | None = None,
          secret: str | None = None, keys: str | os.PathLike | None = None,
          sandbox: Sandbox | None = None, memory_gb: float | None = None,
          processes: int = DEFAULT_PROCESSES, file_size_gb: float | None = None) -> list[dict]:
    """Grade every submission, write the CSVs, ``summary.md`` and the feedback; the rows.

    Raises:
        GradeError: no submissions, bad arguments or ``out``, missing keys or dependencies.
    """
    timeout_s = errors.check_number("timeout_s", timeout_s, low=0, low_open=True, where="grade")
    jobs = errors.check_int("jobs", jobs, low=1, where="grade")
    processes = errors.check_int("processes", processes, low=2, where="grade")
    for name, value in (("memory_gb", memory_gb), ("file_size_gb", file_size_gb)):
        if value is not None:
            errors.check_number(name, value, low=0, low_open=True, where="grade")
    limits = Limits.fair(jobs, timeout_s=timeout_s, processes=processes,
                         memory_bytes=int((memory_gb or 0) * 1e9),
                         file_bytes=int(file_size_gb * 1e9) if file_size_gb
                         else DEFAULT_FILE_BYTES)
    missing = missing_dependencies()
    if missing:
        raise GradeError(f"grading needs {', '.join(missing)}, which this Python "
                         f"({sys.executable}) lacks: pip install {' '.join(missing)}")
    grading = load_keys(keys)
    submissions = list(submissions)
    paths = find_submissions(submissions)
    people = room.Roster.read(roster) if roster else room.Roster()
    out = _prepare_out(out, force, resume)
    secret = read_secret(out, secret)
    hidden = [out, *{p.parent for p in paths}, *submissions]
    sandbox = sandbox or find_sandbox(hidden)
    if progress:
        print(f"tpu-course grade: {sandbox.describe()}", flush=True)
        print(f"tpu-course grade: limits per notebook: {limits.describe()}", flush=True)
    start = time.perf_counter()
    subs = [read_submission(p) for p in paths]
    room.assign(subs, people, _rooms(submissions, paths))
    room.drop_duplicates(subs)
    earlier = _read_rows(out / "grades.csv") if resume else []
    done_files = {r["file"] for r in earlier}
    todo: queue.Queue = queue.Queue()
    for i, sub in enumerate(subs):
        if sub.superseded_by is None and str(sub.path) not in done_files:
            todo.put((i, sub))
    done: dict[int, list[dict]] = {}
    lock = threading.Lock()
    stop = threading.Event()
    # Earlier rows rewritten whole (a row cut short by a crash goes), then appended to.
    room.write_csv(out / "grades.csv", COLUMNS, ([r.get(c, "") for c in COLUMNS]
                                                 for r in earlier))
    log = open(out / "grades.csv", "a", newline="")
    writer = csv.DictWriter(log, fieldnames=COLUMNS, extrasaction="ignore")

    def serve() -> None:
        while not stop.is_set():
            try:
                i, sub = todo.get_nowait()
            except queue.Empty:
                return
            began = time.monotonic()
            try:
                rows = grade_submission(sub, sandbox, grading, secret, limits)
            except Exception as err:  # noqa: BLE001 - a grader bug is a row, not a lost room
                rows = [{"file": str(sub.path), "learner": sub.learner, "lab": sub.lab or "",
                         "id_from": sub.id_from, "exercise": "", "status": "error",
                         "message": _one_line(f"the grader failed on this file: "
                                              f"{type(err).__name__}: {err}")}]
            when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            seconds = time.monotonic() - began
            for r in rows:
                r.update(graded_at=when, seconds=round(seconds, 1))
            with lock:
                done[i] = rows
                writer.writerows({c: _safe(r.get(c, "")) for c in COLUMNS} for r in rows)
                log.flush()
            if progress:
                passed = sum(r["status"] == "passed" for r in rows)
                peak = rows[0].get("peak_gb") or 0
                print(f"  {_one_line(sub.path)}: {passed} of {len(rows)} passed ("
                      f"{', '.join(sorted({r['status'] for r in rows}))}; {seconds:.0f} s, "
                      f"{peak:.2f} GB)", flush=True)

    threads = [threading.Thread(target=serve, daemon=True)
               for _ in range(min(jobs, todo.qsize() or 1))]
    partial = False
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        partial = True
        stop.set()
        print("tpu-course grade: interrupted; writing what was graded so far "
              "(--resume goes on from it)", file=sys.stderr, flush=True)
    with lock:
        log.close()
        rows = [*earlier, *(r for i in sorted(done) for r in done[i])]
        write_results(out, rows, subs, sandbox, limits, time.perf_counter() - start, people,
                      partial=partial or not todo.empty())
    if partial:
        raise KeyboardInterrupt
    return rows


# -- what the grader writes -----------------------------------------------------------------


def write_results(out: pathlib.Path, rows: Sequence[dict], subs: Sequence[Submission],
                  sandbox: Sandbox, limits: "Limits", seconds: float,
                  roster: room.Roster | None = None, partial: bool = False) -> None:
    """``grades.csv`` (whole), the gradebooks, ``summary.md`` and ``feedback/`` in ``out``."""
    roster = roster or room.Roster()
    room.write_csv(out / "grades.csv", COLUMNS, ([r.get(c, "") for c in COLUMNS] for r in rows))
    room.write_gradebook(out / "gradebook.csv", rows, roster)
    room.write_canvas(out / "canvas.csv", rows, roster)
    room.write_moodle(out / "moodle.csv", rows, roster)
    stamps = {(s.learner, s.lab): room.when_handed_in(s) for s in subs
              if s.lab is not None and s.superseded_by is None and not s.problem}
    room.write_nbgrader(out / "nbgrader.csv", rows, roster, stamps)
    room.write_feedback(out / "feedback", rows)
    files = list(dict.fromkeys(r["file"] for r in rows))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    handed = sum(s.id_from == room.FROM_HAND_IN for s in subs if s.lab is not None)
    named = sum(s.id_from == room.FROM_NAME for s in subs if s.lab is not None)
    head = [f"**{sandbox.describe()}.**", ""] if sandbox is not None else []
    if partial:
        head = ["**PARTIAL: grading was interrupted; run again with --resume to grade the "
                "rest.**", "", *head]
    head += [f"{len(files)} submission(s) graded on {now} in {seconds:.0f} s; limits per "
             f"notebook: {limits.describe()}. Ids: {handed} from hand-in cells, {named} from "
             "file names. Every row is in `grades.csv`; one row per learner in "
             "`gradebook.csv`; `canvas.csv`, `moodle.csv` and `nbgrader.csv` to import; "
             "feedback to hand back in `feedback/`.", ""]
    text = room.summary(rows, head=head, subs=subs, roster=roster)
    tmp = out / "summary.md.tmp"
    tmp.write_text(text)
    os.replace(tmp, out / "summary.md")


def _simulate_lab_devices() -> None:
    """Give this process the simulated CPU devices the labs' instruments compile on (lab 6's
    and lab 8's expected outputs come from programs on 8 devices), before JAX starts."""
    from tpu_course import checks, runtime

    global _SUBMISSION_XLA_FLAGS
    wanted = max(checks.lab(n).cpu_devices for n in range(1, len(checks.LABS) + 1))
    before = os.environ.get("XLA_FLAGS")
    try:
        runtime.simulate_devices(wanted)
    except runtime.TooLateError:  # called in a process whose JAX already runs: as it is
        return
    _SUBMISSION_XLA_FLAGS = before  # the notebooks get XLA_FLAGS as they were


def _start_jax_quietly() -> None:
    """Start JAX's backends here, where libtpu's start-up warnings (the ``jax[tpu]`` extra on
    a machine without a TPU) are dropped instead of reaching the instructor's terminal."""
    from tpu_course import runtime

    with runtime.quiet_libtpu():
        import jax

        jax.devices()


#: XLA_FLAGS as they were before this process simulated devices for itself (``False``: it
#: did not), which a submission's processes get back: a notebook simulates its own.
_SUBMISSION_XLA_FLAGS: str | None | bool = False


def main(argv: Sequence[str] | None = None) -> int:
    """``tpu-course grade``; exit 0 when grading ran, 2 when it could not."""
    from tpu_course.checks.worker import skip_uri_grammar

    skip_uri_grammar()
    parser = argparse.ArgumentParser(
        prog="tpu-course grade", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Grade a room's submitted lab notebooks, for feedback, NOT for exams.",
        epilog="Each notebook runs in a worker process, in a bubblewrap sandbox when `bwrap` "
               "runs here (own PID namespace, no network, read-only files; other "
               "submissions, the output, the checkout and the grading keys hidden), else "
               "unsandboxed, as you: the first line says which. The worker writes what the "
               "learner's code returned on the visible and hidden inputs, as data; this "
               "process computes the expected outputs and judges, never running the "
               "learner's code. Details: pydoc tpu_course.grade.")
    parser.add_argument("submissions", nargs="*", metavar="SUBMISSION",
                        help=".ipynb files or folders of them (learner/lab-N.ipynb, alice.ipynb)")
    parser.add_argument("--out", metavar="DIR", help="where grades.csv, gradebook.csv, "
                        "canvas.csv, moodle.csv, nbgrader.csv, summary.md and feedback/ go")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="wall time per notebook, its whole run (default %(default)g)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="notebooks graded at once (default 1)")
    parser.add_argument("--memory", type=float, metavar="GB", help="memory per notebook, "
                        "summed over its processes (default: this machine's memory / --jobs)")
    parser.add_argument("--processes", type=int, default=DEFAULT_PROCESSES, metavar="N",
                        help="processes per notebook at once (default %(default)s)")
    parser.add_argument("--file-size", type=float, metavar="GB", help="largest file a "
                        f"notebook may write (default {DEFAULT_FILE_BYTES / 1e9:.2f})")
    parser.add_argument("--roster", metavar="FILE",
                        help="CSV of id, name, section, email (header optional; or one id a "
                             "line): names and sections in the summary and the gradebooks, "
                             "and who handed nothing in")
    parser.add_argument("--force", action="store_true",
                        help="replace the grades an earlier run left in --out")
    parser.add_argument("--resume", action="store_true",
                        help="go on from the grades an earlier (interrupted) run left in --out")
    parser.add_argument("--secret", metavar="TEXT", help="the seed of the hidden inputs "
                        f"(default: the one kept in DIR/{SECRET_FILE}, made on first use)")
    parser.add_argument("--keys", metavar="PATH", help="the course repository holding "
                        "grading/ (default: the checkout this package runs from)")
    args = parser.parse_args(argv)
    if not args.submissions:
        parser.error("give at least one SUBMISSION (.ipynb files or folders)")
    if not args.out:
        parser.error("--out DIR is required: where grades.csv and summary.md go")
    _simulate_lab_devices()
    _start_jax_quietly()
    try:
        rows = grade(args.submissions, args.out, timeout_s=args.timeout, jobs=args.jobs,
                     force=args.force, resume=args.resume, roster=args.roster,
                     secret=args.secret, keys=args.keys, memory_gb=args.memory,
                     processes=args.processes, file_size_gb=args.file_size)
    except KeyboardInterrupt:
        return 130
    except (GradeError, errors.CourseError, ValueError, TypeError, OSError) as err:
        print(f"tpu-course grade: {err}", file=sys.stderr)
        return 2
    files = len({r["file"] for r in rows})
    print(f"graded {files} submission(s): {args.out}/grades.csv, gradebook.csv, canvas.csv, "
          "moodle.csv, nbgrader.csv, summary.md, feedback/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
