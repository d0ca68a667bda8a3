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
# # Lab 1: The systolic array
#
# Six exercises on chapter 1's weight-stationary array, **about 95 minutes** in all (the
# plan below gives each one's time). Two are code to write (one cycle of the array, then
# a large matmul tiled onto it), two carry the chapter's ideas to cases it did not show,
# and two ask for a prediction before the simulator answers.
# Each ends with a check cell: it says what is right, or what is wrong with a hint;
# `checks.reveal("Exercise 3")` shows the expected answer once your attempt has been
# checked. The last cell is your scorecard.
#
# A prediction is recorded with `checks.ch01.LAB.predict(...)` before its measurement is
# shown, and it is locked once the measurement has been shown in this session: the check
# grades that recorded value. (Grading reads each prediction as it stands at the end of the
# cell that states it, before any later cell runs.) The checks here are feedback on the
# inputs this notebook shows; grading also tries inputs it does not show.
#
# Notation as in the chapter: Y[M x N] = A[M x K] @ B[K x N] on an array of `R` rows and
# `C` columns; `F` folds (tiles of B the array takes one after another), `T` vectors
# streamed per fold; cycles are numbered from 0.

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

print(runtime.describe().banner())

# %%
import math

import ml_dtypes
import numpy as np

from tpu_course import checks, systolic
import tpu_course.checks.ch01
from tpu_course.checks import NotWritten

checks.ch01.LAB

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 1: one cycle of the array (15 min)
#
# The chapter's `ws_array` builds the whole skewed edge buffer first (`skew(A, R)`) and
# moves every register inside its loop. Write one cycle of that array as a function,
# without the buffer: `ws_cycle(w, act, psum, a, s)` gets
#
# * `w`: the weights in the cells, `R x C` (a tile of b, zero-padded to the array's size);
# * `act`, `psum`: the activation and partial-sum registers at the end of the cycle
#   before (`R x C`; an empty register holds 0);
# * `a`: the activations, `M x K` with `K <= R` (rows `k >= K` of the array are padding:
#   their edge feeds 0);
# * `s`: the cycles since the stream began (0 for the first; the `R` load cycles are
#   not counted),
#
# and returns `(act, psum)` at the end of cycle `s`. Three questions: which value of `a`
# enters row `k` at cycle `s` (and when does none)? Where does each activation move? What
# does each cell add to what? The check feeds your function the simulator's own
# registers (`systolic.simulate(..., trace=True)`) cycle by cycle and compares what it
# returns with the simulator's next registers, on a non-square array with a padded row;
# grading also tries other arrays.

# %%
def ws_cycle(w, act, psum, a, s):
    raise NotImplementedError(
        "Exercise 1 (one cycle of the array): "
        "write your code here")


# %%
checks.ch01.check_ws_cycle(ws_cycle)

# %% [markdown]
# Your cycle, run from empty registers until the last result leaves the bottom edge,
# is a whole array (the bottom row of `psum` holds row `s - (R - 1) - j` of the product in
# column `j`):

# %%
a1, b1 = np.arange(1, 16).reshape(5, 3), np.arange(1, 10).reshape(3, 3)
R1, C1 = 4, 3
w1 = np.zeros((R1, C1), np.int64)
w1[:3, :3] = b1
act1 = psum1 = np.zeros((R1, C1), np.int64)
out1 = np.zeros((5, C1), np.int64)
with checks.skip_if_not_written():
    for s in range(5 + R1 + C1 - 2):
        act1, psum1 = ws_cycle(w1, act1, psum1, a1, s)
        for j in range(C1):
            if 0 <= s - (R1 - 1) - j < 5:
                out1[s - (R1 - 1) - j, j] = psum1[R1 - 1, j]
    print("your array's product equals a @ b:", bool((out1 == a1 @ b1).all()))
    print(f"cycles: {R1} to load + {s + 1} streaming = {R1 + s + 1}; "
          "systolic.simulate:", systolic.simulate(a1, b1, R1, C1).cycles)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 2: tile a large matmul onto a fixed array (25 min)
#
# The array holds at most `rows x cols` weights: its rows hold rows of `b` (K), its
# columns columns of `b` (N), and it need not be square. Write `tiled_matmul(a, b, rows,
# cols, sim)` that computes `a @ b` by calling `sim(a_tile, b_tile, rows, cols)` (it
# behaves exactly like `systolic.simulate` and returns a `SystolicRun`) on tiles of `b`
# that fit the array, and assembles the output from the runs' results. Every product goes
# through `sim`, each tile once. Remember which tiles' partial sums belong to the same
# output. The check uses a non-square array; grading also tries other shapes and arrays.

# %%
def tiled_matmul(a, b, rows, cols, sim=systolic.simulate):
    raise NotImplementedError("Exercise 2 (tile a large matmul): write your code here")


# %%
checks.ch01.check_tiled_matmul(tiled_matmul)

# %% [markdown] workshop={"agenda": "half-day"}
# ## Exercise 3: predict a GEMM on two arrays, then simulate (15 min)
#
# A layer multiplies A[200 x 384] by B[384 x 640] (`checks.ch01.GEMM`). TPU v5e has
# 128x128 MXUs, v6e 256x256 ones. **Before simulating**, predict for each array the
# cycles (`timing="tpu"`: only the first weight load is exposed, folds follow each other
# `max(T, R)` cycles apart) and the utilisation (useful MACs / (cells x cycles)), and say
# which array finishes first. Work it out by hand or with a few lines of arithmetic; do
# not call `systolic` here. Predictions within 5 % pass.

# %%
M2, K2, N2 = checks.ch01.GEMM
# Exercise 3 (predict a GEMM on two arrays): write your code here
def ws_cycles(M, K, N, R, C):
    raise NotImplementedError(
        "Exercise 3 (predict a GEMM on two arrays): "
        "write your code here")
c128 = NotWritten("Exercise 3 (predict a GEMM on two arrays)")
c256 = NotWritten("Exercise 3 (predict a GEMM on two arrays)")
predicted_128 = NotWritten("Exercise 3 (predict a GEMM on two arrays)")
predicted_256 = NotWritten("Exercise 3 (predict a GEMM on two arrays)")
finishes_first = NotWritten("Exercise 3 (predict a GEMM on two arrays)")

# %%
checks.ch01.LAB.predict("Exercise 3", predicted_128, predicted_256, finishes_first)

# %% [markdown]
# Now the simulator moves every value through both arrays (once your prediction is
# recorded; showing it locks the prediction):

# %%
if checks.ch01.LAB.predicted("Exercise 3"):
    rng = np.random.default_rng(0)
    A2 = rng.integers(-2, 3, checks.ch01.GEMM[:2])
    B2 = rng.integers(-2, 3, checks.ch01.GEMM[1:])
    for side in (128, 256):
        run = systolic.simulate(A2, B2, side, side)
        print(f"{side}x{side}: {run.folds} folds, {run.cycles:,} cycles, "
              f"utilisation {run.utilization:.3f}")

# %%
checks.ch01.check_gemm_prediction(predicted_128, predicted_256, finishes_first)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 4: the smallest batch that fills the array (15 min)
#
# A layer's weights B[K x N] sit in the array; the batch M streams through. The chapter
# showed utilisation against a square size. Here the weights are fixed and you choose
# the batch: write `smallest_batch(K, N, rows, cols)`, the smallest M at which the
# weight-stationary array (`timing="tpu"`) is at least 90 % busy (wastes under 10 % of
# its cell-cycles), or `None` when no batch gets there. Reason from the cycle model (calling
# the `systolic` functions that compute cycles or utilisation skips the exercise); the
# checker tries a layer with many folds, one with a single fold, a v6e-sized array, a
# non-square array (`rows != cols`), and one more; grading tries other layers and arrays.

# %%
def smallest_batch(K, N, rows, cols):
    raise NotImplementedError(
        "Exercise 4 (the smallest batch that fills the array): "
        "write your code here")


# %%
checks.ch01.check_smallest_batch(smallest_batch)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 5: choose the dataflow (15 min)
#
# The chapter ran the three dataflows on one small problem. Write `best_dataflow(M, K, N,
# rows, cols)` returning `'ws'`, `'is'` or `'os'`: the one with the fewest cycles for this
# shape (`timing="tpu"`). Derive it from what each dataflow keeps in the cells (the
# chapter's table: which dimensions fill the rows and columns, which one streams), not by
# running `systolic` (that would skip the reasoning this exercise is for). Arrays need not be
# square: with `rows != cols` it matters which dimension lies along the rows. The cell
# after the check simulates your choice against the others.

# %%
def best_dataflow(M, K, N, rows, cols):
    raise NotImplementedError("Exercise 5 (choose the dataflow): write your code here")


# %%
checks.ch01.check_best_dataflow(best_dataflow)

# %%
M4, K4, N4, R4, C4 = 384, 640, 192, 256, 128  # a non-square array: 256 rows, 128 cols
rng = np.random.default_rng(4)
a4, b4 = rng.integers(-2, 3, (M4, K4)), rng.integers(-2, 3, (K4, N4))
with checks.skip_if_not_written():
    choice = best_dataflow(M4, K4, N4, R4, C4)
    for df in ("ws", "is", "os"):
        r = systolic.simulate(a4, b4, R4, C4, dataflow=df)
        mark = "  <- your choice" if df == choice else ""
        print(f"{df}: {r.cycles:,} cycles, utilisation {r.utilization:.3f}{mark}")

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 6: where does a bf16 sum stall? (10 min)
#
# The chapter's sum of ones in a bf16 accumulator stopped at 256. Now add 0.1 again and
# again (`checks.ch01.STALL_TERM`) to a running sum kept in bf16. **Predict** the value at
# which the sum stops growing, from the format alone (7 significand bits: the gap between
# neighbouring bf16 numbers in [2^e, 2^(e+1)) is 2^(e-7); a sum rounds to the nearest
# neighbour). Record it, then the cell after computes it.

# %%
# Exercise 6 (where a bf16 sum stalls): write your code here
predicted_stall = NotWritten("Exercise 6 (where a bf16 sum stalls)")

# %%
checks.ch01.LAB.predict("Exercise 6", predicted_stall)

# %%
if checks.ch01.LAB.predicted("Exercise 6"):
    total = ml_dtypes.bfloat16(0)
    for _ in range(2000):
        term = np.float32(checks.ch01.STALL_TERM)
        total = ml_dtypes.bfloat16(np.float32(total) + term)
    print("a bf16 running sum of 0.1, 2000 times:", float(total), "(exact: 200)")

# %%
checks.ch01.check_stall(predicted_stall)

# %% [markdown]
# ## Scorecard

# %%
checks.ch01.LAB.scorecard(globals())


# %% [markdown]
# ## Hand in
#
# Write the id your instructor asked for (your course login or e-mail) between the quotes
# and run the cell: it records who hands the lab in, inside the notebook itself. Then save
# the notebook as the cell says and hand in the `.ipynb` file.

# %%
from tpu_course import checks

MY_ID = ""
checks.hand_in(checks.lab(1), MY_ID)
