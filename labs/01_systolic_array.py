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
# Four exercises on chapter 1's weight-stationary array. Each one ends with a check cell:
# run it after your code; it says what is right, or what it expected and what the
# mistake looks like.
#
# Notation as in the chapter: C[M x N] = A[M x K] @ B[K x N] on an array of `R` rows and
# `C` columns; cycles are numbered from 0; one cycle = every cell does at most one MAC
# and every register passes its value one cell on.

# %%
# Setup: installs the course package where it is missing (Colab, Kaggle) and nothing
# else: the runtime's own jax, jaxlib and libtpu stay. Where jax is older than the
# course's floor, it upgrades them together to a tested set and asks for one restart.
import importlib.metadata as md, importlib.util, os, re, shutil, subprocess, sys
class SetupStop(Exception):  # ends "Run all" with this message instead of a traceback
    def _render_traceback_(self): return [str(self)]
def setup_course(floor="0.7.2"):
    def version(p):
        try: return tuple(int(x) for x in re.findall(r"\d+", md.version(p))[:3])
        except md.PackageNotFoundError: return None
    course = os.environ.get("TPU_COURSE_SPEC",
                            "tpu-course @ git+https://github.com/tpu-course/tpu-course")
    jax_now = version("jax")
    upgrade = jax_now is not None and jax_now < tuple(map(int, floor.split(".")))
    if upgrade:  # one consistent set: jax, jaxlib and the runtime's plugin together
        kind = ("[tpu]" if importlib.util.find_spec("libtpu") else "[cuda12]"
                if version("jax-cuda12-plugin") or shutil.which("nvidia-smi") else "")
        wanted = [f"jax{kind}=={floor}", f"jaxlib=={floor}", course]
    elif importlib.util.find_spec("tpu_course") is None:  # pin the runtime's own jax
        wanted = [f"{p}=={md.version(p)}" for p in ("jax", "jaxlib", "libtpu") if version(p)]
        wanted.append(course)
    else:
        return
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *wanted],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        cause = (pip.stderr or pip.stdout).strip().splitlines()[-6:]
        raise SetupStop("Setup failed: pip could not install " + " ".join(wanted) + ":\n  "
                        + "\n  ".join(cause) + "\nFix: make sure the runtime reaches the "
                        "internet (Kaggle: Settings > Internet on), then run this cell again.")
    if upgrade:
        raise SetupStop(f"Setup: this runtime's jax {'.'.join(map(str, jax_now))} is older "
                        f"than the course's floor {floor}, so jax, jaxlib and the course were"
                        " installed together. Restart the runtime once (Colab: Runtime > "
                        "Restart session) and run all again: the new jax loads only in a "
                        "fresh process, and this cell will then install nothing.")
setup_course()

# %%
from tpu_course import runtime

print(runtime.describe().banner())

# %%
import math

import numpy as np

from tpu_course import checks, systolic
import tpu_course.checks.ch01
from tpu_course.checks import NotWritten

# %% [markdown]
# ## Exercise 1: the weight-stationary schedule
#
# One fold on an `R x C` array with `timing="tpu"`: the weights load in cycles `0 .. R-1`,
# then the rows of A stream in from the left, row `k` of the edge buffer starting `k`
# cycles late, and partial sums flow down.
#
# Write `activation_arrives(i, k, j, rows, cols)`: the cycle at which activation
# `a[i, k]` is in cell `(k, j)`; and `output_leaves(i, j, rows, cols)`: the cycle at the
# end of which `c[i, j]` leaves the bottom of column `j`. The check reads the true
# cycles off a traced simulation (`systolic.simulate(..., trace=True)`).

# %%
def activation_arrives(i, k, j, rows, cols):
    raise NotImplementedError("Exercise 1 (weight-stationary schedule): write your code here")


def output_leaves(i, j, rows, cols):
    raise NotImplementedError("Exercise 1 (weight-stationary schedule): write your code here")


# %%
checks.ch01.check_schedule(activation_arrives, output_leaves)

# %% [markdown]
# ## Exercise 2: tile a large matmul onto a fixed array
#
# The array holds at most `rows x cols` weights. Write `tiled_matmul(a, b, rows, cols,
# sim)` that computes `a @ b` by calling `sim(a_tile, b_tile, rows, cols)` (it behaves
# exactly like `systolic.simulate`) on tiles of `b` that fit the array, and reassembles
# the results. Remember which tiles' partial sums belong to the same output.

# %%
def tiled_matmul(a, b, rows, cols, sim=systolic.simulate):
    raise NotImplementedError("Exercise 2 (tile a large matmul): write your code here")


# %%
checks.ch01.check_tiled_matmul(tiled_matmul)

# %% [markdown]
# ## Exercise 3: predict before you simulate
#
# Write `predict(M, K, N, rows, cols)` returning `(cycles, utilisation)` for the
# weight-stationary array with the default `timing="tpu"` (double-buffered weights:
# each fold after the first starts `max(T, R)` cycles after the previous one, with
# `T = M` rows streamed per fold). Utilisation is useful MACs / (cells x cycles). The
# check compares with what `simulate` measures on a few shapes.

# %%
def predict(M, K, N, rows, cols):
    raise NotImplementedError("Exercise 3 (predict cycles and utilisation): write your code here")


# %%
checks.ch01.check_prediction(predict)

# %% [markdown]
# ## Exercise 4: bf16, answered with numbers
#
# (a) Add `1.0` to a running sum 1,000 times, keeping the running sum in bf16 (round it
# to bf16 after every addition). What is the result?
#
# (b) How far is `1.0` from the next larger bf16 number?
#
# Compute both (with `ml_dtypes.bfloat16`, which comes with JAX), do not type them.

# %%
import ml_dtypes

sum_of_ones_bf16 = gap_above_one = None  # your two answers
# Exercise 4 (bf16 with numbers): write your code here
total = NotWritten("Exercise 4 (bf16 with numbers)")
sum_of_ones_bf16 = NotWritten("Exercise 4 (bf16 with numbers)")
gap_above_one = NotWritten("Exercise 4 (bf16 with numbers)")

# %%
print(sum_of_ones_bf16, gap_above_one)
checks.ch01.check_bf16(sum_of_ones_bf16, gap_above_one)
