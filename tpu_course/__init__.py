"""tpu-course: the helper package behind the course notebooks and labs.

One module per concept (see the README's package table). Importing the package starts
no JAX backend, so ``tpu_course.runtime.simulate_devices(8)`` still works after
``import tpu_course``; submodules load on first use (``tpu_course.hardware`` ...).
"""

from __future__ import annotations

import importlib
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


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'tpu_course' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_SUBMODULES))
