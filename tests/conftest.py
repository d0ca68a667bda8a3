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


@pytest.fixture(scope="session")  # session: module fixtures may run their subprocess once
def subprocess_runner():
    return run_in_subprocess


@pytest.fixture(scope="module")
def compiled_once(tmp_path_factory):
    """JAX's persistent compilation cache, in a fresh folder, for one test module.

    A module whose tests build the same program several times (one config's ``fit``
    repeated, interrupted and resumed) compiles it once: the next identical program is
    loaded from the cache, the same executable, so every number it computes is the same.
    The folder is this module's alone (no other process or earlier run can answer from
    it), and JAX's settings are restored when the module ends. Where this JAX has no such
    cache the tests run as they are, compiling each program.
    """
    import jax

    try:
        from jax._src import compilation_cache
    except ImportError:  # pragma: no cover - a JAX without the module: compile each time
        yield
        return
    settings = {"jax_compilation_cache_dir": str(tmp_path_factory.mktemp("xla_cache")),
                "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": 0}
    before = {name: getattr(jax.config, name) for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()  # read the settings again at the next compile
    try:
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()
