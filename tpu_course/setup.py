"""The rest of every notebook's setup cell: ``tpu_course.setup.finish()``.

The setup cell (the first code cell of every notebook, lab and solution, written by
``python -m tools.notebooks sync``) installs the course where it is missing (Colab,
Kaggle: ``pip install --no-deps`` of the course alone, so nothing else moves yet) and
then calls :func:`finish`, which brings the runtime up to what the course needs:

* every requirement of the course (pyproject.toml's ``dependencies``, each with its
  version floor) that is installed at or above its floor: nothing happens, no pip, and no
  JAX started (a clone, Colab's own stack, the cell's second run);
* jax below its floor (an older Colab or Kaggle image): jax, jaxlib and the runtime's
  plugin (libtpu: ``jax[tpu]``; the CUDA plugin: ``jax[cuda12]``) are installed together
  at the floor's tested versions, with whatever else the course needs, and "Run all"
  stops asking for one restart and naming every package that pip moved (flax and libtpu
  move too, not only jax);
* something else missing or below its floor, jax fine: pip installs it, the runtime's own
  jax, jaxlib and libtpu pinned as they are (no jax at all: pip brings the newest); if pip
  upgraded a package this process had already imported, "Run all" stops for a restart;
* pip fails: pip's own error lines (not only its last lines, which end in "See above")
  and the fix for that cause (no network: Kaggle's Internet switch; anything else); no
  traceback.

The stops are :class:`SetupStop`, which IPython shows as its message. This module
imports only the standard library: it runs before the course's dependencies are there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pathlib
import re
import shutil
import subprocess
import sys
from typing import NamedTuple

#: A requirement as the course writes them: a name, optional extras, optional ``>=`` floor.
REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?"
                         r"\s*(?:>=\s*(?P<floor>\d+(?:\.\d+)*))?")
#: What pip or git say when the machine has no network (Kaggle's default: Internet off).
NETWORK = re.compile(r"name resolution|Failed to establish a new connection|unreachable"
                     r"|Could not resolve host|timed out|No route to host")
#: What to do to restart, where the learner is.
RESTART = ("Restart the runtime once (Colab: Runtime > Restart session; Jupyter: Kernel > "
           "Restart) and run all again: the new versions load only in a fresh process, "
           "and this cell will then install nothing.")


class SetupStop(Exception):
    """Ends "Run all" with this message instead of a traceback."""

    def _render_traceback_(self) -> list[str]:  # what IPython shows for the exception
        return [str(self)]


class Requirement(NamedTuple):
    name: str  # normalised: lower case, runs of - _ . as one -
    floor: str | None  # the ``>=`` version, if any
    text: str  # as written, for pip


def normalise(name: str) -> str:
    """A distribution name as pip compares them: ``Orbax_Checkpoint`` -> ``orbax-checkpoint``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def version_tuple(text: str) -> tuple[int, ...]:
    """The first three numbers of a version: ``"0.0.21.1"`` -> ``(0, 0, 21)``."""
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def requirements() -> dict[str, Requirement]:
    """The course's requirements by normalised name (extras' requirements left out).

    From the checkout's pyproject.toml where there is one (a clone, an editable install:
    an edit there counts without reinstalling), else from the installed package's
    metadata (``pip install`` on Colab or Kaggle brings no pyproject.toml).
    """
    texts = None
    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        if project.get("name") == "tpu-course":
            texts = project.get("dependencies", [])
    if texts is None:
        try:
            texts = importlib.metadata.requires("tpu-course") or []
        except importlib.metadata.PackageNotFoundError:
            texts = []
    found = {}
    for text in texts:
        requirement, _, marker = text.partition(";")
        if "extra" in marker:
            continue
        match = REQUIREMENT.fullmatch(requirement.strip())
        if match is None or marker.strip():
            raise RuntimeError(f"tpu-course: the requirement {text!r} is not of the form "
                               "name>=version, the only one the setup cell reads")
        name = normalise(match.group("name"))
        found[name] = Requirement(name, match.group("floor"), requirement.strip())
    return found


def floor(package: str) -> str:
    """The oldest version of ``package`` the course runs on (its ``>=`` requirement)."""
    requirement = requirements().get(normalise(package))
    if requirement is None or requirement.floor is None:
        raise RuntimeError(f"tpu-course: no `{package}>=` requirement found, neither in a "
                           "pyproject.toml next to the package nor in installed metadata; "
                           "install the course (pip install -e . in a clone) so that its "
                           "requirements are known.")
    return requirement.floor


def installed() -> dict[str, str]:
    """Every installed distribution: normalised name -> version (the first one found)."""
    names: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        names.setdefault(normalise(dist.metadata["Name"] or "?"), dist.version)
    return names


def run_pip(args: list[str]) -> tuple[int, str]:
    """``pip install -q args`` in this Python: the exit status and everything pip said."""
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args],
                         capture_output=True, text=True)
    return pip.returncode, pip.stderr + "\n" + pip.stdout


def plugin(have: dict[str, str]) -> str:
    """The extra that brings this runtime's accelerator plugin with jax: ``[tpu]``
    (libtpu is installed), ``[cuda12]`` (the CUDA plugin, or an NVIDIA driver), or none."""
    if any(name.startswith("libtpu") for name in have):
        return "[tpu]"
    if "jax-cuda12-plugin" in have or shutil.which("nvidia-smi"):
        return "[cuda12]"
    return ""


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What pip moved: ``"jax 0.6.0 -> 0.7.2"`` or ``"optax 0.2.5 (new)"``, by name."""
    return [f"{name} {before[name]} -> {version}" if name in before else f"{name} {version} (new)"
            for name, version in sorted(after.items()) if before.get(name) != version]


def pip_failure(wanted: list[str], output: str) -> SetupStop:
    """pip's own error lines (pip's last lines end in "See above": the cause is earlier)
    and the fix for that cause."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    causes = [line for line in lines
              if re.match(r"(error|fatal)\b", line, re.I) and "See above" not in line]
    if any(NETWORK.search(line) for line in lines):
        fix = "switch the runtime's internet on (Kaggle: Settings > Internet on)"
    else:
        fix = ("read pip's error above; without a network it looks like this too "
               "(Kaggle: Settings > Internet on)")
    shown = "\n  ".join(list(dict.fromkeys(causes or lines[-6:]))[:10])
    return SetupStop(f"Setup failed: pip could not install {' '.join(wanted)}:\n  {shown}\n"
                     f"Fix: {fix}, then run this cell again.")


def _loaded(names: list[str]) -> list[str]:
    """Those of the distributions ``names`` whose modules this process has imported."""
    if not names:
        return []
    modules = importlib.metadata.packages_distributions()
    return sorted({normalise(dist) for module, dists in modules.items()
                   if module in sys.modules for dist in dists} & set(names))


def finish() -> None:
    """Bring this runtime up to the course's requirements; see the module docstring.

    Returns quietly when nothing was missing or pip only added what was; raises
    :class:`SetupStop` when a restart is needed or pip failed.
    """
    required = requirements()
    have = installed()
    jax_floor = floor("jax")
    jax_now = have.get("jax")
    upgrade = jax_now is not None and version_tuple(jax_now) < version_tuple(jax_floor)
    if upgrade:  # one tested set: jax, jaxlib and the runtime's plugin together
        wanted = [f"jax{plugin(have)}=={jax_floor}", f"jaxlib=={jax_floor}",
                  *(r.text for r in required.values() if r.name != "jax")]
    else:
        missing = [r.text for r in required.values() if r.name not in have
                   or (r.floor and version_tuple(have[r.name]) < version_tuple(r.floor))]
        if not missing:
            return
        # the runtime's own jax stays: its jaxlib and libtpu were built for it
        wanted = [f"{p}=={have[p]}" for p in ("jax", "jaxlib", "libtpu") if p in have]
        wanted += missing
    status, output = run_pip(wanted)
    if status != 0:
        raise pip_failure(wanted, output)
    importlib.invalidate_caches()
    moved = changes(have, installed())
    if upgrade:
        raise SetupStop(f"Setup: this runtime's jax {jax_now} is older than the course's "
                        f"floor {jax_floor}, so pip installed a tested set together:\n  "
                        + "\n  ".join(moved) + "\n" + RESTART)
    stale = _loaded([line.split()[0] for line in moved if " -> " in line])
    if stale:
        raise SetupStop("Setup: pip upgraded packages this process had already imported ("
                        + ", ".join(stale) + "):\n  " + "\n  ".join(moved) + "\n" + RESTART)
    print("Setup: installed for the course:", ", ".join(moved) or "nothing new")
