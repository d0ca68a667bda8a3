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
import subprocess
import sys
from typing import Any, Iterator

from tpu_course import errors, hardware

_FLAG = "--xla_force_host_platform_device_count"
TPU_LOCKFILE = "/tmp/libtpu_lockfile"


# What libtpu prints (straight to file descriptor 2) when it is installed on a machine
# without a TPU: harmless, but it would land in every notebook's first output. Why it
# happens: with JAX_PLATFORMS unset, JAX tries every backend it has, and the `aot` extra's
# libtpu registers a TPU one; libtpu then reads the TPU VM's metadata, finds none and logs
# these lines before JAX falls back to the CPU. JAX_PLATFORMS=cpu skips that attempt.
# The profiler adds two more when a trace starts (seen with jax 0.7.2, Colab's, and libtpu
# 0.0.21/0.0.23; jax 0.12 prints neither): "Can't import tensorflow.python.profiler.trace"
# (jaxlib's Python tracer looks for TensorFlow's trace module to record TF ops too; there
# is no TensorFlow, and the Python trace is recorded anyway) and "No factory for
# ACTIVITY_TRACING" (the profiler asks every registered tracer kind; this build has none
# for that kind; the TPU and host traces are recorded anyway), with its source line
# (".../profiler_factory.cc:37"). A trace started under `quiet_libtpu()` drops them.
_LIBTPU_NOISE = re.compile(
    r"could not determine TPU|Logging before InitGoogle|unexpected worker hostname|"
    r"Source Location Trace|tfrc/runtime|Failed to find host bounds|TPU_WORKER_HOSTNAMES|"
    r"Can't import tensorflow\.python\.profiler\.trace|No factory for ACTIVITY_TRACING|"
    r"perftools/accelerators/.*profiler_factory\.cc"
)

# The filter runs in a separate process so that it outlives this one: when XLA aborts
# (an unknown flag in XLA_FLAGS, a failed check), the filter still sees the end of the
# pipe and writes everything it held back, known noise included. A clean exit of the
# `with` block sends the marker line instead, and only then is the noise dropped.
_FILTER = r"""
import os, re, sys
noise, marker = re.compile(sys.argv[1]), sys.argv[2].encode()
held, out = [], sys.stdout.buffer
for line in sys.stdin.buffer:
    if line.rstrip(b"\n") == marker:
        sys.exit(0)
    if not line.strip() or noise.search(line.decode(errors="replace")):
        held.append(line)
    else:
        out.write(line); out.flush()
out.write(b"".join(held)); out.flush()
"""


def _libtpu_may_log() -> bool:
    """Whether starting a backend here can make libtpu print: it is installed, and
    JAX_PLATFORMS does not exclude the TPU backend."""
    import importlib.util

    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms and "tpu" not in platforms.split(","):
        return False
    return importlib.util.find_spec("libtpu") is not None


@contextlib.contextmanager
def quiet_libtpu() -> Iterator[None]:
    """Drop libtpu's known start-up warnings on machines without a TPU; pass all else through.

    libtpu (the ``jax[tpu]`` extra, needed for compile-only TPU targets) looks for TPU
    metadata when JAX starts or a TPU topology is built, and writes warnings to file
    descriptor 2 when there is none. While the block runs, descriptor 2 goes through a
    small filter process: every other line reaches stderr as it comes; the known
    warnings are dropped only when the block ends normally. If the process dies inside
    the block (XLA aborts on an unknown flag in ``XLA_FLAGS``), the filter writes
    everything, so the reason is never lost. Without libtpu (or with ``JAX_PLATFORMS``
    excluding the TPU) nothing is captured at all.
    """
    if not _libtpu_may_log():
        yield
        return
    fd = 2  # where C libraries write; ipykernel's sys.stderr.fileno() may be a copy
    sys.stderr.flush()
    saved = os.dup(fd)
    marker = f"--tpu-course-quiet-libtpu-end-{os.getpid()}-{id(saved)}--"
    read_end, write_end = os.pipe()
    try:
        filt = subprocess.Popen([sys.executable, "-I", "-S", "-c", _FILTER,
                                 _LIBTPU_NOISE.pattern, marker],
                                stdin=read_end, stdout=saved, close_fds=True)
    except OSError:  # no way to start the filter: capture nothing rather than fail
        os.close(read_end), os.close(write_end), os.close(saved)
        yield
        return
    os.close(read_end)
    os.dup2(write_end, fd)
    os.close(write_end)
    try:
        yield
        sys.stderr.flush()
        os.write(fd, f"\n{marker}\n".encode())
    finally:
        sys.stderr.flush()
        os.dup2(saved, fd)  # closes the pipe's last write end here: the filter sees EOF
        os.close(saved)
        try:
            filt.wait(timeout=30)
        except subprocess.TimeoutExpired:
            filt.kill()


class XlaFlagsError(errors.CourseValueError):
    """``XLA_FLAGS`` holds something XLA refuses (it would abort the process).

    ``problem`` says what is wrong, ``fix`` what to do; the message is both."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}\n{fix}")
        self.problem, self.fix = problem, fix


#: XLA_FLAGS values already tried in a throw-away process: None when XLA started.
_CHECKED_FLAGS: dict[str, XlaFlagsError | None] = {}
_FIX_FLAGS = ("in a shell, fix it or `unset XLA_FLAGS` before starting Python or Jupyter; "
              "in a notebook, `os.environ.pop('XLA_FLAGS')` before anything starts JAX")


#: The most simulated CPU devices the course lets XLA create. Measured on a 2-core VM
#: with jax 0.12 (``python -c "import jax; jax.devices()"`` under the flag): 8 devices
#: start in 1.9 s with 0.18 GB resident, 1,024 in 2.5 s with 0.48 GB, 2,048 in 9 s with
#: 0.77 GB, 4,096 in 38 s with 1.4 GB: about 0.3 MB per device, and a start-up time
#: that grows with the square of the count. 1,024 is four times a v5e pod (256 chips);
#: the chapters use 8.
MAX_SIMULATED_DEVICES = 1024
_BASE_BYTES = 0.18e9  # resident before any device (jax imported), measured as above
_BYTES_PER_DEVICE = 0.3e6  # (1.4 GB - 0.18 GB) / 4,096 devices
_START_S_AT_4096 = 38.0  # start-up at 4,096 devices; it grows with the square of the count


def too_many_devices(n: int) -> str:
    """Why ``n`` simulated CPU devices is refused: what such a mesh would need here.

    >>> print(too_many_devices(100_000)[:71])
    100,000 simulated CPU devices is more than the course's limit of 1,024:
    """
    memory_gb = (_BASE_BYTES + _BYTES_PER_DEVICE * n) / 1e9
    start_s = _START_S_AT_4096 * (n / 4096) ** 2
    start = f"{start_s / 3600:,.1f} hours" if start_s >= 3600 else f"{start_s:,.0f} s"
    return (f"{n:,} simulated CPU devices is more than the course's limit of "
            f"{MAX_SIMULATED_DEVICES:,}: XLA would need about {memory_gb:,.1f} GB of host "
            f"memory and {start} just to start them (each simulated device costs ~0.3 MB, "
            "and start-up grows with the square of the count: 4,096 took 38 s and 1.4 GB "
            "here), before the first array; then every array sharded or replicated over "
            "the mesh keeps one buffer per device, and every collective runs one step per "
            "device on this machine's few CPU cores.")


def _device_count_flags(value: str) -> list[str]:
    """The words of ``value`` that set (or try to set) the CPU device count."""
    return [f for f in value.split() if f == _FLAG or f.startswith(_FLAG + "=")]


def check_device_count_flag(value: str | None = None) -> int | None:
    """The CPU device count that ``XLA_FLAGS`` (or ``value``) asks for, checked without
    starting XLA: ``None`` when it asks for none, else a positive integer.

    XLA itself kills the process on ``--xla_force_host_platform_device_count=abc`` (with
    90 lines of flag help), fails with ``vector::reserve`` on ``=-4`` and grows its memory
    for hours on ``=100000``; this raises :class:`XlaFlagsError` naming the flag instead
    (above :data:`MAX_SIMULATED_DEVICES`, with what such a mesh would need:
    :func:`too_many_devices`).

    >>> check_device_count_flag("--xla_force_host_platform_device_count=8")
    8
    >>> try:
    ...     check_device_count_flag("--xla_force_host_platform_device_count=-4")
    ... except XlaFlagsError as err:
    ...     print(str(err)[:79])
    XLA_FLAGS holds --xla_force_host_platform_device_count=-4: the CPU device count
    """
    value = os.environ.get("XLA_FLAGS", "") if value is None else value
    if not isinstance(value, str):
        raise errors.CourseTypeError(
            f"value={value!r}: expected the text of XLA_FLAGS (a string), got "
            f"{type(value).__name__}; pass nothing to read the environment's XLA_FLAGS.")
    count = None
    for flag in _device_count_flags(value):
        text = flag.partition("=")[2]
        if re.fullmatch(r"\+?\d+", text) and int(text) >= 1:
            count, last = int(text), flag  # XLA keeps the last one
            continue
        raise XlaFlagsError(
            f"XLA_FLAGS holds {flag}: the CPU device count must be a whole number of at "
            f"least 1, e.g. {_FLAG}=8 (XLA would stop the process).",
            "Fix it (or call tpu_course.runtime.simulate_devices(8), which sets it): "
            f"{_FIX_FLAGS}.")
    if count is not None and count > MAX_SIMULATED_DEVICES:
        raise XlaFlagsError(
            f"XLA_FLAGS holds {last}: {too_many_devices(count)}",
            f"Ask for at most {MAX_SIMULATED_DEVICES:,} (the multi-chip chapters use "
            f"{_FLAG}=8; tpu_course.runtime.simulate_devices(8) sets it): {_FIX_FLAGS}.")
    return count



def check_xla_flags() -> None:
    """Refuse ``XLA_FLAGS`` that would make XLA abort the process, before it does.

    XLA stops the whole process (a notebook kernel dies with no message) when
    ``XLA_FLAGS`` names a flag it does not know or a value it cannot read. The CPU
    device-count flag is checked here directly (:func:`check_device_count_flag`). When
    ``XLA_FLAGS`` holds anything besides it, a throw-away CPU-only Python starts XLA with
    the same flags first (about a second, once per value); if that process fails, this
    raises :class:`XlaFlagsError` with what XLA said and the fix.
    """
    value = os.environ.get("XLA_FLAGS", "")
    check_device_count_flag(value)
    others = [f for f in value.split() if f not in _device_count_flags(value)]
    if not others:
        return
    if value not in _CHECKED_FLAGS:
        _CHECKED_FLAGS[value] = _try_xla_flags(value)
    refused = _CHECKED_FLAGS[value]
    if refused is not None:
        raise XlaFlagsError(refused.problem, refused.fix)


def _try_xla_flags(value: str) -> XlaFlagsError | None:
    """Start XLA's CPU backend with ``XLA_FLAGS=value`` in a throw-away Python: None when
    it starts (or when that cannot be told), else the error that says why not."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": value}
    try:
        proc = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"],
                              env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None  # cannot tell: let JAX start and speak for itself
    if proc.returncode == 0:
        return None
    said = xla_flag_complaint(proc.stderr)
    return XlaFlagsError(
        f"XLA_FLAGS={value!r} stops XLA from starting (the process would be killed):\n  "
        + "\n  ".join(said),
        f"Remove the flag it names: {_FIX_FLAGS}. Flags differ between jaxlib versions; "
        "`python -m tpu_course doctor` shows the versions here.")


def xla_flag_complaint(stderr: str) -> list[str]:
    """The lines of a dying XLA's ``stderr`` that say which flag it refused, without the
    flag help it may print after them (90 lines) or the log prefix; at most three."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    key = re.compile(r"Unknown flag in XLA_FLAGS|Couldn't interpret value|"
                     r"Could not open file .*XLA_FLAGS|Flag parsing failed")
    said = [ln.split("] ", 1)[-1] for ln in lines if key.search(ln)]
    said = [ln for ln in said if not ln.startswith("Check failed")] or said
    return said[:3] or lines[-3:]


class TooLateError(errors.CourseError, RuntimeError):
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
    """The CPU device count asked for through ``XLA_FLAGS``, or ``None`` (also when the
    flag's value is not a count: :func:`check_device_count_flag` says what is wrong)."""
    try:
        return check_device_count_flag()
    except XlaFlagsError:
        return None


def _with_device_count(xla_flags: str, n: int) -> str:
    """``xla_flags`` with its CPU device count flags (if any, even bad ones) replaced by
    ``n``."""
    drop = _device_count_flags(xla_flags)
    return " ".join([f for f in xla_flags.split() if f not in drop] + [f"{_FLAG}={n}"])


def cpu_subprocess_env(devices: int, keep_xla_flags: bool = True) -> dict[str, str]:
    """This process's environment for a child Python that runs JAX on the CPU only, with
    ``devices`` simulated devices and this package importable (from a checkout too).

    ``keep_xla_flags=False`` drops the other ``XLA_FLAGS`` of this process.
    """
    devices = errors.check_int("devices", devices, low=1, high=MAX_SIMULATED_DEVICES)
    if not isinstance(keep_xla_flags, bool):
        raise errors.CourseTypeError(f"keep_xla_flags={keep_xla_flags!r}: expected True or "
                                     f"False, got {type(keep_xla_flags).__name__}.")
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = _with_device_count(env.get("XLA_FLAGS", "") if keep_xla_flags else "",
                                          devices)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


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
        XlaFlagsError: ``n`` is above :data:`MAX_SIMULATED_DEVICES` (XLA would spend
            gigabytes and hours starting them: :func:`too_many_devices` says how many).
        XlaFlagsError: ``XLA_FLAGS`` already holds something XLA would refuse (a device
            count that is not a positive integer, a flag this jaxlib does not know):
            XLA would stop the process when JAX starts, so it is refused here, by name.
        TooLateError: JAX has already started a backend in this process; restart the
            kernel and call this first.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise errors.CourseValueError(
            f"simulate_devices(n) needs a positive integer, got {n!r}: e.g. "
            "simulate_devices(8) for the 8 devices of the multi-chip chapters")
    if n > MAX_SIMULATED_DEVICES:  # the flag it would set: refused as XLA_FLAGS's would be
        raise XlaFlagsError(f"simulate_devices(n={n:,}): {too_many_devices(n)}",
                            f"Ask for at most {MAX_SIMULATED_DEVICES:,}; the multi-chip "
                            "chapters use simulate_devices(8).")
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
    check_xla_flags()  # a bad flag would kill the process at JAX's start: say so now
    os.environ["XLA_FLAGS"] = _with_device_count(os.environ.get("XLA_FLAGS", ""), n)
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
        """The runtime in two short lines (what computes; the host and jax); every notebook
        prints it near the top."""
        if self.platform == "cpu":
            what = f"{self.device_count} {'simulated ' if self.simulated else ''}CPU device(s)"
            what += " -- timings here are CPU timings, not TPU timings"
        else:
            chip = self.chip.display_name if self.chip else f"unknown chip {self.device_kind!r}"
            what = f"{self.device_count} x {self.device_kind} ({chip})"
            if self.simulated:
                what += (f";\n  plus {self.cpu_device_count} simulated CPU devices for mesh "
                         "demos")
        procs = f", {self.process_count} processes" if self.process_count > 1 else ""
        return (f"Runtime: {self.platform.upper()}: {what}{procs}\n"
                f"  host: {self.host}; jax {self.jax_version}")

    def __str__(self) -> str:
        return self.banner()


def describe() -> Runtime:
    """Describe the runtime JAX sees. Starts JAX's backend if it has not started yet."""
    import jax

    if not _backends_started():
        check_xla_flags()
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


_DONATION: dict[str, bool] = {}


def donation_is_safe() -> bool:
    """Whether a jitted step that donates its input computes the same as one that does not.

    Buffer donation (``jax.jit(step, donate_argnums=0)``) lets XLA write a step's new
    parameters into the old ones' memory. On the CPU backend of jax 0.7.2 (Colab's
    version in August 2026) it gives wrong numbers: three SGD steps of a two-layer MLP
    end at loss 2.06 donated against 1.43 not donated; jax 0.12 agrees with itself. So
    rather than trust a version list, this runs that probe once per backend (about
    0.3 s) and caches the answer; the course donates only where it holds.

    >>> isinstance(donation_is_safe(), bool)
    True
    """
    import jax
    import jax.numpy as jnp

    backend = jax.default_backend()
    if backend not in _DONATION:
        _DONATION[backend] = _donation_probe(jax, jnp)
    return _DONATION[backend]


def _donation_probe(jax: Any, jnp: Any) -> bool:
    """Three SGD steps of a 784-256-10 MLP, donated and not; True when they agree."""
    ks = jax.random.split(jax.random.key(0), 3)
    params = [jax.random.normal(ks[0], (784, 256)) * 0.05, jnp.zeros(256),
              jax.random.normal(ks[1], (256, 10)) * 0.05, jnp.zeros(10)]
    x = jax.random.normal(ks[2], (64, 784))
    y = jax.nn.one_hot(jnp.arange(64) % 10, 10)

    def loss(p: list) -> Any:
        h = jax.nn.relu(x @ p[0] + p[1])
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(h @ p[2] + p[3]), axis=-1))

    def step(p: list) -> tuple[list, Any]:
        value, grads = jax.value_and_grad(loss)(p)
        return [a - 0.1 * g for a, g in zip(p, grads)], value

    losses = []
    for donate in ((), (0,)):
        p = [jnp.array(a, copy=True) for a in params]
        fn = jax.jit(step, donate_argnums=donate)
        for _ in range(3):
            p, value = fn(p)
        losses.append(float(value))
    return abs(losses[0] - losses[1]) <= 1e-5 * max(1.0, abs(losses[0]))
