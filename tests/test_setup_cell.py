"""The first cell of every notebook, run the way Colab and Kaggle run it.

Each case builds a throw-away virtual environment that imitates a hosted runtime and runs
``notebooks.SETUP_CELL`` with that environment's Python. Nothing comes from the network:
small fake wheels of jax, jaxlib, libtpu and the course, served to pip with
``--no-index --find-links``, stand in for the real ones (same names, versions and
dependency pins as the real packages; no code).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from tools import notebooks

# The cell runs in throw-away environments with fake wheels: what it does does not depend
# on the jax the test process runs, so the Colab line does not repeat it.
pytestmark = pytest.mark.stack_independent

FLOOR = notebooks.JAX_FLOOR
OLD = "0.6.0"


def _wheel(folder: pathlib.Path, name: str, version: str, requires: tuple[str, ...] = (),
           extras: tuple[str, ...] = ()) -> None:
    """A minimal pure-Python wheel whose package ``name`` has ``__version__``."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
    files = {
        f"{module}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": "\n".join(meta) + "\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)


#: flax before and after the upgrade the issue saw (0.10.7 -> 0.12.0), and the course's
#: lower bound for it (pyproject.toml's "flax>=...").
OLD_FLAX, NEW_FLAX = "0.10.7", "0.12.0"
FLAX_FLOOR = "0.11.2"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> pathlib.Path:
    """jax and jaxlib at an old version and at the floor, the libtpu each pins, flax old
    and new, the course (which needs jax and flax at their floors, as pyproject.toml)."""
    folder = tmp_path_factory.mktemp("wheels")
    for version, libtpu in ((OLD, "0.0.17"), (FLOOR, "0.0.23")):
        _wheel(folder, "jaxlib", version)
        _wheel(folder, "jax", version, (f"jaxlib<={version},>={version}",
                                        f'libtpu=={libtpu}; extra == "tpu"',
                                        f'jax-cuda12-plugin=={version}; extra == "cuda12"'),
               ("tpu", "cuda12"))
        _wheel(folder, "libtpu", libtpu)
        _wheel(folder, "jax-cuda12-plugin", version)
    _wheel(folder, "flax", OLD_FLAX, ("jax>=0.4.27",))
    _wheel(folder, "flax", NEW_FLAX, (f"jax>={FLOOR}",))
    _wheel(folder, "tpu-course", "0.1.0", (f"jax>={FLOOR}", f"flax>={FLAX_FLOOR}"))
    return folder


def _runtime(tmp_path: pathlib.Path, wheels: pathlib.Path, *packages: str) -> pathlib.Path:
    """A virtual environment holding ``packages`` (from the fake wheels) and nothing else."""
    venv = tmp_path / "runtime"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    if packages:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True,
                       env=_pip_env(wheels), capture_output=True)
    return python


def _pip_env(wheels: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels),
               PIP_DISABLE_PIP_VERSION_CHECK="1", TPU_COURSE_SPEC="tpu-course")
    return env


RUN_CELL = """
import json, sys
cell = open(sys.argv[1]).read()
try:
    exec(compile(cell, "setup-cell", "exec"), {"__name__": "__main__"})
    outcome = {"stopped": None}
except Exception as err:  # what IPython shows is _render_traceback_, not a traceback
    shown = err._render_traceback_() if hasattr(err, "_render_traceback_") else None
    outcome = {"stopped": type(err).__name__, "shown": shown}
import importlib.metadata as md
def version(p):
    try: return md.version(p)
    except md.PackageNotFoundError: return None
outcome["versions"] = {p: version(p) for p in ("jax", "jaxlib", "libtpu", "tpu-course")
                       + (("jax-cuda12-plugin",) if version("jax-cuda12-plugin") else ())}
outcome["flax"] = version("flax")
print(json.dumps(outcome))
"""


def _run_cell(python: pathlib.Path, wheels: pathlib.Path, tmp_path: pathlib.Path,
              env: dict | None = None) -> dict:
    (tmp_path / "cell.py").write_text(notebooks.SETUP_CELL)
    (tmp_path / "run.py").write_text(RUN_CELL)
    out = subprocess.run([str(python), str(tmp_path / "run.py"), str(tmp_path / "cell.py")],
                         capture_output=True, text=True, env=env or _pip_env(wheels),
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_runtime_at_the_floor_gets_the_course_and_nothing_else(tmp_path, wheels):
    python = _runtime(tmp_path, wheels, f"jax=={FLOOR}", f"jaxlib=={FLOOR}")
    first = _run_cell(python, wheels, tmp_path)
    assert first["stopped"] is None
    assert first["versions"] == {"jax": FLOOR, "jaxlib": FLOOR, "libtpu": None,
                                 "tpu-course": "0.1.0"}
    # (c) the course is there now: the cell does nothing, even with pip unable to install
    (wheels_gone := tmp_path / "empty").mkdir()
    again = _run_cell(python, wheels_gone, tmp_path)
    assert again == first


def test_a_tpu_runtime_below_the_floor_upgrades_one_set_and_asks_for_a_restart(tmp_path, wheels):
    # Colab's stack in issue 25: flax 0.10.7 beside an old jax; the course needs a newer
    # flax, so pip moves it too, and the message must say so (not only jax and jaxlib).
    python = _runtime(tmp_path, wheels, f"jax[tpu]=={OLD}", f"flax=={OLD_FLAX}")
    first = _run_cell(python, wheels, tmp_path)
    assert first["stopped"] == "SetupStop" and first["flax"] == NEW_FLAX
    shown = "\n".join(first["shown"])
    assert f"jax {OLD} is older than the course's floor {FLOOR}" in shown
    assert "Restart the runtime once" in shown and "Traceback" not in shown
    # the message names each package that moved (flax and libtpu too), and nothing else
    moved = [line.strip() for line in shown.splitlines() if " -> " in line or "(new)" in line]
    assert sorted(moved) == [f"flax {OLD_FLAX} -> {NEW_FLAX}", f"jax {OLD} -> {FLOOR}",
                             f"jaxlib {OLD} -> {FLOOR}", "libtpu 0.0.17 -> 0.0.23",
                             "tpu-course 0.1.0 (new)"], shown
    # jax, jaxlib and the libtpu jax pins moved together; the course came with them
    assert first["versions"] == {"jax": FLOOR, "jaxlib": FLOOR, "libtpu": "0.0.23",
                                 "tpu-course": "0.1.0"}
    again = _run_cell(python, wheels, tmp_path)  # after the restart: nothing to do
    assert again["stopped"] is None and again["versions"] == first["versions"]


def test_a_gpu_runtime_below_the_floor_upgrades_the_cuda_plugin_with_jax(tmp_path, wheels):
    python = _runtime(tmp_path, wheels, f"jax[cuda12]=={OLD}")
    first = _run_cell(python, wheels, tmp_path)
    assert first["stopped"] == "SetupStop"
    assert first["versions"] == {"jax": FLOOR, "jaxlib": FLOOR, "libtpu": None,
                                 "tpu-course": "0.1.0", "jax-cuda12-plugin": FLOOR}


def test_a_pip_failure_is_a_message_with_the_cause_and_the_fix(tmp_path, wheels):
    python = _runtime(tmp_path, wheels, f"jax=={FLOOR}", f"jaxlib=={FLOOR}")
    (no_course := tmp_path / "no-course").mkdir()
    for whl in wheels.glob("jax*.whl"):
        (no_course / whl.name).write_bytes(whl.read_bytes())
    out = _run_cell(python, no_course, tmp_path)
    assert out["stopped"] == "SetupStop"
    shown = "\n".join(out["shown"])
    assert shown.startswith("Setup failed: pip could not install")
    assert "tpu-course" in shown and "No matching distribution" in shown  # pip's own cause
    assert "Fix:" in shown and "Internet" in shown
    assert out["versions"]["tpu-course"] is None and out["versions"]["jax"] == FLOOR


def test_a_repository_that_cannot_be_read_is_not_blamed_on_the_network(tmp_path, wheels):
    """A private, moved or misspelt repository: git's own line is shown (pip's last lines
    end in "See above for output", with the cause cut off) and the fix names the
    repository, not the internet."""
    import shutil

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    python = _runtime(tmp_path, wheels, f"jax=={FLOOR}", f"jaxlib=={FLOOR}")
    env = {**_pip_env(wheels),
           "TPU_COURSE_SPEC": f"tpu-course @ git+file://localhost{tmp_path}/no-such-repository"}
    out = _run_cell(python, wheels, tmp_path, env=env)
    shown = "\n".join(out["shown"])
    assert out["stopped"] == "SetupStop" and "could not install" in shown
    assert "not appear to be a git repository" in shown or "fatal:" in shown, shown
    assert "repository could not be read" in shown and "TPU_COURSE_SPEC" in shown
    assert "Internet on" not in shown


def test_the_cell_is_folded_collapsed_and_tagged_in_every_notebook():
    """Colab shows a form (the code folded), JupyterLab a collapsed cell, the site and the
    decks nothing (issue 27): the metadata ``make sync`` writes, in every notebook."""
    import nbformat

    assert notebooks.SETUP_CELL.startswith("# @title Install the course")
    assert max(len(line) for line in notebooks.SETUP_CELL.splitlines()) <= 88
    for folder in ("notebooks", "solutions", "labs"):
        for path in sorted((notebooks.ROOT / folder).glob("*.ipynb")):
            first = next(c for c in nbformat.read(path, as_version=4).cells
                         if c.cell_type == "code")
            assert notebooks.has_setup_metadata(first.metadata), path


def test_the_stop_shows_as_a_message_in_ipython_not_a_traceback(capsys):
    """IPython prints ``_render_traceback_``'s lines for the exception, and stops Run all."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell(notebooks.SETUP_CELL.split("def setup_course")[0]
                   + "raise SetupStop('Setup: restart the runtime once')")
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Setup: restart the runtime once" in text and "Traceback" not in text


def test_the_floor_is_one_number_everywhere(monkeypatch):
    """pyproject.toml types it; the setup cell, preflight and CI's Colab line read it."""
    import tpu_course

    root = notebooks.ROOT
    assert f'"jax>={FLOOR}"' in (root / "pyproject.toml").read_text()
    assert f"jax=={FLOOR}\n" in (root / "ci" / "colab.txt").read_text()
    assert f'floor="{FLOOR}"' in notebooks.SETUP_CELL
    # installed without pyproject.toml (pip on Colab): the package's metadata says the same
    monkeypatch.setattr(pathlib.Path, "is_file", lambda self: False)
    assert tpu_course.jax_floor() == FLOOR
