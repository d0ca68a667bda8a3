"""Runtime description and simulated devices.

What must happen before JAX starts runs in a fresh interpreter (two, each shared by the
tests that read it); what needs JAX already started runs in this process, whose JAX has
one CPU device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tpu_course import errors, runtime


def _run(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def doctor_simulates_after_import() -> dict:
    """One fresh Python: the course imported (jax not), then ``tpu-course doctor
    --simulate 8`` through ``main()`` (its ``simulate_devices(8)`` comes after the
    import), then ``describe()``."""
    out = _run("""
        import contextlib, io, json, sys, tpu_course
        from tpu_course import runtime, hardware, data
        found = {"jax imported": "jax" in sys.modules,
                 "count asked before": runtime.requested_cpu_devices()}
        from tpu_course.__main__ import main
        with contextlib.redirect_stdout(io.StringIO()) as said:
            found["doctor exit"] = main(["doctor", "--simulate", "8"])
        found["doctor said"] = said.getvalue()
        rt = runtime.describe()
        found["described"] = [rt.device_count, rt.simulated, rt.platform]
        found["banner"] = rt.banner()
        print(json.dumps(found))
    """)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_does_not_start_jax_and_simulate_works_after_import(
        doctor_simulates_after_import):
    found = doctor_simulates_after_import
    assert found["jax imported"] is False, "importing tpu_course imported jax"
    assert found["count asked before"] is None  # the 8 devices are simulate_devices' own
    assert found["described"] == [8, True, "cpu"]
    banner, host = found["banner"].splitlines()
    assert "8 simulated CPU device(s)" in banner and "not TPU timings" in banner
    assert host.startswith("  host: ") and "jax " in host and max(map(len, (banner, host))) <= 88


@pytest.fixture(scope="module")
def bad_flags_then_simulate() -> dict:
    """One fresh Python: ``simulate_devices`` and ``describe`` refuse XLA_FLAGS that XLA
    would die on (each leaves the flags as they were; ``describe`` imports jax and starts
    nothing); then, with the flags unset, jax imported but not started,
    ``simulate_devices(4)`` still works."""
    out = _run(f"""
        import json, os, sys
        from tpu_course import runtime
        found = {{"simulate": [], "describe": []}}
        for flags in ("{FLAG}=abc", "{FLAG}=-4", "--not_a_flag=1", "{FLAG}=100000"):
            os.environ["XLA_FLAGS"] = flags
            try:
                runtime.simulate_devices(8)
                found["simulate"].append("ACCEPTED " + flags)
            except runtime.XlaFlagsError as err:
                found["simulate"].append("REFUSED " + " ".join(str(err).split()))
            assert os.environ["XLA_FLAGS"] == flags  # left as it was
        for flags in ("{FLAG}=abc", "{FLAG}=100000",  # 100000: memory without end
                      "{FLAG}=2 --not_a_flag=1"):  # a good count beside a refused flag
            os.environ["XLA_FLAGS"] = flags
            try:
                runtime.describe()
                found["describe"].append("ACCEPTED " + flags)
            except runtime.XlaFlagsError as err:
                found["describe"].append("REFUSED " + str(err))
        del os.environ["XLA_FLAGS"]
        import jax
        found["started"] = runtime._backends_started()
        runtime.simulate_devices(4)
        found["devices"] = len(jax.devices())
        print(json.dumps(found))
    """)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_simulate_after_jax_imported_but_not_started_still_works(bad_flags_then_simulate):
    assert bad_flags_then_simulate["started"] is False  # jax imported, no backend yet
    assert bad_flags_then_simulate["devices"] == 4


def test_simulate_too_late_raises_and_says_restart():
    """In this process, whose JAX has started (with one CPU device)."""
    import jax
    import jax.numpy as jnp

    jnp.ones(3).block_until_ready()
    have = len(jax.devices("cpu"))
    flags = os.environ.get("XLA_FLAGS")
    with pytest.raises(runtime.TooLateError) as info:
        runtime.simulate_devices(8 if have != 8 else 4)
    assert "Restart the kernel" in str(info.value)
    assert f"{have} CPU device" in str(info.value)
    assert os.environ.get("XLA_FLAGS") == flags  # left as it was


def test_flag_set_after_start_is_reported_by_describe(monkeypatch):
    """In this process: its JAX has started; the flag is set afterwards."""
    import jax

    jax.devices()
    have = len(jax.devices("cpu"))
    n = 8 if have != 8 else 4
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count={n}")
    assert f"asks for {n} CPU devices but JAX has {have}" in " ".join(
        runtime.describe().warnings)


def test_simulate_rejects_bad_counts():
    import pytest

    for bad in (0, -2, 2.5, True, "8"):
        with pytest.raises(ValueError, match="positive integer"):
            runtime.simulate_devices(bad)  # type: ignore[arg-type]


def test_banner_for_an_accelerator_names_the_chip():
    rt = runtime.Runtime(platform="tpu", device_kind="TPU v6 lite", device_count=8,
                         process_count=1, generation="v6e", simulated=True, host="kaggle",
                         cpu_device_count=8, jax_version="0.12.0")
    text = rt.banner()
    assert "8 x TPU v6 lite (TPU v6e (Trillium))" in text and "simulated CPU devices" in text
    assert rt.chip.mxu_size == 256


def test_doctor_runs_and_reports_simulated_devices(doctor_simulates_after_import):
    found = doctor_simulates_after_import
    assert found["doctor exit"] == 0, found["doctor said"]
    said = found["doctor said"]
    assert "simulated devices: 8 CPU devices" in said
    assert "versions: jax" in said and "backend: cpu" in said


def test_doctor_flags_a_tpu_host_where_jax_sees_only_cpu(monkeypatch):
    from tpu_course import __main__ as doctor

    monkeypatch.setattr(doctor, "_accelerator_hints", lambda: ["tpu"])
    rt = runtime.Runtime("cpu", "cpu", 1, 1, None, False, "colab")
    lines, problems = doctor.doctor_report(rt)
    assert any("JAX sees only a CPU" in p for p in problems)


def test_donation_probe_matches_a_train_step_on_this_jax():
    """Where the probe says donation is safe, a real train step agrees donated or not."""
    import jax
    import numpy as np
    import optax
    from flax import nnx

    from tpu_course import models, train

    # created in one compiled program: the same parameters as eager creation, whose
    # initialisers compile one by one
    model = nnx.jit(lambda: models.create("mlp", seed=0))()
    tx = optax.adam(1e-3)
    graphdef, state0 = train.init_state(model, tx)
    step = train.make_train_step(graphdef, tx)
    rng = np.random.default_rng(0)
    batch = train.Batch(rng.random((64, 28, 28), np.float32),
                        rng.integers(0, 10, 64).astype(np.int32), np.ones(64, np.float32))
    losses = []
    for donate in ((), (0,)):
        state = jax.tree.map(lambda a: jax.numpy.array(a, copy=True), state0)
        fn = jax.jit(step, donate_argnums=donate)
        for _ in range(3):
            state, metrics = fn(state, batch)
        losses.append(float(metrics["loss"]))
    agree = abs(losses[0] - losses[1]) < 1e-5
    assert agree == runtime.donation_is_safe(), (losses, jax.__version__)


# --------------------------------------------------------------------------------------
# XLA_FLAGS that XLA would die on are refused by name, before JAX starts (issue 25 §3)
# --------------------------------------------------------------------------------------

FLAG = "--xla_force_host_platform_device_count"


def test_the_device_count_flag_is_checked_without_starting_xla():
    import pytest

    assert runtime.check_device_count_flag("") is None
    assert runtime.check_device_count_flag(f"--xla_dump_to=/tmp {FLAG}=8") == 8
    assert runtime.check_device_count_flag(f"{FLAG}=2 {FLAG}=+4") == 4  # XLA keeps the last
    for bad in ("abc", "-4", "0", "", "2.5", "8x"):
        flags = f"{FLAG}={bad}"
        with pytest.raises(runtime.XlaFlagsError) as info:
            runtime.check_device_count_flag(flags)
        assert f"XLA_FLAGS holds {flags}:" in str(info.value)
        assert "whole number of at least 1" in info.value.problem and info.value.fix
    with pytest.raises(runtime.XlaFlagsError, match=f"holds {FLAG}:"):  # no value at all
        runtime.check_device_count_flag(FLAG)
    # a bad count is replaced, not kept beside the new one, in a child's environment
    assert runtime._with_device_count(f"--a=1 {FLAG}=abc {FLAG}=-4", 8) == f"--a=1 {FLAG}=8"


def test_simulate_devices_and_describe_refuse_a_bad_flag_before_xla_kills_the_process(
        bad_flags_then_simulate):
    lines = bad_flags_then_simulate["simulate"] + bad_flags_then_simulate["describe"][:2]
    assert len(lines) == 6 and all("REFUSED" in line for line in lines), lines
    assert f"XLA_FLAGS holds {FLAG}=abc: the CPU device count" in lines[0]
    assert f"XLA_FLAGS holds {FLAG}=-4" in lines[1]
    assert "Unknown flag in XLA_FLAGS: --not_a_flag=1" in lines[2]
    assert "Flags:" not in lines[2]  # XLA's reason, not its 90 lines of flag help
    assert f"XLA_FLAGS holds {FLAG}=100000: 100,000 simulated CPU devices" in lines[3]
    assert f"XLA_FLAGS holds {FLAG}=abc" in lines[4]
    assert "more than the course's limit of 1,024" in lines[5]


def test_describe_refuses_a_bad_xla_flag_before_xla_kills_the_process(
        bad_flags_then_simulate):
    """A good device count beside a flag XLA does not know: still refused, by name."""
    said = bad_flags_then_simulate["describe"][2]
    assert said.startswith("REFUSED XLA_FLAGS="), said
    assert "Unknown flag in XLA_FLAGS: --not_a_flag=1" in said


def test_an_absurd_device_count_is_refused_with_the_limit_and_what_it_would_need():
    """XLA would grow its memory for hours on 100,000 devices: refused before it starts."""
    with pytest.raises(runtime.XlaFlagsError) as info:
        runtime.check_device_count_flag(f"{FLAG}=100000")
    problem = info.value.problem
    assert problem.startswith(f"XLA_FLAGS holds {FLAG}=100000: 100,000 simulated CPU devices is "
                              "more than the course's limit of 1,024: XLA would need about 30.2 "
                              "GB of host memory and 6.3 hours just to start them")
    assert "one buffer per device" in problem and info.value.fix.startswith("Ask for at most 1,024")
    assert runtime.check_device_count_flag(f"{FLAG}={runtime.MAX_SIMULATED_DEVICES}") == 1024
    assert runtime.check_device_count_flag(f"{FLAG}=100000 {FLAG}=8") == 8  # XLA keeps the last
    with pytest.raises(runtime.XlaFlagsError, match=r"simulate_devices\(n=2,000\): 2,000 "
                       r"simulated CPU devices is more than the course's limit of 1,024"):
        runtime.simulate_devices(2000)  # refused before anything else: the environment stays
    with pytest.raises(errors.CourseValueError, match=r"devices=2000: expected an integer >= 1 "
                       r"and <= 1024"):
        runtime.cpu_subprocess_env(2000)
    with pytest.raises(errors.CourseTypeError,
                       match=r"keep_xla_flags='no': expected True or False"):
        runtime.cpu_subprocess_env(8, keep_xla_flags="no")


# What XLA prints when it refuses a flag value (jaxlib 0.12, trimmed): the reason, then a
# fatal check, then pages of flag help.
XLA_ABC = f"""\
E1201 18:16:44.225404    1054 command_line_flags.cc:63] Couldn't interpret value abc for flag xla_force_host_platform_device_count.
F1201 18:16:44.225448    1054 parse_flags_from_env.cc:220] Check failed: tsl::Flags::Parse(&env_argv->argc, env_argv->argv.data(), flag_list) Flag parsing failed.
usage: {FLAG}=abc
Flags:
\t--xla_dump_hlo_as_dot=false      \tbool\tDumps HLO modules rendered as dot files to the directory specified by --xla_dump_to.
Available fusion types: dot, eltwise, and reduce.
"""


def test_xlas_complaint_is_the_line_that_names_the_flag():
    assert runtime.xla_flag_complaint(XLA_ABC) == [
        "Couldn't interpret value abc for flag xla_force_host_platform_device_count."]
    unknown = "F1201 12:00:00.1 7 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --x=1"
    assert runtime.xla_flag_complaint(unknown) == ["Unknown flag in XLA_FLAGS: --x=1"]


def test_the_profilers_known_noise_is_dropped_and_nothing_else():
    """The lines chapter 4's profiler cell printed on Colab's stack (jax 0.7.2, libtpu
    0.0.21), as recorded there: each is known noise; an XLA error is not."""
    noise = [
        "WARNING: Logging before InitGoogle() is written to STDERR",
        "E0000 00:00:1796149253.803503    6761 cloud_tpu_profiler_impl.cc:114] UNIMPLEMENTED: "
        "No factory for ACTIVITY_TRACING on ba16c7433",
        "=== Source Location Trace: === ",
        "perftools/accelerators/32a57/32a57ilez/profiler_factory.cc:37",
        "E1201 18:20:53.808768    6761 python_hooks.cc:416] Can't import "
        "tensorflow.python.profiler.trace",
    ]
    for line in noise:
        assert runtime._LIBTPU_NOISE.search(line), line
    for line in ("F1201 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --x=1",
                 "RuntimeError: Unable to initialize backend 'cpu'",
                 "E1201 python_hooks.cc:416] Can't import numpy"):
        assert not runtime._LIBTPU_NOISE.search(line), line
