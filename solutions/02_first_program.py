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
# # Lab 2 (solution): Measure a runtime yourself
#
# Six exercises, **about 60 minutes** in all (the plan below gives each one's time): count
# a matmul's work, time a call the right way, measure the host-to-device link, predict a
# copy before timing it, and find where this chip's matmuls reach half its peak. Each
# ends with a check cell that says what is right, or what is wrong with a hint;
# `checks.reveal("Exercise 3")` shows the expected answer if you are stuck. The checks
# measure on the runtime you are on (TPU, GPU or CPU); the last exercise needs an
# accelerator and is skipped on a CPU. The last cell is your scorecard.
#
# Exercise 4 is a prediction: you record it with `ch02.LAB.predict(...)`, and only then
# does the next cell show the measurement. Once the measurement has been shown in this
# session your prediction is locked, and the check grades the one you recorded;
# `tpu-course grade` re-runs the notebook and grades the value in the cell.

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
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from tpu_course import checks, hardware, runtime
from tpu_course.checks import NotWritten, ch02

print(runtime.describe().banner())
ch02.LAB

# %% [markdown] workshop={"agenda": "one-day"}
# ## Exercise 1: count the FLOPs of a matmul (5 min)
# Write `matmul_flops(m, k, n)`: the floating-point operations of an (m x k) @ (k x n)
# matrix product. Every output element c[i, j] is a sum over k of products.

# %%
def matmul_flops(m: int, k: int, n: int) -> int:
    ### BEGIN SOLUTION Exercise 1 (matmul FLOPs)
    return 2 * m * k * n
    ### END SOLUTION


ch02.check_matmul_flops(matmul_flops)

# %% [markdown] workshop={"agenda": "one-day"}
# ## Exercise 2: time a call correctly (15 min)
# Write `time_call(fn, *args)` returning the seconds one call of the jitted `fn` takes,
# measured with `time.perf_counter()`. Remember the traps of the chapter: the first call
# compiles (warm up with one call *before* you start the clock), a call returns before the
# device has finished, and one sample is not a measurement. The result may be a tuple or
# a dict of arrays, which has no `.block_until_ready()` method: the function
# `jax.block_until_ready(result)` waits for every array in it. The checker hands your
# function an instrumented `fn` and clock: it sees which calls each of your clock
# readings surrounds, whether you waited, and what your timer measured, and it changes
# how long a call takes (so return what you measured).

# %%
def time_call(fn, *args, repeats: int = 5) -> float:
    ### BEGIN SOLUTION Exercise 2 (timing a call)
    jax.block_until_ready(fn(*args))  # warm-up: compile outside the timed region
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))  # waits for every leaf of the output pytree
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
    ### END SOLUTION


ch02.check_time_call(time_call)

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 3: host-to-device bandwidth (10 min)
# Write `h2d_bandwidth(host_array)`: copy a NumPy array to the default device with
# `jax.device_put` and return the bandwidth in **bytes per second**. Warm up with one
# copy, then take the median of a few. Like a call, `jax.device_put` returns before the
# copy has landed. The checker follows the copies your code makes and the clock it reads.

# %%
def h2d_bandwidth(host_array: np.ndarray, repeats: int = 5) -> float:
    ### BEGIN SOLUTION Exercise 3 (host-to-device bandwidth)
    jax.device_put(host_array).block_until_ready()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.device_put(host_array).block_until_ready()
        samples.append(time.perf_counter() - start)
    return host_array.nbytes / statistics.median(samples)
    ### END SOLUTION


ch02.check_h2d_bandwidth(h2d_bandwidth)

# %% tags=["nbval-ignore-output"]
bandwidth = NotWritten(ch02.EX3)  # until Exercise 3 is written
with checks.skip_if_not_written():
    bandwidth = h2d_bandwidth(np.ones(ch02.BANDWIDTH_SHAPE, np.float32))
    where = runtime.describe().platform.upper()
    print(f"host -> {where}: {bandwidth / 1e9:.2f} GB/s on a "
          f"{np.prod(ch02.BANDWIDTH_SHAPE) * 4 / 2**20:.0f} MiB array")

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 4: predict a copy, then time it (10 min)
# **Before timing it**, predict from the bandwidth you just measured (`bandwidth`) how many
# seconds it takes to copy a float32 array of shape `ch02.COPY_SHAPE` (8192 x 8192) to the
# device; assign it to `predicted_copy_s`, and record it with your `bandwidth` in the cell
# after. The check grades your arithmetic from your own `bandwidth` (within 25 %, so a
# busy machine cannot fail a right prediction) and holds that bandwidth to copies it times
# itself (within 5x); the cell after the record shows a real copy beside your prediction.

# %%
### BEGIN SOLUTION Exercise 4 (predict a copy)
copy_bytes = ch02.COPY_SHAPE[0] * ch02.COPY_SHAPE[1] * 4  # float32: 4 bytes per element
predicted_copy_s = copy_bytes / bandwidth
### END SOLUTION

# %% tags=["nbval-ignore-output"]
ch02.LAB.predict("Exercise 4", predicted_copy_s, bandwidth)

# %% tags=["nbval-ignore-output"]
if ch02.LAB.predicted("Exercise 4"):
    from tpu_course import transfer

    copy_host = np.ones(ch02.COPY_SHAPE, np.float32)
    transfer.time_h2d(copy_host)  # warm-up
    measured_copy_s = statistics.median(transfer.time_h2d(copy_host) for _ in range(3))
    print(f"you predicted {predicted_copy_s * 1e3:.1f} ms; three copies measured now "
          f"take {measured_copy_s * 1e3:.1f} ms (median)")

# %% tags=["nbval-ignore-output"]
ch02.check_copy_prediction(predicted_copy_s, bandwidth)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 5: how close to the peak? (5 min)
# Write `fraction_of_peak(flops, seconds, chip)` for a chip name of the hardware table
# (`'v5e'`, `'v6e'`, `'h100'`, ...): achieved FLOP/s divided by the chip's dense bf16 peak,
# as a fraction between 0 and 1. Take the peak from `tpu_course.hardware`, never type it.

# %%
def fraction_of_peak(flops: float, seconds: float, chip: str) -> float:
    ### BEGIN SOLUTION Exercise 5 (fraction of peak)
    return flops / seconds / hardware.get(chip).peak_bf16_flops_per_s
    ### END SOLUTION


ch02.check_fraction_of_peak(fraction_of_peak)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 6: where does this chip reach half its peak? (15 min)
# A small matmul cannot keep the matrix units busy: the chapter showed one size. Sweep
# square bf16 matmuls `n = 256, 512, ..., 8192` with your `time_call` and `matmul_flops`,
# and set `half_peak_n` to the first `n` whose FLOP/s reach half the chip's bf16 peak
# (`hardware.bf16_matrix_peak(runtime.describe().chip)`), or `None` if none does. On a
# CPU there is no peak in the table: the cell sweeps small float32 sizes and compares
# with the best rate it saw instead, and the check is skipped (it needs an accelerator).

# %% tags=["nbval-ignore-output"]
rt = runtime.describe()
peak = hardware.bf16_matrix_peak(rt.chip)
on_chip = rt.platform != "cpu" and peak is not None
sizes = [256, 512, 1024, 2048, 4096, 8192] if on_chip else [128, 256, 512]
dtype = jnp.bfloat16 if on_chip else jnp.float32
### BEGIN SOLUTION Exercise 6 (where this chip reaches half its peak)
rates = {}
for n in sizes:
    a = jnp.ones((n, n), dtype)
    rates[n] = matmul_flops(n, n, n) / time_call(jax.jit(jnp.matmul), a, a)
reference = peak if on_chip else max(rates.values())  # CPU: the plateau it measured
half_peak_n = next((n for n in sizes if rates[n] >= 0.5 * reference), None)
### END SOLUTION

# %% tags=["nbval-ignore-output"]
with checks.skip_if_not_written():
    against = ("of the chip's bf16 peak" if on_chip
               else "of the best rate measured here (CPU)")
    for n, r in rates.items():
        print(f"n={n:5d}: {r / 1e12:8.3f} TFLOP/s = {r / reference:5.0%} {against}")
    print("half_peak_n =", half_peak_n)

# %% tags=["nbval-ignore-output"]
ch02.check_half_peak(half_peak_n)

# %% [markdown]
# ## Scorecard

# %%
ch02.LAB.scorecard(globals())


# %% [markdown]
# ## Hand in
#
# Write the id your instructor asked for (your course login or e-mail) between the quotes
# and run the cell: it records who hands the lab in, inside the notebook itself. Then save
# the notebook as the cell says and hand in the `.ipynb` file.

# %%
from tpu_course import checks

MY_ID = ""
checks.hand_in(checks.lab(2), MY_ID)
