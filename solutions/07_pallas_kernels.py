# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 7 (solution): Pallas kernels for the MXU
#
# Five exercises, **about 90 minutes** in all (the plan below gives each one's time):
# write, predict, compile, measure. Your kernels run in Pallas's TPU interpreter on any
# runtime (on a TPU they run for real), so the checks grade their numbers everywhere.
# Exercise 3 asks the real TPU compiler (compile-only, for a v5e this machine need not
# have) and is skipped where it is not installed; Exercise 5 needs a TPU. A failed check
# gives a hint; `checks.reveal("Exercise 3")` shows the expected answer once your attempt
# has been checked. The last cell is your scorecard. The checks read your kernels as well
# as their numbers: they trace each function and look inside its `pallas_call`, so the
# work has to happen in the kernel, on the grid the exercise asks for. The grader also
# runs them on shapes and blocks this notebook does not show.
#
# Exercises 2, 3 and 5 are predictions: you record yours with `ch07.LAB.predict(...)`,
# and only then does the next cell show what the compiler (or the chip) says. A prediction
# is locked once its measurement has been shown in this session, and the check grades
# that recorded value; `tpu-course grade` re-runs the notebook and grades the value in the
# cell.
#
# Chapter 7's kernels are your starting point (the K-tiled matmul, the online softmax); the
# exercises do not repeat them.

# %% cellView="form" jupyter={"source_hidden": true} tags=["course-setup"]
# @title Install the course where it is missing { display-mode: "form" }
import importlib.util, os, shlex, subprocess, sys
if importlib.util.find_spec("tpu_course") is None:  # Colab, Kaggle: the course alone
    course = os.environ.get("TPU_COURSE_SPEC",
                            "tpu-course @ git+https://github.com/tpu-course/tpu-course")
    status, said = subprocess.getstatusoutput(shlex.join(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", course]))
    if status:  # pip's own words, then the usual fixes
        sys.exit(f"{said}\nSetup failed: pip could not install {course}. Fix: turn on "
                 "the internet (Kaggle: Settings > Internet on) or set TPU_COURSE_SPEC")
import tpu_course.setup  # the rest: tpu_course/setup.py
tpu_course.setup.finish()

# %%
from tpu_course import runtime

rt = runtime.describe()
print(rt.banner())

# %%
import functools
import math
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_course import checks, hardware, hlo, pallas_tools
from tpu_course.checks import NotWritten, ch07

INTERPRET = pallas_tools.interpret_mode()  # False on a TPU, else the TPU interpreter
S = jax.ShapeDtypeStruct
ch07.LAB

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 1: a dense layer in one kernel (25 min)
#
# Chapter 7 wrote the K-tiled matmul: a 3-D grid with K last, a float32 accumulator in
# VMEM scratch, zeroed at the first K step and written at the last. A layer of a network
# is more than its matmul: `relu(x @ w + b)`. Write `dense_relu(x, w, b, bm, bk, bn,
# interpret)` as **one** kernel that does all three, for `x` of shape `[M, K]`, `w` of
# shape `[K, N]` and a bias `b` of shape `[1, N]`, on the chapter's grid
# `(M // bm, N // bn, K // bk)`. Decide where each piece goes: which block of `b` step
# `(i, j, k)` needs (its `BlockSpec`), at which K step the bias and the ReLU may touch
# the sum, and in which dtype. Mark K `"arbitrary"` in `dimension_semantics` (the chapter
# says why) and pass `interpret` straight to `pl.pallas_call`.
#
# The result has `x`'s dtype. The check traces your function and reads it: the matmul, the
# bias add and the ReLU must be inside the kernel (nothing but the `pallas_call` outside),
# on the K-tiled grid, with a float32 accumulator. Then it runs it in Pallas's
# interpreter, which fills fresh VMEM with NaN, on float32 and on bfloat16 inputs, against
# `relu(x @ w + b)`. Calling the chapter's `pallas_tools.matmul_ktiled` does not count:
# the point is the kernel.

# %%
def dense_relu(x, w, b, bm, bk, bn, interpret):
    ### BEGIN SOLUTION Exercise 1 (fused matmul + bias + ReLU kernel)
    def kernel(x_ref, w_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _zero():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], w_ref[...],
                                preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _epilogue():  # only the finished float32 sum gets the bias and the ReLU
            z = acc_ref[...] + b_ref[...].astype(jnp.float32)
            o_ref[...] = jnp.maximum(z, 0).astype(o_ref.dtype)

    m, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))],  # this block's bias
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(x, w, b)
    ### END SOLUTION


# %%
ch07.check_dense_relu(dense_relu)

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 2: the VMEM it needs (10 min)
#
# Write `vmem_footprint(bm, bk, bn, itemsize)`: the bytes of VMEM the chapter's K-tiled
# matmul (`pallas_tools.matmul_ktiled`: x in `(bm, bk)` blocks, y in `(bk, bn)` blocks, a
# `(bm, bn)` output block and accumulator) takes. Pallas double-buffers each block it
# copies in or out (x's, y's and the output's) when the block changes from step to step,
# as all three do here; the accumulator is scratch, float32, and single. (Ignore the
# compiler's own small scratch.) This is a prediction: record your function with the cell
# after it; the next one then compiles the chapter's kernel for a v5e with two block
# choices too big for its scoped VMEM and shows the bytes the compiler asked for beside
# your model's.

# %%
def vmem_footprint(bm, bk, bn, itemsize):
    ### BEGIN SOLUTION Exercise 2 (double-buffered VMEM footprint)
    return 2 * (bm * bk + bk * bn + bm * bn) * itemsize + 4 * bm * bn
    ### END SOLUTION


# %% tags=["nbval-ignore-output"]
with checks.skip_if_not_written():
    vmem_footprint(512, 512, 512, 2)  # still the stub? then nothing is recorded
    ch07.LAB.predict("Exercise 2", vmem_footprint)

# %% tags=["nbval-ignore-output"]
if ch07.LAB.predicted("Exercise 2"):
    problem = hlo.tpu_compiler_problem()
    with checks.skip_if_not_written():
        for bm, bk, bn in [(2048, 512, 1024), (1024, 1024, 2048)]:
            mine = vmem_footprint(bm, bk, bn, 2) / 2**20
            if problem:
                print(f"({bm}, {bk}, {bn}): your model {mine:.2f} MiB; the compiler's "
                      f"count needs the TPU compiler: {problem}")
                continue
            blocks = dict(bm=bm, bk=bk, bn=bn)
            kernel = functools.partial(pallas_tools.matmul_ktiled, **blocks)
            v = pallas_tools.compile_verdict(kernel, S((4096, 4096), jnp.bfloat16),
                                             S((4096, 4096), jnp.bfloat16))
            print(f"({bm}, {bk}, {bn}) in bf16: your model {mine:.2f} MiB;\n  {v}")

# %%
ch07.check_footprint(vmem_footprint)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 3: which blocks compile? (15 min)
#
# The problem: a bf16 matmul of 4096 x 4096 by 4096 x 4096 with the chapter's K-tiled
# kernel (`pallas_tools.matmul_ktiled`) on a
# TPU v5e, whose compiler gives one kernel a **default scoped VMEM limit of 16 MiB**
# (chapter 7 measured it; `vmem_limit_bytes` would raise it, but not here). For each
# candidate `(bm, bk, bn)` below, predict the compiler's verdict: `"fits"`,
# `"misaligned"` (a block's last two dims are not multiples of 8 and 128) or
# `"too big"` (the buffers exceed the scoped limit). Your footprints are printed beside
# them; the check compiles every candidate for the v5e and compares.

# %%
with checks.skip_if_not_written():
    for name, (bm, bk, bn) in ch07.CANDIDATES.items():
        print(f"{name}: (bm, bk, bn) = ({bm:>4}, {bk:>4}, {bn:>4}): "
              f"{vmem_footprint(bm, bk, bn, 2) / 2**20:6.2f} MiB")

# %%
### BEGIN SOLUTION Exercise 3 (which blocks compile)
verdicts = {"a": "fits", "b": "misaligned", "c": "fits", "d": "too big",
            "e": "misaligned", "f": "fits", "g": "too big"}
### END SOLUTION

# %%
ch07.LAB.predict("Exercise 3", verdicts)

# %% tags=["nbval-ignore-output"]
if ch07.LAB.predicted("Exercise 3"):
    problem = hlo.tpu_compiler_problem()
    if problem:
        print(f"the compiler's verdicts need the TPU compiler: {problem}")
    else:
        with checks.skip_if_not_written():
            m, k, n = ch07.PROBLEM
            for name, (bm, bk, bn) in ch07.CANDIDATES.items():
                blocks = dict(bm=bm, bk=bk, bn=bn)
                kernel = functools.partial(pallas_tools.matmul_ktiled, **blocks)
                v = pallas_tools.compile_verdict(kernel, S((m, k), jnp.bfloat16),
                                                 S((k, n), jnp.bfloat16),
                                                 target=ch07.TARGET)
                print(f"{name}: you said {verdicts[name]!r}; the compiler says:\n  {v}")

# %%
ch07.check_verdicts(verdicts)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 4: fuse softmax($QK^T$) for a block of queries (25 min)
#
# Attention scores: `softmax(q @ k.T / sqrt(d))` over the keys, for `q` of shape
# `[Lq, d]` and `k` of shape `[Lk, d]`. XLA compiles it for a v5e as several fusions,
# writing the scores to HBM and reading them back for the softmax. Write
# `attention_scores(q, k, bq, interpret)` as **one** kernel: a 1-D grid over blocks of
# `bq` queries; each step reads its query block and all of `k`, computes the block's
# scores on the MXU (`jax.lax.dot_general` contracting the last dims of both, or
# `jnp.dot` with the k block transposed inside the kernel), scales, and writes the
# block's softmax (subtract each row's max first), in `q`'s dtype. Nothing but the
# `pallas_call` runs outside the kernel: the check traces your function and looks. It runs
# it in the interpreter on float32 and on bfloat16 inputs, some with scores large enough
# to overflow `exp`.
#
# This kernel holds all of `k` and a whole `[bq, Lk]` row of scores in VMEM at once, so
# it stops fitting as the number of keys grows; chapter 7's online softmax walks the keys
# in blocks instead. Here `Lk` stays small.

# %%
def attention_scores(q, k, bq, interpret):
    ### BEGIN SOLUTION Exercise 4 (fused softmax(QK^T) kernel)
    lq, d = q.shape
    lk = k.shape[0]

    def kernel(q_ref, k_ref, o_ref):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) / math.sqrt(d)
        e = jnp.exp(s - s.max(axis=-1, keepdims=True))
        o_ref[...] = (e / e.sum(axis=-1, keepdims=True)).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((lq, lk), q.dtype),
        grid=(lq // bq,),
        in_specs=[pl.BlockSpec((bq, d), lambda i: (i, 0)),
                  pl.BlockSpec((lk, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((bq, lk), lambda i: (i, 0)),
        interpret=interpret,
    )(q, k)
    ### END SOLUTION


# %%
ch07.check_attention_scores(attention_scores)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 5: on a real TPU, near XLA's fused layer (15 min, TPU only)
#
# XLA compiles `relu(x @ w + b)` into one fusion too (chapter 4 showed it), so your
# Exercise 1 kernel has a strong rival. Pick `fast_blocks = (bm, bk, bn)` for a
# 4096-cube bf16 layer so that your `dense_relu` reaches at least 70 % of the throughput
# of XLA's own fused layer on this chip (both timed with `tpu_course.bench`). The blocks
# that get there depend on the chip: put your blocks' intensity by the chapter's traffic
# model for the **3-D** K-tiled grid (section 6: x is read again for each column of
# tiles, w for each row) against this chip's ridge point
# (`hardware.lookup(rt.device_kind).critical_intensity()`), and your Exercise 2 footprint
# against its scoped VMEM limit (chapter 7 measured both chips'). A v6e's ridge is more
# than twice a v5e's: blocks that are compute-bound on a v5e can leave a v6e waiting on
# HBM, and blocks big enough for a v6e can be too big for a v5e's limit. Record your
# choice before the next cell times it.
# The check reads your kernel (it must be Exercise 1's Pallas kernel), then times the
# compiled kernel itself against XLA's layer on fresh inputs. Elsewhere the timing and its
# check are skipped: an interpreter's time says nothing about a TPU.

# %%
### BEGIN SOLUTION Exercise 5 (a real chip: near XLA's fused layer)
# 3-D model, 4096-cube bf16: (512, 1024, 1024) does 315 FLOP/B, above a v5e's ridge
# (241), under a v6e's (560); (1024, 512, 2048) does 585 but needs 22 MiB of VMEM, over
# a v5e's 16 MiB limit and under a v6e's 32 MiB (the check's hint prints these for your
# chip)
this_chip = hardware.lookup(rt.device_kind) or hardware.get("v5e")
fast_blocks = ((1024, 512, 2048)
               if rt.platform == "tpu" and this_chip.critical_intensity() > 315
               else (512, 1024, 1024))
### END SOLUTION

# %%
ch07.LAB.predict("Exercise 5", dense_relu, fast_blocks)

# %% tags=["nbval-ignore-output"]
if ch07.LAB.predicted("Exercise 5"):
    if rt.platform != "tpu":
        print(textwrap.fill(f"no timing here: {pallas_tools.where_kernels_run()}", 88))
    else:
        with checks.skip_if_not_written():
            from tpu_course import bench

            bm, bk, bn = fast_blocks
            m, k, n = ch07.FAST_PROBLEM
            x = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
            w = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16)
            b = jax.random.normal(jax.random.key(2), (1, n), jnp.bfloat16)
            yours = jax.jit(lambda a, c, d: dense_relu(a, c, d, bm, bk, bn, False))
            mine = bench.benchmark(yours, x, w, b, name="your kernel", warn=False)
            xla = jax.jit(lambda a, c, d: jax.nn.relu(a @ c + d))
            ref = bench.benchmark(xla, x, w, b, name="XLA's fused layer", warn=False)
            print(f"your kernel {mine.median_s * 1e3:.3f} ms, XLA's fused layer "
                  f"{ref.median_s * 1e3:.3f} ms: "
                  f"{ref.median_s / mine.median_s:.0%} of its throughput")

# %%
ch07.check_fast(dense_relu, fast_blocks)

# %% [markdown]
# ## Scorecard

# %%
ch07.LAB.scorecard(globals())


# %% [markdown]
# ## Hand in
#
# Write the id your instructor asked for (your course login or e-mail) between the quotes
# and run the cell: it records who hands the lab in, inside the notebook itself. Then save
# the notebook as the cell says and hand in the `.ipynb` file.

# %%
from tpu_course import checks

MY_ID = ""
checks.hand_in(checks.lab(7), MY_ID)
