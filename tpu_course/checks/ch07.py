"""Checkers for lab 7: Pallas kernels for the MXU, graded on any machine.

Kernels are graded by their numbers in Pallas's TPU interpreter (any runtime: see
:func:`tpu_course.kernels.interpret_mode`), by the TPU compiler's verdict on their blocks
and by the HLO it produces (compile-only targets: needs ``libtpu``, see
:func:`tpu_course.hlo.tpu_compiler_problem`), and on a real TPU by their time against
``jnp.dot``'s with :mod:`tpu_course.bench`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

from tpu_course import kernels
from tpu_course.checks._core import CheckResult, Lab, as_number, fail, ok, skipped

LAB = Lab(7, "Pallas kernels for the MXU")

EX1 = "Exercise 1 (K-tiled matmul kernel)"
EX2 = "Exercise 2 (double-buffered VMEM footprint)"
EX3 = "Exercise 3 (which blocks compile)"
EX4 = "Exercise 4 (fused softmax(QK^T) kernel)"
EX5 = "Exercise 5 (a real chip: near jnp.dot's time)"

#: Exercise 1's cases: (m, k, n) and blocks (bm, bk, bn), float32, interpret mode.
MATMUL_CASES = (((256, 384, 256), (128, 128, 128)), ((128, 512, 384), (128, 256, 128)))
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

_VERDICTS = (kernels.FITS, kernels.MISALIGNED, kernels.TOO_BIG)


# -- the references ------------------------------------------------------------------


def ktiled_kernel(x_ref: Any, y_ref: Any, o_ref: Any, acc_ref: Any) -> None:
    """One (i, j, k) grid step: add this K block's product into a float32 accumulator in
    VMEM, zeroed at the first K step and written out at the last."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    @pl.when(pl.program_id(2) == 0)
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _write():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_ktiled_reference(x: Any, y: Any, bm: int, bk: int, bn: int,
                            interpret: Any = False, vmem_limit_bytes: int | None = None) -> Any:
    """Lab 7's reference kernel: ``x @ y`` on a 3-D grid (M/bm, N/bn, K/bk), K last."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        ktiled_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=vmem_limit_bytes),
        interpret=interpret,
    )(x, y)


def footprint(bm: int, bk: int, bn: int, itemsize: int) -> int:
    """Exercise 2's model: the x, y and output blocks, each double-buffered, plus the
    float32 accumulator (single: it stays in VMEM for the whole K loop).

    >>> footprint(512, 512, 512, 2) / 2**20
    4.0
    """
    return 2 * (bm * bk + bk * bn + bm * bn) * itemsize + 4 * bm * bn


def scores_reference(q: Any, k: Any) -> Any:
    """Exercise 4's operation: ``softmax(q @ k.T / sqrt(d))`` over the keys, in float32."""
    import jax
    import jax.numpy as jnp

    s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    return jax.nn.softmax(s, axis=-1).astype(q.dtype)


def _arrays(shape_a: tuple[int, ...], shape_b: tuple[int, ...], seed: int = 0) -> tuple[Any, Any]:
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal(shape_a), jnp.float32),
            jnp.asarray(rng.standard_normal(shape_b), jnp.float32))


def _uses_pallas(fn: Callable, *args: Any) -> bool:
    import jax

    return "pallas_call" in str(jax.make_jaxpr(fn)(*args))


# -- Exercise 1 ----------------------------------------------------------------------


def _carries_over(got: Any, want: Any, bm: int, bn: int) -> bool:
    """True when each output block (in grid order) is the running sum of the right
    blocks so far: an accumulator zeroed once, not at every block's first K step."""
    import numpy as np

    running = np.zeros((bm, bn))
    blocks = [(i, j) for i in range(got.shape[0] // bm) for j in range(got.shape[1] // bn)]
    for i, j in blocks:
        running = running + want[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
        if not np.allclose(got[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn], running,
                           rtol=1e-3, atol=1e-3):
            return False
    return len(blocks) > 1


@LAB.exercise(EX1, minutes=25, kind="transfer")
def check_matmul_ktiled(matmul_ktiled: Callable[..., Any]) -> CheckResult:
    """``matmul_ktiled(x, y, bm, bk, bn, interpret)`` against ``x @ y`` in the TPU
    interpreter on :data:`MATMUL_CASES`, with a diagnosis of the usual mistakes."""
    import numpy as np

    interpret = kernels.interpret_mode("cpu")
    for (m, k, n), (bm, bk, bn) in MATMUL_CASES:
        x, y = _arrays((m, k), (k, n))
        case = f"[{m},{k}] @ [{k},{n}] with blocks (bm, bk, bn) = ({bm}, {bk}, {bn})"
        try:
            got = matmul_ktiled(x, y, bm, bk, bn, interpret)
        except Exception as err:  # noqa: BLE001 - the interpreter's bounds check
            if "out-of-bounds" not in str(err).lower():
                raise
            return fail(EX1, f"for {case} a block index falls outside its array",
                        hint="check the index maps: step (i, j, k) needs x's block (i, k), "
                             "y's block (k, j), and writes the output's block (i, j)")
        if tuple(getattr(got, "shape", ())) != (m, n):
            return fail(EX1, f"for {case} the result has shape {getattr(got, 'shape', None)}, "
                             f"not ({m}, {n})",
                        hint="out_shape is (m, n); the grid covers it with (bm, bn) blocks")
        got = np.asarray(got, np.float64)
        want = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
        if np.allclose(got, want, rtol=1e-3, atol=1e-3):
            continue
        if not np.isfinite(got).all():
            return fail(EX1, f"for {case} the result holds NaN",
                        hint="the interpreter fills fresh VMEM with NaN: is the accumulator "
                             "zeroed (at the first K step, pl.program_id(2) == 0) before "
                             "the first +=?")
        last = np.asarray(x, np.float64)[:, k - bk:] @ np.asarray(y, np.float64)[k - bk:, :]
        if np.allclose(got, last, rtol=1e-3, atol=1e-3):
            return fail(EX1, f"for {case} the result is the product of the last K block only",
                        hint="add each K step's product into the accumulator (+=), and "
                             "zero it only at the first K step")
        if _carries_over(got, want, bm, bn):
            return fail(EX1, f"for {case} each output block holds the sum of all the "
                             "blocks before it",
                        hint="the accumulator carries over from the previous output block: "
                             "zero it when a new block starts (pl.program_id(2) == 0)")
        return fail(EX1, f"for {case} the numbers are wrong (largest error "
                         f"{np.abs(got - want).max():.3g})",
                    hint="check the index maps: step (i, j, k) needs x's block (i, k), y's "
                         "block (k, j), and writes the output's block (i, j)")
    x, y = _arrays((256, 384), (384, 256))
    if not _uses_pallas(lambda a, b: matmul_ktiled(a, b, 128, 128, 128, interpret), x, y):
        return fail(EX1, "the numbers are right, but no pallas_call runs",
                    hint="write the kernel with pl.pallas_call, not jnp.dot")
    return ok(EX1, f"right on {len(MATMUL_CASES)} shapes and block choices in the TPU "
                   "interpreter (float32)")


# -- Exercise 2 ----------------------------------------------------------------------


@LAB.exercise(EX2, minutes=10, kind="predict")
def check_footprint(vmem_footprint: Callable[[int, int, int, int], Any]) -> CheckResult:
    """``vmem_footprint(bm, bk, bn, itemsize)``: :func:`footprint`, exactly."""
    for (bm, bk, bn), size in (((512, 512, 512), 2), ((256, 1024, 128), 4), ((8, 128, 256), 2)):
        got = as_number(EX2, vmem_footprint(bm, bk, bn, size),
                        f"vmem_footprint({bm}, {bk}, {bn}, {size})")
        if isinstance(got, CheckResult):
            return got
        want = footprint(bm, bk, bn, size)
        answer = f"({bm}, {bk}, {bn}), {size}-byte elements: {want:,} bytes"
        if got == want:
            continue
        blocks = (bm * bk + bk * bn + bm * bn) * size
        if got == blocks + 4 * bm * bn:
            return fail(EX2, f"for ({bm}, {bk}, {bn}) you counted each block once",
                        hint="Pallas double-buffers every block it copies in or out: it "
                             "fetches the next block while the MXU works on this one",
                        answer=answer)
        if got == 2 * blocks:
            return fail(EX2, f"for ({bm}, {bk}, {bn}) you left out the accumulator",
                        hint="the scratch accumulator lives in VMEM too (float32)",
                        answer=answer)
        if got in (2 * blocks + bm * bn * size, 2 * blocks + 8 * bm * bn):
            return fail(EX2, f"for ({bm}, {bk}, {bn}) the accumulator is counted wrongly",
                        hint="it is float32 (4 bytes) and single: it is scratch, not copied",
                        answer=answer)
        return fail(EX2, f"for ({bm}, {bk}, {bn}) your footprint is {got / want:.3g}x the "
                         "model's",
                    hint="three blocks (x: bm x bk, y: bk x bn, out: bm x bn), two buffers "
                         "each, plus a bm x bn float32 accumulator", answer=answer)
    return ok(EX2, "2 x (x, y and output blocks) + the float32 accumulator: "
                   f"{footprint(512, 512, 512, 2) / 2**20:.0f} MiB for 512-blocks in bf16")


# -- Exercise 3 ----------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def candidate_verdict(name: str, target: str = TARGET) -> kernels.Verdict:
    """The compiler's verdict on :data:`CANDIDATES` ``[name]`` for :data:`PROBLEM` in bf16
    (the reference kernel; cached)."""
    import jax
    import jax.numpy as jnp

    bm, bk, bn = CANDIDATES[name]
    m, k, n = PROBLEM
    fn = functools.partial(matmul_ktiled_reference, bm=bm, bk=bk, bn=bn)
    S = jax.ShapeDtypeStruct
    return kernels.compile_verdict(fn, S((m, k), jnp.bfloat16), S((k, n), jnp.bfloat16),
                                   target=target)


def _normal_verdict(value: Any) -> str | None:
    text = str(value).strip().lower().replace("_", " ").replace("-", " ")
    aliases = {"fits": kernels.FITS, "fit": kernels.FITS, "ok": kernels.FITS,
               "legal": kernels.FITS, "misaligned": kernels.MISALIGNED,
               "too big": kernels.TOO_BIG, "oom": kernels.TOO_BIG}
    return aliases.get(text) if isinstance(value, str) else None


@LAB.exercise(EX3, minutes=15, needs="tpu-compiler", kind="predict")
def check_verdicts(verdicts: Any) -> CheckResult:
    """``verdicts``: candidate letter -> ``"fits"``, ``"misaligned"`` or ``"too big"``,
    graded against the TPU compiler compiling each candidate for :data:`TARGET`."""
    if not isinstance(verdicts, dict):
        return fail(EX3, f"verdicts should be a dict, not a {type(verdicts).__name__}",
                    hint='{"a": "fits", "b": "misaligned", ...}, one entry per candidate')
    missing = sorted(set(CANDIDATES) - set(verdicts))
    if missing:
        return fail(EX3, f"no verdict for candidate(s) {', '.join(missing)}",
                    hint="give every candidate a verdict")
    wrong, lines = [], []
    for name, blocks in CANDIDATES.items():
        said = _normal_verdict(verdicts[name])
        if said is None:
            return fail(EX3, f"verdicts[{name!r}] is {verdicts[name]!r:.40}",
                        hint=f"use one of {', '.join(map(repr, _VERDICTS))}")
        v = candidate_verdict(name)
        model = footprint(*blocks, 2) / 2**20
        detail = (f"; the compiler asked for {v.needed_bytes / 2**20:.2f} MiB"
                  if v.needed_bytes else "")
        lines.append(f"{name} {blocks}: {v.status} (model {model:.2f} MiB{detail})")
        if said != v.status:
            wrong.append(name)
    limit = kernels.scoped_vmem_limit(TARGET) / 2**20
    answer = f"scoped VMEM limit {limit:.0f} MiB on {TARGET}; " + "; ".join(lines)
    if wrong:
        hint = ("misaligned: the last two dims of each block (x: bm, bk; y: bk, bn; out: "
                "bm, bn) must be multiples of 8 and 128; too big: your vmem_footprint "
                f"against the {limit:.0f} MiB scoped limit, not the chip's whole VMEM")
        return fail(EX3, f"{len(wrong)} of {len(CANDIDATES)} verdicts differ from the "
                         f"compiler's: {', '.join(wrong)}", hint=hint, answer=answer)
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


@LAB.exercise(EX4, minutes=25, kind="transfer")
def check_attention_scores(attention_scores: Callable[..., Any]) -> CheckResult:
    """``attention_scores(q, k, bq, interpret)``: ``softmax(q @ k.T / sqrt(d))`` in the TPU
    interpreter, then (where the TPU compiler is installed) one Mosaic custom call in the
    compiled HLO where XLA's version needs several fusions."""
    import numpy as np

    from tpu_course import hlo

    interpret = kernels.interpret_mode("cpu")
    for (lq, lk, d), bq in SCORES_CASES:
        q, k = _arrays((lq, d), (lk, d), seed=1)
        got = attention_scores(q, k, bq, interpret)
        case = f"q [{lq},{d}], k [{lk},{d}], query block {bq}"
        if tuple(getattr(got, "shape", ())) != (lq, lk):
            return fail(EX4, f"for {case} the result has shape {getattr(got, 'shape', None)}, "
                             f"not ({lq}, {lk})",
                        hint="one row of scores per query, one column per key")
        got = np.asarray(got, np.float64)
        want = np.asarray(scores_reference(q, k), np.float64)
        if np.allclose(got, want, rtol=1e-4, atol=1e-5):
            continue
        s = np.asarray(q, np.float64) @ np.asarray(k, np.float64).T
        unscaled = np.exp(s - s.max(-1, keepdims=True))
        if np.allclose(got, unscaled / unscaled.sum(-1, keepdims=True), rtol=1e-4, atol=1e-5):
            return fail(EX4, f"for {case} the scores are not scaled",
                        hint="divide q @ k.T by sqrt(d) before the softmax")
        if np.allclose(got.sum(0), 1, atol=1e-3) and not np.allclose(got.sum(1), 1, atol=1e-3):
            return fail(EX4, f"for {case} the softmax runs over the queries",
                        hint="normalise each row (over the keys: axis=-1)")
        if not np.isfinite(got).all():
            return fail(EX4, f"for {case} the result holds NaN or inf",
                        hint="subtract each row's max before exp, and check the index maps")
        return fail(EX4, f"for {case} the numbers are wrong (largest error "
                         f"{np.abs(got - want).max():.3g})",
                    hint="query block i reads q's block (i, 0) and all of k (block (0, 0)), "
                         "and writes the output's block (i, 0)")
    q, k = _arrays((256, 64), (384, 64), seed=1)
    if not _uses_pallas(lambda a, b: attention_scores(a, b, 128, interpret), q, k):
        return fail(EX4, "the numbers are right, but no pallas_call runs",
                    hint="write it as one kernel with pl.pallas_call")
    problem = hlo.tpu_compiler_problem()
    if problem:
        return ok(EX4, "right in the TPU interpreter; the compiled-HLO half is not graded "
                       f"here: {problem}")
    (_, _, _), bq = SCORES_COMPILED
    mine = compile_scores(lambda a, b: attention_scores(a, b, bq, False))
    xla = compile_scores(scores_reference)
    calls = mine.compute_ops.get("custom-call", 0)
    if calls != 1 or mine.fusions:
        return fail(EX4, f"compiled for {TARGET}, your version has {calls} custom call(s) and "
                         f"{len(mine.fusions)} fusion(s) around it",
                    hint="do the matmul, the scaling and the whole softmax inside the kernel, "
                         "so that nothing is left for XLA to fuse")
    return ok(EX4, f"right in the TPU interpreter; compiled for {TARGET}: one Mosaic custom "
                   f"call, where XLA's version makes {len(xla.fusions)} fusions (the scores "
                   "go to HBM and come back for the softmax)")


# -- Exercise 5 ----------------------------------------------------------------------


@LAB.exercise(EX5, minutes=15, needs="accelerator", kind="predict",
              predicts=("fast_blocks",))
def check_fast(matmul_ktiled: Callable[..., Any], fast_blocks: Any,
               fraction: float = FAST_FRACTION) -> CheckResult:
    """On a TPU: ``matmul_ktiled`` with ``fast_blocks`` on :data:`FAST_PROBLEM` in bf16
    reaches ``fraction`` of ``jnp.dot``'s throughput (both timed with the harness)."""
    import jax
    import jax.numpy as jnp

    from tpu_course import bench, runtime

    platform = runtime.describe().platform
    if platform != "tpu":
        return skipped(EX5, f"your kernel is a TPU kernel; on this {platform} runtime it runs "
                            "only in the interpreter, whose time means nothing (Pallas's GPU "
                            "kernels are written differently: see the chapter)")
    try:
        bm, bk, bn = (int(b) for b in fast_blocks)
    except (TypeError, ValueError):
        return fail(EX5, f"fast_blocks should be three ints (bm, bk, bn), not {fast_blocks!r:.40}")
    m, k, n = FAST_PROBLEM
    if m % bm or k % bk or n % bn:
        return fail(EX5, f"({bm}, {bk}, {bn}) does not divide {FAST_PROBLEM}",
                    hint="pick blocks that divide the problem")
    x = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
    y = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16)
    mine = bench.benchmark(jax.jit(lambda a, b: matmul_ktiled(a, b, bm, bk, bn, False)), x, y,
                           name="your kernel", warn=False)
    ref = bench.benchmark(jax.jit(jnp.dot), x, y, name="jnp.dot", warn=False)
    ratio = ref.median_s / mine.median_s
    text = (f"your kernel {mine.median_s * 1e3:.3f} ms, jnp.dot {ref.median_s * 1e3:.3f} ms "
            f"on {runtime.describe().device_kind}: {ratio:.0%} of jnp.dot's throughput")
    if ratio < fraction:
        return fail(EX5, text + f" (the goal is {fraction:.0%})",
                    hint="bigger blocks re-read less of x and y from HBM (your traffic model); "
                         "keep them multiples of the MXU width and inside the scoped VMEM "
                         "limit (raise it with vmem_limit_bytes)")
    return ok(EX5, text)
