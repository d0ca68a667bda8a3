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

#: Every submodule, loaded on first use (tests/test_registries.py checks it against the files).
_SUBMODULES = (
    "errors", "warnings_policy", "hardware", "systolic", "roofline", "comms", "plans", "costs", "runtime",
    "data", "aot", "hlo_text", "hlo", "bench", "transfer", "models", "train_step", "pipelines",
    "evaluation", "train_config", "history", "checkpoints", "train", "train_cli", "parallel",
    "multihost", "parity", "kernels", "viz", "checks", "preflight", "grade",
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'tpu_course' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_SUBMODULES))
