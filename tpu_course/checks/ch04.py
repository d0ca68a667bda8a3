"""Checkers for lab 4: predict, compile, measure.

The learner predicts a number (FLOPs, bytes, intensity, which roof binds, the bytes a
TPU-compiled program holds, a time) and each checker grades it against the analytic
model, XLA's cost or memory analysis and, where the runtime allows, a measurement from
:mod:`tpu_course.bench`; when two references disagree the message says why.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

from tpu_course import hardware, roofline
from tpu_course.checks._core import CheckResult, Lab, as_number, close_enough, fail, ok

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


@LAB.exercise(EX1, minutes=5, kind="write")
def check_matmul_flops(matmul_flops: Callable[[int, int, int], Any]) -> CheckResult:
    """FLOPs of an ``[m,k] @ [k,n]`` matmul: ``2*m*k*n``, set beside XLA's count."""
    from tpu_course import hlo

    import jax
    import jax.numpy as jnp

    for m, k, n in (MATMUL, (3, 5, 7)):
        got = as_number(EX1, matmul_flops(m, k, n), f"matmul_flops({m}, {k}, {n})")
        if isinstance(got, CheckResult):
            return got
        want = roofline.matmul_flops(m, k, n)
        answer = f"[{m},{k}] @ [{k},{n}]: {want:,} FLOPs"
        if close_enough(got, want, 1e-9):
            continue
        if close_enough(got, want / 2, 1e-9):
            return fail(EX1, f"for [{m},{k}] @ [{k},{n}] you counted multiply-adds",
                        hint="each multiply-add is two FLOPs", answer=answer)
        return fail(EX1, f"for [{m},{k}] @ [{k},{n}] your count is {got / want:.3g}x the right one",
                    hint="each of the m*n outputs is a sum of k products", answer=answer)
    m, k, n = MATMUL
    xla = hlo.inspect(jnp.matmul, jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                      jax.ShapeDtypeStruct((k, n), jnp.bfloat16)).flops
    said = "" if xla is None else f"; XLA's cost analysis on this runtime says {xla:,.0f}"
    return ok(EX1, f"{roofline.matmul_flops(m, k, n):,} = 2*m*k*n for {m}x{k} @ {k}x{n}{said}")


@LAB.exercise(EX2, minutes=5, kind="write")
def check_matmul_bytes(matmul_bytes: Callable[[int, int, int, int], Any]) -> CheckResult:
    """HBM bytes of a matmul reading each operand once and writing the result once."""
    m, k, n = MATMUL
    for size in (2, 4):
        got = as_number(EX2, matmul_bytes(m, k, n, size), f"matmul_bytes({m}, {k}, {n}, {size})")
        if isinstance(got, CheckResult):
            return got
        want = roofline.matmul_bytes(m, k, n, size)
        answer = f"{size}-byte elements: {want:,} bytes"
        if close_enough(got, want, 1e-9):
            continue
        if close_enough(got, (m * k + k * n) * size, 1e-9):
            return fail(EX2, "you counted the two inputs but not the output",
                        hint="the m*n result is written back to HBM too", answer=answer)
        for other in (1, 2, 4, 8):
            if other != size and close_enough(got, roofline.matmul_bytes(m, k, n, other), 1e-9):
                return fail(EX2, f"with itemsize={size} you counted {other}-byte elements",
                            hint="multiply the element count by itemsize", answer=answer)
        if close_enough(got, (m * k + k * n + m * n), 1e-9):
            return fail(EX2, "you counted elements, not bytes", hint="multiply by itemsize",
                        answer=answer)
        return fail(EX2, f"with itemsize={size} your count is {got / want:.3g}x the right one",
                    hint="each input is read once, the output written once", answer=answer)
    return ok(EX2, f"(m*k + k*n + m*n) * itemsize: {roofline.matmul_bytes(m, k, n, 2):,} bytes "
                   "in bf16")


@LAB.exercise(EX3, minutes=10, kind="write")
def check_roofs(intensity: Callable[..., Any], which_roof: Callable[..., Any]) -> CheckResult:
    """Exercise 3: ``intensity(m, k, n, itemsize)`` within 2 %, and ``which_roof(ai, chip)``
    ('memory' or 'compute') for :data:`LAYER` in bf16 on a v5e and a v6e (and on both for
    a tiny and a huge intensity)."""
    m, k, n = LAYER
    ai = as_number(EX3, intensity(m, k, n, 2), "the intensity")
    if isinstance(ai, CheckResult):
        return ai
    want = roofline.matmul_intensity(m, k, n, 2)
    answer = f"{want:,.1f} FLOP/byte"
    if not close_enough(ai, want, 0.02):
        if close_enough(ai, 1 / want, 0.02):
            return fail(EX3, "that is bytes per FLOP", hint="intensity = FLOPs / bytes",
                        answer=answer)
        return fail(EX3, f"your intensity for the [{m},{k}] @ [{k},{n}] bf16 layer is "
                         f"{ai / want:.3g}x the right one",
                    hint="your matmul_flops divided by your matmul_bytes", answer=answer)
    verdicts = []
    for chip_name in ("v5e", "v6e"):
        spec = hardware.get(chip_name)
        for x in (want, 1.0, 1e5):
            got = which_roof(x, spec)
            text = str(got).strip().lower().replace("-bound", "").replace(" bound", "")
            if text not in ("memory", "compute"):
                return fail(EX3, f"which_roof returned {got!r:.40}",
                            hint="return the string 'memory' or 'compute'")
            right = roofline.bound(x, spec)
            if text != right:
                return fail(EX3, f"at {x:,.1f} FLOP/byte on {spec.display_name} the "
                                 f"{text} roof is not the one that binds",
                            hint="compare the intensity with the ridge point: peak FLOP/s "
                                 "divided by HBM bytes/s, from the chip's spec",
                            answer=f"ridge point {roofline.ridge_point(spec):,.0f} FLOP/byte: "
                                   f"{right}-bound")
            if x == want:
                verdicts.append(f"{spec.display_name} {right}-bound (ridge "
                                f"{roofline.ridge_point(spec):,.0f})")
    return ok(EX3, f"{want:,.1f} FLOP/byte: " + "; ".join(verdicts))


@LAB.exercise(EX4, minutes=10, kind="write")
def check_roofline_time(fastest_time_s: Callable[..., Any], rel: float = 0.05) -> CheckResult:
    """Exercise 4: the roofline's lower bound on time, ``max(flops / peak, bytes / bw)``,
    for :data:`LAYER` in bf16 on a v6e and a much smaller layer on a v5e."""
    for shape, chip_name in ((LAYER, "v6e"), ((8, 4096, 4096), "v5e")):
        spec = hardware.get(chip_name)
        flops, nbytes = roofline.matmul_flops(*shape), roofline.matmul_bytes(*shape, 2)
        got = as_number(EX4, fastest_time_s(flops, nbytes, spec), "the time in seconds")
        if isinstance(got, CheckResult):
            return got
        e = roofline.estimate(flops, nbytes, spec)
        answer = (f"{shape} on {spec.display_name}: max({e.compute_time_s * 1e6:,.2f}, "
                  f"{e.memory_time_s * 1e6:,.2f}) us = {e.time_s * 1e6:,.2f} us")
        if close_enough(got, e.time_s, rel):
            continue
        if close_enough(got, e.compute_time_s + e.memory_time_s, rel):
            return fail(EX4, "you added the compute and memory times",
                        hint="on the roofline they overlap: the bound is the larger one",
                        answer=answer)
        other = e.memory_time_s if e.bound == "compute" else e.compute_time_s
        if close_enough(got, other, rel):
            return fail(EX4, f"for {shape} on {spec.display_name} that is the smaller of the two "
                             "times", hint="the larger one binds", answer=answer)
        if close_enough(got * 1e-6, e.time_s, rel) or close_enough(got * 1e-3, e.time_s, rel):
            return fail(EX4, "that looks like microseconds or milliseconds",
                        hint="return seconds", answer=answer)
        return fail(EX4, f"for {shape} on {spec.display_name} your time is "
                         f"{got / e.time_s:.3g}x the bound",
                    hint="max(FLOPs / peak FLOP/s, bytes / HBM bytes/s)", answer=answer)
    return ok(EX4, "max(compute time, memory time) on both chips: a batch of 384 is "
                   "compute-bound on a v6e, a batch of 8 memory-bound on a v5e")


def layer(x: Any, w: Any, b: Any) -> Any:
    """Exercise 5's layer: ``relu(x @ w + b)``."""
    import jax

    return jax.nn.relu(x @ w + b)


@LAB.exercise(EX5, minutes=10, kind="predict")
def check_xla_flops(layer_flops: Callable[[int, int, int], Any], rel: float = 0.05,
                    shape: tuple[int, int, int] = (32, 1024, 512)) -> CheckResult:
    """Exercise 5: a hand count of :func:`layer`'s FLOPs against XLA's cost analysis on
    this runtime, within ``rel``."""
    import jax
    import jax.numpy as jnp

    from tpu_course import hlo

    B, D, H = shape
    got = as_number(EX5, layer_flops(B, D, H), "your FLOP count")
    if isinstance(got, CheckResult):
        return got
    S = jax.ShapeDtypeStruct
    xla = hlo.inspect(layer, S((B, D), jnp.float32), S((D, H), jnp.float32),
                      S((H,), jnp.float32)).flops
    if xla is None:
        return ok(EX5, "this backend reports no FLOP count; your count could not be compared")
    answer = f"XLA counts {xla:,.0f} FLOPs"
    if close_enough(got, xla, rel):
        gap = "" if got == xla else (
            f" The {abs(xla - got):,.0f}-FLOP gap is the elementwise work (bias add, "
            "activation: about one FLOP per element) beside the matmul's 2*B*D*H.")
        return ok(EX5, f"XLA counts {xla:,.0f}; you said {got:,.0f} (within {rel:.0%}).{gap}")
    if close_enough(got * 2, xla, rel):
        hint = "counted multiply-adds? each is 2 FLOPs"
    else:
        hint = "the matmul's 2*B*D*H, plus one FLOP per output element for each elementwise op"
    return fail(EX5, f"your count is {got / xla:.3g}x XLA's", hint=hint, answer=answer)


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


@LAB.exercise(EX6, minutes=10, kind="transfer")
def check_padded_bytes(tpu_bytes: Callable[[int, int, int], Any],
                       cases: Sequence[tuple[int, int]] = ((100, 100), (129, 128), (8, 1000)),
                       dtype: str = "fp32", target: str = "v5e:1x1") -> CheckResult:
    """Exercise 6: the HBM bytes of 2-D arrays on a TPU, graded against the TPU compiler's
    memory analysis (compile-only, when available) or the T(8,128) tiling model."""
    from tpu_course import hlo

    size = _itemsize(dtype)
    compiler = hlo.compile_only_available(target)
    source = (f"the TPU compiler's memory analysis ({target})" if compiler else
              "the T(8,128) tiling model (the TPU compiler is not available here)")
    for shape in cases:
        got = as_number(EX6, tpu_bytes(*shape, size), f"tpu_bytes{(*shape, size)}")
        if isinstance(got, CheckResult):
            return got
        logical = math.prod(shape) * size
        want = tpu_padded_bytes(shape, dtype)
        if compiler:
            import jax
            import jax.numpy as jnp

            report = hlo.inspect(lambda x: x + 1, jax.ShapeDtypeStruct(tuple(shape), jnp.float32),
                                 target=target)
            want = report.argument_bytes
        answer = f"{dtype}{list(shape)}: {want:,} bytes per {source}"
        if close_enough(got, want, 1e-9):
            continue
        if close_enough(got, logical, 1e-9):
            return fail(EX6, f"for {list(shape)} that is the logical size",
                        hint="HBM stores (8, 128) tiles: the last dim pads to a multiple of "
                             "128, the one before to a multiple of 8", answer=answer)
        return fail(EX6, f"for {list(shape)} your count is {got / want:.3g}x the right one",
                    hint="pad each of the two dims up, then multiply", answer=answer)
    return ok(EX6, f"right for {len(cases)} shapes, per {source}: a 100x100 fp32 array takes "
                   f"{tpu_padded_bytes((100, 100), dtype) / (100 * 100 * size):.2f}x its "
                   "logical bytes")


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
    which the message shows); the roof exactly."""
    flops = as_number(EX7, predicted_ln_flops, "predicted_ln_flops")
    if isinstance(flops, CheckResult):
        return flops
    nbytes = as_number(EX7, predicted_ln_bytes, "predicted_ln_bytes")
    if isinstance(nbytes, CheckResult):
        return nbytes
    roof = str(predicted_ln_roof).strip().lower().replace("-bound", "").replace(" bound", "")
    if roof not in ("memory", "compute"):
        return fail(EX7, f"predicted_ln_roof should be 'memory' or 'compute', not "
                         f"{predicted_ln_roof!r:.40}")
    report = compile_layer_norm()
    t, f = LN_SHAPE
    minimum = 2 * t * f * 2 + 2 * f * 2  # x read and y written in bf16, plus gamma and beta
    spec = hardware.get("v5e")
    right_roof = roofline.bound(report.flops / minimum, spec)
    fusions = ", ".join(re.sub(r"\.\d+$", "", fu.name) for fu in report.fusions) or "none"
    answer = (f"XLA ({LN_TARGET}): {report.flops:,.0f} FLOPs, {report.bytes_accessed:,.0f} bytes "
              f"accessed; the minimum is {minimum:,} bytes; {right_roof}-bound on a v5e "
              f"(ridge {roofline.ridge_point(spec):,.0f} FLOP/byte)")
    if not 1 / flops_slack <= flops / report.flops <= flops_slack:
        hint = ("a handful of FLOPs per element: the mean (an add), the difference, its "
                "square, the variance (an add), the scaling, gamma and beta"
                if flops < report.flops else "is your count per element or for the whole array?")
        return fail(EX7, f"your FLOPs are {flops / report.flops:.3g}x XLA's (tolerance "
                         f"{flops_slack:g}x)", hint=hint, answer=answer)
    if not 1 / bytes_slack <= nbytes / minimum <= bytes_slack:
        if close_enough(nbytes * 2, minimum, 0.1):
            hint = "bf16 is 2 bytes per element, and y is written as well as x read"
        elif close_enough(nbytes, 2 * minimum, 0.1):
            hint = "the array is bf16 (2 bytes), not float32: the float32 math stays on chip"
        else:
            hint = "the least any kernel moves: read x once, write y once (gamma, beta are tiny)"
        return fail(EX7, f"your bytes are {nbytes / minimum:.3g}x the least a kernel must move",
                    hint=hint, answer=answer)
    if roof != right_roof:
        return fail(EX7, f"layer norm is not {roof}-bound on a v5e",
                    hint="its intensity (a few FLOPs per byte) against the v5e's ridge point",
                    answer=answer)
    return ok(EX7, f"{answer}. XLA's TPU byte count is {report.bytes_accessed / minimum:.1f}x "
                   f"the minimum: it made {len(report.fusions)} fusions ({fusions}), and each "
                   "one that needs x reads it from HBM again")
