"""Checkers for lab 7: Pallas kernels for the MXU, graded on any machine.

Kernels are graded by what they are and by their numbers. What they are: each answer is
traced (``jax.make_jaxpr``, no compiler needed) and the checker reads the program: the
work must happen inside the ``pallas_call`` (its kernel body holds the matmul, the
softmax), on the grid the exercise asks for, with the compiler parameters and the
accumulator dtype it asks for. Their numbers: Pallas's TPU interpreter on any runtime
(:func:`tpu_course.pallas_tools.interpret_mode`). Where the TPU compiler is installed (``libtpu``,
see :func:`tpu_course.hlo.tpu_compiler_problem`) it also grades their blocks and the HLO
they produce, and on a real TPU their time against XLA's own fused layer
(:mod:`tpu_course.bench`).

The course's own answers live in :mod:`tpu_course.checks._answers.ch07`; an answer that is,
or calls, one of them is refused.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping

from tpu_course import pallas_tools
from tpu_course.checks._answers import ch07 as _answers
from tpu_course.checks._core import (
    CheckResult, Lab, as_number, ok, refuse, refuse_course_code, skipped,
)

LAB = Lab(7, "Pallas kernels for the MXU")

EX1 = "Exercise 1 (fused matmul + bias + ReLU kernel)"
EX2 = "Exercise 2 (double-buffered VMEM footprint)"
EX3 = "Exercise 3 (which blocks compile)"
EX4 = "Exercise 4 (fused softmax(QK^T) kernel)"
EX5 = "Exercise 5 (a real chip: near XLA's fused layer)"

#: Exercise 1's cases: (m, k, n) and blocks (bm, bk, bn), float32, interpret mode.
DENSE_CASES = (((64, 384, 256), (32, 128, 128)), ((32, 512, 384), (32, 256, 128)))
#: Exercise 2's cases: blocks (bm, bk, bn) and the element size in bytes.
FOOTPRINT_CASES = (((512, 512, 512), 2), ((256, 1024, 128), 4), ((8, 128, 256), 2))
#: Exercise 3: the problem, the target, and the candidate blocks (bm, bk, bn).
PROBLEM = (4096, 4096, 4096)
TARGET = "v5e:1x1"
CANDIDATES = {"a": (512, 512, 512), "b": (256, 64, 256), "c": (2048, 256, 512),
              "d": (1024, 512, 2048), "e": (4, 128, 128), "f": (256, 256, 4096),
              "g": (2048, 1024, 512)}
#: Exercise 4's cases: (queries, keys, head dim) and the query block, float32.
SCORES_CASES = (((256, 384, 64), 128), ((128, 256, 128), 64))
#: Exercise 4's compiled case (bf16) and Exercise 5's problem and target fraction.
SCORES_COMPILED = ((1024, 2048, 128), 256)
FAST_PROBLEM = (4096, 4096, 4096)
FAST_FRACTION = 0.7

_VERDICTS = (pallas_tools.FITS, pallas_tools.MISALIGNED, pallas_tools.TOO_BIG)
_INDEX_MAPS = ("check the index maps: step (i, j, k) needs x's block (i, k), w's block "
               "(k, j), the bias's block (0, j), and writes the output's block (i, j)")


def _arrays(shape_a: tuple[int, ...], shape_b: tuple[int, ...], seed: int = 0) -> tuple[Any, Any]:
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal(shape_a), jnp.float32),
            jnp.asarray(rng.standard_normal(shape_b), jnp.float32))


# -- reading a traced program: what runs inside the kernel, what outside ------------------

#: Primitives that only wrap other code (a jit, a custom derivative, a named call): the
#: checker looks inside them, and they are not work of their own.
_WRAPPERS = frozenset({"pjit", "jit", "closed_call", "core_call", "named_call", "remat",
                       "checkpoint", "custom_jvp_call", "custom_vjp_call",
                       "custom_vjp_call_jaxpr"})
#: Primitives that move or relabel data without computing (allowed around a kernel).
_PLUMBING = frozenset({"convert_element_type", "reshape", "squeeze", "expand_dims", "copy",
                       "copy_p", "device_put"})
_SOFTMAX = frozenset({"exp", "exp2", "reduce_max", "max", "reduce_sum", "logistic", "log",
                      "div"})


def _subjaxprs(value: Any) -> Iterator[Any]:
    """The jaxprs inside one equation parameter (a jaxpr, a closed jaxpr, or a tuple of
    them, as ``cond``'s branches are)."""
    if hasattr(value, "eqns"):
        yield value
    elif hasattr(getattr(value, "jaxpr", None), "eqns"):
        yield value.jaxpr
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _subjaxprs(v)


def _eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and of the jaxprs nested in it (branches, loops)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in _subjaxprs(value):
                yield from _eqns(sub)


def _dtype(aval: Any) -> Any:
    return getattr(aval, "dtype", None) or getattr(getattr(aval, "inner_aval", None), "dtype",
                                                   None)


def _narrow_float(dtype: Any) -> bool:
    """True for a floating dtype of fewer than 32 bits (bfloat16, float16, float8)."""
    import numpy as np

    try:
        import jax.numpy as jnp

        return bool(jnp.issubdtype(dtype, jnp.floating)) and np.dtype(dtype).itemsize < 4
    except TypeError:
        return False


def _semantics(params: Any) -> tuple[str, ...] | None:
    """The ``dimension_semantics`` a pallas_call was given, lowercased, or None."""
    found = getattr(params, "dimension_semantics", None)
    if found is None and isinstance(params, Mapping):  # jax 0.7.2: {"mosaic_tpu": params}
        found = params.get("dimension_semantics")
        for value in params.values():
            found = found or getattr(value, "dimension_semantics", None)
    if found is None:
        return None
    return tuple(str(getattr(s, "name", s)).lower() for s in found)


@dataclasses.dataclass(frozen=True)
class _Kernel:
    """One ``pallas_call`` as traced: its grid, dimension semantics, the equations of its
    kernel body (nested ones included) and the dtypes of its scratch buffers."""

    grid: tuple[int, ...]
    semantics: tuple[str, ...] | None
    body: tuple[Any, ...]
    scratch: tuple[Any, ...]

    @property
    def ops(self) -> set[str]:
        return {e.primitive.name for e in self.body}


@dataclasses.dataclass(frozen=True)
class _Program:
    """A traced answer: its kernels, and the work (primitive names) done outside them."""

    kernels: tuple[_Kernel, ...]
    outside: tuple[str, ...]


def _trace(exercise: str, fn: Callable, *args: Any) -> _Program:
    """Trace ``fn(*args)`` (arrays or ``jax.ShapeDtypeStruct``) and split its program into
    the pallas_calls' kernels and the rest; a function that cannot be traced ends the check."""
    import jax

    try:
        closed = jax.make_jaxpr(fn)(*args)
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - a learner's code may raise anything
        refuse(exercise, f"tracing your function (jax.make_jaxpr) raised {type(err).__name__}: "
                         f"{str(err).splitlines()[0][:240] if str(err) else ''}",
               hint="a kernel's wrapper must trace: only jax.numpy, lax and Pallas on the "
                    "inputs (no numpy conversions, no Python branches on values); inside the "
                    "kernel, read and write refs with the same dtype")
    found: list[_Kernel] = []
    outside: list[str] = []

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name == "pallas_call":
                body = eqn.params["jaxpr"]
                mapping = eqn.params["grid_mapping"]
                count = int(getattr(mapping, "num_scratch_operands", 0) or 0)
                scratch = tuple(_dtype(v.aval) for v in body.invars[len(body.invars) - count:]
                                ) if count else ()
                found.append(_Kernel(tuple(int(g) for g in mapping.grid),
                                     _semantics(eqn.params.get("compiler_params")),
                                     tuple(_eqns(body)), scratch))
                continue
            if name not in _WRAPPERS:
                outside.append(name)
            for value in eqn.params.values():
                for sub in _subjaxprs(value):
                    walk(sub)

    walk(closed.jaxpr)
    return _Program(tuple(found), tuple(outside))


def _one_kernel(exercise: str, program: _Program, what: str) -> _Kernel:
    """The program's one pallas_call; none or several end the check."""
    if not program.kernels:
        refuse(exercise, f"your function runs no pallas_call: {what} is not a Pallas kernel",
               hint="write the kernel with pl.pallas_call and do the work inside it, not "
                    "with jnp outside")
    if len(program.kernels) > 1:
        refuse(exercise, f"your function runs {len(program.kernels)} pallas_calls, not one",
               hint="one kernel does it all: between two pallas_calls the intermediate "
                    "result goes out to HBM and comes back")
    return program.kernels[0]


# -- Exercise 1 ----------------------------------------------------------------------

#: Primitives a ReLU (or another max-with-zero) traces to.
_ACTIVATION = frozenset({"max", "select_n", "clamp", "relu"})


def _dense_program(exercise: str, dense_relu: Callable[..., Any], x: Any, w: Any, b: Any,
                   blocks: tuple[int, int, int], interpret: Any, case: str) -> None:
    """Ends the check unless ``dense_relu`` traces to one pallas_call whose kernel does the
    matmul, the bias add and the activation, on a grid with K's steps last, K not marked
    parallel, and (for narrow inputs) a float32 accumulation."""
    bm, bk, bn = blocks
    m, k = x.shape
    n = w.shape[1]
    program = _trace(exercise, lambda a, c, d: dense_relu(a, c, d, bm, bk, bn, interpret),
                     x, w, b)
    kernel = _one_kernel(exercise, program, "dense_relu")
    work = set(program.outside) - _PLUMBING - {"pallas_call"}
    if "dot_general" in work:
        refuse(exercise, f"for {case} the matmul runs outside your kernel: the traced program "
                         "has a jnp.dot (dot_general) outside the pallas_call",
               hint="the pallas_call must not just finish a product made outside it: each "
                    "grid step multiplies its x block by its w block inside the kernel")
    if work & _ACTIVATION:
        refuse(exercise, f"for {case} the activation runs outside your kernel "
                         f"({', '.join(sorted(work & _ACTIVATION))} outside the pallas_call)",
               hint="apply the ReLU in the kernel at the last K step, before the output block "
                    "is written: outside it, XLA reads the whole output from HBM again")
    if work & {"add", "add_any"}:
        refuse(exercise, f"for {case} the bias is added outside your kernel (an add outside "
                         "the pallas_call)",
               hint="pass b to the pallas_call with its own BlockSpec, (1, bn) at block (0, j), "
                    "and add it to the float32 sum inside the kernel")
    if work:
        refuse(exercise, f"for {case} your function also computes {', '.join(sorted(work))} "
                         "outside the pallas_call",
               hint="the matmul, the bias and the ReLU all happen inside the one kernel")
    if "dot_general" not in kernel.ops:
        refuse(exercise, f"for {case} your kernel does no matmul: its body has no jnp.dot "
                         "(dot_general)",
               hint="each step computes jnp.dot(x_ref[...], w_ref[...], "
                    "preferred_element_type=jnp.float32) and adds it into the accumulator")
    if not kernel.ops & _ACTIVATION:
        refuse(exercise, f"for {case} your kernel has no activation: no ReLU (max with 0) in "
                         "its body",
               hint="relu(z) = jnp.maximum(z, 0), applied to the finished sum plus the bias")
    steps, grid = -(-k // bk), kernel.grid
    if len(grid) < 3 and steps > 1 and steps not in grid:
        refuse(exercise, f"for {case} your grid {grid} has no K axis: K is not tiled into "
                         "bk blocks",
               hint="the chapter's K-tiled grid (M // bm, N // bn, K // bk), K last: x comes "
                    "in (bm, bk) blocks, w in (bk, bn) blocks, and a float32 accumulator sums "
                    "over K's steps")
    if len(grid) != 3 or grid[-1] != steps:
        refuse(exercise, f"for {case} K's steps are not the last axis of your grid {grid}",
               hint="the accumulator sums one output block over all of K before the next "
                    "block starts, so K runs innermost: grid (M // bm, N // bn, K // bk)")
    if sorted(grid[:2]) != sorted((-(-m // bm), -(-n // bn))):
        refuse(exercise, f"for {case} the first two axes of your grid {grid} do not cover "
                         "the output's (bm, bn) blocks",
               hint="grid (M // bm, N // bn, K // bk): one (i, j) pair per output block")
    semantics = kernel.semantics
    if semantics and len(semantics) == len(grid) and "parallel" in semantics[-1]:
        refuse(exercise, f"you marked the K axis {semantics[-1]!r} in dimension_semantics "
                         f"{semantics}",
               hint='each K step adds into what the step before it left in the accumulator: '
                    'K carries a dependence, so it is "arbitrary" (only M and N are '
                    '"parallel"); a parallel axis may be split across cores or reordered')
    narrow = [d for d in kernel.scratch if _narrow_float(d)]
    if narrow:
        refuse(exercise, f"your accumulator (scratch) is {narrow[0]}, not float32",
               hint="accumulate in float32 (pltpu.VMEM((bm, bn), jnp.float32)) and cast once "
                    "when you write the output block: a 16-bit sum over K's steps rounds at "
                    "every step")
    if not _narrow_float(x.dtype):
        return
    for eqn in kernel.body:
        out = eqn.outvars[0].aval if eqn.outvars else None
        if (eqn.primitive.name in ("add", "add_any") and _narrow_float(_dtype(out))
                and tuple(getattr(out, "shape", ())) == (bm, bn) and not kernel.scratch):
            refuse(exercise, f"with {x.dtype} inputs your kernel adds the K steps' products "
                             f"in {_dtype(out)}: a {_dtype(out)} accumulator",
                   hint="keep a float32 accumulator in VMEM scratch (not the output block, "
                        "which has the inputs' dtype) and cast once at the last K step")
    for eqn in kernel.body:
        if eqn.primitive.name == "dot_general" and _narrow_float(_dtype(eqn.outvars[0].aval)):
            refuse(exercise, f"with {x.dtype} inputs each step's jnp.dot returns "
                             f"{_dtype(eqn.outvars[0].aval)}: every block's product is rounded "
                             "before it is added",
                   hint="pass preferred_element_type=jnp.float32 to jnp.dot, so that the MXU's "
                        "float32 sums reach the accumulator as they are")


def _carries_over(got: Any, want: Any, bm: int, bn: int,
                  finish: Callable[[Any, int], Any] = lambda r, j: r) -> bool:
    """True when each output block (in grid order, rows or columns first) is the running
    sum of the right blocks so far (passed through ``finish(sum, column block)``): an
    accumulator zeroed once, not at every block's first K step."""
    import numpy as np

    rows, cols = range(got.shape[0] // bm), range(got.shape[1] // bn)
    for order in ([(i, j) for i in rows for j in cols], [(i, j) for j in cols for i in rows]):
        running, carried = np.zeros((bm, bn)), len(order) > 1
        for i, j in order:
            running = running + want[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            carried &= np.allclose(got[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn],
                                   finish(running, j), rtol=1e-3, atol=1e-3)
        if carried:
            return True
    return False


def _reads_unwritten(run: Callable[[Any], Any], got: Any) -> bool:
    """True when ``run(interpret)`` gives another result once the interpreter fills fresh
    memory with zeros instead of NaN: the kernel reads memory before writing it."""
    import numpy as np
    from jax.experimental.pallas import tpu as pltpu

    try:
        again = np.asarray(run(pltpu.InterpretParams(uninitialized_memory="zero")), np.float64)
    except Exception:  # noqa: BLE001 - a learner's code may raise anything
        return False
    return again.shape == got.shape and not np.allclose(again, got, rtol=1e-6, atol=1e-6,
                                                         equal_nan=True)


def _dense_inputs(m: int, k: int, n: int, seed: int) -> tuple[Any, Any, Any]:
    """x, w and a (1, n) bias whose entries straddle zero, so the ReLU matters."""
    import jax.numpy as jnp
    import numpy as np

    x, w = _arrays((m, k), (k, n), seed)
    rng = np.random.default_rng(seed + 7)
    b = jnp.asarray(rng.uniform(-3.0, 3.0, (1, n)), jnp.float32)
    return x, w, b


def _dense_numbers(dense_relu: Callable[..., Any], m: int, k: int, n: int,
                   blocks: tuple[int, int, int], seed: int, interpret: Any) -> None:
    """Ends the check unless ``dense_relu`` gives ``relu(x @ w + b)`` in the interpreter,
    naming the usual mistakes."""
    import numpy as np

    bm, bk, bn = blocks
    x, w, b = _dense_inputs(m, k, n, seed)
    case = f"[{m},{k}] @ [{k},{n}] + b with blocks (bm, bk, bn) = ({bm}, {bk}, {bn})"
    try:
        got = dense_relu(x, w, b, bm, bk, bn, interpret)
    except Exception as err:
        if "out-of-bounds" not in str(err).lower():
            raise
        refuse(EX1, f"for {case} a block index falls outside its array", hint=_INDEX_MAPS)
    if tuple(getattr(got, "shape", ())) != (m, n):
        refuse(EX1, f"for {case} the result has shape {getattr(got, 'shape', None)}, not "
                    f"({m}, {n})",
               hint="out_shape is (m, n); the grid covers it with (bm, bn) blocks")
    got = np.asarray(got, np.float64)
    xf, wf, bf = (np.asarray(a, np.float64) for a in (x, w, b))
    prod = xf @ wf
    want = np.maximum(prod + bf, 0)

    def close(a: Any) -> bool:
        return bool(np.allclose(got, a, rtol=1e-3, atol=1e-3))

    if close(want):
        return
    if not np.isfinite(got).all():
        refuse(EX1, f"for {case} the result holds NaN",
               hint="the interpreter fills fresh VMEM with NaN: is the accumulator zeroed (at "
                    "the first K step, pl.program_id(2) == 0) before the first +=?")
    steps = k // bk
    parts = [xf[:, s * bk:(s + 1) * bk] @ wf[s * bk:(s + 1) * bk, :] for s in range(steps)]
    running, from_bias = np.zeros_like(prod), np.broadcast_to(bf, prod.shape)
    for p in parts:  # a ReLU at every K step, from zero or from the bias
        running, from_bias = np.maximum(running + p, 0), np.maximum(from_bias + p, 0)
    named = [
        (prod + bf, "the result has negative entries: no ReLU was applied",
         "apply relu (jnp.maximum(z, 0)) to the sum plus the bias before writing"),
        (np.maximum(prod, 0), "the bias is missing",
         "b comes in as a third input: a (1, bn) block at (0, j), added to the float32 sum"),
        (np.maximum(prod, 0) + bf, "the bias is added after the ReLU",
         "relu(x @ w + b): add the bias first, then take the max with 0"),
        (np.maximum(prod + steps * bf, 0), "the bias is added at every K step",
         "add the bias once: at the last K step (or when the accumulator is set at the first)"),
        (np.maximum(sum(np.maximum(p, 0) for p in parts) + bf, 0),
         "the ReLU is applied to each K step's partial product",
         "a partial sum over K is not the result: apply the ReLU once, after the last K step"),
        (np.maximum(running + bf, 0), "the ReLU is applied to the running sum at every K step",
         "a partial sum over K is not the result: apply the ReLU once, after the last K step"),
        (from_bias, "the ReLU is applied to the running sum at every K step",
         "a partial sum over K is not the result: apply the ReLU once, after the last K step"),
        (np.maximum(parts[-1] + bf, 0), "the result uses the last K block's product only",
         "add each K step's product into the accumulator (+=), and zero it only at the first "
         "K step"),
    ]
    for value, message, hint in named:
        if close(value):
            refuse(EX1, f"for {case} {message}", hint=hint)
    if _reads_unwritten(lambda fill: dense_relu(x, w, b, bm, bk, bn, fill), got):
        refuse(EX1, f"for {case} your kernel reads VMEM it never wrote: its result changes "
                    "with what fresh memory holds",
               hint="set the accumulator at the first K step of every output block "
                    "(pl.program_id(2) == 0) before the first +=; the interpreter fills fresh "
                    "VMEM with NaN, and a ReLU written with where() turns that NaN into 0")
    # relu(the sum of every block so far + this block's bias, or the first block's bias
    # when the accumulator was started at the bias once)
    if any(_carries_over(got, prod, bm, bn, finish) for finish in (
            lambda r, j: np.maximum(r + bf[:, j * bn:(j + 1) * bn], 0),
            lambda r, j: np.maximum(r + bf[:, :bn], 0))):
        refuse(EX1, f"for {case} each output block holds the sum of all the blocks before it",
               hint="the accumulator carries over from the previous output block: zero it "
                    "when a new block starts (pl.program_id(2) == 0)")
    refuse(EX1, f"for {case} the numbers are wrong (largest error "
                f"{np.abs(got - want).max():.3g})", hint=_INDEX_MAPS)


def _hidden_dense(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    """Two small problems with other shapes and blocks (at most 12 grid steps each)."""
    cases = []
    for _ in range(2):
        bm, bk, bn = (int(rng.choice([8, 16, 64])), int(rng.choice([128, 256])),
                      int(rng.choice([128, 256])))
        m, k, n = bm * int(rng.integers(1, 3)), bk * int(rng.integers(2, 4)), bn * int(
            rng.integers(1, 3))
        cases.append((f"a [{m},{k}] @ [{k},{n}] layer with blocks ({bm}, {bk}, {bn})",
                      {"cases": (((m, k, n), (bm, bk, bn)),), "seed": int(rng.integers(2, 999))}))
    return cases


@LAB.exercise(EX1, minutes=25, kind="apply", hidden=_hidden_dense)
def check_dense_relu(dense_relu: Callable[..., Any], cases: Any = DENSE_CASES,
                     seed: int = 0) -> CheckResult:
    """``dense_relu(x, w, b, bm, bk, bn, interpret)``: traced, one pallas_call whose kernel
    does the matmul on the K-tiled grid (K last, not parallel) with a float32 accumulator
    (also for bf16 inputs), and the bias and the ReLU inside it; then against
    ``relu(x @ w + b)`` in the TPU interpreter on ``cases``, with a diagnosis of the usual
    mistakes."""
    import jax
    import jax.numpy as jnp

    refuse_course_code(EX1, dense_relu, _answers.dense_relu_reference,
                       _answers.dense_relu_kernel, _answers.dense_relu_xla,
                       pallas_tools.matmul_ktiled, pallas_tools.ktiled_kernel)
    interpret = pallas_tools.interpret_mode("cpu")
    for (m, k, n), blocks in cases:
        x, w, b = _dense_inputs(m, k, n, seed)
        case = f"[{m},{k}] @ [{k},{n}] + b with blocks (bm, bk, bn) = {tuple(blocks)}"
        _dense_program(EX1, dense_relu, x, w, b, tuple(blocks), interpret, case)
    (m, k, n), blocks = cases[0]
    S = jax.ShapeDtypeStruct
    _dense_program(EX1, dense_relu, S((m, k), jnp.bfloat16), S((k, n), jnp.bfloat16),
                   S((1, n), jnp.bfloat16), tuple(blocks), interpret,
                   f"bfloat16 [{m},{k}] @ [{k},{n}]")
    for (m, k, n), blocks in cases:
        _dense_numbers(dense_relu, m, k, n, tuple(blocks), seed, interpret)
    return ok(EX1, f"one kernel: K-tiled grid, K arbitrary, float32 accumulator, bias and ReLU "
                   f"at the last K step; right on {len(cases)} shape(s) and block choice(s) in "
                   "the TPU interpreter")


# -- Exercise 2 ----------------------------------------------------------------------


def _blocks(bm: int, bk: int, bn: int) -> int:
    return bm * bk + bk * bn + bm * bn


#: Exercise 2's usual mistakes: (their footprint, what the message says, the hint). A
#: mistake is named when it gives the learner's number on every case.
_FOOTPRINT_MISTAKES: tuple[tuple[Callable[[int, int, int, int], float], str, str], ...] = (
    (lambda bm, bk, bn, s: _answers.footprint(bm, bk, bn, s) / 2**20,
     "your footprint is in MiB, not bytes", "return bytes; divide by 2**20 only to print"),
    (lambda bm, bk, bn, s: _answers.footprint(bm, bk, bn, s) / 1e6,
     "your footprint is in MB, not bytes", "return bytes; divide by 2**20 only to print"),
    (lambda bm, bk, bn, s: 2 * _blocks(bm, bk, bn) + bm * bn,
     "you counted elements, not bytes",
     "multiply each block's elements by itemsize (the float32 accumulator's by 4)"),
    (lambda bm, bk, bn, s: 8 * _answers.footprint(bm, bk, bn, s),
     "you counted bits, not bytes", "itemsize is in bytes: 2 for bfloat16, 4 for float32"),
    (lambda bm, bk, bn, s: _blocks(bm, bk, bn) * s + 4 * bm * bn,
     "you counted each block once",
     "Pallas double-buffers every block it copies in or out: it fetches the next block "
     "while the MXU works on this one"),
    (lambda bm, bk, bn, s: 2 * _blocks(bm, bk, bn) * s,
     "you left out the accumulator", "the scratch accumulator lives in VMEM too (float32)"),
    (lambda bm, bk, bn, s: 2 * _blocks(bm, bk, bn) * s + bm * bn * s,
     "the accumulator is counted in the inputs' dtype",
     "it is float32 (4 bytes) whatever the inputs' dtype"),
    (lambda bm, bk, bn, s: 2 * _blocks(bm, bk, bn) * s + 8 * bm * bn,
     "the accumulator is counted twice",
     "it is scratch: single, since it is never copied in or out"),
    (lambda bm, bk, bn, s: 2 * _blocks(bm, bk, bn) * s + 2 * bm * bn * s,
     "the accumulator is counted twice, in the inputs' dtype",
     "it is scratch (single, never copied in or out) and float32 (4 bytes)"),
    (lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn) * s + bm * bn * s + 4 * bm * bn,
     "the output block is not double-buffered",
     "the output block is copied out while the next one is computed: two buffers, like "
     "x's and y's"),
)


def _hidden_footprint(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for size in (1, rng.choice([2, 4])):  # 1 byte: int8 and fp8 blocks
        blocks = (int(rng.choice([8, 16, 128, 256, 1024])), int(rng.choice([128, 256, 2048])),
                  int(rng.choice([128, 384, 512])))
        cases.append((f"blocks {blocks} of {int(size)}-byte elements",
                      {"cases": ((blocks, int(size)),)}))
    return cases


@LAB.exercise(EX2, minutes=10, kind="predict", hidden=_hidden_footprint)
def check_footprint(vmem_footprint: Callable[[int, int, int, int], Any],
                    cases: Any = FOOTPRINT_CASES) -> CheckResult:
    """``vmem_footprint(bm, bk, bn, itemsize)``: the double-buffered x, y and output blocks
    plus the single float32 accumulator, in bytes, exactly."""
    refuse_course_code(EX2, vmem_footprint, _answers.footprint)
    got = [as_number(EX2, vmem_footprint(bm, bk, bn, size),
                     f"vmem_footprint({bm}, {bk}, {bn}, {size})")
           for (bm, bk, bn), size in cases]
    want = [_answers.footprint(bm, bk, bn, size) for (bm, bk, bn), size in cases]
    wrong = [i for i in range(len(cases)) if got[i] != want[i]]
    if not wrong:
        return ok(EX2, "2 x (x, y and output blocks) + the float32 accumulator: "
                       f"{_answers.footprint(512, 512, 512, 2) / 2**20:.0f} MiB for "
                       "512-blocks in bf16")
    (bm, bk, bn), size = cases[wrong[0]]
    where = f"for ({bm}, {bk}, {bn}) with {size}-byte elements"
    answer = "; ".join(f"{tuple(b)}, {s}-byte elements: {w:,} bytes"
                       for (b, s), w in zip(cases, want))
    for formula, message, hint in _FOOTPRINT_MISTAKES:
        if all(math.isclose(g, formula(*b, s), rel_tol=1e-9) for g, (b, s) in zip(got, cases)):
            refuse(EX2, f"{where} {message}", hint=hint, answer=answer)
    refuse(EX2, f"{where} your footprint is {got[wrong[0]] / want[wrong[0]]:.3g}x the model's",
           hint="three blocks (x: bm x bk, y: bk x bn, out: bm x bn), two buffers each, plus "
                "a bm x bn float32 accumulator", answer=answer)


# -- Exercise 3 ----------------------------------------------------------------------


def _normal_verdict(value: Any) -> str | None:
    text = str(value).strip().lower().replace("_", " ").replace("-", " ")
    aliases = {"fits": pallas_tools.FITS, "fit": pallas_tools.FITS, "ok": pallas_tools.FITS,
               "legal": pallas_tools.FITS, "misaligned": pallas_tools.MISALIGNED,
               "too big": pallas_tools.TOO_BIG, "oom": pallas_tools.TOO_BIG}
    return aliases.get(text) if isinstance(value, str) else None


@LAB.exercise(EX3, minutes=15, needs="tpu-compiler", kind="predict")
def check_verdicts(verdicts: Any) -> CheckResult:
    """``verdicts``: candidate letter -> ``"fits"``, ``"misaligned"`` or ``"too big"``,
    graded against the TPU compiler compiling each candidate for :data:`TARGET`."""
    if not isinstance(verdicts, dict):
        refuse(EX3, f"verdicts should be a dict, not a {type(verdicts).__name__}",
               hint='{"a": "fits", "b": "misaligned", ...}, one entry per candidate')
    missing = sorted(set(CANDIDATES) - set(verdicts))
    if missing:
        refuse(EX3, f"no verdict for candidate(s) {', '.join(missing)}",
               hint="give every candidate a verdict")
    limit = pallas_tools.scoped_vmem_limit(TARGET) / 2**20
    wrong: dict[tuple[str, str], list[str]] = {}
    lines = []
    for name, blocks in CANDIDATES.items():
        said = _normal_verdict(verdicts[name])
        if said is None:
            refuse(EX3, f"verdicts[{name!r}] is {verdicts[name]!r:.40}",
                   hint=f"use one of {', '.join(map(repr, _VERDICTS))}")
        v = _answers.candidate_verdict(blocks, PROBLEM, TARGET)
        model = _answers.footprint(*blocks, 2) / 2**20
        detail = (f"; the compiler asked for {v.needed_bytes / 2**20:.2f} MiB"
                  if v.needed_bytes else "")
        lines.append(f"{name} {blocks}: {v.status} (model {model:.2f} MiB{detail})")
        if said != v.status:
            wrong.setdefault((said, v.status), []).append(name)
    answer = f"scoped VMEM limit {limit:.0f} MiB on {TARGET}; " + "; ".join(lines)
    if wrong:
        hints = []
        if any(true == pallas_tools.MISALIGNED for _, true in wrong):
            hints.append("a block is misaligned when one of its last two dims (x: bm, bk; "
                         "y: bk, bn; out: bm, bn) is not a multiple of 8 (second to last) and "
                         "128 (last), whatever its size")
        if any(said == pallas_tools.MISALIGNED for said, _ in wrong):
            hints.append("a dim that is a multiple of 8 (second to last) or 128 (last) is "
                         "aligned, however large")
        if (pallas_tools.FITS, pallas_tools.TOO_BIG) in wrong:
            hints.append("every block is double-buffered: count your vmem_footprint against "
                         f"the {limit:.0f} MiB scoped limit, not the chip's whole VMEM")
        if (pallas_tools.TOO_BIG, pallas_tools.FITS) in wrong:
            hints.append(f"a footprint up to the {limit:.0f} MiB scoped limit fits")
        names = sorted(n for group in wrong.values() for n in group)
        refuse(EX3, f"{len(names)} of {len(CANDIDATES)} verdicts differ from the compiler's: "
                    f"{', '.join(names)}", hint="; ".join(hints), answer=answer)
    return ok(EX3, f"all {len(CANDIDATES)} match the TPU compiler ({TARGET}, scoped limit "
                   f"{limit:.0f} MiB): " + "; ".join(lines))


# -- Exercise 4 ----------------------------------------------------------------------


def compile_scores(fn: Callable, target: str = TARGET) -> Any:
    """``fn(q, k)`` on :data:`SCORES_COMPILED`'s bf16 shapes, compiled for ``target``."""
    import jax
    import jax.numpy as jnp

    from tpu_course import hlo

    (lq, lk, d), _ = SCORES_COMPILED
    S = jax.ShapeDtypeStruct
    return hlo.inspect(fn, S((lq, d), jnp.bfloat16), S((lk, d), jnp.bfloat16), target=target)


def _scores_program(attention_scores: Callable[..., Any], q: Any, k: Any, bq: int,
                    interpret: Any, case: str) -> None:
    """Ends the check unless ``attention_scores`` traces to one pallas_call that holds the
    matmul and the whole softmax, with nothing but data plumbing around it."""
    program = _trace(EX4, lambda a, b: attention_scores(a, b, bq, interpret), q, k)
    kernel = _one_kernel(EX4, program, "attention_scores")
    work = sorted(set(program.outside) - _PLUMBING - {"pallas_call"})
    if "dot_general" in work:
        refuse(EX4, f"for {case} the q @ k.T matmul runs outside your kernel (a dot_general "
                    "outside the pallas_call)",
               hint="compute the block's scores inside the kernel: dot_general of the q block "
                    "and k, contracting the last dims of both")
    softmax = [w for w in work if w in _SOFTMAX]
    if softmax:
        refuse(EX4, f"for {case} the softmax runs outside your kernel ({', '.join(softmax)} "
                    "outside the pallas_call)",
               hint="the point of the kernel is that the scores never leave VMEM: take each "
                    "row's max, exp, sum and divide inside it")
    if "transpose" in work:
        refuse(EX4, f"for {case} k is transposed outside your kernel",
               hint="XLA would write a transposed copy of k to HBM first: inside the kernel, "
                    "use dot_general contracting the last dims of both (or jnp.dot with "
                    "k_ref[...].T)")
    if work:
        refuse(EX4, f"for {case} your function also computes {', '.join(work)} outside the "
                    "pallas_call",
               hint="do the matmul, the scaling and the whole softmax inside the one kernel, "
                    "so that nothing is left for XLA")
    ops = kernel.ops
    if "dot_general" not in ops:
        refuse(EX4, f"for {case} your kernel does no matmul: its body has no dot_general",
               hint="each step computes its query block's scores against all of k on the MXU")
    if not ops & {"exp", "exp2"}:
        refuse(EX4, f"for {case} your kernel has no exp: the softmax is not inside it",
               hint="softmax(s) = exp(s - max) / sum(exp(s - max)) over each row, in the kernel")
    if "reduce_max" not in ops:
        refuse(EX4, f"for {case} your kernel does not subtract each row's max before exp",
               hint="exp overflows float32 once a score passes about 88; softmax(s) equals "
                    "softmax(s - max(s)), which never overflows")
    if "reduce_sum" not in ops:
        refuse(EX4, f"for {case} your kernel does not sum each row's exponentials",
               hint="divide each row's exp by its sum over the keys (axis=-1)")
    lq = q.shape[0]
    if math.prod(kernel.grid) != -(-lq // bq):
        refuse(EX4, f"for {case} your grid {kernel.grid} does not step over the queries in "
                    "blocks of bq",
               hint="a 1-D grid with one step per block of bq queries: grid=(Lq // bq,)")


def _scores_numbers(attention_scores: Callable[..., Any], q: Any, k: Any, bq: int,
                    interpret: Any, case: str) -> None:
    import numpy as np

    lq, lk = q.shape[0], k.shape[0]
    got = attention_scores(q, k, bq, interpret)
    if tuple(getattr(got, "shape", ())) != (lq, lk):
        refuse(EX4, f"for {case} the result has shape {getattr(got, 'shape', None)}, not "
                    f"({lq}, {lk})",
               hint="one row of scores per query, one column per key")
    got = np.asarray(got, np.float64)
    want = np.asarray(_answers.scores_reference(q, k), np.float64)
    if np.allclose(got, want, rtol=1e-4, atol=1e-5):
        return
    s = np.asarray(q, np.float64) @ np.asarray(k, np.float64).T
    unscaled = np.exp(s - s.max(-1, keepdims=True))
    if np.allclose(got, unscaled / unscaled.sum(-1, keepdims=True), rtol=1e-4, atol=1e-5):
        refuse(EX4, f"for {case} the scores are not scaled",
               hint="divide q @ k.T by sqrt(d) before the softmax")
    for root in (q.shape[1], 64, 128):
        t = s / math.sqrt(root)
        e = np.exp(t - t.max(-1, keepdims=True))
        if root != q.shape[1] and np.allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-4,
                                              atol=1e-5):
            refuse(EX4, f"for {case} the scores are scaled by a fixed number, not this "
                        "head's sqrt(d)",
                   hint="take d from the shapes (q.shape[-1]) rather than typing it")
    if np.allclose(got.sum(0), 1, atol=1e-3) and not np.allclose(got.sum(1), 1, atol=1e-3):
        refuse(EX4, f"for {case} the softmax runs over the queries",
               hint="normalise each row (over the keys: axis=-1)")
    if not np.isfinite(got).all():
        refuse(EX4, f"for {case} the result holds NaN or inf",
               hint="subtract each row's max before exp, and check the index maps")
    refuse(EX4, f"for {case} the numbers are wrong (largest error "
                f"{np.abs(got - want).max():.3g})",
           hint="query block i reads q's block (i, 0) and all of k (block (0, 0)), and "
                "writes the output's block (i, 0)")


def _hidden_scores(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for _ in range(2):
        bq = int(rng.choice([8, 16, 32]))
        lq, lk, d = bq * int(rng.integers(2, 4)), int(rng.choice([128, 256])), int(
            rng.choice([32, 96, 128]))
        cases.append((f"q [{lq},{d}], k [{lk},{d}] with query blocks of {bq}",
                      {"cases": (((lq, lk, d), bq),), "compiled": False,
                       "seed": int(rng.integers(2, 999))}))
    return cases


@LAB.exercise(EX4, minutes=25, kind="apply", hidden=_hidden_scores)
def check_attention_scores(attention_scores: Callable[..., Any], cases: Any = SCORES_CASES,
                           compiled: bool = True, seed: int = 1) -> CheckResult:
    """``attention_scores(q, k, bq, interpret)``: traced, one pallas_call holding the matmul
    and the whole softmax; ``softmax(q @ k.T / sqrt(d))`` in the TPU interpreter; then
    (``compiled`` and where the TPU compiler is installed) one Mosaic custom call in the
    compiled HLO where XLA's version needs several fusions."""
    from tpu_course import hlo

    refuse_course_code(EX4, attention_scores, _answers.attention_scores_reference,
                       _answers.scores_reference)
    interpret = pallas_tools.interpret_mode("cpu")
    arrays = []
    for (lq, lk, d), bq in cases:
        q, k = _arrays((lq, d), (lk, d), seed=seed)
        case = f"q [{lq},{d}], k [{lk},{d}], query block {bq}"
        _scores_program(attention_scores, q, k, bq, interpret, case)
        arrays.append((q, k, bq, case))
    for q, k, bq, case in arrays:
        _scores_numbers(attention_scores, q, k, bq, interpret, case)
    problem = hlo.tpu_compiler_problem() if compiled else "not asked for"
    if problem:
        return ok(EX4, "one kernel holds the matmul and the softmax; right in the TPU "
                       f"interpreter; the compiled-HLO half is not graded here: {problem}")
    (_, _, _), bq = SCORES_COMPILED
    mine = compile_scores(lambda a, b: attention_scores(a, b, bq, False))
    xla = compile_scores(_answers.scores_reference)
    calls = mine.compute_ops.get("custom-call", 0)
    if calls != 1 or mine.fusions:
        refuse(EX4, f"compiled for {TARGET}, your version has {calls} custom call(s) and "
                    f"{len(mine.fusions)} fusion(s) around it",
               hint="do the matmul, the scaling and the whole softmax inside the kernel, so "
                    "that nothing is left for XLA to fuse")
    return ok(EX4, f"right in the TPU interpreter; compiled for {TARGET}: one Mosaic custom "
                   f"call, where XLA's version makes {len(xla.fusions)} fusions (the scores "
                   "go to HBM and come back for the softmax)")


# -- Exercise 5 ----------------------------------------------------------------------


def _fast_blocks(fast_blocks: Any) -> tuple[int, int, int]:
    if isinstance(fast_blocks, str):
        refuse(EX5, f"fast_blocks should be three ints (bm, bk, bn), not the string "
                    f"{fast_blocks!r:.40}", hint="fast_blocks = (bm, bk, bn), without quotes")
    try:
        blocks = tuple(int(b) for b in fast_blocks)
    except (TypeError, ValueError):
        refuse(EX5, f"fast_blocks should be three ints (bm, bk, bn), not {fast_blocks!r:.40}",
               hint="fast_blocks = (bm, bk, bn)")
    if len(blocks) != 3 or min(blocks) < 1:
        refuse(EX5, f"fast_blocks should be three positive ints (bm, bk, bn), not "
                    f"{fast_blocks!r:.40}", hint="fast_blocks = (bm, bk, bn)")
    m, k, n = FAST_PROBLEM
    bm, bk, bn = blocks
    if m % bm or k % bk or n % bn:
        refuse(EX5, f"{blocks} does not divide {FAST_PROBLEM}",
               hint="pick blocks that divide the problem")
    return blocks  # type: ignore[return-value]


def _ktiled_intensity(blocks: tuple[int, int, int], problem: tuple[int, int, int] = FAST_PROBLEM,
                     itemsize: int = 2) -> float:
    """FLOP per HBM byte of the K-tiled matmul by chapter 7's traffic model for the 3-D grid
    (section 6): x is read once per column of tiles (N / bn), w once per row (M / bm), the
    output written once. Exercise 5's hint sets it against the chip's ridge point.

    >>> round(_ktiled_intensity((512, 1024, 1024)), 1)
    315.1
    >>> round(_ktiled_intensity((1024, 512, 2048)), 1)
    585.1
    """
    (m, k, n), (bm, _, bn) = problem, blocks
    moved = (m * k * (n // bn) + k * n * (m // bm) + m * n) * itemsize
    return 2 * m * k * n / moved


@LAB.exercise(EX5, minutes=15, needs="tpu-chip", kind="predict",
              predicts=("fast_blocks",))
def check_fast(dense_relu: Callable[..., Any], fast_blocks: Any,
               fraction: float = FAST_FRACTION) -> CheckResult:
    """``dense_relu`` must be Exercise 1's kind of kernel (traced: one pallas_call doing the
    matmul, the bias and the ReLU on the K-tiled grid, float32 accumulation); then, on a
    TPU, with ``fast_blocks`` on :data:`FAST_PROBLEM` in bf16 it gives XLA's numbers and
    reaches ``fraction`` of the throughput of XLA's own fused layer (both timed with the
    harness)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tpu_course import bench, runtime

    refuse_course_code(EX5, dense_relu, _answers.dense_relu_reference,
                       _answers.dense_relu_kernel, _answers.dense_relu_xla,
                       pallas_tools.matmul_ktiled, pallas_tools.ktiled_kernel)
    blocks = _fast_blocks(fast_blocks)
    m, k, n = FAST_PROBLEM
    S = jax.ShapeDtypeStruct
    _dense_program(EX5, dense_relu, S((m, k), jnp.bfloat16), S((k, n), jnp.bfloat16),
                   S((1, n), jnp.bfloat16), blocks, False,
                   f"bfloat16 {FAST_PROBLEM} with blocks {blocks}")
    platform = runtime.describe().platform
    if platform != "tpu":
        return skipped(EX5, f"your kernel is a TPU kernel; on this {platform} runtime it runs "
                            "only in the interpreter, whose time means nothing (Pallas's GPU "
                            "kernels are written differently: see the chapter)")
    bm, bk, bn = blocks
    x = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(2), (1, n), jnp.bfloat16)
    fn = jax.jit(lambda a, c, d: dense_relu(a, c, d, bm, bk, bn, False))
    xla = jax.jit(_answers.dense_relu_xla)
    got = np.asarray(fn(x, w, b), np.float32)
    want = np.asarray(xla(x, w, b), np.float32)
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    if not np.isfinite(err) or err > 2e-2:
        refuse(EX5, f"with blocks {blocks} on the TPU your kernel's result differs from "
                    f"XLA's (largest error {err:.2g} of the largest value)",
               hint="run Exercise 1's check again; then check that the blocks divide the "
                    "problem and the accumulator is zeroed at the first K step")
    mine = bench.benchmark(fn, x, w, b, name="your kernel", warn=False)
    ref = bench.benchmark(xla, x, w, b, name="XLA's fused layer", warn=False)
    ratio = ref.median_s / mine.median_s
    text = (f"your kernel {mine.median_s * 1e3:.3f} ms, XLA's fused layer "
            f"{ref.median_s * 1e3:.3f} ms on {runtime.describe().device_kind}: {ratio:.0%} of "
            "its throughput")
    if ratio < fraction:
        from tpu_course import hardware

        chip = hardware.lookup(runtime.describe().device_kind)
        model = ""
        if chip is not None and chip.peak_bf16_flops_per_s:
            ai, ridge = _ktiled_intensity(blocks), chip.critical_intensity()
            model = (f"by chapter 7's 3-D traffic model your blocks do {ai:.0f} FLOP per HBM "
                     f"byte against this {chip.display_name}'s ridge of {ridge:.0f}"
                     + (f": HBM-bound, at most {ai / ridge:.0%} of its peak; " if ai < ridge
                        else ": compute-bound by the model; "))
        refuse(EX5, text + f" (the goal is {fraction:.0%})",
               hint=model + "bigger blocks re-read less of x and w from HBM (x once per column "
                    "of tiles, w once per row); keep them multiples of the MXU width and "
                    "inside this chip's scoped VMEM limit (Exercise 2's footprint)")
    return ok(EX5, text)
