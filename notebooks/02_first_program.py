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

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "half-day"}
# # Chapter 2: Getting a TPU and a first JAX program
#
# Chapter 1 built a matrix unit out of multiply-accumulate cells. This chapter finds a
# real one and talks to it: which runtime this notebook is on, how to get a TPU, how data
# travels from the host to the chip's memory and back, why JAX calls return before the
# work is done, and how fast a first matmul runs compared with the chip's peak.
#
# **Notation.** *Host*: the CPU and its memory that run Python. *Device*: one chip (or
# one TensorCore) that JAX sees. *HBM*: the device's high-bandwidth memory.

# %% slideshow={"slide_type": "skip"} cellView="form" jupyter={"source_hidden": true} tags=["course-setup"]
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

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "half-day"}
# ## 1. Which runtime am I on?
#
# Every notebook of the course starts with this banner, so that every output below it
# can be traced to the machine that made it:

# %% slideshow={"slide_type": "subslide"}
from tpu_course import runtime

rt = runtime.describe()
print(rt.banner())

# %% [markdown] slideshow={"slide_type": "skip"}
# The banner is a summary of what JAX itself reports. Ask JAX directly: `jax.devices()`
# lists the devices of the default backend (TPU, GPU or CPU), `jax.device_count()` counts
# them, and each device says what it is in `device_kind`. On a TPU v5e-1 you would see one
# `TpuDevice` whose kind is `'TPU v5 lite'`; on an old v2-8 runtime eight devices, one per
# TensorCore; here, whatever this runtime is.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
import jax
import jax.numpy as jnp
import numpy as np

print("backend:", jax.default_backend())
print("devices:", jax.devices())
print("device_count:", jax.device_count(), " local:", jax.local_device_count(),
      " processes:", jax.process_count())
device = jax.devices()[0]
print(f"device 0: platform={device.platform!r} kind={device.device_kind!r} "
      f"id={device.id}")

# %% [markdown] slideshow={"slide_type": "skip"}
# Data starts on the host as a NumPy array. `jax.device_put` copies it to a device (the
# first one unless you name another) and returns a `jax.Array`; the array knows where it
# lives: `.devices()` is the set of devices holding a piece of it, and `.sharding` says
# how it is laid out across them (one device holds all of it here; chapter 6 splits
# arrays over many).

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
host = np.arange(12, dtype=np.float32).reshape(3, 4)
on_device = jax.device_put(host, device)
print(type(host).__name__, "->", type(on_device).__name__, on_device.shape,
      on_device.dtype)
print("devices():", on_device.devices())
print("sharding: ", on_device.sharding)
doubled = on_device * 2  # computed where the input lives
print("result lives on", doubled.devices(), "| back on the host:",
      np.asarray(doubled)[0])

# %% [markdown] slideshow={"slide_type": "skip"}
# `runtime.describe()`, used for the banner, gathers exactly these facts (platform,
# device kind, device and process counts) and maps the device kind to a row of the
# course's hardware table:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
# The same facts field by field (they differ from runtime to runtime: nbval skips them)
print(f"platform={rt.platform!r} device_kind={rt.device_kind!r} "
      f"devices={rt.device_count} processes={rt.process_count}")
print(f"generation={rt.generation!r} host={rt.host!r}")
print(rt.chip.summary() if rt.chip else "No accelerator in the hardware table: this is "
      "a CPU (or an unknown chip),\nso there is no peak to compare against.")
assert rt.device_count == jax.device_count() and rt.device_kind == device.device_kind

# %% [markdown] slideshow={"slide_type": "skip"}
# The hardware table carries one row per accelerator, every number with its source
# (`hardware.SOURCES`), per chip (not per TensorCore). The last column is the chip's
# *critical intensity*, peak FLOP/s divided by HBM bytes/s: chapter 4 builds the
# roofline from it.

# %% slideshow={"slide_type": "skip"}
from tpu_course import hardware

print(hardware.table())

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "one-day"}
# ## 2. Getting a TPU
#
# | where | what you get | how |
# | --- | --- | --- |
# | Colab | the free TPU runtime is a **v5e-1**: one chip, one JAX device. The older "TPU v2" runtime is a **v2-8**: 4 chips with 2 TensorCores each, which JAX shows as **8 devices** (one per TensorCore) | Runtime > Change runtime type > TPU |
# | Kaggle | a TPU v5e-8 (8 chips, one host), weekly quota | Notebook settings > Accelerator > TPU |
# | Cloud TPU VM | any slice you pay for, from 1 chip to a pod | `gcloud`, below |
#
# A Cloud TPU VM is a Linux machine with the chips attached; you `ssh` in and run the same
# notebooks. The commands, as text (run them in a terminal with the Google Cloud CLI, not
# here):
#
# ```bash
# # one v5e chip, spot (preemptible, much cheaper, may be taken back at any moment)
# gcloud compute tpus tpu-vm create my-tpu --zone=us-central1-a \
#     --accelerator-type=v5litepod-1 --version=v2-alpha-tpuv5-lite --spot
# gcloud compute tpus tpu-vm ssh my-tpu --zone=us-central1-a
# # ... pip install jax[tpu], clone the course, `make lab` ...
# gcloud compute tpus tpu-vm delete my-tpu --zone=us-central1-a   # stop paying
#
# # or ask the queue to create it when capacity appears
# gcloud compute tpus queued-resources create my-request --node-id=my-tpu \
#     --zone=us-central1-a --accelerator-type=v5litepod-8 \
#     --runtime-version=v2-alpha-tpuv5-lite --spot
# ```
#
# TPUs are a scarce resource per zone. When a zone has none left, `create` fails at once
# with *Error code 8: "There is no more capacity in the zone ..."*; the answer is another
# zone that offers that generation, or a queued resource, which waits instead of failing.
# Spot VMs cost less because they can be reclaimed: save checkpoints (chapter 5).
#
# ### What it costs
# A job's cost is a formula: **chips x hours x price per chip-hour**. Prices change and
# differ by region and by kind (on-demand, spot), so the price is yours to fill in: read
# today's figure for your region on the pricing page (`costs.PRICES_SOURCE`) and pass it
# as `usd_per_chip_hour=`. Left at `None`, `tpu_course.costs` uses its *example* price, a
# dated list price the course could not verify (spot derived from it by an assumed
# fraction), and every line it prints says so.

# %% slideshow={"slide_type": "subslide"}
from tpu_course import costs

print(f"Check today's prices at {costs.PRICES_SOURCE}\n"
      f"(the example prices: {costs.PRICES_AS_OF})")
v5e_spot_price = None  # USD per chip-hour, today's spot price for your region
v6e_price = None  # USD per chip-hour, today's on-demand price
# 20 learners x 1 chip x 3 h, and a v6e-8 for a day
workshop = costs.training_cost("v5e", 20, hours=3, pricing="spot",
                               usd_per_chip_hour=v5e_spot_price)
one_day = costs.training_cost("v6e", 8, hours=24, usd_per_chip_hour=v6e_price)
print("a workshop:", workshop)
print("a day of v6e-8:", one_day)

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "two-days"}
# ## 3. The path of the data: host -> HBM -> compute -> host
#
# NumPy arrays live in host memory. `jax.device_put` copies one to the device's HBM; the
# matrix units only ever read HBM (through on-chip memory); reading a result back with
# `np.asarray` copies it to the host again. On a TPU or GPU both copies cross PCIe (or a
# similar link), which is far slower than HBM: data that stays on the device is the first
# rule of keeping a chip busy.
#
# `transfer.measure_transfers` times both directions over a sweep of sizes, each point the
# median of several runs, waiting for every copy to finish. Small copies are dominated by
# a fixed cost per transfer, large ones by bandwidth.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
# Bandwidth vs transfer size, host to device and back, log-log
from tpu_course import transfer

sizes = transfer.DEFAULT_SIZES_BYTES
sizes = sizes if rt.platform != "cpu" else sizes[:-1]
sweep = transfer.measure_transfers(sizes, repeats=5)
print(sweep)
sweep.plot();

# %% [markdown] slideshow={"slide_type": "skip"}
# On this notebook's runtime (see the banner): on a CPU "device" memory *is* host memory,
# so the sweep measures a memory copy, or nothing at all when JAX can use the NumPy buffer
# in place; the curve says nothing about a TPU. On a TPU or GPU the large transfers settle
# at the host link's bandwidth, typically tens of GB/s, compared with the HBM bandwidth in
# the table above (hundreds to thousands of GB/s).

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "half-day"}
# ## 4. Asynchronous dispatch: JAX returns before the work is done
#
# Calling a jitted function *enqueues* the work on the device and returns at once with an
# array whose value is still being computed. Python can run ahead and queue the next step
# while the chip works: good for throughput, a trap for timing. Only
# `block_until_ready()` (or reading the value) waits.

# %% slideshow={"slide_type": "subslide"}
import time


@jax.jit
def chain(x):
    for _ in range(4):
        x = jnp.tanh(x @ x)
    return x


n = 2048 if rt.platform != "cpu" else 768
x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
_ = chain(x).block_until_ready()  # compile and warm up first

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
start = time.perf_counter()
y = chain(x)  # returns as soon as the work is queued
dispatched = time.perf_counter() - start
y.block_until_ready()  # now wait for the device
finished = time.perf_counter() - start
print(f"returned after {dispatched * 1e3:8.3f} ms (work queued, not done)")
print(f"finished after {finished * 1e3:8.3f} ms (block_until_ready)")
print(f"a timer without block_until_ready would report {dispatched / finished:.1%} "
      "of the real time")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 6, "agenda": "half-day", "needs": "tpu"}
# ## 5. A first timed matmul
#
# `bench.benchmark` does what a correct benchmark needs: it compiles first and reports
# that time apart, warms up, waits for the whole output, repeats and reports the median
# and spread, and counts FLOPs with XLA's own cost analysis. For an (m x k) @ (k x n)
# matmul that count is 2·m·k·n: one multiply and one add per (i, j, k). With the chip
# known, it divides the achieved rate by the chip's peak from the hardware table.

# %% slideshow={"slide_type": "skip"}
from tpu_course import bench

# bf16 matrix units arrived with NVIDIA's compute capability 8.0 (A100); a T4 is 7.5,
# and its row in the hardware table has no bf16 peak (hardware.bf16_matrix_peak gives
# None)
compute_capability = float(getattr(device, "compute_capability", 0) or 0)
bf16_emulated = rt.platform == "gpu" and (hardware.bf16_matrix_peak(rt.chip) is None
                                          or 0 < compute_capability < 8.0)
if rt.platform == "cpu":
    size, dtype = 1024, jnp.float32  # keep a CPU run short
else:
    size, dtype = 8192, jnp.bfloat16  # big enough to keep a matrix unit busy
a = jax.random.normal(jax.random.key(1), (size, size), dtype)
b = jax.random.normal(jax.random.key(2), (size, size), dtype)
matmul = jax.jit(jnp.matmul)
result = bench.benchmark(matmul, a, b, repeats=10, min_time=0.5, warn=False,
                         peak="fp32" if bf16_emulated else "bf16")
print(f"{size} x {size} x {size} {jnp.dtype(dtype).name} matmul: XLA counts "
      f"{result.flops:.4g} FLOPs = 2*{size}^3: {result.flops == 2 * size**3}")

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
result

# %% [markdown] slideshow={"slide_type": "skip"}
# On a T4 (Colab's free GPU) there are no bf16 matrix units: XLA computes a bf16 matmul
# in float32 on the CUDA cores (converting the inputs), so the cell below compares it with
# the T4's fp32 peak, not with a bf16 (or fp16 tensor-core) figure it cannot reach.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
if bf16_emulated:
    print(f"{rt.device_kind}: no bf16 matrix units, so bf16 is emulated (computed in "
          "fp32);\ncompared with the fp32 peak.")
if result.fraction_of_peak is not None:
    print(f"{result.flops_per_s / 1e12:.1f} TFLOP/s = {result.fraction_of_peak:.0%} of "
          f"{hardware.get(result.chip).display_name}'s {result.peak_name} peak")
elif rt.platform == "cpu":
    print(f"{result.flops_per_s / 1e9:.1f} GFLOP/s on {rt.device_kind}: a CPU timing, "
          "with no TPU peak to compare\nagainst; run this notebook on a TPU runtime "
          "to see one.")
else:
    print(f"{result.flops_per_s / 1e12:.1f} TFLOP/s on {rt.device_kind}: the hardware "
          "table has no peak for this chip\nand dtype to compare against.")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 2, "agenda": "half-day"}
# ## Takeaways
# - Print the runtime first: every number in a notebook belongs to a machine. JAX's own
#   view is `jax.devices()`, `device.device_kind` and, for an array, `.devices()` and
#   `.sharding`; `runtime.describe()` sums them up.
# - Data lives on the host until `device_put`; keep it on the device and move as little
#   as possible across the host link.
# - JAX dispatches asynchronously: a timer must wait with `block_until_ready` on the whole
#   result, after a warm-up, or it measures the wrong thing.
# - Throughput is FLOPs / time, and "how good is that?" is answered by the chip's peak
#   from a sourced table, never by a number typed into the notebook.
#
# Lab 2 asks you to write these measurements yourself.
