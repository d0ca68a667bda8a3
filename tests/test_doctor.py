"""The doctor never raises, and nothing XLA says on its way down is swallowed.

Each case meets a broken environment as a learner would on a machine without a TPU or
GPU. JAX starts in fresh processes only: the doctor's own probe (``probe-backend``), or
a small script. One case runs ``python -m tpu_course doctor`` itself; the others call its
``main()`` here with the broken variables set (the doctor starts no JAX of its own before
its probe answers), and share the one probe they all make with ``JAX_PLATFORMS`` and
``XLA_FLAGS`` unset (what is available here).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tpu_course import __main__ as cli

pytestmark = pytest.mark.slow  # most cases start JAX once or twice in a fresh process


def _run(args: list[str], **env: str | None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    full.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run([sys.executable, *args], env=full, capture_output=True, text=True,
                          timeout=300)


def _doctor(**env: str | None) -> subprocess.CompletedProcess:
    return _run(["-m", "tpu_course", "doctor"], **env)


def _no_traceback(out: str) -> None:
    assert "Traceback" not in out, out


@pytest.fixture(scope="module")
def clean_probe() -> dict:
    """The probe with JAX_PLATFORMS and XLA_FLAGS unset, run once for this module: what
    the doctor reports as available after a backend that did not start."""
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    return cli.probe_backend(clean)


@pytest.fixture
def doctor_here(monkeypatch, capfd, clean_probe):
    """``tpu-course doctor ARGS`` through ``main()`` in this process, with ``env`` in place
    of JAX_PLATFORMS and XLA_FLAGS: (exit status, stdout, stderr), the streams read from
    the file descriptors. Its probe of the broken environment runs as it would; its probe
    with both variables unset is :func:`clean_probe`'s."""
    real_probe = cli.probe_backend
    asked_clean = []

    def probe(env: dict[str, str] | None = None, timeout_s: float = 180) -> dict:
        if env is not None and "JAX_PLATFORMS" not in env and "XLA_FLAGS" not in env:
            asked_clean.append(env)
            return dict(clean_probe)
        return real_probe(env, timeout_s)

    monkeypatch.setattr(cli, "probe_backend", probe)

    def run(*args: str, **env: str) -> tuple[int, str, str]:
        for name in ("JAX_PLATFORMS", "XLA_FLAGS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        capfd.readouterr()
        try:
            code = cli.main(["doctor", *args])
        except SystemExit as stop:  # argparse's usage error
            code = stop.code
        out, err = capfd.readouterr()
        _no_traceback(out + err)
        return code, out, err

    run.asked_clean = asked_clean
    return run


@pytest.mark.parametrize("platform, fix", [
    ("tpu", "JAX_PLATFORMS asks for a TPU, but none could be started here"),
    ("cuda", "JAX_PLATFORMS asks for a GPU, but none could be started here"),
    ("bogus", "JAX_PLATFORMS='bogus' names a platform JAX does not know"),
])
def test_doctor_reports_a_platform_that_cannot_start(doctor_here, platform, fix):
    if platform == "tpu" and os.path.exists("/dev/accel0"):
        pytest.skip("this machine has a TPU")
    if platform == "cuda" and os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has an NVIDIA GPU")
    code, out, _ = doctor_here(JAX_PLATFORMS=platform)
    assert code == 1
    assert f"JAX_PLATFORMS: '{platform}'" in out  # what was asked for
    assert "backend: did not start:" in out
    assert "available: with JAX_PLATFORMS and XLA_FLAGS unset, JAX starts cpu" in out
    assert fix in out and "nset JAX_PLATFORMS" in out  # the fix
    assert len(doctor_here.asked_clean) == 1  # what is available: asked once


def test_doctor_reports_an_xla_flag_that_xla_refuses(doctor_here):
    code, out, _ = doctor_here(XLA_FLAGS="--not_a_flag=1")
    assert code == 1
    assert "XLA_FLAGS: '--not_a_flag=1'" in out
    assert "XLA refuses XLA_FLAGS (Unknown flag in XLA_FLAGS: --not_a_flag=1)" in out
    assert "remove that flag or unset XLA_FLAGS" in out


def test_doctor_is_ok_on_a_plain_cpu():
    """The command line itself, in a fresh process, as a learner types it."""
    proc = _doctor(JAX_PLATFORMS="cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "status: OK" in proc.stdout


def test_the_backend_probe_is_a_command_of_the_package(capsys, clean_probe):
    """``probe_backend`` runs ``python -m tpu_course probe-backend`` (a function of
    ``tpu_course.__main__``, no code in a string): one JSON line, here and in its process."""
    assert cli.main([cli.PROBE_COMMAND]) == 0
    here = json.loads(capsys.readouterr().out.strip())
    assert here["ok"] and here["platform"] == "cpu"
    there = clean_probe  # cli.probe_backend in its own process (this module's, shared)
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


@pytest.mark.parametrize("value", ["abc", "-4"])
def test_doctor_names_a_device_count_xla_cannot_read(doctor_here, value):
    flags = f"--xla_force_host_platform_device_count={value}"
    code, out, err = doctor_here(XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    assert code == 1
    assert f"XLA_FLAGS holds {flags}: the CPU device count must be a whole number" in out
    assert "Flags:" not in out + err  # not XLA's flag help
    assert "vector::reserve" not in out + err


def test_doctor_quotes_the_line_that_names_a_bad_flag_value(doctor_here):
    """XLA follows its reason with 90 lines of flag help; the doctor quotes the reason."""
    code, out, _ = doctor_here(XLA_FLAGS="--xla_cpu_use_thunk_runtime=maybe",
                               JAX_PLATFORMS="cpu")
    assert code == 1
    assert ("XLA refuses XLA_FLAGS (Couldn't interpret value maybe for flag "
            "xla_cpu_use_thunk_runtime.)") in out, out


@pytest.mark.parametrize("n", ["0", "-3", "eight"])
def test_doctor_simulate_needs_a_positive_count(doctor_here, n):
    code, _, err = doctor_here("--simulate", n, JAX_PLATFORMS="cpu")
    assert code == 2  # a usage error, before anything starts
    assert f"--simulate: '{n}' is not a number of CPU devices" in err
    assert "e.g. --simulate 8" in err
