"""Checkers for lab 4: predict, compile, measure.

The learner predicts a number (FLOPs, bytes, intensity, which roof binds, the bytes a
TPU-compiled program holds, a time) and each checker grades it against the analytic
model, XLA's cost or memory analysis and, where the runtime allows, a measurement from
:mod:`tpu_course.bench`; when two references disagree the message says why. The course's
own answers live in :mod:`tpu_course.checks._answers.ch04`; an answer that is, or calls,
one of them or the package helper that computes the same number (``roofline.bound``,
``roofline.matmul_intensity``, ``hlo.inspect`` where the exercise asks for a prediction)
is refused. Function answers are also checked on inputs the notebook does not show
(other shapes, itemsizes and chips) when the grader passes a seed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tpu_course import hardware, roofline
from tpu_course.checks._answers import ch04 as reference
from tpu_course.checks._core import (
    CheckResult,
    Lab,
    as_number,
    close_enough,
    ok,
    refuse,
    refuse_course_code,
)

LAB = Lab(4, "Inside the TPU: what jit produces")

EX1 = "Exercise 1 (matmul FLOPs)"
EX2 = "Exercise 2 (matmul bytes)"
EX3 = "Exercise 3 (intensity and the binding roof)"
EX4 = "Exercise 4 (roofline time)"
EX5 = "Exercise 5 (a layer by hand, against XLA)"
EX6 = "Exercise 6 (TPU padded bytes)"
EX7 = "Exercise 7 (layer norm on a v5e)"

#: Exercise 1's and 2's matmul, and Exercise 3's and 4's layer (batch 384, 4096 x 4096).
MATMUL = (256, 512, 384)
LAYER = (384, 4096, 4096)
#: Exercise 7: layer norm over the last axis of a bf16 [tokens, features] array.
LN_SHAPE = (4096, 1024)
LN_TARGET = "v5e:2x2"

ITEMSIZE = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4,
            "f32": 4, "int8": 1, "s8": 1}


def _itemsize(dtype: str) -> int:
    key = str(dtype).replace("jnp.", "").replace("<class '", "").lower()
    for name, size in ITEMSIZE.items():
        if name in key:
            return size
    raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(ITEMSIZE)}")


def _shape(rng: np.random.Generator, low: int = 3, high: int = 3000) -> tuple[int, int, int]:
    m, k, n = (int(v) for v in rng.integers(low, high, 3))
    return m, k + 1 if k in (m, n) else k, n + 2 if n == m else n


def _hidden_matmul(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    return [("other matmul shapes, with m, k and n all different",
             {"shapes": (_shape(rng), _shape(rng, 1, 64))})]


@LAB.exercise(EX1, minutes=5, kind="write", hidden=_hidden_matmul)
def check_matmul_flops(matmul_flops: Callable[[int, int, int], Any],
                       shapes: Sequence[tuple[int, int, int]] = (MATMUL, (3, 5, 7))
                       ) -> CheckResult:
    """FLOPs of an ``[m,k] @ [k,n]`` matmul: ``2*m*k*n``, set beside XLA's count."""
    import jax
    import jax.numpy as jnp

    from tpu_course import hlo

    refuse_course_code(EX1, matmul_flops, reference.matmul_flops, roofline.matmul_flops,
                       hlo.inspect)
    for m, k, n in shapes:
        got = as_number(EX1, matmul_flops(m, k, n), f"matmul_flops({m}, {k}, {n})")
        want = 2 * m * k * n
        answer = f"[{m},{k}] @ [{k},{n}]: {want:,} FLOPs"
        if close_enough(got, want, 1e-9):
            continue
        if close_enough(got, want / 2, 1e-9):
            refuse(EX1, f"for [{m},{k}] @ [{k},{n}] you counted multiply-adds",
                   hint="each multiply-add is two FLOPs", answer=answer)
        refuse(EX1, f"for [{m},{k}] @ [{k},{n}] your count is {got / want:.3g}x the right one",
               hint="each of the m*n outputs is a sum of k products", answer=answer)
    m, k, n = MATMUL
    xla = hlo.inspect(jnp.matmul, jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                      jax.ShapeDtypeStruct((k, n), jnp.bfloat16)).flops
    said = "" if xla is None else f"; XLA's cost analysis on this runtime says {xla:,.0f}"
    return ok(EX1, f"{roofline.matmul_flops(m, k, n):,} = 2*m*k*n for {m}x{k} @ {k}x{n}{said}")


def _hidden_bytes(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    return [("another matmul shape with 1-byte (int8) and 8-byte (float64) elements",
             {"shape": _shape(rng), "itemsizes": (1, 8)})]


@LAB.exercise(EX2, minutes=5, kind="write", hidden=_hidden_bytes)
def check_matmul_bytes(matmul_bytes: Callable[[int, int, int, int], Any],
                       shape: tuple[int, int, int] = MATMUL,
                       itemsizes: Sequence[int] = (2, 4)) -> CheckResult:
    """HBM bytes of a matmul reading each operand once and writing the result once."""
    refuse_course_code(EX2, matmul_bytes, reference.matmul_bytes, roofline.matmul_bytes)
    m, k, n = shape
    elements = m * k + k * n + m * n
    for size in itemsizes:
        got = as_number(EX2, matmul_bytes(m, k, n, size), f"matmul_bytes({m}, {k}, {n}, {size})")
        want = elements * size
        answer = f"[{m},{k}] @ [{k},{n}] with {size}-byte elements: {want:,} bytes"
        if close_enough(got, want, 1e-9):
            continue
        if close_enough(got, (m * k + k * n) * size, 1e-9):
            refuse(EX2, "you counted the two inputs but not the output",
                   hint="the m*n result is written back to HBM too", answer=answer)
        if close_enough(got, elements, 1e-9):
            refuse(EX2, "you counted elements, not bytes", hint="multiply by itemsize",
                   answer=answer)
        for other in (1, 2, 4, 8):
            if other != size and close_enough(got, elements * other, 1e-9):
                refuse(EX2, f"with itemsize={size} you counted {other}-byte elements",
                       hint="multiply the element count by itemsize, the argument, not a "
                            "number you typed", answer=answer)
        refuse(EX2, f"with itemsize={size} your count is {got / want:.3g}x the right one",
               hint="each input is read once, the output written once", answer=answer)
    return ok(EX2, f"(m*k + k*n + m*n) * itemsize: {elements * itemsizes[0]:,} bytes with "
                   f"{itemsizes[0]}-byte elements")


_ROOF_CHIPS = ("v4", "v5p", "v6e", "7x", "h100", "a100", "v3")


def _roof_text(got: Any) -> str:
    return str(got).strip().lower().replace("-bound", "").replace(" bound", "")


def _hidden_roofs(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    chips = tuple(str(c) for c in rng.choice(_ROOF_CHIPS, 2, replace=False))
    return [("another layer in float32 on other chips",
             {"shape": _shape(rng, 8, 6000), "itemsize": 4, "chips": chips}),
            ("a small-batch layer in int8 on another chip",
             {"shape": (int(rng.integers(1, 16)), *_shape(rng, 512, 8192)[1:]), "itemsize": 1,
              "chips": chips[:1]})]


@LAB.exercise(EX3, minutes=10, kind="write", hidden=_hidden_roofs)
def check_roofs(intensity: Callable[..., Any], which_roof: Callable[..., Any],
                shape: tuple[int, int, int] = LAYER, itemsize: int = 2,
                chips: Sequence[str] = ("v5e", "v6e")) -> CheckResult:
    """Exercise 3: ``intensity(m, k, n, itemsize)`` within 2 %, and ``which_roof(ai, chip)``
    ('memory' or 'compute') for :data:`LAYER` in bf16 on a v5e and a v6e (and on each chip
    for a tiny and a huge intensity, and just either side of its ridge point)."""
    refuse_course_code(EX3, intensity, reference.intensity, roofline.matmul_intensity,
                       roofline.arithmetic_intensity, roofline.matmul_flops,
                       roofline.matmul_bytes, roofline.estimate)
    refuse_course_code(EX3, which_roof, reference.which_roof, roofline.bound,
                       roofline.ridge_point, roofline.estimate, roofline.attainable_flops_per_s)
    m, k, n = shape
    ai = as_number(EX3, intensity(m, k, n, itemsize), "the intensity")
    want = 2 * m * k * n / ((m * k + k * n + m * n) * itemsize)
    answer = f"[{m},{k}] @ [{k},{n}] with {itemsize}-byte elements: {want:,.1f} FLOP/byte"
    if not close_enough(ai, want, 0.02):
        if close_enough(ai, 1 / want, 0.02):
            refuse(EX3, "that is bytes per FLOP", hint="intensity = FLOPs / bytes",
                   answer=answer)
        if close_enough(ai, want * itemsize, 0.02):
            refuse(EX3, "you divided the FLOPs by elements, not bytes",
                   hint="use itemsize: bytes = elements x itemsize", answer=answer)
        refuse(EX3, f"your intensity for the [{m},{k}] @ [{k},{n}] layer with {itemsize}-byte "
                    f"elements is {ai / want:.3g}x the right one",
               hint="your matmul_flops divided by your matmul_bytes", answer=answer)
    verdicts = []
    for chip_name in chips:
        spec = hardware.get(chip_name)
        ridge = spec.peak_bf16_flops_per_s / spec.hbm_bytes_per_s
        for x in (want, 1.0, 1e5, ridge * 0.97, ridge * 1.03):
            got = which_roof(x, spec)
            text = _roof_text(got)
            if text not in ("memory", "compute"):
                refuse(EX3, f"which_roof returned {got!r:.40}",
                       hint="return the string 'memory' or 'compute'")
            right = "memory" if x < ridge else "compute"
            if text != right:
                refuse(EX3, f"at {x:,.1f} FLOP/byte on {spec.display_name} the "
                            f"{text} roof is not the one that binds",
                       hint="compare the intensity with this chip's ridge point: its peak "
                            "FLOP/s divided by its HBM bytes/s, from the chip you are given",
                       answer=f"ridge point {ridge:,.0f} FLOP/byte: {right}-bound")
            if x == want:
                verdicts.append(f"{spec.display_name} {right}-bound (ridge {ridge:,.0f})")
    return ok(EX3, f"{want:,.1f} FLOP/byte: " + "; ".join(verdicts))


def _hidden_times(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    chips = [str(c) for c in rng.choice(_ROOF_CHIPS, 2, replace=False)]
    return [("other layers on other chips",
             {"cases": ((_shape(rng, 256, 8192), chips[0]),
                        ((int(rng.integers(1, 12)), *_shape(rng, 1024, 8192)[1:]), chips[1]))})]


@LAB.exercise(EX4, minutes=10, kind="write", hidden=_hidden_times)
def check_roofline_time(fastest_time_s: Callable[..., Any], rel: float = 0.05,
                        cases: Sequence[tuple[tuple[int, int, int], str]] = (
                            (LAYER, "v6e"), ((8, 4096, 4096), "v5e"))) -> CheckResult:
    """Exercise 4: the roofline's lower bound on time, ``max(flops / peak, bytes / bw)``,
    for :data:`LAYER` in bf16 on a v6e and a much smaller layer on a v5e."""
    refuse_course_code(EX4, fastest_time_s, reference.fastest_time_s, roofline.estimate,
                       roofline.attainable_flops_per_s)
    for shape, chip_name in cases:
        spec = hardware.get(chip_name)
        m, k, n = shape
        flops, nbytes = 2 * m * k * n, (m * k + k * n + m * n) * 2
        got = as_number(EX4, fastest_time_s(flops, nbytes, spec), "the time in seconds")
        compute_s, memory_s = flops / spec.peak_bf16_flops_per_s, nbytes / spec.hbm_bytes_per_s
        bound_s = max(compute_s, memory_s)
        answer = (f"{shape} on {spec.display_name}: max({compute_s * 1e6:,.2f}, "
                  f"{memory_s * 1e6:,.2f}) us = {bound_s * 1e6:,.2f} us")
        if close_enough(got, bound_s, rel):
            continue
        if close_enough(got, compute_s + memory_s, rel):
            refuse(EX4, "you added the compute and memory times",
                   hint="on the roofline they overlap: the bound is the larger one",
                   answer=answer)
        if close_enough(got, min(compute_s, memory_s), rel):
            refuse(EX4, f"for {shape} on {spec.display_name} that is the smaller of the two "
                        "times", hint="the larger one binds", answer=answer)
        if close_enough(got * 1e-6, bound_s, rel) or close_enough(got * 1e-3, bound_s, rel):
            refuse(EX4, "that looks like microseconds or milliseconds",
                   hint="return seconds", answer=answer)
        refuse(EX4, f"for {shape} on {spec.display_name} your time is "
                    f"{got / bound_s:.3g}x the bound",
               hint="max(FLOPs / peak FLOP/s, bytes / HBM bytes/s), with the peak and "
                    "bandwidth of the chip you are given", answer=answer)
    return ok(EX4, "max(compute time, memory time) on both chips: a batch of 384 is "
                   "compute-bound on a v6e, a batch of 8 memory-bound on a v5e")


def layer(x: Any, w: Any, b: Any) -> Any:
    """Exercise 5's layer: ``relu(x @ w + b)``."""
    import jax

    return jax.nn.relu(x @ w + b)


def xla_layer_flops(shape: tuple[int, int, int]) -> float | None:
    """XLA's FLOP count of :func:`layer` for ``(B, D, H)`` in float32 on this runtime (the
    measurement Exercise 5 shows once its prediction is recorded)."""
    import jax
    import jax.numpy as jnp

    from tpu_course import hlo

    B, D, H = shape
    S = jax.ShapeDtypeStruct
    return hlo.inspect(layer, S((B, D), jnp.float32), S((D, H), jnp.float32),
                       S((H,), jnp.float32)).flops


#: Exercise 5's layer in the notebook.
LAYER_5 = (32, 1024, 512)


def _hidden_layer(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    return [("another layer shape", {"shape": (int(rng.integers(2, 64)),
                                               int(rng.integers(200, 1500)),
                                               int(rng.integers(3, 700)))})]


@LAB.exercise(EX5, minutes=10, kind="predict", hidden=_hidden_layer)
def check_xla_flops(layer_flops: Callable[[int, int, int], Any], rel: float = 0.05,
                    shape: tuple[int, int, int] = LAYER_5) -> CheckResult:
    """Exercise 5: a hand count of :func:`layer`'s FLOPs against XLA's cost analysis on
    this runtime, within ``rel``."""
    from tpu_course import hlo

    refuse_course_code(EX5, layer_flops, reference.layer_flops, hlo.inspect, xla_layer_flops)
    B, D, H = shape
    got = as_number(EX5, layer_flops(B, D, H), f"layer_flops({B}, {D}, {H})")
    xla = xla_layer_flops(shape)
    if xla is None:
        return ok(EX5, "this backend reports no FLOP count; your count could not be compared")
    answer = f"B, D, H = {B}, {D}, {H}: XLA counts {xla:,.0f} FLOPs"
    if close_enough(got, xla, rel):
        gap = "" if got == xla else (
            f" The {abs(xla - got):,.0f}-FLOP gap is the elementwise work (bias add, "
            "activation: about one FLOP per element) beside the matmul's 2*B*D*H.")
        return ok(EX5, f"XLA counts {xla:,.0f}; you said {got:,.0f} (within {rel:.0%}).{gap}")
    if close_enough(got * 2, xla, rel):
        hint = "counted multiply-adds? each is 2 FLOPs"
    elif close_enough(got * B, xla, rel):
        hint = "that is the count for one row of x: multiply by the batch B"
    else:
        hint = "the matmul's 2*B*D*H, plus one FLOP per output element for each elementwise op"
    refuse(EX5, f"for B, D, H = {B}, {D}, {H} your count is {got / xla:.3g}x XLA's",
           hint=hint, answer=answer)


def _hidden_padded(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    def row_major_is_smallest(rows: int, cols: int) -> bool:
        # XLA lays a parameter out the way that pads least; the row-major T(8,128) model
        # is the exercise, so draw shapes where that is the layout XLA picks
        return (reference.tpu_padded_bytes((rows, cols))
                < reference.tpu_padded_bytes((cols, rows)))

    rows, cols = 100, 100
    for _ in range(100):
        rows, cols = (int(v) for v in rng.integers(9, 700, 2))
        if row_major_is_smallest(rows, cols):
            break
    short = (int(rng.integers(9, 64)), cols + 129)
    return [("other 2-D shapes", {"cases": ((rows, cols), short)}),
            ("a bf16 array", {"cases": ((rows + 3, 127),), "dtype": "bf16"})]


@LAB.exercise(EX6, minutes=10, kind="transfer", hidden=_hidden_padded)
def check_padded_bytes(tpu_bytes: Callable[[int, int, int], Any],
                       cases: Sequence[tuple[int, int]] = ((100, 100), (129, 128), (8, 1000)),
                       dtype: str = "fp32", target: str = "v5e:1x1") -> CheckResult:
    """Exercise 6: the HBM bytes of 2-D arrays on a TPU, graded against the TPU compiler's
    memory analysis (compile-only, when available) or the T(8,128) tiling model."""
    from tpu_course import hlo

    refuse_course_code(EX6, tpu_bytes, reference.tpu_bytes, reference.tpu_padded_bytes,
                       hlo.inspect)
    size = _itemsize(dtype)
    compiler = hlo.compile_only_available(target)
    source = (f"the TPU compiler's memory analysis ({target})" if compiler else
              "the T(8,128) tiling model (the TPU compiler is not available here)")
    for shape in cases:
        got = as_number(EX6, tpu_bytes(*shape, size), f"tpu_bytes{(*shape, size)}")
        logical = math.prod(shape) * size
        want = reference.tpu_padded_bytes(shape, size)
        if compiler:
            import jax
            import jax.numpy as jnp

            jdtype = {1: jnp.int8, 2: jnp.bfloat16, 4: jnp.float32}[size]
            report = hlo.inspect(lambda x: x + 1, jax.ShapeDtypeStruct(tuple(shape), jdtype),
                                 target=target)
            want = report.argument_bytes
        answer = f"{dtype}{list(shape)}: {want:,} bytes per {source}"
        if close_enough(got, want, 1e-9):
            continue
        if close_enough(got, logical, 1e-9):
            refuse(EX6, f"for {list(shape)} that is the logical size",
                   hint="HBM stores (8, 128) tiles: the last dim pads to a multiple of 128, "
                        "the one before to a multiple of 8", answer=answer)
        rows, cols = shape
        swapped = -(-rows // 128) * 128 * (-(-cols // 8) * 8) * size
        if close_enough(got, swapped, 1e-9):
            refuse(EX6, f"for {list(shape)} you padded the rows to 128 and the columns to 8",
                   hint="the LAST dimension (columns) pads to a multiple of 128 lanes, the "
                        "one before (rows) to a multiple of 8 sublanes", answer=answer)
        if close_enough(got, want / size, 1e-9):
            refuse(EX6, f"for {list(shape)} you counted padded elements, not bytes",
                   hint="multiply by itemsize", answer=answer)
        refuse(EX6, f"for {list(shape)} your count is {got / want:.3g}x the right one",
               hint="pad each of the two dims up, then multiply", answer=answer)
    return ok(EX6, f"right for {len(cases)} shapes, per {source}: a 100x100 {dtype} array "
                   f"takes {reference.tpu_padded_bytes((100, 100), size) / (100 * 100 * size):.2f}x "
                   "its logical bytes")


def layer_norm(x: Any, gamma: Any, beta: Any, eps: float = 1e-5) -> Any:
    """Exercise 7's operation: layer norm over the last axis (statistics in float32)."""
    import jax
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * gamma + beta).astype(x.dtype)


def compile_layer_norm(target: str | None = LN_TARGET) -> Any:
    """:func:`layer_norm` on a bf16 :data:`LN_SHAPE` array, compiled for ``target``
    (compile-only: this machine needs no TPU) and inspected."""
    import jax
    import jax.numpy as jnp

    from tpu_course import hlo

    t, f = LN_SHAPE
    S = jax.ShapeDtypeStruct
    return hlo.inspect(layer_norm, S((t, f), jnp.bfloat16), S((f,), jnp.bfloat16),
                       S((f,), jnp.bfloat16), target=target)


@LAB.exercise(EX7, minutes=20, needs="tpu-compiler", kind="predict")
def check_layer_norm(predicted_ln_flops: Any, predicted_ln_bytes: Any, predicted_ln_roof: Any,
                     flops_slack: float = 3.0, bytes_slack: float = 1.5) -> CheckResult:
    """Exercise 7: FLOPs, bytes (the least any kernel moves) and the binding roof of
    :func:`layer_norm` on a v5e, against the TPU compiler's cost analysis.

    FLOPs pass within ``flops_slack`` of XLA's count (which also counts the converts and
    the rsqrt's work its own way); bytes within ``bytes_slack`` of the minimum, read x once
    and write y once (XLA's TPU count is larger when its fusions read x more than once,
    which the message shows); the roof exactly. A count for one element or one row, where
    the whole array is asked for, is named."""
    flops = as_number(EX7, predicted_ln_flops, "predicted_ln_flops")
    nbytes = as_number(EX7, predicted_ln_bytes, "predicted_ln_bytes")
    roof = _roof_text(predicted_ln_roof)
    if roof not in ("memory", "compute"):
        refuse(EX7, f"predicted_ln_roof should be 'memory' or 'compute', not "
                    f"{predicted_ln_roof!r:.40}")
    report = compile_layer_norm()
    t, f = LN_SHAPE
    minimum = 2 * t * f * 2 + 2 * f * 2  # x read and y written in bf16, plus gamma and beta
    spec = hardware.get("v5e")
    ridge = spec.peak_bf16_flops_per_s / spec.hbm_bytes_per_s
    right_roof = "memory" if report.flops / minimum < ridge else "compute"
    fusions = ", ".join(re.sub(r"\.\d+$", "", fu.name) for fu in report.fusions) or "none"
    answer = (f"XLA ({LN_TARGET}): {report.flops:,.0f} FLOPs, {report.bytes_accessed:,.0f} bytes "
              f"accessed; the minimum is {minimum:,} bytes; {right_roof}-bound on a v5e "
              f"(ridge {ridge:,.0f} FLOP/byte)")

    def within(value: float, want: float, slack: float) -> bool:
        return 1 / slack <= value / want <= slack

    if not within(flops, report.flops, flops_slack):
        if within(flops * t * f, report.flops, flops_slack):
            refuse(EX7, "you gave FLOPs per element, and the prediction is for the whole "
                        "array", hint=f"multiply by the number of elements ({t} x {f})",
                   answer=answer)
        if within(flops * t, report.flops, flops_slack):
            refuse(EX7, "you gave the FLOPs of one row, and the prediction is for the whole "
                        "array", hint=f"multiply by the number of rows ({t})", answer=answer)
        hint = ("a handful of FLOPs per element: the mean (an add), the difference, its "
                "square, the variance (an add), the scaling, gamma and beta; then times the "
                "number of elements" if flops < report.flops else
                "count each elementwise operation once per element, not once per byte or "
                "per pass")
        refuse(EX7, f"your FLOPs are {flops / report.flops:.3g}x XLA's (tolerance "
                    f"{flops_slack:g}x)", hint=hint, answer=answer)
    if not within(nbytes, minimum, bytes_slack):
        if within(nbytes * t * f, minimum, bytes_slack):
            refuse(EX7, "you gave bytes per element, and the prediction is for the whole "
                        "array", hint=f"multiply by the number of elements ({t} x {f})",
                   answer=answer)
        if close_enough(nbytes * 2, minimum, 0.1):
            hint = "bf16 is 2 bytes per element, and y is written as well as x read"
        elif close_enough(nbytes, 2 * minimum, 0.1):
            hint = "the array is bf16 (2 bytes), not float32: the float32 math stays on chip"
        else:
            hint = "the least any kernel moves: read x once, write y once (gamma, beta are tiny)"
        refuse(EX7, f"your bytes are {nbytes / minimum:.3g}x the least a kernel must move",
               hint=hint, answer=answer)
    if roof != right_roof:
        refuse(EX7, f"layer norm is not {roof}-bound on a v5e",
               hint="its intensity (a few FLOPs per byte) against the v5e's ridge point",
               answer=answer)
    return ok(EX7, f"{answer}. XLA's TPU byte count is {report.bytes_accessed / minimum:.1f}x "
                   f"the minimum: it made {len(report.fusions)} fusions ({fusions}), and each "
                   "one that needs x reads it from HBM again")
