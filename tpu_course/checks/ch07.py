"""Lab 7 (Pallas kernels for the MXU): each exercise declared once.

A kernel's probe runs it in Pallas's interpreter (``interpret=True``, on any runtime) and
returns plain facts: its output, and what its traced program holds (how many
``pallas_call``s, the grid, the dimension semantics, the primitives inside the kernel and
outside it, the scratch and accumulation dtypes). The expected outputs come from
instruments: ``numpy`` for the numbers, the chapter's kernel's own BlockSpecs for the VMEM
footprint, the TPU compiler for the verdicts, the chip itself for the speed. Hidden cases
and known mistakes live in the repository's ``grading/ch07.py``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import numpy as np

from tpu_course import pallas_tools
from tpu_course.checks.engine import Case, Exercise, Lab, Mistake, Wrong, array, number

LAB = Lab(7, "Pallas kernels for the MXU")

#: Exercise 3: the problem, the target, and the candidate blocks (bm, bk, bn).
PROBLEM = (4096, 4096, 4096)
TARGET = "v5e:1x1"
CANDIDATES = {"a": (512, 512, 512), "b": (256, 64, 256), "c": (2048, 256, 512),
              "d": (1024, 512, 2048), "e": (4, 128, 128), "f": (256, 256, 4096),
              "g": (2048, 1024, 512)}
#: Exercise 5's problem (bf16) and the fraction of XLA's throughput to reach.
FAST_PROBLEM = (4096, 4096, 4096)
FAST_FRACTION = 0.7
_NARROW = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
_WRAPPERS = {"pjit", "jit", "closed_call", "core_call", "named_call", "remat", "checkpoint",
             "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"}
_PLUMBING = {"convert_element_type", "reshape", "squeeze", "expand_dims", "copy", "copy_p",
             "device_put", "pallas_call"}
_INDEX_MAPS = ("check the index maps: step (i, j, k) needs x's block (i, k), w's block "
               "(k, j), the bias's block (0, j), and writes the output's block (i, j)")


# -- what a traced kernel holds ----------------------------------------------------------


def _subjaxprs(value: Any) -> list:
    if hasattr(value, "eqns"):
        return [value]
    if hasattr(getattr(value, "jaxpr", None), "eqns"):
        return [value.jaxpr]
    return [j for v in value for j in _subjaxprs(v)] if isinstance(value, (tuple, list)) else []


def _eqns(jaxpr: Any) -> list:
    return [e for eqn in jaxpr.eqns for e in [eqn, *(x for v in eqn.params.values()
                                                     for sub in _subjaxprs(v)
                                                     for x in _eqns(sub))]]


def _name(aval: Any) -> str:
    return str(getattr(aval, "dtype", None) or getattr(getattr(aval, "inner_aval", None),
                                                       "dtype", ""))


def program(fn: Any, *args: Any) -> dict:
    """What ``fn(*args)`` traces to: its pallas_calls, the first one's grid, dimension
    semantics, primitives inside it, scratch dtypes, the dtypes its dot_generals return and
    its block-shaped adds compute in, and the work done outside any kernel."""
    import jax

    try:
        closed = jax.make_jaxpr(fn)(*args)
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - a learner's code may raise anything
        raise Wrong(f"tracing your function (jax.make_jaxpr) raised {type(err).__name__}: "
                    f"{(str(err).splitlines() or [''])[0][:200]}",
                    "the wrapper must trace: only jax.numpy, lax and Pallas on the inputs "
                    "(no numpy conversions, no Python branches on values)") from None
    calls, outside = [], set()

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                calls.append(eqn)
                continue
            outside.add(eqn.primitive.name)
            for sub in (s for v in eqn.params.values() for s in _subjaxprs(v)):
                walk(sub)

    walk(closed.jaxpr)
    facts = {"calls": len(calls), "outside": sorted(outside - _PLUMBING - _WRAPPERS)}
    if calls:
        body, mapping = calls[0].params["jaxpr"], calls[0].params["grid_mapping"]
        count = int(getattr(mapping, "num_scratch_operands", 0) or 0)
        params = calls[0].params.get("compiler_params")
        found = getattr(params, "dimension_semantics", None)
        if found is None and isinstance(params, Mapping):
            found = next((getattr(v, "dimension_semantics", None) for v in params.values()), None)
        eqns = _eqns(body)
        facts.update(
            grid=tuple(int(g) for g in mapping.grid),
            semantics=None if found is None else tuple(str(getattr(s, "name", s)).lower()
                                                       for s in found),
            inside=sorted({e.primitive.name for e in eqns}),
            scratch=[_name(v.aval) for v in body.invars[len(body.invars) - count:]][:count],
            dots=[_name(e.outvars[0].aval) for e in eqns if e.primitive.name == "dot_general"],
            adds=[_name(e.outvars[0].aval) for e in eqns if e.primitive.name in
                  ("add", "add_any") and len(getattr(e.outvars[0].aval, "shape", ())) == 2])
    return facts


def _run(fn: Any, arrays: tuple, *static: Any) -> Any:
    """``fn(*arrays, *static)`` jitted (cached per function and shapes), as numpy."""
    import jax

    try:
        jitted = jax.jit(fn, static_argnums=tuple(range(len(arrays), len(arrays) + len(static))))
    except TypeError:
        return np.asarray(fn(*arrays, *static))
    return np.asarray(jitted(*arrays, *static))


def _kernel_structure(f: Any, what: str) -> None:
    """One pallas_call, nothing but data plumbing outside it, a matmul inside."""
    if not isinstance(f, dict) or "calls" not in f:
        raise Wrong(f"the probe's output is {type(f).__name__}, not a kernel's facts",
                    "run the check cell as the lab wrote it")
    if f["calls"] == 0:
        raise Wrong(f"your function runs no pallas_call: {what} is not a Pallas kernel",
                    "write the kernel with pl.pallas_call and do the work inside it")
    if f["calls"] > 1:
        raise Wrong(f"your function runs {f['calls']} pallas_calls, not one",
                    "one kernel does it all: between two pallas_calls the intermediate "
                    "result goes out to HBM and comes back")
    if "dot_general" in f["outside"]:
        raise Wrong("the matmul runs outside your kernel (a dot_general outside the "
                    "pallas_call)", "each grid step multiplies its blocks inside the kernel")


def _near(got: Any, want: Any, dtype: str) -> Any:
    """Where ``got`` is within the rounding of ``dtype`` of ``want`` (both float64)."""
    rtol, atol = (8e-3, 2e-2) if dtype in _NARROW else (1e-5, 1e-5)
    return np.isclose(got, want, rtol=rtol, atol=atol * max(1.0, np.abs(want).max()))


def _numbers(got: Any, want: Any, case: Case, what: str) -> str | None:
    out = array(got.get("out") if isinstance(got, dict) else got, "your result",
                want["out"].shape)
    if out.dtype != want["out"].dtype:
        raise Wrong(f"{want['out'].dtype} inputs came in and your kernel returned {out.dtype}",
                    "return the inputs' dtype: out_shape=jax.ShapeDtypeStruct(shape, x.dtype), "
                    "and cast once (.astype(o_ref.dtype)) when you write the block")
    g, w = out.astype(np.float64), want["out"].astype(np.float64)
    if not np.isfinite(g).all():
        return f"your result holds {int((~np.isfinite(g)).sum())} NaN or inf entries"
    bad = ~_near(g, w, case.args["dtype"])
    if not bad.any():
        return None
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"your result differs from {what} in {int(bad.sum())} of {bad.size} places "
            f"(first at {at}: {g[at]:.6g}, expected {w[at]:.6g})")


def _rule(hint: str, variant: Any) -> Mistake:
    """A mistake recognised when the output equals ``variant(inputs, case)``."""
    def when(got: Any, want: Any, case: Case) -> bool:
        out = np.asarray(got["out"], np.float64)
        return bool(_near(out, variant(case), case.args["dtype"]).all())
    return Mistake(hint, when=when)


# -- Exercise 1: a dense layer in one kernel ----------------------------------------------


@functools.lru_cache(maxsize=64)
def _dense_inputs(m: int, k: int, n: int, seed: int) -> tuple:
    """Small integers (exact in bf16 and in a float32 sum) and a bias that straddles zero."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-3, 4, (m, k)).astype(np.float64),
            rng.integers(-3, 4, (k, n)).astype(np.float64),
            rng.integers(-40, 41, (1, n)) / 2)


def _dense_case(m: int, k: int, n: int, bm: int, bk: int, bn: int, dtype: str, seed: int,
                label: str = "") -> Case:
    return Case(f"{label}{dtype} [{m},{k}] @ [{k},{n}] + b with blocks (bm, bk, bn) = "
                f"({bm}, {bk}, {bn})", {"m": m, "k": k, "n": n, "bm": bm, "bk": bk, "bn": bn,
                                        "dtype": dtype, "seed": seed})


def _dense_args(case: Case) -> tuple:
    a = case.args
    return _dense_inputs(a["m"], a["k"], a["n"], a["seed"]), (a["bm"], a["bk"], a["bn"])


def _probe_dense(answer: Mapping[str, Any], case: Case) -> dict:
    import jax.numpy as jnp

    (x, w, b), blocks = _dense_args(case)
    arrays = tuple(jnp.asarray(v, case.args["dtype"]) for v in (x, w, b))
    fn = answer["dense_relu"]
    facts = program(lambda p, q, r: fn(p, q, r, *blocks, True), *arrays)
    return facts | {"out": _run(fn, arrays, *blocks, True) if facts["calls"] == 1 else None}


def _expect_dense(case: Case) -> dict:
    (x, w, b), _ = _dense_args(case)
    return {"out": np.maximum(x @ w + b, 0).astype(_np_dtype(case.args["dtype"]))}


def _np_dtype(name: str) -> Any:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _dense_structure(f: Any, a: Mapping[str, Any]) -> None:
    _kernel_structure(f, "dense_relu")
    outside = set(f["outside"])
    if outside & {"max", "select_n", "clamp", "relu"}:
        raise Wrong("the activation runs outside your kernel",
                    "apply the ReLU in the kernel at the last K step, before the output block "
                    "is written: outside it, XLA reads the whole output from HBM again")
    if outside & {"add", "add_any"}:
        raise Wrong("the bias is added outside your kernel (an add outside the pallas_call)",
                    "pass b to the pallas_call with its own BlockSpec, (1, bn) at block (0, j), "
                    "and add it to the float32 sum inside the kernel")
    if outside:
        raise Wrong(f"your function also computes {', '.join(sorted(outside))} outside the "
                    "pallas_call", "the matmul, the bias and the ReLU all happen in the kernel")
    if "dot_general" not in f["inside"]:
        raise Wrong("your kernel does no matmul (no dot_general in its body)",
                    "each step adds jnp.dot(x_ref[...], w_ref[...], preferred_element_type="
                    "jnp.float32) into the accumulator")
    grid, steps = f["grid"], a["k"] // a["bk"]
    blocks = sorted((a["m"] // a["bm"], a["n"] // a["bn"]))
    if len(grid) != 3 or grid[-1] != steps or sorted(grid[:2]) != blocks:
        raise Wrong(f"your grid is {grid}: K's {steps} steps are not its last axis beside "
                    f"the {blocks[0]} x {blocks[1]} output blocks",
                    "the chapter's K-tiled grid (M // bm, N // bn, K // bk), K innermost: x in "
                    "(bm, bk) blocks, w in (bk, bn) blocks, a float32 accumulator over K's steps")
    if f["semantics"] and "parallel" in f["semantics"][-1]:
        raise Wrong(f"you marked the K axis {f['semantics'][-1]!r}",
                    "each K step adds into what the step before left in the accumulator: K is "
                    '"arbitrary" (only M and N are "parallel")')
    narrow = [d for d in f["scratch"] + f["dots"] if d in _NARROW] or [
        d for d in f["adds"] if d in _NARROW and not f["scratch"]]
    if narrow:
        raise Wrong(f"your kernel accumulates the K steps' products in {narrow[0]}",
                    "keep a float32 accumulator in VMEM scratch (pltpu.VMEM((bm, bn), "
                    "jnp.float32)), take each jnp.dot with preferred_element_type=jnp.float32, "
                    "and cast once at the last K step")


def _compare_dense(got: Any, want: Any, case: Case) -> str | None:
    _dense_structure(got, case.args)
    return _numbers(got, want, case, "relu(x @ w + b)")


def _dense_variant(kind: str):
    def variant(case: Case) -> Any:
        (x, w, b), (_, bk, _) = _dense_args(case)
        parts = [x[:, s:s + bk] @ w[s:s + bk] for s in range(0, x.shape[1], bk)]
        relu = functools.partial(np.maximum, 0)
        running = functools.reduce(lambda r, p: relu(r + p), parts, 0 * parts[0])
        return {"no relu": lambda: x @ w + b, "no bias": lambda: relu(x @ w),
                "bias after": lambda: relu(x @ w) + b,
                "bias each step": lambda: relu(x @ w + len(parts) * b),
                "relu parts": lambda: relu(sum(relu(p) for p in parts) + b),
                "relu running": lambda: relu(running + b),
                "last only": lambda: relu(parts[-1] + b), "first only": lambda: relu(parts[0] + b),
                "first each step": lambda: relu(len(parts) * parts[0] + b)}[kind]()
    return variant


_ONCE = "a partial sum over K is not the result: apply the ReLU once, after the last K step"
_ACCUMULATE = ("add each K step's product into the accumulator (+=), zero it only at the "
               "first K step (pl.program_id(2) == 0), and let x's index map follow k")
check_dense_relu = LAB.add(Exercise(
    "Exercise 1 (fused matmul + bias + ReLU kernel)", minutes=25, kind="apply",
    provides=("dense_relu",),
    cases=(_dense_case(16, 384, 256, 8, 128, 128, "float32", 0, "2 x 2 output blocks, "),
           _dense_case(24, 256, 384, 8, 128, 128, "bfloat16", 1, "3 x 3 output blocks, ")),
    probe=_probe_dense, expect=_expect_dense, compare=_compare_dense, time_limit_s=120.0,
    rules=(
        _rule("apply relu (jnp.maximum(z, 0)) to the sum plus the bias before writing",
              _dense_variant("no relu")),
        _rule("b comes in as a third input: a (1, bn) block at (0, j), added to the float32 sum",
              _dense_variant("no bias")),
        _rule("relu(x @ w + b): add the bias first, then take the max with 0",
              _dense_variant("bias after")),
        _rule("add the bias once: at the last K step (or when the accumulator is set at the "
              "first)", _dense_variant("bias each step")),
        _rule(_ONCE, _dense_variant("relu parts")), _rule(_ONCE, _dense_variant("relu running")),
        _rule(_ACCUMULATE, _dense_variant("last only")),
        _rule(_ACCUMULATE, _dense_variant("first only")),
        _rule(_ACCUMULATE, _dense_variant("first each step")),
        Mistake("the interpreter fills fresh VMEM with NaN: set the accumulator at the first K "
                "step of every output block (pl.program_id(2) == 0) before the first +=",
                when=lambda got, want, case: not np.isfinite(np.asarray(got["out"], float)).all()
                or not np.asarray(got["out"], float).any()),
    ),
    hint=_INDEX_MAPS))


# -- Exercise 2: the VMEM it needs ----------------------------------------------------------


@functools.lru_cache(maxsize=256)
def vmem_buffers(bm: int, bk: int, bn: int, itemsize: int) -> int:
    """The VMEM the chapter's K-tiled kernel (``pallas_tools.matmul_ktiled``) holds, read
    from its own BlockSpecs on a problem of 2 x 2 x 2 blocks: a block whose index changes
    between grid steps twice (Pallas double-buffers it), each scratch buffer once."""
    import jax
    import jax.numpy as jnp

    dtype = {1: jnp.int8, 2: jnp.bfloat16, 4: jnp.float32}[itemsize]
    fn = functools.partial(pallas_tools.matmul_ktiled, bm=bm, bk=bk, bn=bn)
    args = (jax.ShapeDtypeStruct((2 * bm, 2 * bk), dtype),
            jax.ShapeDtypeStruct((2 * bk, 2 * bn), dtype))
    total = sum((2 if t.copies > 1 else 1) * t.bytes // t.copies
                for t in pallas_tools.block_copies(fn, *args))
    (eqn,) = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name == "pallas_call"]
    count = eqn.params["grid_mapping"].num_scratch_operands
    return total + sum(math.prod(v.aval.shape) * np.dtype(v.aval.dtype).itemsize
                       for v in eqn.params["jaxpr"].invars[-count:])


def _footprint_case(bm: int, bk: int, bn: int, itemsize: int) -> Case:
    return Case(f"blocks ({bm}, {bk}, {bn}) of {itemsize}-byte elements",
                {"bm": bm, "bk": bk, "bn": bn, "itemsize": itemsize})


check_footprint = LAB.add(Exercise(
    "Exercise 2 (double-buffered VMEM footprint)", minutes=10, kind="predict",
    provides=("vmem_footprint",),
    cases=(_footprint_case(512, 512, 512, 2), _footprint_case(256, 1024, 128, 4),
           _footprint_case(8, 128, 256, 2)),
    probe=lambda answer, case: number(answer["vmem_footprint"](*case.args.values()),
                                      "your footprint"),
    expect=lambda case: vmem_buffers(**case.args),
    compare=lambda got, want, case: None if got == want else (
        f"your footprint is {got:,.6g} bytes, {got / want:.3g}x the kernel's"),
    hint="three blocks (x: bm x bk, y: bk x bn, out: bm x bn), two buffers each, plus a "
         "bm x bn float32 accumulator, in bytes"))


# -- Exercise 3: which blocks compile ---------------------------------------------------------

_VERDICTS = {"fits": pallas_tools.FITS, "fit": pallas_tools.FITS, "ok": pallas_tools.FITS,
             "misaligned": pallas_tools.MISALIGNED, "too big": pallas_tools.TOO_BIG,
             "oom": pallas_tools.TOO_BIG}


@functools.lru_cache(maxsize=None)
def compiler_verdicts(target: str = TARGET) -> dict | None:
    """The TPU compiler's verdict on each candidate (None where it is not installed)."""
    import jax
    import jax.numpy as jnp

    from tpu_course import hlo

    if hlo.tpu_compiler_problem():
        return None
    m, k, n = PROBLEM
    S = jax.ShapeDtypeStruct
    return {name: pallas_tools.compile_verdict(
        functools.partial(pallas_tools.matmul_ktiled, bm=bm, bk=bk, bn=bn),
        S((m, k), jnp.bfloat16), S((k, n), jnp.bfloat16), target=target).status
        for name, (bm, bk, bn) in CANDIDATES.items()}


def _probe_verdicts(answer: Mapping[str, Any], case: Case) -> dict:
    given = answer["verdicts"]
    if not isinstance(given, dict):
        raise Wrong(f"verdicts should be a dict, not {type(given).__name__}",
                    '{"a": "fits", "b": "misaligned", ...}, one entry per candidate')
    out = {}
    for name in CANDIDATES:
        said = given.get(name)
        text = said.strip().lower().replace("_", " ").replace("-", " ") \
            if isinstance(said, str) else None
        if text not in _VERDICTS:
            raise Wrong(f"verdicts[{name!r}] is {said!r:.40}",
                        'give every candidate one of "fits", "misaligned", "too big"')
        out[name] = _VERDICTS[text]
    return out


def _compare_verdicts(got: Any, want: Any, case: Case) -> str | None:
    wrong = sorted(n for n in CANDIDATES if got[n] != want[n])
    return None if not wrong else (f"{len(wrong)} of {len(CANDIDATES)} verdicts differ from "
                                   f"the compiler's: {', '.join(wrong)}")


check_verdicts = LAB.add(Exercise(
    "Exercise 3 (which blocks compile)", minutes=15, kind="predict", needs="tpu-compiler",
    provides=("verdicts",), probe=_probe_verdicts,
    expect=lambda case: compiler_verdicts(), compare=_compare_verdicts,
    hint="misaligned: a block's last two dims (x: bm, bk; y: bk, bn; out: bm, bn) are not "
         "multiples of 8 and 128, whatever its size; otherwise too big when the "
         "double-buffered footprint (Exercise 2) passes the 16 MiB scoped limit"))


# -- Exercise 4: fused softmax(QK^T) -----------------------------------------------------------


def _scores_case(lq: int, lk: int, d: int, bq: int, dtype: str, scale: float, seed: int,
                 label: str = "") -> Case:
    return Case(f"{label}{dtype} q [{lq},{d}], k [{lk},{d}], query blocks of {bq}",
                {"lq": lq, "lk": lk, "d": d, "bq": bq, "dtype": dtype, "scale": scale,
                 "seed": seed})


@functools.lru_cache(maxsize=64)
def _qk(lq: int, lk: int, d: int, dtype: str, scale: float, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    cast = _np_dtype(dtype)  # the values the kernel sees
    return tuple((scale * rng.standard_normal(s)).astype(cast).astype(np.float64)
                 for s in ((lq, d), (lk, d)))


def _softmax(s: Any, axis: int = -1) -> Any:
    e = np.exp(s - s.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _scores_qk(case: Case) -> tuple:
    a = case.args
    return _qk(a["lq"], a["lk"], a["d"], a["dtype"], a["scale"], a["seed"])


def _probe_scores(answer: Mapping[str, Any], case: Case) -> dict:
    import jax.numpy as jnp

    arrays = tuple(jnp.asarray(v, case.args["dtype"]) for v in _scores_qk(case))
    fn, bq = answer["attention_scores"], case.args["bq"]
    facts = program(lambda a, b: fn(a, b, bq, True), *arrays)
    return facts | {"out": _run(fn, arrays, bq, True) if facts["calls"] == 1 else None}


def _compare_scores(got: Any, want: Any, case: Case) -> str | None:
    _kernel_structure(got, "attention_scores")
    outside = got["outside"]
    if outside:
        raise Wrong(f"your function also computes {', '.join(outside)} outside the "
                    "pallas_call", "the scores never leave VMEM: scale, take each row's max, "
                    "exp, sum and divide inside the kernel; transpose k inside it too (or "
                    "contract the last dims of both with dot_general)")
    steps = case.args["lq"] // case.args["bq"]
    if math.prod(got["grid"]) != steps:
        raise Wrong(f"your grid {got['grid']} does not step over the queries in blocks of bq",
                    "a 1-D grid with one step per block of bq queries: grid=(Lq // bq,)")
    return _numbers(got, want, case, "softmax(q @ k.T / sqrt(d))")


def _scores_variant(kind: str):
    def variant(case: Case) -> Any:
        q, k = _scores_qk(case)
        s = q @ k.T
        root = {"unscaled": 1, "lk": k.shape[0], "64": 64, "128": 128}.get(kind, q.shape[1])
        return _softmax(s / math.sqrt(root), axis=0 if kind == "queries" else -1)
    return variant


check_attention_scores = LAB.add(Exercise(
    "Exercise 4 (fused softmax(QK^T) kernel)", minutes=25, kind="apply",
    provides=("attention_scores",),
    cases=(_scores_case(64, 256, 64, 16, "float32", 1.0, 2),
           _scores_case(48, 128, 128, 16, "bfloat16", 6.0, 3, "large scores, ")),
    probe=_probe_scores, compare=_compare_scores, time_limit_s=120.0,
    expect=lambda case: {"out": _scores_variant("right")(case).astype(
        _np_dtype(case.args["dtype"]))},
    rules=(
        _rule("divide q @ k.T by sqrt(d), d = q.shape[-1], before the softmax",
              _scores_variant("unscaled")),
        _rule("the scale is 1 / sqrt(d), with d the head dim (q.shape[-1]), not the number "
              "of keys", _scores_variant("lk")),
        _rule("take d from the shapes (q.shape[-1]) rather than typing it",
              _scores_variant("64")),
        _rule("take d from the shapes (q.shape[-1]) rather than typing it",
              _scores_variant("128")),
        _rule("normalise each row (over the keys: axis=-1)", _scores_variant("queries")),
        Mistake("exp overflows float32 once a score passes about 88: subtract each row's max "
                "first (softmax(s) equals softmax(s - max(s)))",
                when=lambda got, want, case: not np.isfinite(np.asarray(got["out"], float)).all()),
    ),
    hint="query block i reads q's block (i, 0) and all of k (block (0, 0)), and writes the "
         "output's block (i, 0); scale by 1 / sqrt(d) and subtract each row's max before exp"))


# -- Exercise 5: a real chip ------------------------------------------------------------------


def _probe_fast(answer: Mapping[str, Any], case: Case) -> dict:
    import jax
    import jax.numpy as jnp

    given = answer["fast_blocks"]
    try:
        blocks = tuple(int(b) for b in given) if not isinstance(given, str) else ()
    except (TypeError, ValueError):
        blocks = ()
    if len(blocks) != 3 or min(blocks) < 1 or any(p % b for p, b in zip(FAST_PROBLEM, blocks)):
        raise Wrong(f"fast_blocks should be three ints (bm, bk, bn) that divide "
                    f"{FAST_PROBLEM}, not {given!r:.40}", "fast_blocks = (bm, bk, bn)")
    m, k, n = FAST_PROBLEM
    fn = answer["dense_relu"]
    shapes = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((m, k), (k, n), (1, n))]
    layer = jax.jit(lambda x, w, b: fn(x, w, b, *blocks, False))
    facts = program(layer, *shapes) | {"blocks": blocks}
    if jax.default_backend() == "tpu":  # the compiled program, for the checker to time
        facts["program"] = np.frombuffer(jax.export.export(layer)(*shapes).serialize(), np.uint8)
    return facts


def ktiled_intensity(blocks: tuple, problem: tuple = FAST_PROBLEM, itemsize: int = 2) -> float:
    """FLOP per HBM byte of the K-tiled matmul by chapter 7's 3-D traffic model: x read once
    per column of tiles, w once per row, the output written once."""
    (m, k, n), (bm, _, bn) = problem, blocks
    return 2 * m * k * n / ((m * k * (n // bn) + k * n * (m // bm) + m * n) * itemsize)


def _compare_fast(got: Any, want: Any, case: Case) -> str | None:
    """The layer's structure, then (on a TPU) its compiled program against XLA's fused layer,
    both run and timed here on fresh inputs."""
    import jax
    import jax.numpy as jnp

    from tpu_course import bench, hardware, runtime

    m, k, n = FAST_PROBLEM
    bm, bk, bn = got.get("blocks", (1, 1, 1)) if isinstance(got, dict) else (1, 1, 1)
    _dense_structure(got, {"m": m, "k": k, "n": n, "bm": bm, "bk": bk, "bn": bn})
    if "program" not in got:
        raise Wrong("no compiled program came back: the kernel was not run on a TPU",
                    "run the notebook on a TPU runtime")
    mine = jax.jit(jax.export.deserialize(bytearray(np.asarray(got["program"]).tobytes())).call)
    xla = jax.jit(lambda x, w, b: jax.nn.relu(jnp.dot(x, w, preferred_element_type=jnp.float32)
                                              + b).astype(x.dtype))
    keys = jax.random.split(jax.random.key(np.random.default_rng().integers(2**31)), 3)
    x, w, b = (jax.random.normal(key, s, jnp.bfloat16)
               for key, s in zip(keys, ((m, k), (k, n), (1, n))))
    ours, theirs = (np.asarray(f(x, w, b), np.float32) for f in (mine, xla))
    if not np.allclose(ours, theirs, rtol=2e-2, atol=2e-2 * np.abs(theirs).max()):
        return "on the TPU your kernel's result differs from XLA's fused layer"
    ratio = (bench.benchmark(xla, x, w, b, name="XLA", warn=False).median_s
             / bench.benchmark(mine, x, w, b, name="yours", warn=False).median_s)
    if ratio >= FAST_FRACTION:
        return None
    chip = hardware.lookup(runtime.describe().device_kind)
    ridge = chip.critical_intensity() if chip and chip.peak_bf16_flops_per_s else float("nan")
    raise Wrong(f"your kernel reaches {ratio:.0%} of XLA's throughput (the goal is "
                f"{FAST_FRACTION:.0%})", f"your blocks do {ktiled_intensity((bm, bk, bn)):.0f} "
                f"FLOP per HBM byte against this chip's ridge of {ridge:.0f}: bigger blocks "
                "re-read less of x and w, within the scoped VMEM limit (Exercise 2)")


check_fast = LAB.add(Exercise(
    "Exercise 5 (a real chip: near XLA's fused layer)", minutes=15, kind="predict",
    needs="tpu-chip", provides=("dense_relu", "fast_blocks"), probe=_probe_fast,
    expect=lambda case: {"fraction": FAST_FRACTION}, compare=_compare_fast, time_limit_s=300.0,
    hint="bigger blocks re-read less of x and w from HBM; keep them multiples of the MXU "
         "width and inside the scoped VMEM limit (Exercise 2's footprint)"))
