"""Lab 7 (Pallas kernels for the MXU). A kernel's probe returns its output and what its traced
program holds; expected outputs come from numpy, BlockSpecs, the TPU compiler and the chip."""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

from tpu_course import pallas_tools
from tpu_course.checks.engine import Case, Exercise, Lab, Mistake, Wrong, array, close, number

LAB = Lab(7, "Pallas kernels for the MXU")
#: Exercise 3: the problem, the target, and the candidate blocks (bm, bk, bn).
PROBLEM, TARGET = (4096, 4096, 4096), "v5e:1x1"
CANDIDATES = {"a": (512, 512, 512), "b": (256, 64, 256), "c": (2048, 256, 512),
              "d": (1024, 512, 2048), "e": (4, 128, 128), "f": (256, 256, 4096),
              "g": (2048, 1024, 512)}
#: Exercise 5's problem (bf16) and the fraction of XLA's throughput to reach.
FAST_PROBLEM, FAST_FRACTION = (4096, 4096, 4096), 0.7
_NARROW = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
#: Primitives that only wrap or move data: allowed outside a kernel.
_PLUMBING = set("pjit jit closed_call core_call named_call remat checkpoint custom_jvp_call "
                "custom_vjp_call custom_vjp_call_jaxpr pallas_call convert_element_type reshape "
                "squeeze expand_dims copy copy_p device_put".split())

# -- what a traced kernel holds, and its output -------------------------------------------
def _eqns(value, stop=""):
    """Every equation in ``value`` (jaxprs, nested ones too), not inside a ``stop`` primitive."""
    if isinstance(value, (tuple, list)):
        return [e for v in value for e in _eqns(v, stop)]
    jaxpr = value if hasattr(value, "eqns") else getattr(value, "jaxpr", None)
    return [e for eqn in getattr(jaxpr, "eqns", ()) for e in [eqn, *(
        [] if eqn.primitive.name == stop else _eqns(list(eqn.params.values()), stop))]]

def _name(aval):  # the dtype of a value or of a ref
    return str(getattr(getattr(aval, "inner_aval", aval), "dtype", ""))

def _dtypes(eqns, *names, rank=None):  # the dtypes the named primitives return
    return [_name(e.outvars[0].aval) for e in eqns if e.primitive.name in names
            and rank in (None, len(getattr(e.outvars[0].aval, "shape", ())))]

def program(fn, *args):
    """What ``fn(*args)`` traces to: its pallas_calls, the primitives outside them, and the
    first one's grid, semantics, primitives and sums' dtypes (scratch, dots, 2-D adds)."""
    import jax
    try:
        closed = jax.make_jaxpr(fn)(*args)
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - a learner's code may raise anything
        raise Wrong(f"tracing your function (jax.make_jaxpr) raised {type(err).__name__}: "
                    f"{(str(err).splitlines() or [''])[0][:200]}", "the wrapper must trace: only "
                    "jax.numpy, lax and Pallas on the inputs (no numpy, no branch on values)") from None
    eqns = _eqns(closed.jaxpr, stop="pallas_call")
    calls = [e.params for e in eqns if e.primitive.name == "pallas_call"]
    facts = {"calls": len(calls), "outside": sorted({e.primitive.name for e in eqns} - _PLUMBING)}
    if not calls:
        return facts
    body, mapping, params = (calls[0].get(p) for p in ("jaxpr", "grid_mapping", "compiler_params"))
    found = getattr(params, "dimension_semantics", None)
    if found is None and hasattr(params, "values"):
        found = next((getattr(v, "dimension_semantics", None) for v in params.values()), None)
    count, eqns = int(getattr(mapping, "num_scratch_operands", 0) or 0), _eqns(body)
    scratch = [_name(v.aval) for v in body.invars[len(body.invars) - count:]][:count]
    return facts | {
        "grid": tuple(int(g) for g in mapping.grid), "semantics": found and tuple(
            str(getattr(s, "name", s)).lower() for s in found),
        "inside": sorted({e.primitive.name for e in eqns}), "sums": scratch + _dtypes(
            eqns, "dot_general") + ([] if scratch else _dtypes(eqns, "add", "add_any", rank=2))}

def _kernel_facts(fn, arrays, case, *names):
    """A kernel's probe: ``fn(*arrays, *case's names, True)`` traced, and run (jitted)."""
    import jax
    arrays, static = tuple(jax.numpy.asarray(v, case.args["dtype"]) for v in arrays), (
        *(case.args[name] for name in names), True)
    facts = program(lambda *a: fn(*a, *static), *arrays)
    jitted = jax.jit(fn, static_argnums=tuple(range(len(arrays), len(arrays) + len(static))))
    return facts | {"out": np.asarray(jitted(*arrays, *static)) if facts["calls"] == 1 else None}

def _tolerance(want, dtype):  # (rtol, atol) of the rounding of dtype, atol scaled to want
    rtol, atol = (8e-3, 2e-2) if dtype in _NARROW else (1e-5, 1e-5)
    return rtol, atol * max(1.0, np.abs(np.asarray(want, np.float64)).max())

def _refuse(*checks):  # raises the first (wrong, message, hint) that is wrong
    for wrong, message, hint in checks:
        if wrong:
            raise Wrong(message, hint)

def _one_kernel(f, what, hint, *named):
    """One pallas_call, only plumbing outside it; ``named``: (primitives, message, hint)."""
    _refuse((not isinstance(f, dict) or "calls" not in f, f"the probe's output is "
             f"{type(f).__name__}, not a kernel's facts", "run the check cell as the lab wrote it"))
    out = set(f["outside"])
    _refuse((f["calls"] == 0, f"your function runs no pallas_call: {what} is not a Pallas kernel",
             "write the kernel with pl.pallas_call and do the work inside it"),
            (f["calls"] > 1, f"your function runs {f['calls']} pallas_calls, not one", "one "
             "kernel does it all: between two, the intermediate result goes through HBM"),
            ("dot_general" in out, "the matmul runs outside your kernel (a dot_general outside "
             "the pallas_call)", "each grid step multiplies its blocks inside the kernel"),
            *((out & set(p), message, why) for p, message, why in named),
            (out, f"your function also computes {', '.join(sorted(out))} outside the "
             "pallas_call", hint))

def _numbers(got, want, case, what):
    out, want = array(got.get("out"), "your result", want["out"].shape), want["out"]
    _refuse((out.dtype != want.dtype, f"{want.dtype} inputs came in and your kernel returned "
             f"{out.dtype}", "return the inputs' dtype: out_shape=jax.ShapeDtypeStruct(shape, "
             "x.dtype), and cast once (.astype(o_ref.dtype)) when you write the block"))
    return close(*_tolerance(want, case.args["dtype"]), f"your result ({what})")(out, want, case)

def _expect(inputs, right):  # the output right(*inputs(**args)) in the case's dtype
    return lambda case: {"out": right(*inputs(**case.args)).astype(
        getattr(ml_dtypes, d := case.args["dtype"], d))}

def _rules(inputs, table, *more):
    """A mistake per ``{hint: [variant, ...]}``: the output is ``variant(*inputs(**args))``."""
    def rule(hint, variant):
        def when(got, want, case):
            wrong = variant(*inputs(**case.args))
            return bool(np.isclose(np.asarray(got["out"], np.float64), wrong,
                                   *_tolerance(wrong, case.args["dtype"])).all())
        return Mistake(hint, when=when)
    return tuple(rule(hint, v) for hint, variants in table.items() for v in variants) + more

def _not_finite(got, want, case):
    return not np.isfinite(np.asarray(got["out"], float)).all()

# -- Exercise 1: a dense layer in one kernel ----------------------------------------------
def _dense_case(m, k, n, bm, bk, bn, dtype, seed, label=""):
    return Case(f"{label}{dtype} [{m},{k}] @ [{k},{n}] + b with blocks (bm, bk, bn) = "
                f"({bm}, {bk}, {bn})", {"m": m, "k": k, "n": n, "bm": bm, "bk": bk, "bn": bn,
                                        "dtype": dtype, "seed": seed})

@functools.lru_cache(maxsize=64)
def _dense(m, k, n, bm, bk, bn, dtype, seed):
    """x, w, b (small integers: exact in bf16 and float32 sums) and K's blocks' products."""
    rng = np.random.default_rng(seed)
    x, w = (rng.integers(-3, 4, s).astype(np.float64) for s in ((m, k), (k, n)))
    return x, w, rng.integers(-40, 41, (1, n)) / 2, [x[:, s:s + bk] @ w[s:s + bk]
                                                     for s in range(0, k, bk)]

def _dense_structure(f, a):
    _one_kernel(f, "dense_relu", "the matmul, the bias and the ReLU all happen in the kernel",
                (("max", "select_n", "clamp", "relu"), "the activation runs outside your kernel",
                 "apply the ReLU in the kernel at the last K step, not to the output in HBM"),
                (("add", "add_any"), "the bias is added outside your kernel", "pass b to the "
                 "pallas_call as a (1, bn) block at (0, j); add it to the float32 sum in there"))
    grid, steps = f["grid"], a["k"] // a["bk"]
    blocks, k_axis = sorted((a["m"] // a["bm"], a["n"] // a["bn"])), (f["semantics"] or [""])[-1]
    narrow = [d for d in f["sums"] if d in _NARROW] or [None]
    _refuse(("dot_general" not in f["inside"], "your kernel does no matmul (no dot_general)",
             "each step adds jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)"),
            (len(grid) != 3 or grid[-1] != steps or sorted(grid[:2]) != blocks, f"your grid is "
             f"{grid}: K's {steps} steps are not its last axis beside the {blocks[0]} x "
             f"{blocks[1]} output blocks", "the chapter's K-tiled grid (M // bm, N // bn, "
             "K // bk), K innermost, with a float32 accumulator over K's steps"),
            ("parallel" in k_axis, f"you marked the K axis {k_axis!r}", "each K step adds to "
             'what the one before left: K is "arbitrary" (only M and N are "parallel")'),
            (narrow[0], f"your kernel accumulates the K steps' products in {narrow[0]}", "keep "
             "a float32 scratch accumulator, take each jnp.dot with preferred_element_type="
             "jnp.float32, and cast once at the last K step"))

_relu = functools.partial(np.maximum, 0)
_ONCE = "a partial sum over K is not the result: apply the ReLU once, after the last K step"
_ACCUMULATE = ("add each K step's product into the accumulator (+=), zero it only at the "
               "first K step (pl.program_id(2) == 0), and let x's index map follow k")
check_dense_relu = LAB.add(Exercise(
    "Exercise 1 (fused matmul + bias + ReLU kernel)", minutes=25, kind="apply",
    provides=("dense_relu",), time_limit_s=120.0,
    cases=(_dense_case(16, 384, 256, 8, 128, 128, "float32", 0, "2 x 2 output blocks, "),
           _dense_case(24, 256, 384, 8, 128, 128, "bfloat16", 1, "3 x 3 output blocks, ")),
    probe=lambda answer, case: _kernel_facts(answer["dense_relu"], _dense(**case.args)[:3],
                                             case, "bm", "bk", "bn"),
    expect=_expect(_dense, lambda x, w, b, p: _relu(x @ w + b)),
    compare=lambda got, want, case: _dense_structure(got, case.args) or _numbers(
        got, want, case, "relu(x @ w + b)"),
    rules=_rules(lambda **a: _dense(**a)[2:], {  # wrong outputs from b and K's products p
        "apply relu (jnp.maximum(z, 0)) to the sum plus the bias": [lambda b, p: sum(p) + b],
        "add b, a (1, bn) block at (0, j), to the float32 sum": [lambda b, p: _relu(sum(p))],
        "relu(x @ w + b): the bias first, then the max with 0": [lambda b, p: _relu(sum(p)) + b],
        "add the bias once, not at every K step": [lambda b, p: _relu(sum(p) + len(p) * b)],
        _ONCE: [lambda b, p: _relu(sum(_relu(q) for q in p) + b),
                lambda b, p: _relu(functools.reduce(lambda r, q: _relu(r + q), p, 0) + b)],
        _ACCUMULATE: [lambda b, p: _relu(p[-1] + b), lambda b, p: _relu(p[0] + b),
                      lambda b, p: _relu(len(p) * p[0] + b)],
    }, Mistake("the interpreter fills fresh VMEM with NaN: set the accumulator at the first K "
               "step of every output block (pl.program_id(2) == 0) before the first +=",
               when=lambda got, want, case: _not_finite(got, want, case)
               or not np.asarray(got["out"], float).any())),
    hint="check the index maps: step (i, j, k) needs x's block (i, k), w's block (k, j), the "
         "bias's block (0, j), and writes the output's block (i, j)"))

# -- Exercise 2: the VMEM it needs ----------------------------------------------------------
@functools.lru_cache(maxsize=256)
def vmem_buffers(bm, bk, bn, itemsize):
    """The VMEM of ``pallas_tools.matmul_ktiled``'s BlockSpecs: twice each block that moves."""
    import jax
    dtype = {1: "int8", 2: "bfloat16", 4: "float32"}[itemsize]
    fn = functools.partial(pallas_tools.matmul_ktiled, bm=bm, bk=bk, bn=bn)
    args = [jax.ShapeDtypeStruct(s, dtype) for s in ((2 * bm, 2 * bk), (2 * bk, 2 * bn))]
    total = sum((2 if t.copies > 1 else 1) * t.bytes // t.copies
                for t in pallas_tools.block_copies(fn, *args))
    (eqn,) = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name == "pallas_call"]
    count = eqn.params["grid_mapping"].num_scratch_operands
    return total + sum(math.prod(v.aval.shape) * np.dtype(v.aval.dtype).itemsize
                       for v in eqn.params["jaxpr"].invars[-count:])

def _footprint_case(bm, bk, bn, itemsize):
    return Case(f"blocks ({bm}, {bk}, {bn}) of {itemsize}-byte elements",
                {"bm": bm, "bk": bk, "bn": bn, "itemsize": itemsize})

check_footprint = LAB.add(Exercise(
    "Exercise 2 (double-buffered VMEM footprint)", minutes=10, kind="predict",
    provides=("vmem_footprint",), expect=lambda case: vmem_buffers(**case.args),
    cases=(_footprint_case(512, 512, 512, 2), _footprint_case(256, 1024, 128, 4),
           _footprint_case(8, 128, 256, 2)),
    probe=lambda answer, case: number(answer["vmem_footprint"](*case.args.values()),
                                      "your footprint"),
    compare=lambda got, want, case: None if got == want else (
        f"your footprint is {got:,.6g} bytes, {got / want:.3g}x the kernel's"),
    hint="three blocks (x: bm x bk, y: bk x bn, out: bm x bn), two buffers each, plus a "
         "bm x bn float32 accumulator, in bytes"))

# -- Exercise 3: which blocks compile ---------------------------------------------------------
_VERDICTS = {"fit": pallas_tools.FITS, "ok": pallas_tools.FITS, "oom": pallas_tools.TOO_BIG,
             **{v: v for v in (pallas_tools.FITS, pallas_tools.MISALIGNED, pallas_tools.TOO_BIG)}}

@functools.lru_cache(maxsize=None)
def compiler_verdicts(target=TARGET):
    """The TPU compiler's verdict on each candidate (None where it is not installed)."""
    import jax
    from tpu_course import hlo
    if hlo.tpu_compiler_problem():
        return None
    (m, k, n), S = PROBLEM, functools.partial(jax.ShapeDtypeStruct, dtype="bfloat16")
    return {name: pallas_tools.compile_verdict(functools.partial(
        pallas_tools.matmul_ktiled, bm=bm, bk=bk, bn=bn), S((m, k)), S((k, n)), target=target)
        .status for name, (bm, bk, bn) in CANDIDATES.items()}

def _probe_verdicts(answer, case):
    given = answer["verdicts"]
    _refuse((not isinstance(given, dict), f"verdicts should be a dict, not "
             f"{type(given).__name__}", '{"a": "fits", "b": "misaligned", ...}, one per candidate'))
    read = {n: _VERDICTS.get(v.strip().lower().replace("_", " ").replace("-", " "))
            if isinstance(v := given.get(n), str) else None for n in CANDIDATES}
    _refuse(*((read[n] is None, f"verdicts[{n!r}] is {given.get(n)!r:.40}", 'give every '
               'candidate one of "fits", "misaligned", "too big"') for n in CANDIDATES))
    return read

def _compare_verdicts(got, want, case):
    wrong = sorted(n for n in CANDIDATES if got[n] != want[n])
    return wrong and f"{len(wrong)} verdicts differ from the compiler's: {', '.join(wrong)}" or None

check_verdicts = LAB.add(Exercise(
    "Exercise 3 (which blocks compile)", minutes=15, kind="predict", needs="tpu-compiler",
    provides=("verdicts",), probe=_probe_verdicts, expect=lambda case: compiler_verdicts(),
    compare=_compare_verdicts,
    hint="misaligned: a block's last two dims are not multiples of 8 and 128, whatever its "
         "size; else too big when its double-buffered footprint passes the 16 MiB scoped limit"))

# -- Exercise 4: fused softmax(QK^T) -----------------------------------------------------------
def _scores_case(lq, lk, d, bq, dtype, scale, seed, label=""):
    return Case(f"{label}{dtype} q [{lq},{d}], k [{lk},{d}], query blocks of {bq}",
                dict(lq=lq, lk=lk, d=d, bq=bq, dtype=dtype, scale=scale, seed=seed))

@functools.lru_cache(maxsize=64)
def _qk(lq, lk, d, bq, dtype, scale, seed):  # q, k as the kernel sees them, in float64
    rng = np.random.default_rng(seed)
    return tuple((scale * rng.standard_normal(s)).astype(getattr(ml_dtypes, dtype, dtype))
                 .astype(np.float64) for s in ((lq, d), (lk, d)))

def _softmax(q, k, root=None, axis=-1):  # softmax(q @ k.T / sqrt(root or d)) over axis
    s = q @ k.T / math.sqrt(root or q.shape[1])
    e = np.exp(s - s.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)

def _compare_scores(got, want, case):
    _one_kernel(got, "attention_scores", "the scores never leave VMEM: scale, max, exp, sum "
                "and divide in the kernel; transpose k there too (or use dot_general)")
    _refuse((math.prod(got["grid"]) != case.args["lq"] // case.args["bq"], f"your grid "
             f"{got['grid']} does not step over the queries in blocks of bq", "a 1-D grid with "
             "one step per block of bq queries: grid=(Lq // bq,)"))
    return _numbers(got, want, case, "softmax(q @ k.T / sqrt(d))")

check_attention_scores = LAB.add(Exercise(
    "Exercise 4 (fused softmax(QK^T) kernel)", minutes=25, kind="apply",
    provides=("attention_scores",), time_limit_s=120.0,
    cases=(_scores_case(64, 256, 64, 16, "float32", 1.0, 2),
           _scores_case(48, 128, 128, 16, "bfloat16", 6.0, 3, "large scores, ")),
    probe=lambda answer, case: _kernel_facts(answer["attention_scores"], _qk(**case.args),
                                             case, "bq"),
    expect=_expect(_qk, _softmax), compare=_compare_scores,
    rules=_rules(_qk, {
        "scale q @ k.T by 1 / sqrt(d), d = q.shape[-1]": [lambda q, k: _softmax(q, k, 1)],
        "d is the head dim, not the number of keys": [lambda q, k: _softmax(q, k, len(k))],
        "take d from the shapes (q.shape[-1]) rather than typing it": [
            lambda q, k: _softmax(q, k, 64), lambda q, k: _softmax(q, k, 128)],
        "normalise each row (over the keys: axis=-1)": [lambda q, k: _softmax(q, k, axis=0)],
    }, Mistake("exp overflows float32 once a score passes about 88: subtract each row's max "
               "first (softmax(s) equals softmax(s - max(s)))", when=_not_finite)),
    hint="query block i reads q's block (i, 0) and all of k (block (0, 0)), and writes the "
         "output's block (i, 0); scale by 1 / sqrt(d) and subtract each row's max before exp"))

# -- Exercise 5: a real chip ------------------------------------------------------------------
def _probe_fast(answer, case):
    import jax
    given = answer["fast_blocks"]
    try:
        blocks = tuple(int(b) for b in given) if not isinstance(given, str) else ()
    except (TypeError, ValueError):
        blocks = ()
    if len(blocks) != 3 or min(blocks) < 1 or any(p % b for p, b in zip(FAST_PROBLEM, blocks)):
        raise Wrong(f"fast_blocks should be three ints (bm, bk, bn) that divide "
                    f"{FAST_PROBLEM}, not {given!r:.40}", "fast_blocks = (bm, bk, bn)")
    (m, k, n), fn = FAST_PROBLEM, answer["dense_relu"]
    shapes = [jax.ShapeDtypeStruct(s, "bfloat16") for s in ((m, k), (k, n), (1, n))]
    layer = jax.jit(lambda x, w, b: fn(x, w, b, *blocks, False))
    facts = program(layer, *shapes) | {"blocks": blocks}
    if jax.default_backend() == "tpu":  # the compiled program, for the checker to time
        facts["program"] = np.frombuffer(jax.export.export(layer)(*shapes).serialize(), np.uint8)
    return facts

def _compare_fast(got, want, case):
    """The layer's structure, then its compiled program against XLA's, timed on fresh inputs."""
    import jax
    import jax.numpy as jnp
    from tpu_course import bench, hardware, runtime
    m, k, n = FAST_PROBLEM
    bm, bk, bn = got.get("blocks", (1, 1, 1)) if isinstance(got, dict) else (1, 1, 1)
    _dense_structure(got, {"m": m, "k": k, "n": n, "bm": bm, "bk": bk, "bn": bn})
    _refuse(("program" not in got, "no compiled program came back: the kernel was not run on "
             "a TPU", "run the notebook on a TPU runtime"))
    mine = jax.jit(jax.export.deserialize(bytearray(np.asarray(got["program"]).tobytes())).call)
    xla = jax.jit(lambda x, w, b: jax.nn.relu(jnp.dot(x, w, preferred_element_type=jnp.float32)
                                              + b).astype(x.dtype))
    rng = np.random.default_rng()
    x, w, b = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in ((m, k), (k, n), (1, n)))
    ours, theirs = (np.asarray(f(x, w, b), np.float32) for f in (mine, xla))
    if not np.allclose(ours, theirs, rtol=2e-2, atol=2e-2 * np.abs(theirs).max()):
        return "on the TPU your kernel's result differs from XLA's fused layer"
    ratio = (bench.benchmark(xla, x, w, b, name="XLA", warn=False).median_s
             / bench.benchmark(mine, x, w, b, name="yours", warn=False).median_s)
    if ratio >= FAST_FRACTION:
        return None
    chip = hardware.lookup(runtime.describe().device_kind)
    ridge = chip.critical_intensity() if chip and chip.peak_bf16_flops_per_s else float("nan")
    # FLOP per HBM byte by chapter 7's traffic model: x read per column of tiles, w per row
    intensity = m * k * n / (m * k * (n // bn) + k * n * (m // bm) + m * n)
    raise Wrong(f"your kernel reaches {ratio:.0%} of XLA's throughput (the goal is "
                f"{FAST_FRACTION:.0%})", f"your blocks do {intensity:.0f} FLOP per HBM byte "
                f"against this chip's ridge of {ridge:.0f}: bigger blocks re-read less of x "
                "and w, within the scoped VMEM limit (Exercise 2)")

check_fast = LAB.add(Exercise(
    "Exercise 5 (a real chip: near XLA's fused layer)", minutes=15, kind="predict",
    needs="tpu-chip", provides=("dense_relu", "fast_blocks"), probe=_probe_fast,
    expect=lambda case: {"fraction": FAST_FRACTION}, compare=_compare_fast, time_limit_s=300.0,
    hint="bigger blocks re-read less of x and w from HBM; keep them multiples of the MXU "
         "width and inside the scoped VMEM limit (Exercise 2's footprint)"))
