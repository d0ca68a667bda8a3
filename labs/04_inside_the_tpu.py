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
# # Lab 4: Ask the compiler, predict, compile, measure
#
# Six exercises, **about 70 minutes** in all (the plan below gives each one's time).
# Exercise 1 asks the compiler itself, with JAX's own calls: after it you can get XLA's
# count for any function of yours without the course. The others ask you to **predict**
# a number with pencil-and-paper arithmetic (written as a small function or a value),
# then the check **compiles** the real program and asks XLA, or a model of the chip; it
# grades your prediction with a stated tolerance and explains any gap. A failed check
# gives a hint; `checks.reveal("Exercise 3")` shows the expected answer. Exercise 6
# compiles for a TPU v5e this machine does not have, and is skipped where the TPU
# compiler is not installed (or does not match jax). The last cell is your scorecard.
#
# Exercises 4 and 6 are predictions: you record yours with `ch04.LAB.predict(...)`, and
# only then does the next cell show what XLA counts. Once that has been shown in this
# session your prediction is locked, and the check grades the one you recorded;
# `tpu-course grade` re-runs the notebook and grades the value in the cell (and checks
# your functions on functions, shapes, dtypes and chips the notebook does not show).
#
# Notation as in chapter 4: $F$ FLOPs (multiply + add = 2), $B$ bytes moved to and from
# HBM, $I = F/B$ arithmetic intensity, $P$ peak FLOP/s, $W$ HBM bytes/s, ridge $P/W$.
# The chip numbers come from `tpu_course.hardware`; never type them in.

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
import math
import os

import jax
import jax.numpy as jnp

from tpu_course import bench, checks, hardware, hlo
from tpu_course.checks import NotWritten, ch04

ch04.LAB

# %% [markdown] workshop={"agenda": "half-day"}
# ## Exercise 1: XLA's FLOPs and bytes for any function (12 min)
#
# Write `xla_cost(fn, *args)`: the pair `(flops, bytes_accessed)` that XLA's cost
# analysis gives for the **compiled** `fn` at `args`, with JAX's own calls as chapter 4
# section 1 showed them (no `tpu_course` helper: the point is to know them). The arguments
# may be `jax.ShapeDtypeStruct` placeholders, so nothing must run. The check sets your
# function on the chapter's layer and a row softmax; the grader also on functions the
# notebook never shows (other dtypes, a dict of parameters, a function already jitted).

# %%
def xla_cost(fn, *args):
    raise NotImplementedError(
        "Exercise 1 (XLA's FLOPs and bytes for any function): "
        "write your code here")


# %%
ch04.check_xla_cost(xla_cost)

# %% tags=["nbval-ignore-output"]
# Your function on your own code: the chapter's GELU, fused by XLA (counts per backend)
with checks.skip_if_not_written():
    def gelu(x):
        return 0.5 * x * (1 + jnp.tanh(0.7978845608 * (x + 0.044715 * x**3)))

    f, b = xla_cost(gelu, jax.ShapeDtypeStruct((1024, 1024), jnp.float32))
    print(f"GELU on f32[1024, 1024]: {f:,.0f} FLOPs, {b:,.0f} bytes, "
          f"{f / b:.2f} FLOP/byte")

# %% [markdown] workshop={"agenda": "half-day"}
# ## Exercise 2: the batch where a layer turns compute-bound (10 min)
#
# A bf16 layer multiplies activations `x: [m, k]` by weights `w: [k, n]` into `y: [m, n]`;
# the least a kernel can move is `x` and `w` read once and `y` written once. Chapter 4
# said the ridge point is roughly the batch (in tokens) below which such a layer cannot
# keep a chip busy. Make that exact: write `compute_bound_batch(k, n, chip)`, the least
# whole batch `m` at which the layer's intensity reaches the ridge point of `chip` (a
# `hardware.Chip`: its bf16 peak over its HBM bandwidth), or `None` when no batch, however
# large, gets there.

# %%
def compute_bound_batch(k, n, chip):
    raise NotImplementedError(
        "Exercise 2 (the batch where a layer turns compute-bound): "
        "write your code here")


# %%
ch04.check_compute_bound_batch(compute_bound_batch)

# %% [markdown] workshop={"agenda": "one-day"}
# ## Exercise 3: the least time of a chain of kernels (10 min)
#
# A compiled program is a sequence of kernels (the fusions of chapter 4), each with its
# own FLOPs and bytes. Write `chain_time_s(kernels, chip)`: the least time, in seconds,
# that the roofline allows for `kernels`, a list of `(flops, bytes)` pairs run one after
# another on `chip`. The check gives a matmul followed by a large elementwise kernel on a
# v5e, and a three-kernel chain on a v6e.

# %%
def chain_time_s(kernels, chip):
    raise NotImplementedError(
        "Exercise 3 (the least time of a chain of kernels): "
        "write your code here")


# %%
ch04.check_chain_time(chain_time_s)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 4: a layer by hand, against XLA (10 min)
#
# Predict the FLOPs of `relu(x @ w + b)` (`ch04.layer`) for `x: [M, D]`, `w: [D, H]`,
# `b: [H]` in `layer_flops(M, D, H)`, by hand (not by asking XLA: a `layer_flops` that
# compiles fails the check), and record it in the cell after. The case is `ch04.LAYER_4`, a
# first layer on only a few input features. Then the next cell shows XLA's count on this
# runtime; the check compares your count with XLA's within 5 %.

# %%
def layer_flops(M, D, H):
    raise NotImplementedError(
        "Exercise 4 (a layer by hand, against XLA): "
        "write your code here")


# %% tags=["nbval-ignore-output"]
with checks.skip_if_not_written():
    layer_flops(*ch04.LAYER_4)  # still the stub? then nothing is recorded
    ch04.LAB.predict("Exercise 4", layer_flops)

# %% tags=["nbval-ignore-output"]
if ch04.LAB.predicted("Exercise 4"):
    with checks.skip_if_not_written():
        M, D, H = ch04.LAYER_4
        print(f"M, D, H = {M}, {D}, {H}: you predict {layer_flops(M, D, H):,} FLOPs; "
              f"XLA counts {ch04.xla_layer_flops(ch04.LAYER_4):,.0f} on this runtime")

# %%
ch04.check_xla_flops(layer_flops)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 5: how big an array is on a TPU (12 min)
#
# Chapter 4 section 7 printed the HBM layout and the bytes of a few arrays compiled for a
# TPU v5e. From those (and, where the TPU compiler is installed, from arrays you compile
# yourself in the cell below, with the chapter's JAX calls), work out the rule, then write
# `tpu_bytes(shape, itemsize)`: the bytes a 2-D array of `shape` (both dimensions at least
# 9) takes in a TPU's HBM, for float32 (`itemsize=4`) and bf16 (`itemsize=2`). Watch the
# layout's `{1,0}` or `{0,1}` as well as its `T(...)`. The check expects the bytes the TPU
# compiler's memory analysis gives for a v5e; a `tpu_bytes` that asks the compiler fails
# the check.

# %% tags=["nbval-ignore-output"]
# Explore (optional): compile `x + 1` for one v5e chip and read what the compiler says.
problem = hlo.tpu_compiler_problem()  # the course's guard: a libtpu that matches jax
if problem:
    print("no TPU compiler here:", problem)
else:
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    # no TPU here: skip libtpu's lock
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with runtime.quiet_libtpu():  # drops libtpu's "no TPU metadata" start-up warnings
        v5e_chip = topologies.get_topology_desc("v5e:2x2", "tpu").devices[0]
    for shape, dtype in (((100, 100), jnp.float32), ((24, 300), jnp.bfloat16)):
        on_chip = SingleDeviceSharding(v5e_chip)
        arg = jax.ShapeDtypeStruct(shape, dtype, sharding=on_chip)
        compiled = jax.jit(lambda x: x + 1).lower(arg).compile()
        text = compiled.as_text()
        layout = text.split("entry_computation_layout={(")[1].split(")->")[0]
        nbytes = compiled.memory_analysis().argument_size_in_bytes
        print(f"{layout:<34} {nbytes:>8,} bytes")

# %%
def tpu_bytes(shape, itemsize):
    raise NotImplementedError(
        "Exercise 5 (how big an array is on a TPU): "
        "write your code here")


# %%
ch04.check_tpu_bytes(tpu_bytes)

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 6: layer norm on a v5e, predicted, then compiled (15 min)
#
# Chapter 4 analysed matmuls. Layer norm (`ch04.layer_norm`, shown below) normalises each
# row of a bf16 `[4096, 1024]` array (`ch04.LN_SHAPE`) with float32 statistics, then
# scales by `gamma` and shifts by `beta`. **Before compiling**, predict
#
# * `predicted_ln_flops`: its FLOPs (count the elementwise and reduction work per
#   element; within 3x of XLA's count passes: XLA counts the converts and the `rsqrt` its
#   own way);
# * `predicted_ln_bytes`: the least any kernel must move to and from HBM (within 1.5x);
# * `predicted_ln_roof`: `'memory'` or `'compute'` on a v5e.
#
# Record your three predictions in the cell after; the cell after that compiles layer
# norm for a v5e (`target="v5e:2x2"`, compile-only) and shows what the TPU compiler counts,
# and the check compares and names the fusions XLA made.

# %%
import inspect

print(inspect.getsource(ch04.layer_norm))

# %%
# Exercise 6 (layer norm on a v5e): write your code here
tokens = NotWritten("Exercise 6 (layer norm on a v5e)")
features = NotWritten("Exercise 6 (layer norm on a v5e)")
predicted_ln_flops = NotWritten("Exercise 6 (layer norm on a v5e)")
predicted_ln_bytes = NotWritten("Exercise 6 (layer norm on a v5e)")
predicted_ln_roof = NotWritten("Exercise 6 (layer norm on a v5e)")

# %%
ch04.LAB.predict("Exercise 6", predicted_ln_flops, predicted_ln_bytes,
                 predicted_ln_roof)

# %% tags=["nbval-ignore-output"]
if ch04.LAB.predicted("Exercise 6"):
    print(f"you predict {predicted_ln_flops:,} FLOPs, {predicted_ln_bytes:,} bytes, "
          f"{predicted_ln_roof}-bound")
    if hlo.tpu_compiler_problem() is None:
        ln = ch04.compile_layer_norm()
        print(f"XLA for {ln.target}: {ln.flops:,.0f} FLOPs, "
              f"{ln.bytes_accessed:,.0f} bytes accessed")
        for fusion in ln.fusions:
            print(" ", fusion.name, fusion.kind)
    else:
        print("no TPU compiler here:", hlo.tpu_compiler_problem())

# %% tags=["nbval-ignore-output"]
ch04.check_layer_norm(predicted_ln_flops, predicted_ln_bytes, predicted_ln_roof)

# %% [markdown]
# ## Measure: the prediction against this runtime
#
# On a TPU or GPU, the last cell measures a large bf16 matmul and sets it against the
# roofline time of its compiled program for this chip (your Exercises 1 and 3). On a CPU
# there is no chip in the table to predict for, and the cell says so instead of comparing
# a CPU with a TPU.

# %% tags=["nbval-ignore-output"]
with checks.skip_if_not_written():
    # None: no chip, or no bf16 peak (T4)
    peak = getattr(rt.chip, "peak_bf16_flops_per_s", None)
    if rt.chip is None or peak is None:
        print("No accelerator with a bf16 peak in tpu_course.hardware on this "
              "runtime:\nnothing to compare. Run this lab on a TPU or GPU runtime to "
              "close the loop.")
    else:
        n = 8192
        a = jnp.ones((n, n), jnp.bfloat16)
        r = bench.benchmark(jax.jit(jnp.matmul), a, a, repeats=10, warn=False,
                            flops=2 * n**3)
        predicted = chain_time_s([xla_cost(jnp.matmul, a, a)], rt.chip)
        print(f"predicted at best {predicted * 1e3:.3f} ms, measured "
              f"{r.median_s * 1e3:.3f} ms on {rt.device_kind}: "
              f"{predicted / r.median_s:.0%} of the roofline")

# %% [markdown]
# ## Scorecard

# %% tags=["nbval-ignore-output"]
ch04.LAB.scorecard(globals())


# %% [markdown]
# ## Hand in
#
# Write the id your instructor asked for (your course login or e-mail) between the quotes
# and run the cell: it records who hands the lab in, inside the notebook itself. Then save
# the notebook as the cell says and hand in the `.ipynb` file.

# %%
from tpu_course import checks

MY_ID = ""
checks.hand_in(checks.lab(4), MY_ID)
