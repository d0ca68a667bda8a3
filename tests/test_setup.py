"""The setup cell and ``tpu_course.setup.finish``, the way Colab and Kaggle run them.

Most cases call :func:`tpu_course.setup.finish` (or execute the cell) in this process
with fakes: an installed set given as a dict, and a pip that records what it was asked
for and what it moved. One case runs the real cell with the real pip in a throw-away
virtual environment that imitates an old TPU runtime; nothing comes from the network
there: small fake wheels of jax, jaxlib, libtpu, flax and the course (same names,
versions and dependency pins as the real packages; the course's wheel holds the real
``tpu_course/setup.py``), served to pip with ``--no-index --find-links``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pip
import pytest

from tools import notebooks
from tpu_course import setup

# What the cell and finish() do depends on the installed set they are shown (fakes, or a
# throw-away environment), not on the jax the test process runs: the Colab line does not
# repeat these.
pytestmark = pytest.mark.stack_independent

ROOT = notebooks.ROOT
FLOOR = notebooks.JAX_FLOOR
OLD = "0.6.0"
#: flax before and after the upgrade issue 25 saw (0.10.7 -> 0.12.0), and the course's floor.
OLD_FLAX, NEW_FLAX = "0.10.7", "0.12.0"
FLAX_FLOOR = setup.floor("flax")
REQUIRED = setup.requirements()
#: A runtime with every requirement at its floor (and the course).
AT_FLOOR = {**{r.name: r.floor or "1.0" for r in REQUIRED.values()}, "tpu-course": "0.1.0"}


class FakeRuntime:
    """What ``finish`` sees: ``have`` as the installed set; pip records its arguments and
    leaves ``after`` installed (or fails with ``status`` and ``output``)."""

    def __init__(self, monkeypatch, have: dict[str, str], after: dict[str, str] | None = None,
                 status: int = 0, output: str = "", gpu: bool = False):
        self.have, self.after, self.status, self.output = dict(have), after, status, output
        self.calls: list[list[str]] = []
        monkeypatch.setattr(setup, "installed", lambda: dict(self.have))
        monkeypatch.setattr(setup, "run_pip", self.pip)
        monkeypatch.setattr(setup.shutil, "which",
                            lambda name: "/usr/bin/nvidia-smi" if gpu and name == "nvidia-smi"
                            else None)

    def pip(self, args: list[str]) -> tuple[int, str]:
        self.calls.append(list(args))
        if self.status == 0 and self.after is not None:
            self.have = dict(self.after)
        return self.status, self.output


def _others(*, but: str = "jax") -> list[str]:
    return [r.text for r in REQUIRED.values() if r.name != but]


# ------------------------------------------------------------------------ finish()


def test_a_runtime_with_everything_at_its_floor_runs_no_pip_and_says_nothing(monkeypatch,
                                                                              capsys):
    runtime = FakeRuntime(monkeypatch, AT_FLOOR)
    assert setup.finish() is None
    assert runtime.calls == [] and capsys.readouterr().out == ""


def test_what_is_missing_is_installed_beside_the_runtimes_own_jax(monkeypatch, capsys):
    """Colab with the course just installed (--no-deps) and optax missing: pip adds it,
    jax, jaxlib and libtpu pinned as they are; no restart (nothing loaded moved)."""
    have = {**AT_FLOOR, "jaxlib": FLOOR, "libtpu": "0.0.21.1"}
    del have["optax"]
    runtime = FakeRuntime(monkeypatch, have, after={**have, "optax": "0.2.8"})
    setup.finish()
    assert runtime.calls == [[f"jax=={FLOOR}", f"jaxlib=={FLOOR}", "libtpu==0.0.21.1",
                              REQUIRED["optax"].text]]
    assert capsys.readouterr().out == "Setup: installed for the course: optax 0.2.8 (new)\n"


def test_a_runtime_without_jax_gets_the_newest_from_pip(monkeypatch):
    runtime = FakeRuntime(monkeypatch, {"tpu-course": "0.1.0"},
                          after={**AT_FLOOR, "jax": "0.9.0"})
    setup.finish()
    assert runtime.calls == [[r.text for r in REQUIRED.values()]]  # no pins, jax>=floor


def test_a_tpu_runtime_below_the_floor_upgrades_one_set_and_asks_for_a_restart(monkeypatch):
    """Colab's stack in issue 25: flax 0.10.7 beside an old jax; the course needs a newer
    flax, so pip moves it too, and the message must say so (not only jax and jaxlib)."""
    have = {**AT_FLOOR, "jax": OLD, "jaxlib": OLD, "libtpu": "0.0.17", "flax": OLD_FLAX}
    after = {**have, "jax": FLOOR, "jaxlib": FLOOR, "libtpu": "0.0.23", "flax": NEW_FLAX}
    runtime = FakeRuntime(monkeypatch, have, after=after)
    with pytest.raises(setup.SetupStop) as stop:
        setup.finish()
    assert runtime.calls == [[f"jax[tpu]=={FLOOR}", f"jaxlib=={FLOOR}", *_others()]]
    shown = "\n".join(stop.value._render_traceback_())  # what IPython prints
    assert f"jax {OLD} is older than the course's floor {FLOOR}" in shown
    assert "Restart the runtime once (Colab: Runtime > Restart session" in shown
    # the message names each package that moved (flax and libtpu too), and nothing else
    moved = [line.strip() for line in shown.splitlines() if " -> " in line or "(new)" in line]
    assert moved == [f"flax {OLD_FLAX} -> {NEW_FLAX}", f"jax {OLD} -> {FLOOR}",
                     f"jaxlib {OLD} -> {FLOOR}", "libtpu 0.0.17 -> 0.0.23"], shown
    runtime.calls.clear()  # after the restart: nothing to do
    assert setup.finish() is None and runtime.calls == []


@pytest.mark.parametrize("have, gpu, extra", [
    ({"jax-cuda12-plugin": OLD}, False, "[cuda12]"),  # the CUDA plugin moves with jax
    ({}, True, "[cuda12]"),  # an NVIDIA driver, no plugin yet
    ({}, False, ""),  # a CPU runtime
])
def test_a_runtime_below_the_floor_gets_its_own_plugin(monkeypatch, have, gpu, extra):
    runtime = FakeRuntime(monkeypatch, {**AT_FLOOR, "jax": OLD, "jaxlib": OLD, **have},
                          after=AT_FLOOR, gpu=gpu)
    with pytest.raises(setup.SetupStop, match="older than the course's floor"):
        setup.finish()
    assert runtime.calls[0][:2] == [f"jax{extra}=={FLOOR}", f"jaxlib=={FLOOR}"]


PIP_NO_MATCH = f"""\
ERROR: Could not find a version that satisfies the requirement flax>={FLAX_FLOOR} (from versions: none)
ERROR: No matching distribution found for flax>={FLAX_FLOOR}
"""
PIP_OFFLINE = """\
WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after \
connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection \
object at 0x7f>: Failed to establish a new connection: [Errno -3] Temporary failure in name \
resolution')': /simple/flax/
ERROR: Could not find a version that satisfies the requirement flax>=0.11.2
  error: subprocess-exited-with-error
  note: This error originates from a subprocess. See above for output.
"""


def test_a_pip_failure_is_a_message_with_pips_cause_and_the_fix(monkeypatch):
    have = {**AT_FLOOR}
    del have["flax"]
    runtime = FakeRuntime(monkeypatch, have, status=1, output=PIP_NO_MATCH)
    with pytest.raises(setup.SetupStop) as stop:
        setup.finish()
    shown = "\n".join(stop.value._render_traceback_())
    assert shown.startswith(f"Setup failed: pip could not install jax=={FLOOR} ")
    assert "No matching distribution found for flax" in shown  # pip's own cause
    assert "Fix: read pip's error above" in shown and "Internet on" in shown
    assert len(runtime.calls) == 1


def test_no_network_is_named_and_pips_see_above_line_is_left_out(monkeypatch):
    """Kaggle's default (Internet off): pip's last line ends in "See above", the cause is
    earlier; the fix is the Internet switch."""
    FakeRuntime(monkeypatch, {"tpu-course": "0.1.0"}, status=1, output=PIP_OFFLINE)
    with pytest.raises(setup.SetupStop) as stop:
        setup.finish()
    shown = str(stop.value)
    assert "Could not find a version that satisfies the requirement flax" in shown
    assert "See above" not in shown
    assert "Fix: switch the runtime's internet on (Kaggle: Settings > Internet on)" in shown


def test_an_upgraded_package_this_process_already_imported_asks_for_a_restart(monkeypatch):
    import numpy  # noqa: F401 - loaded here, as a kernel that imported it

    have = {**AT_FLOOR, "numpy": "1.0"}  # below the floor, jax fine
    FakeRuntime(monkeypatch, have, after={**have, "numpy": "2.1.0"})
    with pytest.raises(setup.SetupStop, match=r"already imported \(numpy\)"):
        setup.finish()


def test_the_floors_are_pyprojects_everywhere(monkeypatch):
    """pyproject.toml types them; the cell's finish(), preflight and CI's Colab line read
    them (installed without pyproject.toml, as pip on Colab: from the package metadata)."""
    import tpu_course

    assert f'"jax>={FLOOR}"' in (ROOT / "pyproject.toml").read_text()
    assert f"jax=={FLOOR}\n" in (ROOT / "ci" / "colab.txt").read_text()
    assert setup.floor("jax") == tpu_course.jax_floor() == FLOOR
    assert {"jax", "flax", "optax", "ipykernel"} <= set(REQUIRED)
    monkeypatch.setattr(pathlib.Path, "is_file", lambda self: False)
    assert setup.requirements() == REQUIRED


def test_the_module_runs_before_the_course_dependencies_are_there():
    """The cell imports tpu_course.setup right after installing the course alone: the
    module (and the package's __init__) import only the standard library."""
    import ast

    for name in ("setup", "__init__", "warnings_policy"):  # what `import tpu_course.setup` runs
        path = ROOT / "tpu_course" / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for imported in names:
                top = imported.split(".")[0]
                assert top in sys.stdlib_module_names or top in ("__future__", "tpu_course"), \
                    (path.name, imported)
    assert "from tpu_course" not in (ROOT / "tpu_course" / "setup.py").read_text()


# -------------------------------------------------------------------------- the cell

FIND_SPEC = importlib.util.find_spec  # the real one, before any test replaces it


def _exec_cell(monkeypatch, *, present: bool, status: int = 0, said: str = "") -> dict:
    """Run the cell here: find_spec says whether the course is installed, pip's answer
    is given, finish() only counts its calls."""
    seen: dict = {"commands": [], "finish": 0}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (FIND_SPEC(name, *a) if present
                                          or name != "tpu_course" else None))

    def pip(command):
        seen["commands"].append(command)
        return status, said

    monkeypatch.setattr(subprocess, "getstatusoutput", pip)
    monkeypatch.setattr(setup, "finish", lambda: seen.__setitem__("finish", seen["finish"] + 1))
    exec(compile(notebooks.SETUP_CELL, "setup-cell", "exec"), {"__name__": "__main__"})
    return seen


def test_the_cell_installs_the_course_alone_then_hands_over(monkeypatch):
    monkeypatch.delenv("TPU_COURSE_SPEC", raising=False)
    seen = _exec_cell(monkeypatch, present=False)
    [command] = seen["commands"]
    assert command.startswith(f"{sys.executable} -m pip install -q --no-deps ")
    assert command.endswith(f"'tpu-course @ git+https://github.com/{notebooks.REPOSITORY}'")
    assert seen["finish"] == 1
    monkeypatch.setenv("TPU_COURSE_SPEC", "tpu-course @ git+https://example.org/fork")
    assert _exec_cell(monkeypatch, present=False)["commands"][0].endswith(
        "'tpu-course @ git+https://example.org/fork'")
    # installed already (a clone, the second run): no pip, straight to finish()
    assert _exec_cell(monkeypatch, present=True) == {"commands": [], "finish": 1}


def test_a_course_that_cannot_be_fetched_shows_gits_words_and_the_fixes(monkeypatch):
    """A private, moved or misspelt repository, or no network: pip's and git's own lines,
    then the two fixes; "Run all" stops (SystemExit: no traceback in IPython)."""
    said = ("  error: subprocess-exited-with-error\n  fatal: repository "
            "'https://github.com/nobody/nothing/' not found\n  note: See above for output.")
    with pytest.raises(SystemExit) as stop:
        _exec_cell(monkeypatch, present=False, status=1, said=said)
    shown = str(stop.value.code)
    assert "fatal: repository 'https://github.com/nobody/nothing/' not found" in shown
    assert "Setup failed: pip could not install tpu-course" in shown
    assert "Settings > Internet on" in shown and "TPU_COURSE_SPEC" in shown


def test_the_cell_is_short_folded_collapsed_and_tagged_in_every_notebook():
    """At most 12 lines (issue 39); Colab shows a form (the code folded), JupyterLab a
    collapsed cell, the site and the decks nothing (issue 27): the metadata ``make sync``
    writes, in every notebook."""
    import nbformat

    lines = notebooks.SETUP_CELL.splitlines()
    assert lines[0].startswith("# @title Install the course")
    assert len(lines) <= notebooks.SETUP_CELL_MAX_LINES == 12
    assert max(len(line) for line in lines) <= 88
    long = []
    for folder in ("notebooks", "solutions", "labs"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            first = next(c for c in nbformat.read(path, as_version=4).cells
                         if c.cell_type == "code")
            assert notebooks.has_setup_metadata(first.metadata), path
            if len(first.source.splitlines()) > notebooks.SETUP_CELL_MAX_LINES:
                long.append(f"{folder}/{path.name}")
    assert not long, f"setup cells over 12 lines (run `make sync`): {long}"


@pytest.mark.filterwarnings("ignore:To exit")  # what IPython adds to a SystemExit
def test_the_stops_show_as_messages_in_ipython_not_tracebacks(capsys):
    """IPython prints ``_render_traceback_``'s lines for SetupStop (and SystemExit's
    message for the cell's own stop); both end "Run all"."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    for code, message in (
            ("from tpu_course.setup import SetupStop\n"
             "raise SetupStop('Setup: restart the runtime once')",
             "Setup: restart the runtime once"),
            ("import sys\nsys.exit('Setup failed: pip could not install tpu-course')",
             "Setup failed: pip could not install tpu-course")):
        result = shell.run_cell(code)
        out = capsys.readouterr()
        text = out.out + out.err
        assert message in text and "Traceback" not in text
        assert not result.success  # "Run all" stops here


# ------------------------------------------------------------- one real environment


def _wheel(folder: pathlib.Path, name: str, version: str, requires: tuple[str, ...] = (),
           extras: tuple[str, ...] = (), files: dict[str, str] | None = None) -> None:
    """A minimal pure-Python wheel: package ``name`` with ``__version__``, or ``files``."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
    files = {**(files or {f"{module}/__init__.py": f"__version__ = {version!r}\n"}),
             f"{dist}/METADATA": "\n".join(meta) + "\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)


RUN_CELL = """
import json, sys
try:
    exec(compile(open(sys.argv[1]).read(), "setup-cell", "exec"), {"__name__": "__main__"})
    outcome = {"stopped": None}
except BaseException as err:  # what IPython shows is _render_traceback_, not a traceback
    outcome = {"stopped": type(err).__name__, "shown": err._render_traceback_()
               if hasattr(err, "_render_traceback_") else [str(err)]}
import importlib.metadata as md
outcome["versions"] = {d.metadata["Name"]: d.version for d in md.distributions()
                       if d.metadata["Name"] not in ("pip", "setuptools")}
print(json.dumps(outcome))
"""


def test_an_old_tpu_runtime_end_to_end_with_the_real_pip(tmp_path):
    """The cell and finish() in a real environment: jax 0.6.0 with its libtpu and flax
    0.10.7, no course. The cell installs the course alone, finish() upgrades one set and
    asks for a restart; run again (after the restart) it installs nothing, even with pip
    unable to."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version, libtpu in ((OLD, "0.0.17"), (FLOOR, "0.0.23")):
        _wheel(wheels, "jaxlib", version)
        _wheel(wheels, "jax", version, (f"jaxlib<={version},>={version}",
                                        f'libtpu=={libtpu}; extra == "tpu"'), ("tpu",))
        _wheel(wheels, "libtpu", libtpu)
    _wheel(wheels, "flax", OLD_FLAX, ("jax>=0.4.27",))
    _wheel(wheels, "flax", NEW_FLAX, (f"jax>={FLOOR}",))
    _wheel(wheels, "tpu-course", "0.1.0", (f"jax>={FLOOR}", f"flax>={FLAX_FLOOR}",
                                           'pytest>=8; extra == "dev"'), ("dev",),
           files={"tpu_course/__init__.py": "",
                  "tpu_course/setup.py": (ROOT / "tpu_course" / "setup.py").read_text()})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels),
               PIP_DISABLE_PIP_VERSION_CHECK="1", TPU_COURSE_SPEC="tpu-course")
    venv = tmp_path / "runtime"
    # this Python's pip, linked in: ensurepip's own copy would cost 6 CPU-seconds
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True)
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "pip").symlink_to(pathlib.Path(pip.__file__).parent, target_is_directory=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", f"jax[tpu]=={OLD}",
                    f"flax=={OLD_FLAX}"], check=True, env=env, capture_output=True)
    (tmp_path / "cell.py").write_text(notebooks.SETUP_CELL)
    (tmp_path / "run.py").write_text(RUN_CELL)

    def run_cell() -> dict:
        out = subprocess.run([python, str(tmp_path / "run.py"), str(tmp_path / "cell.py")],
                             capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run_cell()
    assert first["stopped"] == "SetupStop", first
    shown = "\n".join(first["shown"])
    assert f"jax {OLD} is older than the course's floor {FLOOR}" in shown
    moved = sorted(line.strip() for line in shown.splitlines() if " -> " in line)
    assert moved == [f"flax {OLD_FLAX} -> {NEW_FLAX}", f"jax {OLD} -> {FLOOR}",
                     f"jaxlib {OLD} -> {FLOOR}", "libtpu 0.0.17 -> 0.0.23"], shown
    assert first["versions"] == {"jax": FLOOR, "jaxlib": FLOOR, "libtpu": "0.0.23",
                                 "flax": NEW_FLAX, "tpu-course": "0.1.0"}
    (empty := tmp_path / "empty").mkdir()
    env["PIP_FIND_LINKS"] = str(empty)
    again = run_cell()
    assert again == {"stopped": None, "versions": first["versions"]}
