"""Checkers for lab 4: predict, compile, measure.

The learner predicts a number (FLOPs, bytes, intensity, which roof binds, the bytes a
TPU-compiled program holds, a time) and each checker grades it against the analytic
model, XLA's cost or memory analysis and, where the runtime allows, a measurement from
:mod:`tpu_course.bench`; when two references disagree the message says why.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from tpu_course import hardware, roofline
from tpu_course.checks._core import CheckResult, close_enough, fail, ok

ITEMSIZE = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4,
            "f32": 4, "int8": 1, "s8": 1}


def _number(exercise: str, value: Any) -> float | CheckResult:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return fail(exercise, f"expected a number, got {value!r} ({type(value).__name__})")
    if math.isnan(x):
        return fail(exercise, "got NaN: compute a number")
    return x


def _itemsize(dtype: str) -> int:
    key = str(dtype).replace("jnp.", "").replace("<class '", "").lower()
    for name, size in ITEMSIZE.items():
        if name in key:
            return size
    raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(ITEMSIZE)}")


def check_matmul_flops(predicted: Any, m: int, k: int, n: int, xla_flops: float | None = None,
                       ) -> CheckResult:
    """FLOPs of an ``[m,k] @ [k,n]`` matmul: ``2*m*k*n``, and XLA's count when given."""
    ex = f"FLOPs of a [{m},{k}] @ [{k},{n}] matmul"
    got = _number(ex, predicted)
    if isinstance(got, CheckResult):
        return got
    want = roofline.matmul_flops(m, k, n)
    xla = "" if xla_flops is None else f"; XLA's cost analysis says {xla_flops:,.0f}"
    if close_enough(got, want, 1e-6):
        return ok(ex, f"{want:,} = 2*m*k*n{xla}")
    if close_enough(got, want / 2, 1e-6):
        return fail(ex, f"you gave {got:,.0f}, which is m*k*n: that counts multiply-adds. "
                        f"Each is two FLOPs (a multiply and an add): expected {want:,}.")
    return fail(ex, f"expected {want:,} (2*m*k*n: each of the m*n outputs is a sum of k "
                    f"products, a multiply and an add each), got {got:,.0f}{xla}")


def check_matmul_bytes(predicted: Any, m: int, k: int, n: int, dtype: str = "bf16") -> CheckResult:
    """HBM bytes of a matmul reading each operand once and writing the result once."""
    ex = f"bytes moved by a {dtype} [{m},{k}] @ [{k},{n}] matmul"
    got = _number(ex, predicted)
    if isinstance(got, CheckResult):
        return got
    size = _itemsize(dtype)
    want = roofline.matmul_bytes(m, k, n, size)
    if close_enough(got, want, 1e-6):
        return ok(ex, f"{want:,} = (m*k + k*n + m*n) * {size} bytes")
    if close_enough(got, (m * k + k * n) * size, 1e-6):
        return fail(ex, f"you counted the two inputs but not the output (m*n*{size} bytes "
                        f"written back): expected {want:,}")
    for other in (1, 2, 4, 8):
        if other != size and close_enough(got, roofline.matmul_bytes(m, k, n, other), 1e-6):
            return fail(ex, f"that is the count for {other}-byte elements; {dtype} has "
                            f"{size} bytes per element: expected {want:,}")
    return fail(ex, f"expected {want:,} ((m*k + k*n + m*n) elements of {size} bytes), "
                    f"got {got:,.0f}")


def check_intensity(predicted: Any, m: int, k: int, n: int, dtype: str = "bf16",
                    rel: float = 0.02) -> CheckResult:
    """Arithmetic intensity of a matmul, FLOP per byte, within ``rel``."""
    ex = f"arithmetic intensity of a {dtype} [{m},{k}] @ [{k},{n}] matmul"
    got = _number(ex, predicted)
    if isinstance(got, CheckResult):
        return got
    want = roofline.matmul_intensity(m, k, n, _itemsize(dtype))
    if close_enough(got, want, rel):
        return ok(ex, f"{want:,.1f} FLOP/byte (within {rel:.0%})")
    if close_enough(got, 1 / want, rel):
        return fail(ex, f"you gave bytes per FLOP; intensity is FLOPs / bytes = {want:,.1f}")
    return fail(ex, f"expected {want:,.1f} FLOP/byte = 2mkn / ((mk+kn+mn) * itemsize), "
                    f"got {got:,.1f}")


def check_bound(predicted: Any, intensity: float, chip: str = "v5e") -> CheckResult:
    """Which roof binds a kernel of ``intensity`` on ``chip``: 'memory' or 'compute'."""
    spec = hardware.get(chip)
    ex = f"which roof binds at {intensity:,.1f} FLOP/byte on {spec.display_name}"
    answer = str(predicted).strip().lower().replace("-bound", "").replace(" bound", "")
    if answer not in ("memory", "compute"):
        return fail(ex, f"answer 'memory' or 'compute', got {predicted!r}")
    ridge = roofline.ridge_point(spec)
    want = roofline.bound(intensity, spec)
    why = (f"the ridge point is {hardware.peak_flops_per_s(spec) / 1e12:,.0f} TFLOP/s / "
           f"{spec.hbm_bytes_per_s / 1e9:,.0f} GB/s = {ridge:,.0f} FLOP/byte, and "
           f"{intensity:,.1f} is {'below' if want == 'memory' else 'above'} it")
    if answer == want:
        return ok(ex, f"{want}-bound: {why}")
    return fail(ex, f"not {answer}-bound: {why}, so it is {want}-bound")


def check_roofline_time(predicted_s: Any, flops: float, bytes_moved: float, chip: str = "v5e",
                        rel: float = 0.05) -> CheckResult:
    """The roofline's lower bound on time: ``max(flops / peak, bytes / bandwidth)``."""
    spec = hardware.get(chip)
    ex = f"fastest possible time on {spec.display_name}"
    got = _number(ex, predicted_s)
    if isinstance(got, CheckResult):
        return got
    e = roofline.estimate(flops, bytes_moved, spec)
    if close_enough(got, e.time_s, rel):
        return ok(ex, f"{e.time_s * 1e6:,.2f} us ({e.bound}-bound)")
    if close_enough(got, e.compute_time_s + e.memory_time_s, rel):
        return fail(ex, "you added the compute and memory times; on the roofline they overlap, "
                        f"so the bound is the larger one: {e.time_s * 1e6:,.2f} us")
    other = e.memory_time_s if e.bound == "compute" else e.compute_time_s
    if close_enough(got, other, rel):
        return fail(ex, f"that is the {'memory' if e.bound == 'compute' else 'compute'} time; "
                        f"the {e.bound} time is larger and binds: {e.time_s * 1e6:,.2f} us")
    return fail(ex, f"expected {e.time_s * 1e6:,.2f} us = max(FLOPs / peak, bytes / bandwidth) "
                    f"= max({e.compute_time_s * 1e6:,.2f}, {e.memory_time_s * 1e6:,.2f}) us, "
                    f"got {got * 1e6:,.2f} us")


def check_xla_flops(predicted: Any, fn: Callable, *args: Any, rel: float = 0.05) -> CheckResult:
    """A hand count of ``fn``'s FLOPs against XLA's cost analysis, within ``rel``."""
    from tpu_course import hlo

    name = getattr(fn, "__name__", "fn")
    ex = f"FLOPs of {name} by hand vs XLA"
    got = _number(ex, predicted)
    if isinstance(got, CheckResult):
        return got
    xla = hlo.inspect(fn, *args).flops
    if xla is None:
        return ok(ex, "this backend reports no FLOP count; your count could not be compared")
    if close_enough(got, xla, rel):
        gap = "" if got == xla else (
            f" The {abs(xla - got):,.0f}-FLOP gap is the elementwise work (bias add, "
            "activation: about one FLOP per element) beside the matmul's 2*m*k*n.")
        return ok(ex, f"XLA counts {xla:,.0f}; you said {got:,.0f} (within {rel:.0%}).{gap}")
    hint = " (counted multiply-adds? each is 2 FLOPs)" if close_enough(got * 2, xla, rel) else ""
    return fail(ex, f"XLA's cost analysis counts {xla:,.0f}, you said {got:,.0f}{hint}")


def tpu_padded_bytes(shape: Sequence[int], dtype: str = "fp32") -> int:
    """Bytes of a row-major array in the TPU's tiled HBM layout: the last dim padded to a
    multiple of 128 lanes, the one before to a multiple of 8 sublanes (layout
    ``T(8,128)``; bf16 packs pairs of rows in a tile as ``(2,1)``, the same padding).
    A model for 2-D arrays in the layout XLA picks for them; 1-D and other ranks get
    other tilings (read the HLO).

    >>> tpu_padded_bytes((100, 100), "fp32")  # 104 x 128 x 4
    53248
    """
    if len(shape) < 2:
        raise ValueError("the T(8,128) model is for arrays of rank 2 or more")
    *lead, rows, cols = shape
    return math.prod(lead) * (-(-rows // 8) * 8) * (-(-cols // 128) * 128) * _itemsize(dtype)


def check_padded_bytes(predicted: Any, shape: Sequence[int], dtype: str = "fp32",
                       target: str = "v5e:1x1") -> CheckResult:
    """The HBM bytes of one ``shape`` array on a TPU, graded against the TPU compiler's
    memory analysis (compile-only, when the aot extra is installed) or the tiling model."""
    from tpu_course import hlo

    ex = f"TPU bytes of a {dtype}{list(shape)} array"
    got = _number(ex, predicted)
    if isinstance(got, CheckResult):
        return got
    logical = math.prod(shape) * _itemsize(dtype)
    want = tpu_padded_bytes(shape, dtype)
    source = "the T(8,128) tiling model (install the aot extra to grade against the TPU compiler)"
    if hlo.compile_only_available(target):
        import jax
        import jax.numpy as jnp

        jdtype = jnp.bfloat16 if _itemsize(dtype) == 2 else jnp.float32
        report = hlo.inspect(lambda x: x + 1, jax.ShapeDtypeStruct(tuple(shape), jdtype),
                             target=target)
        want, source = report.argument_bytes, f"the TPU compiler's memory analysis ({target})"
    if close_enough(got, want, 1e-6):
        pad = "" if want == logical else f" ({want / logical:.2f}x the {logical:,} logical bytes)"
        return ok(ex, f"{want:,} bytes{pad}, per {source}")
    if close_enough(got, logical, 1e-6):
        return fail(ex, f"{logical:,} is the logical size; on a TPU the array is stored in "
                        f"(8,128) tiles, so the last dim pads to a multiple of 128 and the one "
                        f"before to a multiple of 8: {want:,} bytes per {source}")
    return fail(ex, f"expected {want:,} bytes per {source}, got {got:,.0f}")


def check_timing(measured_s: Any, fn: Callable, *args: Any, slack: float = 3.0) -> CheckResult:
    """A hand-made timing of ``fn(*args)`` against :func:`tpu_course.bench.benchmark`.

    Passes within a factor ``slack`` of the harness's median (a shared CPU is noisy);
    a much smaller time means the device work was not waited for, a much larger one
    that the compile or a cold first call was timed.
    """
    from tpu_course import bench

    ex = "your timing vs the harness"
    got = _number(ex, measured_s)
    if isinstance(got, CheckResult):
        return got
    r = bench.benchmark(fn, *args, repeats=5, min_time=0.05, warn=False)
    ref = r.median_s
    where = f"(harness median {ref * 1e3:,.3f} ms on {r.platform.upper()} {r.device_kind})"
    if got <= 0:
        return fail(ex, f"a time must be positive, got {got!r}")
    if got < ref / slack:
        return fail(ex, f"{got * 1e3:,.3f} ms is {ref / got:,.1f}x faster than the harness "
                        f"{where}: you timed the dispatch, not the work. JAX returns before "
                        "the device finishes; call .block_until_ready() on the result.")
    if got > ref * slack:
        compile_hint = "" if r.compile_time_s is None else f" (compiling takes {r.compile_time_s:,.3f} s)"
        return fail(ex, f"{got * 1e3:,.3f} ms is {got / ref:,.1f}x slower than the harness "
                        f"{where}: you probably timed the first call, which traces and "
                        f"compiles{compile_hint}. Warm up first, then time.")
    return ok(ex, f"{got * 1e3:,.3f} ms, within {slack:g}x of the harness {where}")
