"""Runtime description and simulated devices, each in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tpu_course import runtime


def _run(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)


def test_import_does_not_start_jax_and_simulate_works_after_import():
    out = _run("""
        import sys, tpu_course
        from tpu_course import runtime, hardware, data
        assert "jax" not in sys.modules, "importing tpu_course imported jax"
        runtime.simulate_devices(8)
        rt = runtime.describe()
        print(rt.device_count, rt.simulated, rt.platform)
        print(rt.banner())
    """)
    assert out.returncode == 0, out.stderr
    first, banner = out.stdout.strip().splitlines()
    assert first == "8 True cpu"
    assert "8 simulated CPU device(s)" in banner and "not TPU timings" in banner


def test_simulate_after_jax_imported_but_not_started_still_works():
    out = _run("""
        import jax
        from tpu_course import runtime
        runtime.simulate_devices(4)
        print(len(jax.devices()))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4"


def test_simulate_too_late_raises_and_says_restart():
    out = _run("""
        import jax, jax.numpy as jnp
        jnp.ones(3).block_until_ready()
        from tpu_course import runtime
        try:
            runtime.simulate_devices(8)
        except runtime.TooLateError as err:
            print("TooLateError:", err)
    """)
    assert out.returncode == 0, out.stderr
    assert "TooLateError" in out.stdout and "Restart the kernel" in out.stdout
    assert "1 CPU device" in out.stdout


def test_flag_set_after_start_is_reported_by_describe():
    out = _run("""
        import os, jax
        jax.devices()
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        from tpu_course import runtime
        print(runtime.describe().warnings)
    """)
    assert "asks for 8 CPU devices but JAX has 1" in out.stdout


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


def test_doctor_runs_and_reports_simulated_devices():
    out = _run("""
        from tpu_course.__main__ import main
        raise SystemExit(main(["doctor", "--simulate", "8"]))
    """)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "simulated devices: 8 CPU devices" in out.stdout
    assert "versions: jax" in out.stdout and "backend: cpu" in out.stdout


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

    from tpu_course import models, train

    model = models.create("mlp", seed=0)
    tx = optax.adam(1e-3)
    graphdef, state0 = train.init_state(model, tx)
    step = train.make_train_step(graphdef, tx)
    rng = np.random.default_rng(0)
    batch = train.Batch(rng.random((64, 28, 28), np.float32), rng.integers(0, 10, 64).astype(np.int32),
                        np.ones(64, np.float32))
    losses = []
    for donate in ((), (0,)):
        state = jax.tree.map(lambda a: jax.numpy.array(a, copy=True), state0)
        fn = jax.jit(step, donate_argnums=donate)
        for _ in range(3):
            state, metrics = fn(state, batch)
        losses.append(float(metrics["loss"]))
    agree = abs(losses[0] - losses[1]) < 1e-5
    assert agree == runtime.donation_is_safe(), (losses, jax.__version__)
