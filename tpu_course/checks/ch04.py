"""Checkers for lab 4: ask the compiler, predict, compile, measure.

Exercise 1 asks the compiler itself, with JAX's own calls (no course helper); the others
predict a number (the batch where a layer turns compute-bound, the least time of a chain
of kernels, a layer's FLOPs, the bytes an array takes on a TPU, layer norm's cost on a
v5e) and each checker grades it against the analytic model, XLA's cost or memory
analysis and, where the runtime allows, the TPU compiler; when two references disagree
the message says why. The course's own answers live in
:mod:`tpu_course.checks._answers.ch04`; an answer that is, or calls, one of them or the
package helper that computes the same number (``hlo.inspect``, ``roofline.*``) is
refused, and so is a prediction that asks the compiler instead of reasoning. Function
answers are also checked on inputs the notebook does not show (other functions, shapes,
dtypes and chips) when the grader passes a seed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tpu_course import hardware, roofline
from tpu_course.checks._answers import ch04 as reference
from tpu_course.checks._core import (
    CheckResult,
    Lab,
    as_number,
    close_enough,
    names_used,
    ok,
    refuse,
    refuse_course_code,
)

LAB = Lab(4, "Ask the compiler, predict, compile, measure")

EX1 = "Exercise 1 (XLA's FLOPs and bytes for any function)"
EX2 = "Exercise 2 (the batch where a layer turns compute-bound)"
EX3 = "Exercise 3 (the least time of a chain of kernels)"
EX4 = "Exercise 4 (a layer by hand, against XLA)"
EX5 = "Exercise 5 (how big an array is on a TPU)"
EX6 = "Exercise 6 (layer norm on a v5e)"

#: Exercise 6: layer norm over the last axis of a bf16 [tokens, features] array.
LN_SHAPE = (4096, 1024)
LN_TARGET = "v5e:2x2"

_ROOF_CHIPS = ("v4", "v5p", "v6e", "7x", "h100", "a100", "v3")


def _roof_text(got: Any) -> str:
    return str(got).strip().lower().replace("-bound", "").replace(" bound", "")


def _roofline_helpers() -> tuple[Callable, ...]:
    names = ("ridge_point", "critical_intensity", "bound", "estimate", "attainable_flops_per_s",
             "matmul_intensity", "matmul_flops", "matmul_bytes", "arithmetic_intensity")
    return tuple(getattr(roofline, n) for n in names if hasattr(roofline, n))


#: Names that mean "ask the compiler" in code that should be a prediction or a rule.
_COMPILER_CALLS = frozenset({"cost_analysis", "memory_analysis", "compile", "get_topology_desc"})


def _asks_the_compiler(fn: Any) -> str | None:
    """The compiler call (``cost_analysis``, ``compile`` ...) that ``fn`` or a function of
    the learner's it calls makes, or None: a prediction is reasoned, not asked."""
    return names_used(fn, _COMPILER_CALLS)


# -- Exercise 1: XLA's FLOPs and bytes, with JAX's own calls -------------------------------

def layer(x: Any, w: Any, b: Any) -> Any:
    """Exercise 1's and 4's layer: ``relu(x @ w + b)``."""
    import jax

    return jax.nn.relu(x @ w + b)


def _softmax_rows(x: Any) -> Any:
    import jax

    return jax.nn.softmax(x, axis=-1)


def _two_matmuls(x: Any, w1: Any, w2: Any) -> Any:
    return (x @ w1) @ w2


def _pytree_layer(params: Mapping[str, Any], x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.tanh(x @ params["w"]) + params["b"]


def _sine_mix(x: Any, y: Any) -> Any:
    import jax.numpy as jnp

    return jnp.sin(x) * y + x.sum(0)


#: What each kind of function Exercise 1 is checked on is, in words.
COST_FUNCTIONS = {
    "layer": "the layer relu(x @ w + b)",
    "softmax": "a row softmax",
    "two matmuls": "two matmuls in a row, in bf16",
    "pytree": "a function of a dict of parameters",
    "jitted": "a function that is already jitted",
}


def _cost_case(kind: str, dims: Sequence[int], dtype: str) -> tuple[Callable, tuple[Any, ...]]:
    """The function and its ``jax.ShapeDtypeStruct`` arguments for one Exercise 1 case."""
    import jax

    a, b, c = dims
    S = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
    if kind == "layer":
        return layer, (S(a, b), S(b, c), S(c))
    if kind == "softmax":
        return _softmax_rows, (S(a, b),)
    if kind == "two matmuls":
        return _two_matmuls, (S(a, b), S(b, c), S(c, a))
    if kind == "pytree":
        return _pytree_layer, ({"w": S(b, c), "b": S(c)}, S(a, b))
    if kind == "jitted":
        return jax.jit(_sine_mix), (S(a, b), S(a, b))
    raise ValueError(f"unknown case {kind!r}")


def _truth(fn: Callable, args: tuple[Any, ...]) -> dict[str, float]:
    """XLA's counts, asked the way the exercise asks: the compiled program's cost analysis
    (and, to name a mistake, the unoptimised program's)."""
    import jax

    def flat(cost: Any) -> dict[str, float]:
        if isinstance(cost, (list, tuple)):
            cost = cost[0] if cost else {}
        return {k: float(v) for k, v in (cost or {}).items() if isinstance(v, (int, float))}

    lowered = jax.jit(fn).lower(*args)
    out = flat(lowered.compile().cost_analysis())
    before = flat(lowered.cost_analysis())
    out["lowered flops"] = before.get("flops", math.nan)
    out["lowered bytes"] = before.get("bytes accessed", math.nan)
    return out


def _hidden_cost(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    dims = lambda: tuple(int(v) for v in rng.integers(8, 300, 3))
    return [(COST_FUNCTIONS["two matmuls"], {"cases": (("two matmuls", dims(), "bfloat16"),)}),
            (COST_FUNCTIONS["pytree"], {"cases": (("pytree", dims(), "float32"),)}),
            (COST_FUNCTIONS["jitted"], {"cases": (("jitted", dims(), "float32"),)})]


@LAB.exercise(EX1, minutes=12, kind="write", hidden=_hidden_cost)
def check_xla_cost(xla_cost: Callable[..., Any],
                   cases: Sequence[tuple[str, tuple[int, int, int], str]] = (
                       ("layer", (64, 512, 256), "float32"),
                       ("softmax", (96, 200, 0), "float32"))) -> CheckResult:
    """Exercise 1: ``xla_cost(fn, *args)`` returns ``(flops, bytes accessed)`` of the
    compiled ``fn`` at ``args`` (``jax.ShapeDtypeStruct`` placeholders), asked with JAX's
    own calls; equal to XLA's numbers on each case."""
    from tpu_course import hlo

    refuse_course_code(EX1, xla_cost, reference.xla_cost, hlo.inspect, hlo.normalise_cost,
                       hlo.normalise_memory, xla_layer_flops, compile_layer_norm,
                       hlo.tpu_topology)
    said = []
    for kind, dims, dtype in cases:
        fn, args = _cost_case(kind, dims, dtype)
        what = COST_FUNCTIONS[kind]
        truth = _truth(fn, args)
        try:
            got = xla_cost(fn, *args)
        except (TypeError, AttributeError) as err:
            if "ShapeDtypeStruct" not in str(err):
                raise
            refuse(EX1, f"on {what}, your function ran fn on its arguments, which are shapes "
                        "(jax.ShapeDtypeStruct), not arrays",
                   hint="nothing needs to run: lower the jitted function at these arguments, "
                        "compile it, and ask the compiled program")
        if isinstance(got, Mapping):
            refuse(EX1, f"on {what} you returned the whole analysis (a dict)",
                   hint="return the pair (flops, bytes accessed): two numbers")
        if isinstance(got, str) or not isinstance(got, Sequence) or len(got) != 2:
            refuse(EX1, f"on {what} you returned {type(got).__name__} {got!r:.60}",
                   hint="return the pair (flops, bytes accessed)")
        flops = as_number(EX1, got[0], "the FLOPs (first of the pair)")
        nbytes = as_number(EX1, got[1], "the bytes accessed (second of the pair)")
        want_f, want_b = truth.get("flops", math.nan), truth.get("bytes accessed", math.nan)
        answer = (f"{what} at {dims} ({dtype}): {want_f:,.0f} FLOPs, {want_b:,.0f} bytes "
                  "accessed (the compiled program's cost analysis)")

        def same(x: float, y: float) -> bool:
            return (math.isnan(y) and math.isnan(x)) or close_enough(x, y, 1e-9)

        if same(flops, want_f) and same(nbytes, want_b):
            said.append(f"{what}: {want_f:,.0f} FLOPs, {want_b:,.0f} B")
            continue
        if same(flops, want_b) and same(nbytes, want_f):
            refuse(EX1, f"on {what} your pair is the wrong way round",
                   hint="the FLOPs first, then the bytes accessed", answer=answer)
        if same(nbytes, truth["lowered bytes"]) and not same(want_b, truth["lowered bytes"]):
            refuse(EX1, f"on {what} your bytes are those of the program before XLA optimised "
                        "(fused) it",
                   hint="Lowered.cost_analysis() counts the unoptimised program; compile() "
                        "first and ask the Compiled object", answer=answer)
        if same(flops, truth.get("transcendentals", math.nan)) and not same(flops, want_f):
            refuse(EX1, f"on {what} your FLOPs are XLA's count of transcendentals",
                   hint="the entry is 'flops'", answer=answer)
        if same(flops, want_f):
            refuse(EX1, f"on {what} your FLOPs are right and your bytes are "
                        f"{nbytes / want_b:.3g}x XLA's",
                   hint="the entry 'bytes accessed' of the compiled program's cost analysis, "
                        "for the function and arguments you are given", answer=answer)
        refuse(EX1, f"on {what} your FLOPs are {flops / want_f:.3g}x XLA's",
               hint="ask the compiler for the function and the arguments you are given: "
                    "its cost analysis has an entry 'flops'", answer=answer)
    return ok(EX1, "the compiler's own counts: " + "; ".join(said))


# -- Exercise 2: the batch where a layer turns compute-bound -------------------------------

def _hidden_batch(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    chips = [str(c) for c in rng.choice(_ROOF_CHIPS, 2, replace=False)]
    k, n = (int(v) for v in rng.integers(1024, 16384, 2))
    small = int(rng.integers(32, 96))
    return [("other weight shapes on other chips",
             {"cases": ((k, n, chips[0]), (n + 7, 3 * k + 1, chips[1]))}),
            ("weights so small that no batch reaches the ridge",
             {"cases": ((small, small + 5, chips[0]),)})]


@LAB.exercise(EX2, minutes=10, kind="apply", hidden=_hidden_batch)
def check_compute_bound_batch(compute_bound_batch: Callable[..., Any],
                              cases: Sequence[tuple[int, int, str]] = (
                                  (4096, 4096, "v5e"), (8192, 2048, "v6e"),
                                  (256, 256, "v6e"))) -> CheckResult:
    """Exercise 2: the least whole batch ``m`` at which a bf16 ``[m, k] @ [k, n]`` layer
    (x, w read once, y written once) reaches the chip's ridge point, or None."""
    refuse_course_code(EX2, compute_bound_batch, reference.compute_bound_batch,
                       reference.ridge, *_roofline_helpers())
    said = []
    for k, n, chip_name in cases:
        chip = hardware.get(chip_name)
        r = chip.critical_intensity()
        want = reference.compute_bound_batch(k, n, chip)
        got = compute_bound_batch(k, n, chip)
        where = f"weights [{k}, {n}] on {chip.display_name}"
        answer = (f"{where}: " + ("no batch: the intensity tends to "
                                  f"{2 * k * n / (2 * (k + n)):,.1f} < ridge {r:,.1f}"
                                  if want is None else f"m = {want:,} (ridge {r:,.1f} FLOP/byte)"))
        if want is None:
            if got is None:
                said.append(f"{where}: none")
                continue
            as_number(EX2, got, "the batch")
            refuse(EX2, f"for {where} no batch is large enough, and you gave one",
                   hint="as m grows, the intensity 2mkn / (2(mk + kn + mn)) tends to a limit: "
                        "compare that limit with the ridge point", answer=answer)
        if got is None:
            refuse(EX2, f"for {where} a batch does reach the ridge, and you said none",
                   hint="the intensity's limit as m grows is above the ridge here: solve for m",
                   answer=answer)
        m = as_number(EX2, got, "the batch")
        if m == want:
            said.append(f"{where}: {want:,}")
            continue
        if want - 1 < m < want:
            refuse(EX2, f"for {where} your batch is not a whole number",
                   hint="round up: the whole batch below your value is still memory-bound",
                   answer=answer)
        if m == want - 1:
            refuse(EX2, f"for {where} your batch is still memory-bound (just)",
                   hint="the least batch AT or above the ridge: round up, not down",
                   answer=answer)
        room_no_y = 2 * k * n - 2 * r * k
        if room_no_y > 0 and m == math.ceil(2 * r * k * n / room_no_y):
            refuse(EX2, f"for {where} you left out the bytes of the output",
                   hint="y, [m, n], is written to HBM too", answer=answer)
        room_elements = 2 * k * n - r * (k + n)
        if room_elements > 0 and m == math.ceil(r * k * n / room_elements):
            refuse(EX2, f"for {where} you counted elements, not bytes",
                   hint="bf16 is 2 bytes per element", answer=answer)
        if m in (math.ceil(r), math.floor(r), round(r)):
            refuse(EX2, f"for {where} that is the ridge point itself",
                   hint="the rule of thumb 'batch = ridge' counts only the weights' bytes; the "
                        "activations x and outputs y are bytes too: count them and solve for m",
                   answer=answer)
        refuse(EX2, f"for {where} your batch is {m / want:.3g}x the least compute-bound one",
               hint="write the FLOPs and the bytes of x, w and y in terms of m, then solve "
                    "intensity >= this chip's ridge point (its bf16 peak / HBM bytes/s)",
               answer=answer)
    return ok(EX2, "; ".join(said) + ". The rule of thumb 'batch = ridge' is short by the "
                                     "bytes of the activations and outputs")


# -- Exercise 3: the least time of a chain of kernels --------------------------------------

def _mm(n: int) -> tuple[float, float]:
    return 2.0 * n ** 3, 3.0 * n * n * 2


def _ew(elements: int, flops_per: int = 8) -> tuple[float, float]:
    return float(flops_per * elements), 2.0 * elements * 2


def _hidden_chain(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    chips = [str(c) for c in rng.choice(_ROOF_CHIPS, 2, replace=False)]
    n = int(rng.integers(1024, 8192))
    chain = (_mm(n), _ew(n * n * int(rng.integers(2, 6))), _mm(int(rng.integers(128, 512))),
             _ew(int(rng.integers(10**6, 10**8)), 3))
    return [("other chains on other chips", {"cases": ((chain, chips[0]),
                                                       (chain[::-1][:3], chips[1]))})]


@LAB.exercise(EX3, minutes=10, kind="apply", hidden=_hidden_chain)
def check_chain_time(chain_time_s: Callable[..., Any], rel: float = 0.02,
                     cases: Sequence[tuple[Sequence[tuple[float, float]], str]] = (
                         ((_mm(4096), _ew(2 * 8192 * 8192)), "v5e"),
                         ((_ew(4096 * 4096), _mm(8192), _ew(4096 * 4096, 2)), "v6e"),
                     )) -> CheckResult:
    """Exercise 3: ``chain_time_s(kernels, chip)``, the roofline's least time of kernels
    ``[(flops, bytes), ...]`` run one after another: the sum of each kernel's larger time."""
    refuse_course_code(EX3, chain_time_s, reference.chain_time_s, *_roofline_helpers())
    for kernels, chip_name in cases:
        chip = hardware.get(chip_name)
        P, W = chip.peak_bf16_flops_per_s, chip.hbm_bytes_per_s
        kernels = [tuple(map(float, kernel)) for kernel in kernels]
        got = as_number(EX3, chain_time_s([tuple(x) for x in kernels], chip),
                        "the time in seconds")
        each = [max(f / P, b / W) for f, b in kernels]
        want = sum(each)
        where = f"the chain of {len(kernels)} kernels on {chip.display_name}"
        answer = f"{where}: " + " + ".join(f"{t * 1e6:,.1f}" for t in each) + \
            f" us = {want * 1e6:,.1f} us"
        if close_enough(got, want, rel):
            continue
        pooled = max(sum(f for f, _ in kernels) / P, sum(b for _, b in kernels) / W)
        if close_enough(got, pooled, rel):
            refuse(EX3, f"for {where} you pooled the kernels' FLOPs and bytes",
                   hint="kernels run one after another: one kernel's compute does not hide "
                        "another kernel's memory traffic", answer=answer)
        if close_enough(got, sum(f / P + b / W for f, b in kernels), rel):
            refuse(EX3, f"for {where} you added each kernel's compute and memory times",
                   hint="inside one kernel they overlap: its time is the larger of the two",
                   answer=answer)
        if close_enough(got, max(each), rel):
            refuse(EX3, f"for {where} that is the slowest kernel alone",
                   hint="the kernels run one after another: their times add", answer=answer)
        if close_enough(got, sum(min(f / P, b / W) for f, b in kernels), rel):
            refuse(EX3, f"for {where} you took each kernel's smaller time",
                   hint="the larger of the two binds", answer=answer)
        if close_enough(got * 1e-6, want, rel) or close_enough(got * 1e-3, want, rel):
            refuse(EX3, "that looks like microseconds or milliseconds", hint="return seconds",
                   answer=answer)
        refuse(EX3, f"for {where} your time is {got / want:.3g}x the least one",
               hint="the chapter's roofline per kernel (with the peak and bandwidth of the "
                    "chip you are given), then the kernels in sequence", answer=answer)
    return ok(EX3, "each kernel at its own roof, one after another: the elementwise "
                   "kernels' memory time is not hidden by the matmul's compute")


# -- Exercise 4: a layer by hand, against XLA ----------------------------------------------

def xla_layer_flops(shape: tuple[int, int, int]) -> float | None:
    """XLA's FLOP count of :func:`layer` for ``(M, D, H)`` in float32 on this runtime (the
    measurement Exercise 4 shows once its prediction is recorded)."""
    import jax
    import jax.numpy as jnp

    from tpu_course import hlo

    M, D, H = shape
    S = jax.ShapeDtypeStruct
    return hlo.inspect(layer, S((M, D), jnp.float32), S((D, H), jnp.float32),
                       S((H,), jnp.float32)).flops


#: Exercise 4's layer: a first layer on only 4 input features (a tabular model, say).
LAYER_4 = (256, 4, 512)


def _hidden_layer(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    return [("another layer on a few input features",
             {"shape": (int(rng.integers(16, 300)), int(rng.integers(2, 7)),
                        int(rng.integers(64, 700)))})]


@LAB.exercise(EX4, minutes=10, kind="predict", hidden=_hidden_layer)
def check_xla_flops(layer_flops: Callable[[int, int, int], Any], rel: float = 0.05,
                    shape: tuple[int, int, int] = LAYER_4) -> CheckResult:
    """Exercise 4: a hand count of :func:`layer`'s FLOPs against XLA's cost analysis on
    this runtime, within ``rel``; with so few inputs the elementwise work counts."""
    from tpu_course import hlo

    refuse_course_code(EX4, layer_flops, reference.layer_flops, hlo.inspect, xla_layer_flops,
                       reference.xla_cost)
    asked = _asks_the_compiler(layer_flops)
    if asked:
        refuse(EX4, f"your layer_flops asks the compiler ({asked}): this is a prediction",
               hint="count by hand: the matmul, then each elementwise operation per element")
    M, D, H = shape
    got = as_number(EX4, layer_flops(M, D, H), f"layer_flops({M}, {D}, {H})")
    xla = xla_layer_flops(shape)
    if xla is None:
        return ok(EX4, "this backend reports no FLOP count; your count could not be compared")
    answer = f"M, D, H = {M}, {D}, {H}: XLA counts {xla:,.0f} FLOPs"
    if close_enough(got, xla, rel):
        return ok(EX4, f"XLA counts {xla:,.0f}; you said {got:,.0f} (within {rel:.0%}). With "
                       f"D = {D}, the matmul's 2*M*D*H is only {2 * M * D * H / xla:.0%} of it")
    matmul = 2 * M * D * H
    if close_enough(got, matmul, 1e-9):
        hint = (f"that is the matmul alone; with only D = {D} inputs per output, the bias add "
                "and the relu (one FLOP per output element each) are a large share: count them")
    elif close_enough(got * 2, matmul, 1e-9) or close_enough(got, matmul / 2 + 2 * M * H, 1e-9):
        hint = "counted multiply-adds? each is 2 FLOPs"
    elif close_enough(got * M, xla, rel):
        hint = "that is the count for one row of x: multiply by the batch M (the rows of x)"
    else:
        hint = "the matmul's 2*M*D*H, plus one FLOP per output element for each elementwise op"
    refuse(EX4, f"for M, D, H = {M}, {D}, {H} your count is {got / xla:.3g}x XLA's",
           hint=hint, answer=answer)


# -- Exercise 5: how big an array is on a TPU ----------------------------------------------

#: 2-D shapes whose HBM bytes the TPU compiler (v5e, f32 and bf16) was checked to give as
#: the T(8,128) rule, laid out whichever way round pads less: row-major wins for the first,
#: column-major ({0,1}) for the second.
ROW_MAJOR_WINS = ((40, 300), (129, 128), (12, 1000), (57, 130), (200, 520), (9, 777),
                  (33, 256), (24, 900), (17, 127))
COLUMN_MAJOR_WINS = ((300, 200), (640, 129), (100, 260), (515, 300), (1000, 12), (130, 57),
                     (127, 17))


def _hidden_padded(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    rows = [tuple(s) for s in ROW_MAJOR_WINS if s not in ((40, 300), (17, 127))]
    cols = [tuple(s) for s in COLUMN_MAJOR_WINS if s != (1000, 12)]
    a = rows[int(rng.integers(len(rows)))]
    b = cols[int(rng.integers(len(cols)))]
    return [("other 2-D shapes in float32 and bf16", {"cases": ((a, 2), (b, 4))}),
            ("another shape the compiler lays out column-major, in bf16",
             {"cases": ((cols[(cols.index(b) + 1) % len(cols)], 2),)})]


@LAB.exercise(EX5, minutes=12, kind="apply", hidden=_hidden_padded)
def check_tpu_bytes(tpu_bytes: Callable[..., Any],
                    cases: Sequence[tuple[tuple[int, int], int]] = (
                        ((40, 300), 4), ((17, 127), 2), ((1000, 12), 4)),
                    target: str = "v5e:1x1") -> CheckResult:
    """Exercise 5: the HBM bytes of 2-D arrays on a TPU, graded against the TPU compiler's
    memory analysis (compile-only, when available) or the layout model."""
    from tpu_course import hlo

    refuse_course_code(EX5, tpu_bytes, reference.tpu_bytes, reference.tpu_padded_bytes,
                       hlo.inspect)
    asked = _asks_the_compiler(tpu_bytes)
    if asked:
        refuse(EX5, f"your tpu_bytes asks the compiler ({asked})",
               hint="write the rule you found; the compiler is what the check holds it to")
    compiler = hlo.compile_only_available(target)
    source = (f"the TPU compiler's memory analysis ({target})" if compiler else
              "the T(8,128) layout model (the TPU compiler is not available here)")
    pad = lambda d, to: -(-d // to) * to
    for shape, size in cases:
        rows, cols = shape
        got = as_number(EX5, tpu_bytes(tuple(shape), size), f"tpu_bytes({tuple(shape)}, {size})")
        want = reference.tpu_padded_bytes(shape, size)
        if compiler:
            import jax
            import jax.numpy as jnp

            jdtype = {2: jnp.bfloat16, 4: jnp.float32}[size]
            want = hlo.inspect(lambda x: x + 1, jax.ShapeDtypeStruct(tuple(shape), jdtype),
                               target=target).argument_bytes
        dtype = {2: "bf16", 4: "f32"}[size]
        what = f"{dtype}{list(shape)}"
        answer = f"{what}: {want:,} bytes per {source}"
        row_major = pad(rows, 8) * pad(cols, 128) * size
        col_major = pad(cols, 8) * pad(rows, 128) * size
        if close_enough(got, want, 1e-9):
            continue
        if close_enough(got, rows * cols * size, 1e-9):
            refuse(EX5, f"for {what} that is the logical size",
                   hint="HBM holds whole tiles: look at the T(...) in the layouts the chapter "
                        "printed, and at the bytes beside them", answer=answer)
        if close_enough(got, row_major, 1e-9):
            refuse(EX5, f"for {what} that is the row-major layout, and the compiler lays this "
                        "array out the other way round",
                   hint="the layout {0,1} (column-major) is the compiler's choice when it pads "
                        "less: try both orders of the two dimensions", answer=answer)
        if close_enough(got, col_major, 1e-9):
            refuse(EX5, f"for {what} you padded the rows to 128 and the columns to 8",
                   hint="in the layout {1,0} the LAST dimension is minor: it pads to 128 "
                        "lanes, the one before to 8 sublanes (and the compiler keeps that "
                        "order when it pads less)", answer=answer)
        if close_enough(got, want / size, 1e-9):
            refuse(EX5, f"for {what} you counted padded elements, not bytes",
                   hint="multiply by itemsize", answer=answer)
        if size == 2 and min(pad(rows, 16) * pad(cols, 128), pad(cols, 16) * pad(rows, 128)) \
                * size == got:
            refuse(EX5, f"for {what} you padded to 16 sublanes",
                   hint="a bf16 array's tile is still T(8,128); the (2,1) after it says how two "
                        "bf16 values share one 32-bit word, not a bigger tile", answer=answer)
        if close_enough(got, min(rows * pad(cols, 128), cols * pad(rows, 128)) * size, 1e-9):
            refuse(EX5, f"for {what} you padded only the minor dimension",
                   hint="the dimension before it pads to a multiple of 8 too", answer=answer)
        refuse(EX5, f"for {what} your count is {got / want:.3g}x the right one",
               hint="pad each of the two dimensions up to its tile, in the order that wastes "
                    "less, then multiply by itemsize", answer=answer)
    return ok(EX5, f"right for {len(cases)} arrays, per {source}: the (8, 128) tile, in the "
                   "order that pads less")


# -- Exercise 6: layer norm on a v5e --------------------------------------------------------

def layer_norm(x: Any, gamma: Any, beta: Any, eps: float = 1e-5) -> Any:
    """Exercise 6's operation: layer norm over the last axis (statistics in float32)."""
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


@LAB.exercise(EX6, minutes=15, needs="tpu-compiler", kind="predict")
def check_layer_norm(predicted_ln_flops: Any, predicted_ln_bytes: Any, predicted_ln_roof: Any,
                     flops_slack: float = 3.0, bytes_slack: float = 1.5) -> CheckResult:
    """Exercise 6: FLOPs, bytes (the least any kernel moves) and the binding roof of
    :func:`layer_norm` on a v5e, against the TPU compiler's cost analysis.

    FLOPs pass within ``flops_slack`` of XLA's count (which also counts the converts and
    the rsqrt's work its own way); bytes within ``bytes_slack`` of the minimum, read x once
    and write y once (XLA's TPU count is larger when its fusions read x more than once,
    which the message shows); the roof exactly. A count for one element or one row, where
    the whole array is asked for, is named."""
    flops = as_number(EX6, predicted_ln_flops, "predicted_ln_flops")
    nbytes = as_number(EX6, predicted_ln_bytes, "predicted_ln_bytes")
    roof = _roof_text(predicted_ln_roof)
    if roof not in ("memory", "compute"):
        refuse(EX6, f"predicted_ln_roof should be 'memory' or 'compute', not "
                    f"{predicted_ln_roof!r:.40}")
    report = compile_layer_norm()
    t, f = LN_SHAPE
    minimum = 2 * t * f * 2 + 2 * f * 2  # x read and y written in bf16, plus gamma and beta
    spec = hardware.get("v5e")
    ridge = spec.critical_intensity()
    right_roof = "memory" if report.flops / minimum < ridge else "compute"
    fusions = ", ".join(re.sub(r"\.\d+$", "", fu.name) for fu in report.fusions) or "none"
    answer = (f"XLA ({LN_TARGET}): {report.flops:,.0f} FLOPs, {report.bytes_accessed:,.0f} bytes "
              f"accessed; the minimum is {minimum:,} bytes; {right_roof}-bound on a v5e "
              f"(ridge {ridge:,.0f} FLOP/byte)")

    def within(value: float, want: float, slack: float) -> bool:
        return 1 / slack <= value / want <= slack

    if not within(flops, report.flops, flops_slack):
        if within(flops * t * f, report.flops, flops_slack):
            refuse(EX6, "you gave FLOPs per element, and the prediction is for the whole "
                        "array", hint=f"multiply by the number of elements ({t} x {f})",
                   answer=answer)
        if within(flops * t, report.flops, flops_slack):
            refuse(EX6, "you gave the FLOPs of one row, and the prediction is for the whole "
                        "array", hint=f"multiply by the number of rows ({t})", answer=answer)
        hint = ("a handful of FLOPs per element: the mean (an add), the difference, its "
                "square, the variance (an add), the scaling, gamma and beta; then times the "
                "number of elements" if flops < report.flops else
                "count each elementwise operation once per element, not once per byte or "
                "per pass")
        refuse(EX6, f"your FLOPs are {flops / report.flops:.3g}x XLA's (tolerance "
                    f"{flops_slack:g}x)", hint=hint, answer=answer)
    if not within(nbytes, minimum, bytes_slack):
        if within(nbytes * t * f, minimum, bytes_slack):
            refuse(EX6, "you gave bytes per element, and the prediction is for the whole "
                        "array", hint=f"multiply by the number of elements ({t} x {f})",
                   answer=answer)
        if close_enough(nbytes * 2, minimum, 0.1):
            hint = "bf16 is 2 bytes per element, and y is written as well as x read"
        elif close_enough(nbytes, 2 * minimum, 0.1):
            hint = "the array is bf16 (2 bytes), not float32: the float32 math stays on chip"
        else:
            hint = "the least any kernel moves: read x once, write y once (gamma, beta are tiny)"
        refuse(EX6, f"your bytes are {nbytes / minimum:.3g}x the least a kernel must move",
               hint=hint, answer=answer)
    if roof != right_roof:
        refuse(EX6, f"layer norm is not {roof}-bound on a v5e",
               hint="its intensity (a few FLOPs per byte) against the v5e's ridge point",
               answer=answer)
    return ok(EX6, f"{answer}. XLA's TPU byte count is {report.bytes_accessed / minimum:.1f}x "
                   f"the minimum: it made {len(report.fusions)} fusions ({fusions}), and each "
                   "one that needs x reads it from HBM again")
