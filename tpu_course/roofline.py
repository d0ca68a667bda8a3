"""The roofline model: how fast a kernel can possibly run on a chip.

A kernel that does ``F`` floating-point operations and moves ``B`` bytes between HBM and
the chip has *arithmetic intensity* ``I = F / B`` (FLOP per byte). A chip with peak
compute ``P`` (FLOP/s) and memory bandwidth ``W`` (bytes/s) can run it no faster than

    attainable(I) = min(P, I * W)          (Williams, Waterman, Patterson, CACM 2009)

so its time is at least ``max(F / P, B / W)``. The two roofs meet at the *ridge point*
``I* = P / W`` (the chip's critical intensity): below it the kernel is memory-bound,
above it compute-bound. Chip numbers come from :mod:`tpu_course.hardware`, with their
source tags. This module is pure (NumPy; Matplotlib only inside :func:`plot`).

Worked numbers (TPU v5e: 197 TFLOP/s bf16, 819 GB/s HBM, source S5):

>>> from tpu_course import hardware
>>> v5e = hardware.get("v5e")
>>> round(ridge_point(v5e), 1)
240.5
>>> matmul_intensity(4096, 4096, 4096, bytes_per_element=2)  # n / 3 for a square bf16 matmul
1365.3333333333333
>>> bound(matmul_intensity(128, 8192, 8192), v5e)  # a 128-token batch: memory-bound
'memory'
>>> round(estimate(2 * 8192**3, 3 * 8192**2 * 2, v5e).time_s * 1e3, 2)  # 8192^3 bf16, ms
5.58
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any, Iterable, Sequence

from tpu_course import errors, hardware


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved: ``flops / bytes_moved``.

    >>> arithmetic_intensity(2e9, 1e9)
    2.0
    """
    flops = errors.check_number("flops", flops, low=0)
    bytes_moved = errors.check_number("bytes_moved", bytes_moved, low=0, low_open=True)
    return flops / bytes_moved


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an ``[m,k] @ [k,n]`` matmul: ``2 * m * k * n`` (a multiply and an add
    per term).

    >>> matmul_flops(2, 3, 4)
    48
    """
    m, k, n = (errors.check_int(name, v, low=1) for name, v in (("m", m), ("k", k), ("n", n)))
    return 2 * m * k * n


def matmul_bytes(m: int, k: int, n: int, bytes_per_element: float = 2) -> float:
    """HBM bytes of an ``[m,k] @ [k,n]`` matmul when each operand is read once and the
    result written once: ``(m*k + k*n + m*n) * bytes_per_element`` (a lower bound).

    >>> matmul_bytes(2, 3, 4, bytes_per_element=4)
    104
    """
    m, k, n = (errors.check_int(name, v, low=1) for name, v in (("m", m), ("k", k), ("n", n)))
    errors.check_number("bytes_per_element", bytes_per_element, low=0, low_open=True)
    return (m * k + k * n + m * n) * bytes_per_element


def matmul_intensity(m: int, k: int, n: int, bytes_per_element: float = 2) -> float:
    """Arithmetic intensity of a matmul: :func:`matmul_flops` / :func:`matmul_bytes`."""
    return matmul_flops(m, k, n) / matmul_bytes(m, k, n, bytes_per_element)


def elementwise_intensity(flops_per_element: float = 1, inputs: int = 1, outputs: int = 1,
                          bytes_per_element: float = 4) -> float:
    """Intensity of an elementwise op: ``flops_per_element / ((inputs + outputs) *
    bytes_per_element)``. ``x + y`` in fp32 is 1 / 12 FLOP per byte.

    >>> round(elementwise_intensity(1, inputs=2), 4)
    0.0833
    """
    errors.check_number("flops_per_element", flops_per_element, low=0)
    errors.check_int("inputs", inputs, low=0)
    errors.check_int("outputs", outputs, low=0)
    errors.check_number("bytes_per_element", bytes_per_element, low=0, low_open=True)
    if inputs + outputs == 0:
        raise errors.CourseValueError("inputs=0 and outputs=0: an elementwise op moves at "
                                      "least one array; give inputs >= 1 or outputs >= 1.")
    return flops_per_element / ((inputs + outputs) * bytes_per_element)


def _peak(chip: hardware.Chip | str, dtype: str) -> float:
    chip = hardware.as_chip(chip)
    try:
        return chip.peak_flops(dtype)
    except ValueError as err:
        hint = (" TPUs publish bf16 peaks only (they run fp32 matmuls as several bf16 passes)."
                if chip.kind == "tpu" else "")
        raise errors.CourseValueError(f"{err}; pass one of those as dtype=.{hint}") from None


def critical_intensity(chip: hardware.Chip | str, dtype: str = "bf16") -> float:
    """The intensity where the memory roof meets the compute roof: peak / bandwidth
    (FLOP per byte), :meth:`tpu_course.hardware.Chip.critical_intensity` with a hint when
    the chip has no such peak."""
    _peak(chip, dtype)  # refuses a missing peak with the roofline's hint
    return hardware.as_chip(chip).critical_intensity(dtype)


#: The roofline's name for the chip's critical intensity: one function, two names.
ridge_point = critical_intensity


def attainable_flops_per_s(intensity: float, chip: hardware.Chip, dtype: str = "bf16") -> float:
    """The roofline: ``min(peak, intensity * hbm_bytes_per_s)`` in FLOP/s.

    >>> v5e = hardware.get("v5e")
    >>> attainable_flops_per_s(10, v5e) / 1e12  # memory-bound: 10 * 819e9
    8.19
    >>> attainable_flops_per_s(1000, v5e) / 1e12  # compute-bound: the peak
    197.0
    """
    intensity = errors.check_number("intensity", intensity, low=0)
    peak = _peak(chip, dtype)
    return min(peak, intensity * hardware.as_chip(chip).hbm_bytes_per_s)


def bound(intensity: float, chip: hardware.Chip, dtype: str = "bf16") -> str:
    """``'memory'`` below the ridge point, ``'compute'`` at or above it."""
    intensity = errors.check_number("intensity", intensity, low=0)
    return "memory" if intensity < ridge_point(chip, dtype) else "compute"


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A kernel placed on a chip's roofline (times in seconds, rates per second)."""

    chip: str
    flops: float
    bytes_moved: float
    intensity: float
    ridge: float
    bound: str  # 'memory' or 'compute'
    attainable_flops_per_s: float
    time_s: float  # max(flops / peak, bytes / bandwidth): the fastest it can run
    compute_time_s: float
    memory_time_s: float

    def __str__(self) -> str:
        return (f"{self.chip}: intensity {self.intensity:,.1f} FLOP/B vs ridge {self.ridge:,.1f} "
                f"-> {self.bound}-bound; at best {self.attainable_flops_per_s / 1e12:,.2f} TFLOP/s, "
                f"{self.time_s * 1e6:,.1f} us")

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(str(self))}</code>"


def estimate(flops: float, bytes_moved: float, chip: hardware.Chip, dtype: str = "bf16") -> Estimate:
    """Place a kernel of ``flops`` and ``bytes_moved`` on ``chip``'s roofline."""
    peak = _peak(chip, dtype)
    chip = hardware.as_chip(chip)
    ai = arithmetic_intensity(flops, bytes_moved)
    compute_s, memory_s = flops / peak, bytes_moved / chip.hbm_bytes_per_s
    return Estimate(chip.name, flops, bytes_moved, ai, ridge_point(chip, dtype),
                    bound(ai, chip, dtype), attainable_flops_per_s(ai, chip, dtype),
                    max(compute_s, memory_s), compute_s, memory_s)


@dataclasses.dataclass(frozen=True)
class Point:
    """A kernel to draw on a roofline: its intensity and (measured or predicted) rate."""

    label: str
    intensity: float
    flops_per_s: float
    measured: bool = True  # filled marker when measured, hollow when predicted


def plot(chip: hardware.Chip, points: Iterable[Point | Sequence[Any]] = (), dtype: str = "bf16",
         ax: Any = None, intensity_range: tuple[float, float] | None = None) -> Any:
    """Draw ``chip``'s roofline (log-log) and the ``points`` on it; return the Axes.

    The memory roof and the compute roof are labelled with the chip's numbers and the
    source tags from :mod:`tpu_course.hardware`; the ridge point is marked. ``points``
    are :class:`Point` or ``(label, intensity, flops_per_s[, measured])`` tuples.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    pts = [p if isinstance(p, Point) else Point(*p) for p in points]
    peak, bw = _peak(chip, dtype), chip.hbm_bytes_per_s
    ridge = peak / bw
    lo, hi = intensity_range or (
        min([ridge / 1000] + [p.intensity / 2 for p in pts]),
        max([ridge * 30] + [p.intensity * 2 for p in pts]))
    x = np.geomspace(lo, hi, 200)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    src_bw = chip.sources.get("hbm_bytes_per_s", "?")
    src_peak = chip.sources.get(f"peak_{dtype}_flops_per_s", "?")
    ax.loglog(x, np.minimum(peak, x * bw) / 1e12, color="black", lw=2)
    ax.loglog(x[x < ridge], x[x < ridge] * bw / 1e12, color="tab:blue", lw=2,
              label=f"memory roof: HBM {bw / 1e9:,.0f} GB/s [{src_bw}]")
    ax.axhline(peak / 1e12, color="tab:red", lw=1, ls="--",
               label=f"compute roof: {peak / 1e12:,.0f} TFLOP/s {dtype} [{src_peak}]")
    ax.axvline(ridge, color="grey", lw=1, ls=":", label=f"ridge point: {ridge:,.0f} FLOP/byte")
    for p in pts:
        ax.loglog([p.intensity], [p.flops_per_s / 1e12], "o", ms=7,
                  mfc=None if p.measured else "none")
        # vertical labels hanging below their point: neighbours a factor of 2 apart
        # (matmul 1024, 2048, ... on the flat roof) no longer overlap
        ax.annotate(p.label, (p.intensity, p.flops_per_s / 1e12), textcoords="offset points",
                    xytext=(0, -8), fontsize=8, rotation=90, ha="center", va="top")
    if pts:  # room below the lowest point for its hanging label (about a decade and a half)
        low = min(p.flops_per_s for p in pts) / 1e12 / 10**1.6
        ax.set_ylim(bottom=min(ax.get_ylim()[0], low))
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Roofline of {chip.display_name}")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    return ax
