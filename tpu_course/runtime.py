"""What am I running on? Platform, chips, generation, host, and simulated CPU devices.

Every notebook prints ``describe().banner()`` near its top, so a reader always knows
which runtime produced the outputs below it. Multi-device chapters call
``simulate_devices(8)`` *before* JAX starts a backend, so that a laptop or a CI machine
sees eight CPU devices.

JAX is imported lazily: importing this module does not start a backend, which is what
lets ``simulate_devices`` run after ``import tpu_course``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from typing import Any, Iterator

from tpu_course import hardware

_FLAG = "--xla_force_host_platform_device_count"
TPU_LOCKFILE = "/tmp/libtpu_lockfile"


# What libtpu prints (straight to file descriptor 2) when it is installed on a machine
# without a TPU: harmless, but it would land in every notebook's first output.
_LIBTPU_NOISE = re.compile(
    r"could not determine TPU|Logging before InitGoogle|unexpected worker hostname|"
    r"Source Location Trace|tfrc/runtime|Failed to find host bounds|TPU_WORKER_HOSTNAMES"
)


@contextlib.contextmanager
def quiet_libtpu() -> Iterator[None]:
    """Drop libtpu's start-up warnings on machines without a TPU; pass all else through.

    libtpu (the ``jax[tpu]`` extra, needed for compile-only TPU targets) looks for TPU
    metadata when JAX starts or a TPU topology is built, and writes warnings to file
    descriptor 2 when there is none. This captures that descriptor for the duration,
    then re-emits every line that is not one of those known warnings.
    """
    fd = 2  # where C libraries write; ipykernel's sys.stderr.fileno() may be a copy
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
    kept = [line for line in text.splitlines() if line.strip() and not _LIBTPU_NOISE.search(line)]
    if kept:
        print("\n".join(kept), file=sys.stderr)


class TooLateError(RuntimeError):
    """Raised when a setting that must precede JAX's backend start comes too late."""


def _backends_started() -> bool:
    """True once JAX has created a backend (the point after which flags are ignored)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    probe = getattr(xla_bridge, "backends_are_initialized", None)
    if probe is not None:
        return bool(probe())
    return bool(getattr(xla_bridge, "_backends", {}))


def requested_cpu_devices() -> int | None:
    """The CPU device count asked for through ``XLA_FLAGS``, or ``None``."""
    match = re.search(_FLAG + r"=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else None


def simulate_devices(n: int) -> None:
    """Make the CPU platform expose ``n`` devices, to simulate a multi-chip mesh.

    Must run before JAX starts a backend (before the first ``jax.devices()``, array or
    jitted call). It sets ``--xla_force_host_platform_device_count`` in ``XLA_FLAGS``
    and, when JAX is already imported, ``jax_num_cpu_devices`` too.

    On a TPU or GPU runtime the simulated devices exist only on the CPU platform, beside
    the accelerator: use ``cpu_devices()`` (or ``jax.devices("cpu")``) to build a
    simulated mesh there. ``describe().banner()`` says how many are simulated.

    Raises:
        ValueError: ``n`` is not a positive integer.
        TooLateError: JAX has already started a backend in this process; restart the
            kernel and call this first.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"simulate_devices(n) needs a positive integer, got {n!r}")
    if _backends_started():
        import jax

        have = len(jax.devices("cpu"))
        if have == n:
            return  # already what was asked: re-running the cell is harmless
        raise TooLateError(
            f"simulate_devices({n}) came too late: JAX has already started with {have} "
            "CPU device(s), and the device count is fixed from then on. Restart the "
            "kernel (Runtime > Restart session on Colab) and run the cell that calls "
            "simulate_devices() before anything that touches jax.devices() or creates "
            "an array."
        )
    flags = re.sub(_FLAG + r"=\d+", "", os.environ.get("XLA_FLAGS", "")).split()
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"{_FLAG}={n}"])
    if "jax" in sys.modules:
        import jax

        try:
            jax.config.update("jax_num_cpu_devices", n)
        except AttributeError:  # older JAX without the option: XLA_FLAGS suffices
            pass


def cpu_devices() -> list[Any]:
    """The CPU devices (the simulated mesh when ``simulate_devices`` ran first)."""
    import jax

    return jax.devices("cpu")


def _host() -> str:
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ or "KAGGLE_URL_BASE" in os.environ:
        return "kaggle"
    return "local"


@dataclasses.dataclass(frozen=True)
class Runtime:
    """A snapshot of the runtime: what JAX's default backend sees, and the CPU tier."""

    platform: str  # 'tpu' | 'gpu' | 'cpu'
    device_kind: str
    device_count: int  # devices of the default platform, all processes
    process_count: int
    generation: str | None  # hardware-table key, None when the chip is not in the table
    simulated: bool  # True when the CPU platform was split into several devices
    host: str  # 'colab' | 'kaggle' | 'local'
    cpu_device_count: int = 1
    jax_version: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def chip(self) -> hardware.Chip | None:
        """The hardware-table row, or None for a CPU or an unknown chip."""
        return hardware.get(self.generation) if self.generation else None

    def banner(self) -> str:
        """One line naming the runtime; every notebook prints it near the top."""
        if self.platform == "cpu":
            what = f"{self.device_count} {'simulated ' if self.simulated else ''}CPU device(s)"
            what += " -- timings here are CPU timings, not TPU timings"
        else:
            chip = self.chip.display_name if self.chip else f"unknown chip {self.device_kind!r}"
            what = f"{self.device_count} x {self.device_kind} ({chip})"
            if self.simulated:
                what += f"; plus {self.cpu_device_count} simulated CPU devices for mesh demos"
        procs = f", {self.process_count} processes" if self.process_count > 1 else ""
        return f"Runtime: {self.platform.upper()}: {what}{procs}; host: {self.host}; jax {self.jax_version}"

    def __str__(self) -> str:
        return self.banner()


def describe() -> Runtime:
    """Describe the runtime JAX sees. Starts JAX's backend if it has not started yet."""
    import jax

    with quiet_libtpu():
        devices = jax.devices()
    first = devices[0]
    platform = first.platform if first.platform in ("tpu", "gpu", "cpu") else "gpu"
    if platform == "gpu" or first.platform in ("cuda", "rocm"):
        platform = "gpu"
    cpu_count = len(jax.devices("cpu"))
    chip = hardware.lookup(first.device_kind) if platform != "cpu" else None
    warnings = []
    want = requested_cpu_devices()
    if want is not None and want != cpu_count:
        warnings.append(
            f"XLA_FLAGS asks for {want} CPU devices but JAX has {cpu_count}: the flag was "
            "set after JAX started. Restart the kernel and call "
            "tpu_course.runtime.simulate_devices() first."
        )
    if platform != "cpu" and chip is None:
        why = hardware.missing_reason(first.device_kind)
        warnings.append(
            f"{first.device_kind!r} is not in tpu_course.hardware: peak numbers are unknown"
            + (f" ({why})." if why else ".")
        )
    return Runtime(
        platform=platform,
        device_kind=first.device_kind,
        device_count=len(devices),
        process_count=jax.process_count(),
        generation=chip.name if chip else None,
        simulated=cpu_count > 1,
        host=_host(),
        cpu_device_count=cpu_count,
        jax_version=jax.__version__,
        warnings=tuple(warnings),
    )
