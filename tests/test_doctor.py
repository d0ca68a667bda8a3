"""The doctor never raises, and nothing XLA says on its way down is swallowed.

Each case runs ``python -m tpu_course doctor`` (or a small script) in a fresh process with
a broken environment, as a learner would meet it on a machine without a TPU or GPU.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each case starts JAX two or three times


def _run(args: list[str], **env: str | None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    full.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run([sys.executable, *args], env=full, capture_output=True, text=True,
                          timeout=300)


def _doctor(**env: str | None) -> subprocess.CompletedProcess:
    return _run(["-m", "tpu_course", "doctor"], **env)


def _no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("platform, fix", [
    ("tpu", "JAX_PLATFORMS asks for a TPU, but none could be started here"),
    ("cuda", "JAX_PLATFORMS asks for a GPU, but none could be started here"),
    ("bogus", "JAX_PLATFORMS='bogus' names a platform JAX does not know"),
])
def test_doctor_reports_a_platform_that_cannot_start(platform, fix):
    if platform == "tpu" and os.path.exists("/dev/accel0"):
        pytest.skip("this machine has a TPU")
    if platform == "cuda" and os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has an NVIDIA GPU")
    proc = _doctor(JAX_PLATFORMS=platform)
    _no_traceback(proc)
    assert proc.returncode == 1
    out = proc.stdout
    assert f"JAX_PLATFORMS: '{platform}'" in out  # what was asked for
    assert "backend: did not start:" in out
    assert "available: with JAX_PLATFORMS and XLA_FLAGS unset, JAX starts cpu" in out
    assert fix in out and "nset JAX_PLATFORMS" in out  # the fix


def test_doctor_reports_an_xla_flag_that_xla_refuses():
    proc = _doctor(XLA_FLAGS="--not_a_flag=1")
    _no_traceback(proc)
    assert proc.returncode == 1
    assert "XLA_FLAGS: '--not_a_flag=1'" in proc.stdout
    assert "XLA refuses XLA_FLAGS (Unknown flag in XLA_FLAGS: --not_a_flag=1)" in proc.stdout
    assert "remove that flag or unset XLA_FLAGS" in proc.stdout


def test_doctor_is_ok_on_a_plain_cpu():
    proc = _doctor(JAX_PLATFORMS="cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "status: OK" in proc.stdout


def test_the_backend_probe_is_a_command_of_the_package(capsys):
    """``probe_backend`` runs ``python -m tpu_course probe-backend`` (a function of
    ``tpu_course.__main__``, no code in a string): one JSON line, here and in its process."""
    import json

    from tpu_course import __main__ as cli

    assert cli.main([cli.PROBE_COMMAND]) == 0
    here = json.loads(capsys.readouterr().out.strip())
    assert here["ok"] and here["platform"] == "cpu"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    there = cli.probe_backend({**env, "JAX_PLATFORMS": "cpu"})
    assert there["ok"] and there["platform"] == "cpu" and there["returncode"] == 0
    assert {k: there[k] for k in here} == {**here, "count": there["count"]}


QUIET = """
import sys, jax
from tpu_course import runtime
with runtime.quiet_libtpu():
    print("a line the learner must see", file=sys.stderr, flush=True)
    import os; os.write(2, b"Failed to find host bounds for accelerator type: noise\\n")
    jax.devices()
print("survived")
"""


def test_quiet_libtpu_lets_xla_fatal_errors_through():
    """The symptom: a notebook kernel died with nothing shown. Now XLA's reason shows,
    and so does everything that was held back (the process is dying)."""
    proc = _run(["-c", QUIET], XLA_FLAGS="--not_a_flag=1")
    assert proc.returncode != 0
    assert "survived" not in proc.stdout
    assert "Unknown flag in XLA_FLAGS: --not_a_flag=1" in proc.stderr
    assert "a line the learner must see" in proc.stderr
    assert "Failed to find host bounds" in proc.stderr  # dying: nothing is dropped


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="without libtpu nothing is captured (there is no noise to drop)")
def test_quiet_libtpu_drops_only_known_noise_on_a_clean_exit():
    proc = _run(["-c", QUIET])
    assert proc.returncode == 0, proc.stderr
    assert "survived" in proc.stdout
    assert "a line the learner must see" in proc.stderr
    assert "Failed to find host bounds" not in proc.stderr
    assert "unexpected worker hostname" not in proc.stderr


def test_describe_refuses_a_bad_xla_flag_before_xla_kills_the_process():
    code = ("from tpu_course import runtime\n"
            "try:\n    runtime.describe()\n"
            "except runtime.XlaFlagsError as err:\n    print('REFUSED', err)\n")
    proc = _run(["-c", code], XLA_FLAGS="--xla_force_host_platform_device_count=2 --not_a_flag=1")
    assert proc.returncode == 0, proc.stderr
    assert "REFUSED XLA_FLAGS=" in proc.stdout
    assert "Unknown flag in XLA_FLAGS: --not_a_flag=1" in proc.stdout


@pytest.mark.parametrize("value", ["abc", "-4"])
def test_doctor_names_a_device_count_xla_cannot_read(value):
    flags = f"--xla_force_host_platform_device_count={value}"
    proc = _doctor(XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    _no_traceback(proc)
    assert proc.returncode == 1
    assert f"XLA_FLAGS holds {flags}: the CPU device count must be a whole number" in proc.stdout
    assert "Flags:" not in proc.stdout + proc.stderr  # not XLA's flag help
    assert "vector::reserve" not in proc.stdout + proc.stderr


def test_doctor_quotes_the_line_that_names_a_bad_flag_value():
    """XLA follows its reason with 90 lines of flag help; the doctor quotes the reason."""
    proc = _doctor(XLA_FLAGS="--xla_cpu_use_thunk_runtime=maybe", JAX_PLATFORMS="cpu")
    _no_traceback(proc)
    assert proc.returncode == 1
    assert ("XLA refuses XLA_FLAGS (Couldn't interpret value maybe for flag "
            "xla_cpu_use_thunk_runtime.)") in proc.stdout, proc.stdout


@pytest.mark.parametrize("n", ["0", "-3", "eight"])
def test_doctor_simulate_needs_a_positive_count(n):
    proc = _run(["-m", "tpu_course", "doctor", "--simulate", n], JAX_PLATFORMS="cpu")
    _no_traceback(proc)
    assert proc.returncode == 2  # a usage error, before anything starts
    assert f"--simulate: '{n}' is not a number of CPU devices" in proc.stderr
    assert "e.g. --simulate 8" in proc.stderr
