"""tpu-course: the helper package behind the course notebooks and labs.

One module per concept (see the README's package table). Importing the package starts
no JAX backend, so ``tpu_course.runtime.simulate_devices(8)`` still works after
``import tpu_course``; submodules load on first use (``tpu_course.hardware`` ...).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from tpu_course import warnings_policy as _warnings_policy

__version__ = "0.1.0"

# CI (and any process with TPU_COURSE_STRICT_WARNINGS=1, such as the notebook kernels
# nbval starts) turns deprecation and future warnings into errors: see warnings_policy.
_warnings_policy.install_if_requested()

#: The GitHub repository the course lives in (owner/name). The README's "Open in Colab"
#: links and every notebook's setup cell are generated from this one setting
#: (``python -m tools.notebooks sync``).
REPOSITORY = "tpu-course/tpu-course"

def jax_floor() -> str:
    """The oldest jax the course runs on, such as ``"0.7.2"``: the ``jax>=`` bound of
    pyproject.toml's dependencies, the one place it is typed (Colab's own jax: the setup
    cell, ``tools.notebooks.JAX_FLOOR`` and ``tpu_course.preflight`` read it here).

    From the checkout's pyproject.toml where there is one (a clone, an editable install:
    an edit there counts without reinstalling), else from the installed package's
    metadata (``pip install`` on Colab or Kaggle brings no pyproject.toml).
    """
    import importlib.metadata
    import pathlib
    import re

    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        requirements = project.get("dependencies", []) if project.get("name") == "tpu-course" else None
    else:
        requirements = None
    if requirements is None:
        try:
            requirements = importlib.metadata.requires("tpu-course") or []
        except importlib.metadata.PackageNotFoundError:
            requirements = []
    for requirement in requirements:
        found = re.fullmatch(r"jax\s*>=\s*([\d.]+)", requirement.strip())
        if found:
            return found.group(1)
    raise RuntimeError("tpu-course: no `jax>=` requirement found, neither in a pyproject.toml "
                       "next to the package nor in installed metadata; install the course "
                       "(pip install -e . in a clone) so that its requirements are known.")


#: Every submodule, loaded on first use (tests/test_registries.py checks it against the files).
_SUBMODULES = (
    "errors", "warnings_policy", "hardware", "systolic", "roofline", "comms", "plans", "costs", "runtime",
    "data", "hlo", "bench", "transfer", "models", "train", "parallel", "multihost", "parity",
    "pallas_tools", "viz", "tables", "checks", "preflight", "grade", "lm", "textdata",
    "profiling",
)

#: Modules that moved (into a package, or to a name that says what they hold): the old name
#: raises an error naming the new home (it never serves the old name), so a learner's saved
#: notebook says what to write.
MOVED = {
    "train_step": "tpu_course.train.step", "pipelines": "tpu_course.train.pipelines",
    "evaluation": "tpu_course.train.evaluation", "train_config": "tpu_course.train.config",
    "history": "tpu_course.train.history", "checkpoints": "tpu_course.train.checkpoints",
    "train_cli": "tpu_course.train.__main__", "aot": "tpu_course.hlo.aot",
    "hlo_text": "tpu_course.hlo.text", "kernels": "tpu_course.pallas_tools",
}


def _moved_message(name: str) -> str:
    home = MOVED[name]
    package = home.split(".")[1]
    if name == "train_cli":
        how = "run `python -m tpu_course.train` (or call tpu_course.train.fit)"
    elif home.count(".") == 1:  # renamed, not moved into a package
        how = (f"use `from tpu_course import {package}`, then {package}.X (the same names: "
               f"{name}.X is now {package}.X)")
    else:
        part = home.split(".")[2]
        how = (f"use `from tpu_course import {package}`, then {package}.{part}.X (the names "
               f"the chapters use are also {package}.X)")
    return f"tpu_course.{name} moved to {home}: {how}"


class _MovedModules:
    """``import tpu_course.train_step`` and ``from tpu_course import train_step`` raise an
    ImportError naming the new home (a finder consulted after every other one)."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> None:
        package, _, name = fullname.partition(".")
        if package == __name__ and name in MOVED:
            raise ModuleNotFoundError(_moved_message(name))  # no name=: not swallowed
        return None


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in MOVED:
        raise AttributeError(_moved_message(name))
    raise AttributeError(f"module 'tpu_course' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_SUBMODULES))
