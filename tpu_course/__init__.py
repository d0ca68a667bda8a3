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
    cell's :func:`tpu_course.setup.finish`, ``tools.notebooks.JAX_FLOOR`` and
    ``tpu_course.preflight`` read it here).

    From the checkout's pyproject.toml where there is one (a clone, an editable install:
    an edit there counts without reinstalling), else from the installed package's
    metadata (``pip install`` on Colab or Kaggle brings no pyproject.toml).
    """
    from tpu_course import setup

    return setup.floor("jax")


#: Every submodule, loaded on first use (tests/test_registries.py checks it against the files).
_SUBMODULES = (
    "errors", "warnings_policy", "hardware", "systolic", "roofline", "comms", "plans", "costs", "runtime",
    "data", "hlo", "bench", "transfer", "models", "train", "parallel", "multihost", "parity",
    "pallas_tools", "viz", "tables", "checks", "preflight", "grade", "room", "lm", "textdata",
    "profiling", "setup",
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'tpu_course' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_SUBMODULES))
