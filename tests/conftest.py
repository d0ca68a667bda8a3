"""Shared test helpers.

The test process sees one CPU device. Tests that need a simulated mesh run their code in
a fresh interpreter with the device-count flag set before JAX starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest


def run_in_subprocess(code: str, devices: int = 8, timeout_s: float = 300,
                      env: dict[str, str] | None = None) -> Any:
    """Run ``code`` in a new Python with ``devices`` CPU devices; return what it prints as JSON.

    The code must ``print(json.dumps(...))`` as its last line of output.
    """
    full_env = dict(os.environ)
    full_env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    full_env["JAX_PLATFORMS"] = "cpu"
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=timeout_s, env=full_env,
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def fresh_checks_state():
    """Every test starts and ends with no recorded prediction and no last result, so
    ``LAB.predict`` locks and ``checks.reveal`` answers only what the test itself did."""
    from tpu_course.checks import engine

    for state in (engine._PREDICTIONS, engine._LAST):
        state.clear()
    yield
    for state in (engine._PREDICTIONS, engine._LAST):
        state.clear()


@pytest.fixture
def subprocess_runner():
    return run_in_subprocess
