"""``python -m tpu_course doctor`` (or ``tpu-course doctor``): is this runtime ready?

The same command runs ``tpu-course preflight`` (:mod:`tpu_course.preflight`: the core of
every chapter on this runtime, one row each) and ``tpu-course grade``
(:mod:`tpu_course.grade`: grade submitted lab notebooks).

Prints the versions that matter, what JAX sees, the chip's row in the hardware table,
whether devices are simulated, and what to do when something is off. It never raises:
JAX first starts in a throw-away process, so a backend that cannot start (a
``JAX_PLATFORMS`` naming a missing or unknown platform, an ``XLA_FLAGS`` that XLA
refuses) is reported with what was asked for, what is available and the fix, and the
exit status is 1.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
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


#: The hidden command that :func:`probe_backend` runs in a fresh Python:
#: ``python -m tpu_course probe-backend`` (:func:`report_backend`).
PROBE_COMMAND = "probe-backend"


def report_backend() -> int:
    """Start JAX's default backend in this process and print what came up, or why not, as
    one JSON line: ``{"ok": True, "platform", "count", "device_kind"}`` or ``{"ok": False,
    "error"}``. :func:`probe_backend` runs it in a separate process, since a backend that
    XLA refuses can end the process that starts it."""
    try:
        import jax

        d = jax.devices()
        found = {"ok": True, "platform": d[0].platform, "count": len(d),
                 "device_kind": d[0].device_kind}
    except BaseException as err:  # noqa: BLE001 - whatever stops JAX is the answer
        found = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    print(json.dumps(found))
    return 0


_PLATFORM_NAMES = ("cpu", "tpu", "cuda", "gpu", "rocm")


def probe_backend(env: dict[str, str] | None = None, timeout_s: float = 180) -> dict:
    """Start JAX in a separate process with ``env``; report what came up or why not.

    Returns ``{"ok": True, "platform", "count", "device_kind"}`` or ``{"ok": False,
    "error", "stderr", "returncode"}``. A process that XLA aborts, or that hangs, is a
    result here, not an exception.
    """
    try:
        proc = subprocess.run([sys.executable, "-m", "tpu_course", PROBE_COMMAND], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"JAX did not start within {timeout_s:.0f} s",
                "stderr": "", "returncode": None}
    except OSError as err:
        return {"ok": False, "error": str(err), "stderr": "", "returncode": None}
    out = proc.stdout.strip().splitlines()
    try:
        result = json.loads(out[-1]) if out else {}
    except ValueError:
        result = {}
    if not result:
        said = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        result = {"ok": False, "error": said[-1] if said else
                  f"the process ended with exit code {proc.returncode} and said nothing"}
    result.update(stderr=proc.stderr, returncode=proc.returncode)
    return result


def _header() -> list[str]:
    return [
        "tpu-course doctor",
        "  versions: " + ", ".join(f"{p} {_version(p)}" for p in
                                   ("jax", "jaxlib", "libtpu", "flax", "optax")),
        f"  python {sys.version.split()[0]}; host: {runtime._host()}",
    ]


def _first_line(error: str) -> str:
    line = (error.strip().splitlines() or [""])[0][:400]
    if line.rstrip(": ") == "AssertionError":  # JAX's bare assert: no backend came up
        return "AssertionError (JAX found no backend it could start)"
    return line


def failure_report(failed: dict) -> tuple[list[str], list[str]]:
    """What to say when JAX's backend does not start: asked for, available, the fix."""
    asked = os.environ.get("JAX_PLATFORMS", "")
    flags = os.environ.get("XLA_FLAGS", "")
    lines = _header() + [
        f"  JAX_PLATFORMS: {asked!r}" + ("" if asked else " (unset: JAX picks what it finds)"),
        f"  XLA_FLAGS: {flags!r}" if flags else "  XLA_FLAGS: (unset)",
        f"  backend: did not start: {_first_line(failed['error'])}",
    ]
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    fallback = probe_backend(clean)
    if fallback.get("ok"):
        available = (f"{fallback['platform']} ({fallback['count']} x "
                     f"{fallback['device_kind']})")
        lines.append(f"  available: with JAX_PLATFORMS and XLA_FLAGS unset, JAX starts {available}")
    else:
        available = None
        lines.append("  available: JAX does not start even with JAX_PLATFORMS and XLA_FLAGS "
                     f"unset: {_first_line(fallback['error'])}")
    stderr = failed.get("stderr", "")
    wanted = [p.strip().lower() for p in asked.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in _PLATFORM_NAMES]
    hints = _accelerator_hints()
    refused = runtime.xla_flag_complaint(stderr) if flags else []
    if flags and any("XLA_FLAGS" in ln or "for flag" in ln for ln in refused):
        # XLA's own log lines, without their "F1130 21:10:13.19 1234 file.cc:234] " prefix
        # and without the flag help XLA prints after them
        problem = (f"XLA refuses XLA_FLAGS ({'; '.join(refused)}): remove that flag "
                   "or unset XLA_FLAGS (flags differ between jaxlib versions). In a notebook, "
                   "a bad XLA_FLAGS kills the kernel as it starts JAX.")
    elif unknown:
        problem = (f"JAX_PLATFORMS={asked!r} names a platform JAX does not know "
                   f"({', '.join(map(repr, unknown))}): use 'cpu', 'tpu' or 'cuda', or unset "
                   "JAX_PLATFORMS to let JAX pick.")
    elif "tpu" in wanted:
        problem = ("JAX_PLATFORMS asks for a TPU, but none could be started here. "
                   + ("This looks like a TPU host: check that no other process holds the TPU "
                      f"(`sudo lsof -w /dev/accel0`; a stale {runtime.TPU_LOCKFILE} can be "
                      "deleted when none does) and that jax[tpu] is installed. "
                      if "tpu" in hints else "This machine shows no TPU device. ")
                   + "Unset JAX_PLATFORMS (or set it to 'cpu') to run on what is here.")
    elif {"cuda", "gpu", "rocm"} & set(wanted):
        problem = ("JAX_PLATFORMS asks for a GPU, but none could be started here. "
                   + ("An NVIDIA GPU is present: install the CUDA build, "
                      "`pip install 'jax[cuda12]'`. " if "gpu" in hints else
                      "This machine shows no NVIDIA GPU. ")
                   + "Unset JAX_PLATFORMS (or set it to 'cpu') to run on what is here.")
    else:
        problem = ("JAX could not start a backend: reinstall matching jax and jaxlib "
                   "versions (`pip install -U jax`), and see the message above.")
    if available and "XLA_FLAGS" not in problem:
        problem += f" Available here: {available}."
    lines.append("  status: 1 problem(s)")
    lines.append(f"  ! {problem}")
    return lines, [problem]


def doctor_report(rt: runtime.Runtime | None = None) -> tuple[list[str], list[str]]:
    """The doctor's findings as (lines, problems); ``rt`` defaults to ``describe()``."""
    rt = rt or runtime.describe()
    lines = _header() + [
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
    if (rt.platform == "cpu" and importlib.util.find_spec("libtpu") is not None
            and not os.environ.get("JAX_PLATFORMS")):
        lines.append(
            "  note: libtpu (the aot extra, for compile-only TPU targets) is installed on a "
            "machine without a TPU. With JAX_PLATFORMS unset, JAX tries its TPU backend "
            "first, and libtpu prints start-up warnings ('... unexpected worker hostname "
            "...', 'could not determine TPU accelerator type'): harmless. Set "
            "JAX_PLATFORMS=cpu to skip that attempt; compile-only TPU targets keep working.")
    lines.append("  status: " + ("OK" if not problems else f"{len(problems)} problem(s)"))
    lines += [f"  ! {p}" for p in problems]
    return lines, problems


def _device_count(text: str) -> int:
    """``--simulate``'s value: a whole number of CPU devices, at least 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1 or str(n) != text.strip().lstrip("+"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of CPU devices: give a whole number of at least 1, "
            "e.g. --simulate 8 (what the multi-chip chapters use)")
    return n


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "preflight":
        from tpu_course import preflight

        return preflight.main(argv[1:])
    if argv and argv[0] == "grade":
        from tpu_course import grade

        return grade.main(argv[1:])
    if argv == [PROBE_COMMAND]:  # not in --help: probe_backend's own process
        return report_backend()
    parser = argparse.ArgumentParser(prog="tpu-course", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["doctor", "preflight", "grade"],
                        help="doctor: is this runtime ready; preflight: run every chapter's "
                             "core here; grade: grade submitted labs (each has its own --help)")
    parser.add_argument("--simulate", type=_device_count, metavar="N",
                        help="simulate N CPU devices first (as the multi-chip chapters do)")
    args = parser.parse_args(argv)
    try:
        runtime.check_device_count_flag()  # XLA would die on it with 90 lines of flag help
        if args.simulate is not None:
            runtime.simulate_devices(args.simulate)
    except runtime.XlaFlagsError as err:
        problem = str(err)
        flags = os.environ.get("XLA_FLAGS", "")
        print("\n".join(_header() + [f"  XLA_FLAGS: {flags!r}", "  backend: not started "
                                     "(XLA would stop the process)", "  status: 1 problem(s)",
                                     f"  ! {problem}"]))
        return 1
    probe = probe_backend()
    if not probe.get("ok"):
        lines, problems = failure_report(probe)
    else:
        try:
            lines, problems = doctor_report()
        except Exception as err:  # noqa: BLE001 - the doctor reports, it never raises
            problem = (f"describing the runtime failed: {type(err).__name__}: {err}. Please "
                       "report this with the lines above.")
            lines, problems = _header() + ["  status: 1 problem(s)", f"  ! {problem}"], [problem]
    print("\n".join(lines))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
