"""A benchmark harness that avoids the classic timing mistakes.

``benchmark(fn, *args)`` measures a JAX function the way the course says to:

1. **Compile apart from run.** A jitted ``fn`` is lowered and compiled first
   (``fn.lower(*args).compile()``), and that time is reported as ``compile_time_s``;
   the warm-up calls then run the cached executable. The first call's time is kept
   (``first_call_s``) so the cost of forgetting the warm-up can be shown.
2. **Wait for the result.** JAX dispatches asynchronously: a call returns before the
   device has finished. Every timed sample ends with ``block_until_ready`` on *every
   leaf* of the output pytree (a tuple, dict or list of arrays), not just the first.
3. **No recompiles in the timed loop.** JAX's compile events are counted before and
   after the timed samples; any compilation inside them is reported
   (``recompilations``) with a warning, since those samples timed the compiler.
4. **Enough repeats to trust.** At least ``repeats`` samples and ``min_time`` seconds;
   the spread (interquartile range over median) is reported and a warning raised when
   it is above ``SPREAD_WARN``.

FLOPs and bytes come from XLA's cost analysis (or the ``flops=`` / ``bytes_accessed=``
you pass); achieved FLOP/s and bytes/s divide them by the median time, and
``fraction_of_peak`` divides FLOP/s by the dense bf16 peak *of one device* from
:mod:`tpu_course.hardware` (``None`` on a CPU or a chip not in the table): the chip's
peak divided by its JAX devices per chip, since on v2, v3 and 7x each TensorCore is a
device and a one-device benchmark can reach only that share. On a chip without bf16
(the T4), XLA computes bf16 in fp32, so the fp32 peak is used and ``peak_name`` says so.

>>> import jax, jax.numpy as jnp
>>> r = benchmark(jax.jit(lambda a: a @ a), jnp.ones((64, 64)), repeats=5, min_time=0.0,
...               warn=False)
>>> r.flops == 2 * 64**3, len(r.times_s) >= 5, r.recompilations
(True, True, 0)
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import threading
import textwrap
import time
import warnings
from typing import Any, Callable

from tpu_course import errors, hardware, tables

#: Spread (interquartile range / median of the per-run times) above which a result is
#: flagged as too noisy to trust.
SPREAD_WARN = 0.10

#: Each timed sample runs ``number`` calls back to back (then waits for all of them);
#: with ``number=None`` the harness picks ``number`` so a sample lasts about this long,
#: which amortises the cost of waiting for the device (tens of microseconds on a GPU).
TARGET_SAMPLE_S = 0.01


class BenchmarkWarning(UserWarning):
    """A benchmark result that should not be trusted as it stands."""


# --------------------------------------------------------------------------------------
# Counting compilations with jax.monitoring
# --------------------------------------------------------------------------------------

_COMPILE_EVENTS = ("/jax/core/compile/backend_compile_duration",
                   "/jax/core/compile/jaxpr_trace_duration")
_counts = {event: 0 for event in _COMPILE_EVENTS}
_lock = threading.Lock()
_listening = False


def _on_event(event: str, duration_s: float, *args: Any, **kwargs: Any) -> None:
    if event in _counts:
        with _lock:
            _counts[event] += 1


def compile_counts() -> dict[str, int]:
    """How many traces and backend compilations JAX has done since the harness began
    listening (the first call to this function or to :func:`benchmark`)."""
    global _listening
    if not _listening:
        from jax import monitoring

        monitoring.register_event_duration_secs_listener(_on_event)
        _listening = True
    with _lock:
        return {"traces": _counts[_COMPILE_EVENTS[1]], "compiles": _counts[_COMPILE_EVENTS[0]]}


# --------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BenchResult:
    """One benchmark: per-run times and what they imply. Times in seconds."""

    name: str
    times_s: tuple[float, ...]  # per-run time of each sample (sample time / number)
    number: int  # calls per timed sample
    compile_time_s: float | None  # lower + compile, measured apart (None: fn not jitted)
    first_call_s: float  # the first call after compiling, waited for
    warmup: int
    flops: float | None  # per call, from XLA's cost analysis or given
    bytes_accessed: float | None  # per call
    platform: str
    device_kind: str
    chip: str | None  # hardware-table key, None for a CPU or an unknown chip
    peak_flops_per_s: float | None  # one device's dense peak, used for fraction_of_peak
    peak_name: str  # which peak that is ('bf16 dense', 'fp32', ...)
    recompilations: int  # compilations seen during the timed samples
    jax_version: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.times_s)

    @property
    def spread(self) -> float:
        """Interquartile range divided by the median (0.05 = 5 %)."""
        if len(self.times_s) < 4:
            return (max(self.times_s) - min(self.times_s)) / self.median_s
        q1, _, q3 = statistics.quantiles(self.times_s, n=4)
        return (q3 - q1) / self.median_s

    @property
    def flops_per_s(self) -> float | None:
        """Achieved FLOP/s at the median time."""
        return None if not self.flops else self.flops / self.median_s

    @property
    def bytes_per_s(self) -> float | None:
        """Achieved bytes/s at the median time (XLA's bytes accessed)."""
        return None if not self.bytes_accessed else self.bytes_accessed / self.median_s

    @property
    def fraction_of_peak(self) -> float | None:
        """Achieved FLOP/s over the chip's peak, or None when either is unknown."""
        if self.flops_per_s is None or not self.peak_flops_per_s:
            return None
        return self.flops_per_s / self.peak_flops_per_s

    def rows(self) -> list[tuple[str, str]]:
        def t(x: float | None) -> str:
            if x is None:
                return "n/a"
            return f"{x * 1e3:.3f} ms" if x >= 1e-3 else f"{x * 1e6:.1f} us"

        device = f"{self.platform.upper()} {self.device_kind}"
        if self.platform == "cpu":
            device += " (CPU timing, not a TPU timing)"
        rows = [
            ("benchmark", self.name), ("device", device),
            ("compile", t(self.compile_time_s)), ("first call", t(self.first_call_s)),
            ("per run: min / median", f"{t(self.min_s)} / {t(self.median_s)}"),
            ("spread (IQR / median)", f"{self.spread:.1%}"),
            ("samples", f"{len(self.times_s)} x {self.number} call(s), after {self.warmup} warm-up"),
        ]
        if self.flops_per_s is not None:
            rows.append(("achieved", f"{self.flops_per_s / 1e12:.3f} TFLOP/s"))
        if self.bytes_per_s is not None:
            rows.append(("memory traffic", f"{self.bytes_per_s / 1e9:.2f} GB/s"))
        if self.fraction_of_peak is not None:
            rows.append(("fraction of peak", f"{self.fraction_of_peak:.1%} of "
                         f"{self.peak_flops_per_s / 1e12:.0f} TFLOP/s ({self.peak_name})"))
        rows.append(("recompilations while timing", str(self.recompilations)))
        rows += [("warning", w) for w in self.warnings]
        return rows

    def __str__(self) -> str:
        return tables.text(self.rows())

    def __repr__(self) -> str:
        return f"BenchResult(\n{self}\n)"

    def _repr_html_(self) -> str:
        return tables.html(self.rows(), labels=True, align_left=True)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the fields plus the derived numbers (for tables and JSON)."""
        out = dataclasses.asdict(self)
        out["times_s"] = list(self.times_s)
        out["warnings"] = list(self.warnings)
        for key in ("min_s", "median_s", "spread", "flops_per_s", "bytes_per_s",
                    "fraction_of_peak"):
            out[key] = getattr(self, key)
        return out

    def to_json(self) -> str:
        """A JSON string that :meth:`from_json` reads back into an equal result."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | dict[str, Any]) -> "BenchResult":
        data = json.loads(text) if isinstance(text, str) else dict(text)
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        kwargs["times_s"] = tuple(kwargs["times_s"])
        kwargs["warnings"] = tuple(kwargs.get("warnings", ()))
        return cls(**kwargs)


# --------------------------------------------------------------------------------------
# benchmark
# --------------------------------------------------------------------------------------

def block(tree: Any) -> Any:
    """Wait until every array in ``tree`` (any pytree) is computed; return ``tree``."""
    import jax

    for leaf in jax.tree_util.tree_leaves(tree):
        wait = getattr(leaf, "block_until_ready", None)
        if wait is not None:
            wait()
    return tree


def _device_of(args: Any) -> Any:
    import jax

    for leaf in jax.tree_util.tree_leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and getattr(sharding, "device_set", None):
            return sorted(sharding.device_set, key=lambda d: d.id)[0]
    return jax.devices()[0]


def device_peak(chip: hardware.Chip | None, peak: str = "bf16") -> tuple[float | None, str]:
    """The peak FLOP/s one JAX device of ``chip`` can reach for ``peak`` (a dtype name),
    and a label saying which peak that is.

    The chip's peak divided by its devices per chip (v2, v3, 7x: 2). A chip without a
    bf16 peak (the T4: XLA computes bf16 in fp32) is compared with its fp32 peak, and the
    label says so. ``(None, ...)`` when the table has no such peak.

    >>> from tpu_course import hardware
    >>> device_peak(hardware.get("7x"))
    (1153500000000000.0, 'bf16 dense, one of 2 devices per chip (chip peak / 2)')
    >>> device_peak(hardware.get("t4"))
    (8100000000000.0, 'fp32: NVIDIA T4 has no bf16, XLA computes it in fp32')
    """
    if chip is None:
        return None, "unknown"
    errors.check_choice("peak", peak, hardware.DTYPES)
    dtype, name = peak, ("bf16 dense" if peak == "bf16" else peak)
    if peak == "bf16" and chip.peak_bf16_flops_per_s is None:
        dtype, name = "fp32", f"fp32: {chip.display_name} has no bf16, XLA computes it in fp32"
    try:
        value = chip.peak_flops_per_device(dtype)
    except ValueError:
        return None, f"{peak}: none published"
    if chip.devices_per_chip > 1:
        name += (f", one of {chip.devices_per_chip} devices per chip "
                 f"(chip peak / {chip.devices_per_chip})")
    return value, name


def benchmark(fn: Callable, *args: Any, warmup: int = 2, repeats: int = 10,
              min_time: float = 0.2, number: int | None = None, name: str | None = None,
              flops: float | None = None, bytes_accessed: float | None = None,
              peak: str = "bf16", max_time: float = 30.0, warn: bool = True,
              **kwargs: Any) -> BenchResult:
    """Time ``fn(*args, **kwargs)`` correctly; see the module docstring for how.

    Args:
        fn: a jitted function (compile time is then measured apart), or any callable
            (timed as it is, op by op; ``compile_time_s`` is then ``None``).
        warmup: untimed calls after compiling (at least 1 is always made).
        repeats: the least number of timed samples.
        min_time: keep sampling until this many seconds have been timed (capped by
            ``max_time``).
        number: calls per sample; ``None`` picks it so a sample lasts about
            ``TARGET_SAMPLE_S``. Per-run times are sample time / ``number``.
        flops, bytes_accessed: per-call counts to use instead of XLA's cost analysis.
        peak: ``'bf16'`` (dense bf16 peak, default), ``'fp16'`` or ``'fp32'``; always
            one device's share of the chip's peak (:func:`device_peak`).
        warn: issue a :class:`BenchmarkWarning` for a recompile or a large spread.

    Returns:
        A :class:`BenchResult`.
    """
    import jax

    from tpu_course.hlo import normalise_cost

    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    compile_counts()  # start listening before anything compiles
    label = name or getattr(getattr(fn, "__wrapped__", fn), "__name__", type(fn).__name__)

    compile_time_s = None
    cost: dict[str, float] = {}
    if hasattr(fn, "lower"):
        start = time.perf_counter()
        compiled = fn.lower(*args, **kwargs).compile()
        compile_time_s = time.perf_counter() - start
        cost = normalise_cost(compiled.cost_analysis())
    elif flops is None or bytes_accessed is None:
        try:  # the same maths, jitted, only for its cost analysis
            cost = normalise_cost(jax.jit(fn).lower(*args, **kwargs).compile().cost_analysis())
        except Exception:  # noqa: BLE001 - a function that cannot be jitted: no counts
            cost = {}

    start = time.perf_counter()
    block(fn(*args, **kwargs))
    first_call_s = time.perf_counter() - start
    for _ in range(max(warmup - 1, 0)):
        block(fn(*args, **kwargs))

    if number is None:
        number = max(1, min(1000, int(TARGET_SAMPLE_S / max(first_call_s, 1e-7))))
        # first_call_s may still hold one-off costs: check with one timed sample
        start = time.perf_counter()
        block([fn(*args, **kwargs) for _ in range(number)])
        per_call = (time.perf_counter() - start) / number
        number = max(1, min(10_000, int(TARGET_SAMPLE_S / max(per_call, 1e-7))))

    before = compile_counts()
    times: list[float] = []
    spent = 0.0
    while len(times) < repeats or (spent < min_time and spent < max_time):
        start = time.perf_counter()
        outs = [fn(*args, **kwargs) for _ in range(number)]
        block(outs)
        elapsed = time.perf_counter() - start
        del outs
        times.append(elapsed / number)
        spent += elapsed
    after = compile_counts()
    recompilations = max(after["compiles"] - before["compiles"], after["traces"] - before["traces"])

    device = _device_of(args)
    platform = device.platform if device.platform in ("tpu", "cpu") else "gpu"
    chip = hardware.lookup(device.device_kind) if platform != "cpu" else None
    peak_flops, peak_name = device_peak(chip, peak)
    notes = []
    if recompilations:
        notes.append(
            f"{recompilations} compilation(s) happened during the timed samples: those "
            "samples timed the compiler. Look for arguments whose shape, dtype or static "
            "value changes between calls, or a jax.jit created inside the function.")
    result = BenchResult(
        name=label, times_s=tuple(times), number=number, compile_time_s=compile_time_s,
        first_call_s=first_call_s, warmup=max(warmup, 1),
        flops=flops if flops is not None else cost.get("flops"),
        bytes_accessed=bytes_accessed if bytes_accessed is not None else cost.get("bytes accessed"),
        platform=platform, device_kind=device.device_kind, chip=chip.name if chip else None,
        peak_flops_per_s=peak_flops, peak_name=peak_name, recompilations=recompilations,
        jax_version=jax.__version__,
    )
    if result.spread > SPREAD_WARN:
        notes.append(f"spread {result.spread:.0%} is above {SPREAD_WARN:.0%}: the machine is "
                     "busy or the run too short; raise repeats/min_time before trusting it.")
    if notes:
        result = dataclasses.replace(result, warnings=tuple(notes))
        if warn:
            for note in notes:
                # Python prints the file and line first: the note starts below them.
                text = textwrap.fill(note, 88, initial_indent="  ", subsequent_indent="  ")
                warnings.warn(f"benchmark {label!r}:\n{text}", BenchmarkWarning, stacklevel=2)
    return result


def compare(baseline: BenchResult, other: BenchResult) -> float:
    """Speed-up of ``other`` over ``baseline``: baseline median / other median."""
    return baseline.median_s / other.median_s
