"""``python -m tpu_course doctor`` (or ``tpu-course doctor``): is this runtime ready?

Prints the versions that matter, what JAX sees, the chip's row in the hardware table,
whether devices are simulated, and what to do when something is off.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

from tpu_course import hardware, runtime


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _accelerator_hints() -> list[str]:
    """Signs that an accelerator exists although JAX may not see it."""
    hints = []
    if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0") or "TPU_NAME" in os.environ \
            or os.environ.get("COLAB_TPU_ADDR"):
        hints.append("tpu")
    if os.path.exists("/dev/nvidia0") or os.environ.get("COLAB_GPU"):
        hints.append("gpu")
    return hints


def doctor_report(rt: runtime.Runtime | None = None) -> tuple[list[str], list[str]]:
    """The doctor's findings as (lines, problems); ``rt`` defaults to ``describe()``."""
    rt = rt or runtime.describe()
    lines = [
        "tpu-course doctor",
        "  versions: " + ", ".join(f"{p} {_version(p)}" for p in
                                   ("jax", "jaxlib", "libtpu", "flax", "optax")),
        f"  python {sys.version.split()[0]}; host: {rt.host}",
        f"  backend: {rt.platform}; device kind: {rt.device_kind!r}; devices: "
        f"{rt.device_count}; processes: {rt.process_count}",
    ]
    chip = rt.chip
    if chip:
        peak_field = ("peak_bf16_flops_per_s" if chip.peak_bf16_flops_per_s is not None
                      else "peak_fp16_flops_per_s")
        lines.append(f"  chip: {chip.summary()} (hardware table row {chip.name!r}, "
                     f"peak sources {chip.sources.get(peak_field, '')})")
    elif rt.platform == "cpu":
        lines.append("  chip: none (CPU): timings on this runtime are CPU timings, not TPU timings")
    else:
        why = hardware.missing_reason(rt.device_kind)
        lines.append(f"  chip: {rt.device_kind!r} is not in the hardware table: peaks unknown"
                     + (f" ({why})" if why else ""))
    if rt.simulated:
        lines.append(f"  simulated devices: {rt.cpu_device_count} CPU devices "
                     "(--xla_force_host_platform_device_count) for mesh demos")
    else:
        lines.append("  simulated devices: no (call tpu_course.runtime.simulate_devices(8) "
                     "before JAX starts to get 8)")
    problems = list(rt.warnings)
    seen = _accelerator_hints()
    if rt.platform == "cpu" and "tpu" in seen:
        problems.append(
            "This machine looks like a TPU host but JAX sees only a CPU: install the TPU "
            "build with `pip install 'jax[tpu]'` (on Colab, do not upgrade the preinstalled "
            "jax), and check JAX_PLATFORMS is not set to 'cpu'."
        )
    if rt.platform == "cpu" and "gpu" in seen:
        problems.append(
            "An NVIDIA GPU is present but JAX sees only a CPU: install `jax[cuda12]` (or "
            "the CUDA version of your driver) and check JAX_PLATFORMS."
        )
    if rt.platform == "cpu" and os.environ.get("COLAB_RELEASE_TAG") and not seen:
        problems.append(
            "You are on a Colab CPU runtime. For a TPU: Runtime > Change runtime type > "
            "TPU, then rerun; the course also runs on this CPU, with smaller sizes."
        )
    # libtpu writes this lock while a process holds the TPU; a crashed process leaves it
    # behind and the next one reports "TPU in use". It only matters on a TPU host.
    if os.path.exists(runtime.TPU_LOCKFILE) and rt.platform != "tpu" and "tpu" in seen:
        problems.append(
            f"{runtime.TPU_LOCKFILE} exists: another (possibly crashed) process holds the "
            "TPU. Stop other notebooks/processes using it (`sudo lsof -w /dev/accel0`), or "
            f"if none is running delete the stale lock: `rm {runtime.TPU_LOCKFILE}`."
        )
    lines.append("  status: " + ("OK" if not problems else f"{len(problems)} problem(s)"))
    lines += [f"  ! {p}" for p in problems]
    return lines, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpu-course", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["doctor"])
    parser.add_argument("--simulate", type=int, metavar="N",
                        help="simulate N CPU devices first (as the multi-chip chapters do)")
    args = parser.parse_args(argv)
    if args.simulate:
        runtime.simulate_devices(args.simulate)
    lines, problems = doctor_report()
    print("\n".join(lines))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
