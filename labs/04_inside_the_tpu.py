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
# # Lab 4: Predict, compile, measure
#
# Seven exercises, **about 70 minutes** in all (the plan below gives each one's time).
# Each asks you to **predict** a number with pencil-and-paper arithmetic (written as a
# small function or a value), then the check **compiles** the real program and asks XLA,
# or a model of the chip; it grades your prediction with a stated tolerance and explains
# any gap. A failed check gives a hint; `checks.reveal("Exercise 3")` shows the expected
# answer. Exercise 7 compiles for a TPU v5e this machine does not have, and is skipped
# where the TPU compiler is not installed. The last cell is your scorecard.
#
# Exercises 5 and 7 are predictions: you record yours with `ch04.LAB.predict(...)`, and
# only then does the next cell show what XLA counts. Once that has been shown in this
# session your prediction is locked, and the check grades the one you recorded;
# `tpu-course grade` re-runs the notebook and grades the value in the cell (and checks
# your functions on shapes, itemsizes and chips the notebook does not show).
#
# Notation as in chapter 4: $F$ FLOPs (multiply + add = 2), $B$ bytes moved to and from
# HBM, $I = F/B$ arithmetic intensity, $P$ peak FLOP/s, $W$ HBM bytes/s, ridge $P/W$.
# The chip numbers come from `tpu_course.hardware`; never type them in.

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

rt = runtime.describe()
print(rt.banner())

# %%
import math

import jax
import jax.numpy as jnp

from tpu_course import bench, checks, hardware, hlo
from tpu_course.checks import NotWritten, ch04

ch04.LAB

# %% [markdown] workshop={"agenda": "half-day"}
# ## Exercise 1: the FLOPs of a matmul (5 min)
#
# Write `matmul_flops(m, k, n)`: the floating-point operations of `[m, k] @ [k, n]`. The
# check compiles one and sets your count beside XLA's.

# %%
def matmul_flops(m, k, n):
    raise NotImplementedError("Exercise 1 (matmul FLOPs): write your code here")


# %%
ch04.check_matmul_flops(matmul_flops)

# %% [markdown] workshop={"agenda": "half-day"}
# ## Exercise 2: the bytes it must move (5 min)
#
# Write `matmul_bytes(m, k, n, itemsize)`: the bytes read from and written to HBM if
# each input is read once and the output written once (the least any kernel can move).
# `itemsize` is bytes per element: 2 for bf16, 4 for fp32.

# %%
def matmul_bytes(m, k, n, itemsize):
    raise NotImplementedError("Exercise 2 (matmul bytes): write your code here")


# %%
ch04.check_matmul_bytes(matmul_bytes)

# %% [markdown] workshop={"agenda": "half-day"}
# ## Exercise 3: intensity, and which roof binds (10 min)
#
# Write `intensity(m, k, n, itemsize)` (FLOP per byte, from your two functions) and
# `which_roof(ai, chip)`, which returns `'memory'` or `'compute'` for a kernel of
# intensity `ai` on a `hardware.Chip`. The test case is a layer with a batch of 384
# tokens against a 4096 x 4096 bf16 weight, on a v5e and on a v6e.

# %%
def intensity(m, k, n, itemsize):
    raise NotImplementedError("Exercise 3 (intensity and the binding roof): write your code here")


def which_roof(ai, chip):
    raise NotImplementedError("Exercise 3 (intensity and the binding roof): write your code here")


# %%
ch04.check_roofs(intensity, which_roof)

# %% [markdown] workshop={"agenda": "half-day"}
# ## Exercise 4: the fastest it can possibly run (10 min)
#
# Write `fastest_time_s(flops, nbytes, chip)`: the roofline's lower bound on the time
# of a kernel, in seconds. Compute and memory traffic overlap on a TPU.

# %%
def fastest_time_s(flops, nbytes, chip):
    raise NotImplementedError("Exercise 4 (roofline time): write your code here")


# %%
ch04.check_roofline_time(fastest_time_s)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 5: a layer by hand, against XLA (10 min)
#
# Predict the FLOPs of `relu(x @ w + b)` (`ch04.layer`) for `x: [B, D]`, `w: [D, H]`,
# `b: [H]` in `layer_flops(B, D, H)`, by hand (not by asking XLA), and record it in the
# cell after. Then the next cell compiles the layer for `ch04.LAYER_5` on this runtime and
# shows XLA's count; the check compares your count with XLA's within 5 %, and if you
# counted only the matmul, it says what the gap is.

# %%
def layer_flops(B, D, H):
    raise NotImplementedError("Exercise 5 (a layer by hand, against XLA): write your code here")


# %% tags=["nbval-ignore-output"]
with checks.skip_if_not_written():
    layer_flops(*ch04.LAYER_5)  # still the stub? then nothing is recorded
    ch04.LAB.predict("Exercise 5", layer_flops)

# %% tags=["nbval-ignore-output"]
if ch04.LAB.predicted("Exercise 5"):
    with checks.skip_if_not_written():
        B, D, H = ch04.LAYER_5
        print(f"B, D, H = {B}, {D}, {H}: you predict {layer_flops(B, D, H):,} FLOPs; XLA "
              f"counts {ch04.xla_layer_flops(ch04.LAYER_5):,.0f} on this runtime")

# %%
ch04.check_xla_flops(layer_flops)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 6: how big is an array on a TPU? (10 min)
#
# HBM stores a 2-D array in tiles of 8 rows x 128 columns (`T(8,128)` in the HLO): the
# last dimension pads up to a multiple of 128, the one before to a multiple of 8.
# Write `tpu_bytes(rows, cols, itemsize)`. With the TPU compiler installed, the checker
# compiles a program for a TPU v5e that this machine does not have and reads the TPU
# compiler's memory analysis; without it, it uses the tiling model.

# %%
def tpu_bytes(rows, cols, itemsize):
    raise NotImplementedError("Exercise 6 (TPU padded bytes): write your code here")


# %%
ch04.check_padded_bytes(tpu_bytes)

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 7: layer norm on a v5e, predicted, then compiled (20 min)
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
# Exercise 7 (layer norm on a v5e): write your code here
tokens = NotWritten("Exercise 7 (layer norm on a v5e)")
features = NotWritten("Exercise 7 (layer norm on a v5e)")
predicted_ln_flops = NotWritten("Exercise 7 (layer norm on a v5e)")
predicted_ln_bytes = NotWritten("Exercise 7 (layer norm on a v5e)")
predicted_ln_roof = NotWritten("Exercise 7 (layer norm on a v5e)")

# %%
ch04.LAB.predict("Exercise 7", predicted_ln_flops, predicted_ln_bytes, predicted_ln_roof)

# %% tags=["nbval-ignore-output"]
if ch04.LAB.predicted("Exercise 7"):
    print(f"you predict {predicted_ln_flops:,} FLOPs, {predicted_ln_bytes:,} bytes, "
          f"{predicted_ln_roof}-bound")
    if hlo.tpu_compiler_problem() is None:
        ln = ch04.compile_layer_norm()
        print(f"XLA for {ln.target}: {ln.flops:,.0f} FLOPs, {ln.bytes_accessed:,.0f} bytes "
              "accessed")
        for fusion in ln.fusions:
            print(" ", fusion.name, fusion.kind)
    else:
        print("no TPU compiler here:", hlo.tpu_compiler_problem())

# %% tags=["nbval-ignore-output"]
ch04.check_layer_norm(predicted_ln_flops, predicted_ln_bytes, predicted_ln_roof)

# %% [markdown]
# ## Measure: the prediction against this runtime
#
# On a TPU or GPU, the last cell measures a large bf16 matmul and sets it against your
# roofline time for this chip. On a CPU there is no chip in the table to predict for,
# and the cell says so instead of comparing a CPU with a TPU.

# %% tags=["nbval-ignore-output"]
with checks.skip_if_not_written():
    peak = getattr(rt.chip, "peak_bf16_flops_per_s", None)  # None: no chip, or no bf16 peak (T4)
    if rt.chip is None or peak is None:
        print("No accelerator with a bf16 peak in tpu_course.hardware on this runtime: nothing "
              "to compare. Run this lab on a TPU or GPU runtime to close the loop.")
    else:
        n = 8192
        a = jnp.ones((n, n), jnp.bfloat16)
        r = bench.benchmark(jax.jit(jnp.matmul), a, a, repeats=10, warn=False,
                            flops=matmul_flops(n, n, n))
        predicted = fastest_time_s(matmul_flops(n, n, n), matmul_bytes(n, n, n, 2), rt.chip)
        print(f"predicted at best {predicted * 1e3:.3f} ms, measured {r.median_s * 1e3:.3f} ms "
              f"on {rt.device_kind}: {predicted / r.median_s:.0%} of the roofline")

# %% [markdown]
# ## Scorecard

# %% tags=["nbval-ignore-output"]
ch04.LAB.scorecard(globals())
