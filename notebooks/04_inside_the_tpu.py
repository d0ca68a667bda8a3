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

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 7, "agenda": "half-day"}
# # Chapter 4: Inside the TPU: what `jit` produces
#
# Chapter 3 used `jax.jit` as a black box that makes code fast. This chapter opens the
# box. We follow one small function down through the three programs JAX and XLA build
# from it, read the optimised program the way a performance engineer does (fusions,
# layouts, padding, collectives), ask XLA how many FLOPs and bytes it will cost, place it
# on the chip's *roofline*, and then measure it without fooling ourselves.
#
# **A real TPU compiler, with or without a TPU.** With the course's `aot` extra
# (`pip install "tpu-course[aot]"`, which brings `libtpu`), JAX can compile for TPU
# topologies this machine does not have: the real TPU compiler runs here and hands back
# the program a v5e or v6e would run. Every such cell says "compile-only". Without the
# extra those cells print a note and skip; everything else still runs.
#
# **Notation** (one meaning per symbol in this chapter):
#
# | symbol | meaning |
# | --- | --- |
# | $F$ | floating-point operations (a multiply and an add are 2) |
# | $B$ | bytes moved between HBM and the chip |
# | $I = F/B$ | arithmetic intensity, FLOPs per byte |
# | $P$ | peak FLOP/s |
# | $W$ | HBM bandwidth, bytes/s |
# | $I^* = P/W$ | the ridge point (critical intensity) |
# | $M$, $D$, $H$ | the layer's batch (rows of `x`), inputs and outputs: `x: [M, D]`, `W: [D, H]` |

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

# %% slideshow={"slide_type": "skip"}
from tpu_course import runtime

rt = runtime.describe()
print(rt.banner())

# %% slideshow={"slide_type": "skip"}
import os
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

from tpu_course import bench, hardware, hlo, roofline

ON_CPU = rt.platform == "cpu"
AOT = hlo.compile_only_available()
print("compile-only TPU targets available:", AOT)
if not AOT:
    print("Note: the cells that compile for a TPU will print a note and skip. To see "
          "them,\ninstall the extra: "
          'pip install "tpu-course[aot]" (about 700 MB), then restart.')

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 6, "agenda": "half-day"}
# ## 1. Three programs from one function
#
# Take one layer of an MLP, $y = \mathrm{relu}(xW + b)$, with a batch of 64 rows, 512
# inputs and 256 outputs. `jit` turns it into three successive programs:
#
# 1. the **jaxpr**: JAX's own record of the primitive operations, produced by tracing
#    the Python function with abstract values (shapes and dtypes, no numbers);
# 2. **StableHLO**: the jaxpr written in the portable MLIR dialect that every XLA
#    backend accepts;
# 3. **optimised HLO**: what the XLA compiler for *this* backend made of it, after
#    fusion, layout assignment and (on several devices) partitioning.
#
# A jitted function has a method for each step, and none of them runs the function:
# `.trace(*args)` gives the jaxpr, `.lower()` the StableHLO, `.compile()` the compiled
# program. The arguments can be `jax.ShapeDtypeStruct` placeholders: a shape and a dtype,
# no data.

# %% slideshow={"slide_type": "subslide"}
M, D, H = 64, 512, 256


def layer(x, w, b):
    return jax.nn.relu(x @ w + b)


args = (jax.ShapeDtypeStruct((M, D), jnp.float32),
        jax.ShapeDtypeStruct((D, H), jnp.float32),
        jax.ShapeDtypeStruct((H,), jnp.float32))
traced = jax.jit(layer).trace(*args)  # 1. trace: the jaxpr
lowered = traced.lower()  # 2. lower: StableHLO (jax.jit(layer).lower does 1 and 2)
compiled = lowered.compile()  # 3. compile: XLA for this backend
print(traced.jaxpr.pretty_print(use_color=False))

# %% [markdown] slideshow={"slide_type": "skip"}
# The jaxpr lists `dot_general` (the matmul), a `broadcast_in_dim` of the bias, an `add`
# and a `max` against zero: four operations, each with its output shape. StableHLO,
# `lowered.as_text()`, says the same in MLIR (the first lines are shown):

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
# hlo.wrap_lines continues each long line on the next (88 characters a line)
print(hlo.wrap_lines("\n".join(lowered.as_text().splitlines()[:12])))

# %% [markdown] slideshow={"slide_type": "skip"}
# The optimised HLO, `compiled.as_text()`, is where XLA's decisions appear: its fusions,
# the layout of every array (`{1,0}` is row-major), which operations became one kernel.
# The entry computation is the program itself:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
hlo_text = compiled.as_text()
print(hlo.wrap_lines(hlo_text[hlo_text.index("ENTRY"):].split("\n}")[0]))

# %% [markdown] slideshow={"slide_type": "skip"}
# The compiled program also answers two questions without running: what it costs
# (`cost_analysis()`, XLA's count of FLOPs and of bytes accessed in memory) and how much
# device memory it needs (`memory_analysis()`: arguments, outputs, temporaries). Older jax
# returns the cost analysis as a list with one dict per program:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
cost = compiled.cost_analysis()
cost = cost[0] if isinstance(cost, (list, tuple)) else cost
memory = compiled.memory_analysis()
print(f"FLOPs {cost['flops']:,.0f}, bytes accessed {cost['bytes accessed']:,.0f}")
print(f"memory: arguments {memory.argument_size_in_bytes:,} B, outputs "
      f"{memory.output_size_in_bytes:,} B, temporaries {memory.temp_size_in_bytes:,} B")

# %% [markdown] slideshow={"slide_type": "skip"}
# These five calls are all you need to look inside any function of yours. The course
# wraps them in one instrument, `hlo.inspect(fn, *args)`: it makes the same three calls,
# parses the HLO (op counts, fusions, collectives) and gathers both analyses and the
# compile time in one report. From here on the chapter uses it as a shortcut; its numbers
# are the ones above:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
report = hlo.inspect(layer, *args)
assert (report.flops, report.bytes_accessed) == (cost["flops"], cost["bytes accessed"])
report

# %% [markdown] slideshow={"slide_type": "skip"}
# `report.show_hlo()` prints the optimised HLO with the lines that do the work (fusions,
# dots, convolutions) marked `>>`:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
print(report.show_hlo())

# %% [markdown] slideshow={"slide_type": "slide"}
# ### The same layer, compiled for a TPU v5e
#
# JAX can compile for TPU chips this machine does not have: `jax.experimental.topologies`
# describes a TPU slice (`"v5e:2x2"`: four v5e chips), and its `devices` are compile-only
# devices. Place the arguments on one of them (a `sharding` on each placeholder) and the
# same `trace`/`lower`/`compile` runs the real TPU compiler here. That needs `libtpu`, the
# TPU compiler (the course's `aot` extra), and a libtpu of the build this jax expects: a
# mismatched one (Colab's TPU runtime ships jax 0.7.2 with libtpu 0.0.21.1) crashes the
# whole process when it compiles for a topology. `hlo.tpu_compiler_problem()` is the
# course's guard for both: None when it is safe, else why not.
#
# Look for three TPU-specific things: the layouts now carry a tiling such as `T(8,128)`
# (HBM stores arrays in tiles of 8 sublanes x 128 lanes); the matmul is a `convolution`
# inside a fusion (the MXU's instruction); and the bias add and the relu are fused *into*
# the matmul's output fusion, so the intermediate never goes to HBM.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
problem = hlo.tpu_compiler_problem()
if problem is None:
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    # no TPU here: skip libtpu's lock
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with runtime.quiet_libtpu():  # drops libtpu's "no TPU metadata" start-up warnings
        v5e_slice = topologies.get_topology_desc("v5e:2x2", "tpu")
    chip0 = SingleDeviceSharding(v5e_slice.devices[0])
    tpu_args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=chip0) for a in args]
    tpu_compiled = jax.jit(layer).trace(*tpu_args).lower().compile()
    tpu_hlo = tpu_compiled.as_text()
    print("compiled for", v5e_slice.devices[0].device_kind,
          "(compile-only); the entry,\nand the MXU's convolution inside its fusion:")
    entry = tpu_hlo[tpu_hlo.index("ENTRY"):].split("\n}")[0].splitlines()
    for line in entry + [l for l in tpu_hlo.splitlines() if " convolution(" in l]:
        line = line.strip().split(", metadata=")[0].split(", backend_config=")[0]
        print(hlo.wrap_lines("  " + line))
else:
    print("skipped:", problem)

# %% [markdown] slideshow={"slide_type": "skip"}
# The shortcut again: `hlo.inspect(layer, *args, target="v5e:2x2")` builds the topology,
# places the arguments and compiles, behind the same guard, and parses what came out:

# %% slideshow={"slide_type": "skip"}
if AOT:
    tpu_report = hlo.inspect(layer, *args, target="v5e:2x2")
    print(f"compiled for {tpu_report.target} ({tpu_report.device_kind}), "
          f"compile-only: {tpu_report.compile_only}")
    print("top-level ops:", tpu_report.compute_ops)
    for f in tpu_report.fusions:
        ops = ", ".join(f"{op} x{k}" for op, k in f.ops.items())
        print(textwrap.fill(f"  fusion {f.kind}: {ops}", 88, subsequent_indent="    "))
else:
    print("skipped: needs the TPU extra (libtpu) to compile for a TPU")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "one-day"}
# ## 2. Fusion, seen and measured
#
# Fusion is XLA's most important optimisation for memory-bound code: a chain of
# elementwise operations becomes one kernel that reads the input once and writes the
# output once, instead of writing and re-reading every intermediate. The tanh
# approximation of GELU is a good chain (8 elementwise operations). We compile it as
# is, then with `lax.optimization_barrier` after each step, which forbids XLA to fuse
# across it, and compare what XLA says.

# %% slideshow={"slide_type": "subslide"}
def gelu(x):
    return 0.5 * x * (1.0 + jnp.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def gelu_unfused(x):
    cut = jax.lax.optimization_barrier
    inner = cut(x + 0.044715 * cut(x**3))
    return 0.5 * x * cut(1.0 + cut(jnp.tanh(0.7978845608 * inner)))


N = 1024 if ON_CPU else 8192
x = jax.random.normal(jax.random.key(0), (N, N), jnp.float32)
fused_r, unfused_r = hlo.inspect(gelu, x), hlo.inspect(gelu_unfused, x)

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
# (the counts depend on the backend and on N, which is larger on an accelerator)
print(f"fusions: {len(fused_r.fusions)} vs {len(unfused_r.fusions)}")
print(f"bytes accessed (XLA): {fused_r.bytes_accessed / 2**20:.1f} MiB vs "
      f"{unfused_r.bytes_accessed / 2**20:.1f} MiB  "
      f"(the array itself is {x.nbytes / 2**20:.0f} MiB)")

# %% [markdown] slideshow={"slide_type": "skip"}
# The fused version touches the array about twice (read $x$, write $y$); the unfused
# one writes and re-reads each intermediate. `report.diff(other)` sets the two side by
# side, op by op:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
fused_r.diff(unfused_r)

# %% [markdown] slideshow={"slide_type": "skip"}
# Does it matter in time? Elementwise code is memory-bound, so the time should follow
# the bytes. The harness measures both (compile apart, warm-up, waiting for results):

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
t_fused = bench.benchmark(jax.jit(gelu), x, repeats=5, min_time=0.2)
t_unfused = bench.benchmark(jax.jit(gelu_unfused), x, repeats=5, min_time=0.2)
print(f"fused   {t_fused.median_s * 1e3:8.3f} ms  ({rt.platform.upper()} timing)")
print(f"unfused {t_unfused.median_s * 1e3:8.3f} ms")
print(f"unfused / fused time: {bench.compare(t_fused, t_unfused) ** -1:.2f}x; "
      f"bytes ratio from XLA: {unfused_r.bytes_accessed / fused_r.bytes_accessed:.2f}x")

# %% [markdown] slideshow={"slide_type": "skip"}
# On a CPU the time ratio comes out well below the byte ratio: a CPU's caches hide part
# of the extra traffic for arrays of a few MiB. On a TPU or GPU, where this chain is
# memory-bound in HBM, the roofline predicts that time follows bytes, so the two ratios
# should be close. That is a prediction, not a measurement: the course's accelerator
# results (`make bench`) time matmuls, not this pair. Run this cell on a TPU or GPU and
# compare the two ratios yourself.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 7, "agenda": "half-day"}
# ## 3. FLOPs and bytes: XLA against a hand count
#
# For the layer, count by hand. The matmul does $2 \cdot M \cdot D \cdot H$ FLOPs (each
# of the $M \cdot H$ outputs is a sum of $D$ products: a multiply and an add each); the
# bias add and the relu one FLOP per output element each. The bytes: read $x$, $W$, $b$
# once, write $y$ once, 4 bytes per fp32 element.

# %% slideshow={"slide_type": "subslide"}
hand_flops = 2 * M * D * H + 2 * M * H
hand_bytes = (M * D + D * H + H + M * H) * 4


def count_row(name, flops, nbytes):
    print(f"{name:<29} FLOPs {flops:>12,.0f}   bytes {nbytes:>10,.0f}   "
          f"intensity {flops / nbytes:6.1f}")


count_row("hand count", hand_flops, hand_bytes)
intermediate = M * H * 4  # the matmul's [M, H] fp32 result
count_row("hand, matmul result unfused", hand_flops, hand_bytes + 2 * intermediate)
if AOT:
    count_row("XLA, TPU v5e (compile-only)", tpu_report.flops,
              tpu_report.bytes_accessed)

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
# XLA's counts for this runtime's backend (they differ between CPU, GPU and TPU)
count_row(f"XLA, this runtime ({rt.platform})", report.flops, report.bytes_accessed)
print("kernels:", report.compute_ops)
for name, nbytes in (("hand count", hand_bytes),
                     ("unfused hand count", hand_bytes + 2 * intermediate)):
    if report.bytes_accessed == nbytes:
        print(f"XLA's bytes equal the {name}")

# %% [markdown] slideshow={"slide_type": "skip"}
# The FLOPs agree to within the elementwise work (compilers differ on how many FLOPs a
# `max` costs). The bytes need a second look.
#
# **The CPU: an intermediate that was not fused.** XLA's CPU backend counts 852,992
# bytes, not the 721,920 of the hand count. Its HLO (section 1) has two kernels: the
# matmul, then a loop fusion that adds the bias and applies the relu. Between them the
# matmul's `[64, 256]` fp32 result goes to memory: 65,536 bytes written and 65,536 read
# back, and 721,920 + 2 x 65,536 = 852,992 exactly, the second row above. The TPU
# compiler fuses the bias and relu into the matmul's output (section 1), so that
# intermediate never exists there. An unfused intermediate is the first thing to look
# for when XLA's bytes exceed a hand count.
#
# **The TPU: about four times the floor.** The compile-only TPU count is 2,823,680
# bytes. The memory analysis and the cost analysis's per-operand counts say where that
# is, and where it is not:

# %% slideshow={"slide_type": "skip"}
if AOT:
    print(f"memory analysis: arguments {tpu_report.argument_bytes:,} B "
          f"(x + W + b = {(M * D + D * H + H) * 4:,}),\n"
          f"output {tpu_report.output_bytes:,} B, "
          f"temporaries {tpu_report.temp_bytes:,} B")
    per_operand = {"x (operand 0)": "bytes accessed0{}",
                   "W (operand 1)": "bytes accessed1{}",
                   "b (operand 2)": "bytes accessed2{}",
                   "output": "bytes accessedout{}"}
    floors = {"x (operand 0)": M * D * 4, "W (operand 1)": D * H * 4,
              "b (operand 2)": H * 4, "output": M * H * 4}
    for what, key in per_operand.items():
        got = tpu_report.cost.get(key, 0.0)
        print(f"  cost analysis, {what:<14} {got:>11,.0f} B = "
              f"{got / floors[what]:5.2f} x its size")
else:
    print("skipped: needs the TPU extra (libtpu) to compile for a TPU")

# %% [markdown] slideshow={"slide_type": "skip"}
# The memory analysis rules out padding and layout: the arguments are exactly x, W and b
# (nothing is padded at these shapes), the output is 65,536 bytes, and there are no
# temporaries. The extra bytes are in the cost model's per-operand counts: W is charged
# once, but x about 5 times and the output about 25 times. That is the TPU cost model's
# estimate of how the fused MXU kernel re-reads activation tiles and rewrites output
# tiles as it streams, and the multipliers depend on tiling choices the HLO does not
# show. Why exactly 5 and 25 is **not explained here**. Keep both numbers in mind: the
# hand count is the *floor*, XLA's number is what this compiler expects.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "half-day"}
# ## 4. Arithmetic intensity and the roofline
#
# A chip can do at most $P$ FLOP/s and move at most $W$ bytes/s, so a kernel with
# intensity $I$ runs at most at $\min(P, I \cdot W)$: the *roofline*. Below the ridge
# point $I^* = P/W$ the memory roof binds. For a square $n \times n$ bf16 matmul,
# $I = 2n^3 / (3n^2 \cdot 2) = n/3$, which grows with $n$; for an elementwise op it is a
# small constant. On a TPU v5e:

# %% slideshow={"slide_type": "subslide"}
v5e = hardware.get("v5e")
print(f"v5e: P = {v5e.peak_bf16_flops_per_s / 1e12:.0f} TFLOP/s bf16, "
      f"W = {v5e.hbm_bytes_per_s / 1e9:.0f} GB/s, "
      f"ridge I* = {roofline.ridge_point(v5e):.0f} FLOP/byte")
points = []
for n in (128, 256, 512, 1024, 2048, 4096, 8192):
    e = roofline.estimate(roofline.matmul_flops(n, n, n),
                          roofline.matmul_bytes(n, n, n, 2), v5e)
    points.append(roofline.Point(f"matmul {n}", e.intensity, e.attainable_flops_per_s,
                                 measured=False))
    print(f"matmul {n:>5}: I = {e.intensity:7.1f}  {e.bound:>7}-bound  "
          f"at best {e.attainable_flops_per_s / 1e12:6.1f} TFLOP/s")
for label, ai in (("x + y (fp32)", roofline.elementwise_intensity(1, 2, 1, 4)),
                  ("gelu (fp32)", roofline.elementwise_intensity(8, 1, 1, 4))):
    points.append(roofline.Point(label, ai, roofline.attainable_flops_per_s(ai, v5e),
                                 measured=False))
    print(f"{label:>12}: I = {ai:7.3f}   memory-bound  at best "
          f"{roofline.attainable_flops_per_s(ai, v5e) / 1e12:6.3f} TFLOP/s")

# %% slideshow={"slide_type": "slide"}
# Roofline of a TPU v5e, log-log: FLOP/s vs FLOP per byte, matmuls and elementwise ops
import matplotlib.pyplot as plt

roofline.plot(v5e, points)
plt.show()

# %% [markdown] slideshow={"slide_type": "skip"}
# Hollow markers are predictions. On a TPU or GPU this notebook also measures the
# matmuls and places the measured points (filled) on the chip's own roof; on a CPU there
# is no chip roof in the table to compare against, and it says so.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
# This runtime's roofline, log-log, with the matmuls measured here as filled points
if rt.chip is None:
    print("This runtime has no roof in tpu_course.hardware "
          "(a CPU or an unknown chip):\n"
          "measured points would not be comparable, so none are drawn.")
else:
    measured = []
    for n in (512, 1024, 2048, 4096, 8192):
        a = jnp.ones((n, n), jnp.bfloat16)
        r = bench.benchmark(jax.jit(jnp.matmul), a, a, repeats=5, min_time=0.1,
                            warn=False, flops=roofline.matmul_flops(n, n, n))
        measured.append(roofline.Point(f"{n}", roofline.matmul_intensity(n, n, n),
                                       r.flops_per_s))
        print(f"matmul {n}: {r.flops_per_s / 1e12:.1f} TFLOP/s = "
              f"{r.fraction_of_peak:.0%} of one device's peak ({r.peak_name})")
    # a chip without bf16 (the T4) computes these matmuls in fp32: draw its fp32 roof
    roof = "bf16" if rt.chip.peak_bf16_flops_per_s is not None else "fp32"
    roofline.plot(rt.chip, measured, dtype=roof)
    plt.show()

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "half-day", "needs": "tpu"}
# ## 5. A correct benchmark, and three classic mistakes
#
# `bench.benchmark` compiles first and reports that time apart, warms up, waits for
# every output with `block_until_ready`, repeats until the numbers are stable, watches
# for recompilation, and warns when the spread is too large to trust. Here is what each
# rule saves us from, with numbers from this runtime.

# %% slideshow={"slide_type": "subslide"}
n = 1024 if ON_CPU else 4096
a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)


def step(a):
    return jnp.tanh(a @ a) @ a


# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
import time

good = bench.benchmark(jax.jit(step), a, repeats=5, min_time=0.2)
good

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
# Mistake 1: no warm-up. The first call traces and compiles before it runs (clearing
# JAX's caches makes this call as cold as the first one in a fresh process).
jax.clear_caches()
fresh = jax.jit(step)
start = time.perf_counter()
fresh(a).block_until_ready()
cold_s = time.perf_counter() - start

# Mistake 2: no block_until_ready. The call returns once the work is *queued*.
start = time.perf_counter()
out = fresh(a)
dispatch_s = time.perf_counter() - start
out.block_until_ready()

# Mistake 3: timing a recompile. A shape that changes every call compiles every call.
jitted = jax.jit(step)
start = time.perf_counter()
for k in range(5):
    jitted(a[: n - k, : n - k]).block_until_ready()
recompile_s = (time.perf_counter() - start) / 5

for what, t in (("correct (harness median)", good.median_s),
                ("1. no warm-up", cold_s),
                ("2. no block_until_ready", dispatch_s),
                ("3. recompiling each call", recompile_s)):
    print(f"{what:<26} {t * 1e3:10.3f} ms   {t / good.median_s:8.2f}x the correct time")

# %% [markdown] slideshow={"slide_type": "skip"}
# The harness catches the third mistake by itself: it counts JAX's compile events
# during the timed samples and reports them.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
sizes = iter(range(10**6))


def changing(a):
    m = n - next(sizes) % 7  # a different square shape on most calls
    return jitted(a[:m, :m])


r = bench.benchmark(changing, a, repeats=5, min_time=0.0, number=1, warn=False)
print("recompilations seen while timing:", r.recompilations)
print(textwrap.fill(r.warnings[0], 88))

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "two-days", "needs": "tpu"}
# ## 6. bf16 against fp32
#
# bf16 halves the bytes of every array, so a memory-bound op moves half the data, and
# the MXU multiplies bf16 natively. An fp32 matmul at the default precision is one bf16
# pass with fp32 accumulation too (chapter 3, section 10: the inputs are rounded to bf16),
# so in the MXU it costs what bf16 costs, while its operands move twice the bytes; only
# `HIGH` (3 passes) and `HIGHEST` (6) multiply the MXU's work. What the compiler sees, for
# a 1024-cubed matmul:

# %% slideshow={"slide_type": "subslide"}
if AOT:
    print("a 1024-cubed matmul compiled for a v5e (compile-only):")
for dt in (jnp.float32, jnp.bfloat16):
    s = jax.ShapeDtypeStruct((1024, 1024), dt)
    if AOT:
        r = hlo.inspect(jnp.matmul, s, s, target="v5e:1x1")
        print(f"{jnp.dtype(dt).name:>8}: FLOPs {r.flops:,.0f}, "
              f"arguments {r.argument_bytes:,} B, output {r.output_bytes:,} B")
    else:
        print("skipped: needs the TPU extra")

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
n = 1024 if ON_CPU else 8192
rates = {}
for dt in (jnp.float32, jnp.bfloat16):
    m = jnp.ones((n, n), dt)
    r = bench.benchmark(jax.jit(jnp.matmul), m, m, repeats=5, min_time=0.1, warn=False,
                        flops=roofline.matmul_flops(n, n, n))
    frac = ("" if r.fraction_of_peak is None else
            f" = {r.fraction_of_peak:.0%} of one device's peak ({r.peak_name})")
    print(f"{jnp.dtype(dt).name:>8} {n}^3 matmul on {rt.platform.upper()}: "
          f"{r.flops_per_s / 1e12:.3f} TFLOP/s{frac}")
    rates[jnp.dtype(dt).name] = r.flops_per_s
if ON_CPU:
    ratio = rates["bfloat16"] / rates["float32"]
    print(textwrap.fill(
        f"bf16 ran at {ratio:.2f}x the float32 rate on this CPU. A CPU timing, not a "
        "TPU one: whether bf16 is faster on a CPU depends on its own instructions "
        "(some have bf16 dot products, many convert to float32 first), not on an MXU.",
        88))

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "one-day"}
# ## 7. Shapes that pad badly
#
# Two kinds of padding cost a TPU. **In HBM**, arrays are stored in tiles of 8 x 128
# (the layout `T(8,128)` in the HLO): the last dimension pads to a multiple of 128 and
# the one before to 8. **In the MXU**, a matmul is cut into blocks of the array's size:
# 128 x 128 on v5e, 256 x 256 on v6e, and a dimension that is not a multiple pays for a
# whole extra block. The TPU compiler's memory analysis shows the first:

# %% slideshow={"slide_type": "subslide"}
if AOT:
    for shape, dt in (((100, 100), jnp.float32), ((128, 128), jnp.float32),
                      ((129, 128), jnp.float32), ((64, 384), jnp.float32),
                      ((100, 100), jnp.bfloat16)):
        r = hlo.inspect(lambda x: x + 1, jax.ShapeDtypeStruct(shape, dt),
                        target="v5e:1x1")
        logical = int(np.prod(shape)) * jnp.dtype(dt).itemsize
        layout = r.lines("parameter")[0].split(" = ")[1].split(" ")[0]
        print(f"layout {layout:<32} logical {logical:>7,} B  "
              f"in HBM {r.argument_bytes:>7,} B  ({r.argument_bytes / logical:.2f}x)")
else:
    print("skipped: needs the TPU extra")

# %% [markdown] slideshow={"slide_type": "skip"}
# The bf16 array keeps the same tile: in `T(8,128)(2,1)` the `(2,1)` says how two 16-bit
# values share one 32-bit word, so it too takes 1.33x its logical bytes.
#
# The MXU's padding follows from its width. A dimension $d$ mapped onto an array of
# width $w$ uses $\lceil d/w \rceil$ blocks, of which a fraction $d / (w\lceil d/w
# \rceil)$ does useful work. For a `[M, K] @ [K, N]` matmul the contracted $K$ and the
# output width $N$ both land on the array:

# %% slideshow={"slide_type": "skip"}
def mxu_fraction(k, n, width):
    pad = lambda d: -(-d // width) * width  # noqa: E731
    return (k * n) / (pad(k) * pad(n))


v6e = hardware.get("v6e")
print(f"{'K x N':>12} {'v5e (128)':>10} {'v6e (256)':>10}")
for k, n in ((128, 128), (384, 384), (1000, 1000), (130, 130), (4096, 4096)):
    print(f"{f'{k} x {n}':>12} {mxu_fraction(k, n, v5e.mxu_size):>10.0%} "
          f"{mxu_fraction(k, n, v6e.mxu_size):>10.0%}")

# %% [markdown] slideshow={"slide_type": "skip"}
# 384 is a perfect fit for v5e's 128-wide MXU and, in each dimension, fills only 1.5 of
# the 2 blocks of v6e's 256-wide one (56% of the work is useful). Where does this show
# in the compiled program? Compile the same 384-cubed matmul for both chips:

# %% slideshow={"slide_type": "skip"}
if AOT:
    s = jax.ShapeDtypeStruct((384, 384), jnp.bfloat16)
    for target in ("v5e:1x1", "v6e:1x1"):
        r = hlo.inspect(jnp.matmul, s, s, target=target)
        conv = [l for l in r.hlo.splitlines() if " convolution(" in l]
        print(f"{target}: FLOPs {r.flops:,.0f}; argument + output + temp bytes "
              f"{r.argument_bytes:,} + {r.output_bytes:,} + {r.temp_bytes:,}")
        print("   ", hlo.clean_line(conv[0]).split(", dim_labels")[0] if conv
              else "(no convolution line)")
else:
    print("skipped: needs the TPU extra")

# %% [markdown] slideshow={"slide_type": "skip"}
# The two programs are the same at the HLO level: the same FLOPs, the same `T(8,128)`
# HBM layouts, the same bytes. The MXU's block size is applied *below* HLO, when the
# backend turns the convolution into MXU instructions, so the HLO and the memory
# analysis show the HBM tiling (the 1.33x of `f32[100,100]` above) but not the MXU's
# padding: that one is the arithmetic of the table above, and it shows up in the
# measured time on the chip. Rule of thumb: keep the matmul dimensions multiples of
# 128 on v5e and earlier, of 256 on v6e.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 2, "agenda": "self-paced"}
# ## 8. Profiling a step
#
# Timing says *how long*; a profile says *where the time went*: which kernels ran, for
# how long, and what the host did in between. `jax.profiler.trace(folder)` records
# everything inside the `with` block into `folder`; `StepTraceAnnotation` marks each
# training step so the viewer can group them.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
import pathlib
import tempfile

logdir = pathlib.Path(tempfile.mkdtemp(prefix="ch04-profile-"))
f = jax.jit(step)
f(a).block_until_ready()  # compile outside the trace
# quiet_libtpu: some runtimes log profiler start-up lines that are not errors (below)
with runtime.quiet_libtpu(), jax.profiler.trace(str(logdir)):
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("step", step_num=i):
            f(a).block_until_ready()
for path in sorted(logdir.rglob("*.*")):
    print(path.relative_to(logdir), f"{path.stat().st_size:,} bytes")

# %% [markdown] slideshow={"slide_type": "skip"}
# To look at it, install the viewer and point it at the folder:
#
# ```
# pip install xprof
# xprof --logdir <folder>        # then open http://localhost:8791 and pick "trace_viewer"
# ```
#
# On some runtimes (Colab's jax 0.7.2 with libtpu) starting the profiler logs lines
# that are not errors, which `runtime.quiet_libtpu()` keeps out of the notebook: "Logging
# before InitGoogle" (libtpu's logging is not set up yet), "No factory for
# ACTIVITY_TRACING" (this build has no tracer of that kind; device and host traces are
# still recorded) and "Can't import tensorflow.python.profiler.trace" (jaxlib looks for
# TensorFlow's tracer; the Python trace is still recorded).
#
# (TensorBoard with `tensorboard-plugin-profile` reads the same folder.) The trace
# viewer shows one row per device stream and one for the host: on a TPU, each fusion
# from the HLO above appears as a kernel with its duration, and gaps between kernels
# are time the chip sat idle waiting for the host.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "self-paced"}
# ## 9. TPU generations beside GPUs, with the same arithmetic
#
# The roofline needs only two numbers per chip. Here they are for the TPUs and the
# NVIDIA GPUs in the course's table (bf16 dense peaks, HBM bandwidth; sources in
# `hardware.SOURCES`), with the time a 8192-cubed bf16 matmul and an fp32 `x + y` of
# $2^{28}$ elements (1 GiB per array) take at best:

# %% slideshow={"slide_type": "subslide"}
mm = roofline.estimate(roofline.matmul_flops(8192, 8192, 8192),
                       roofline.matmul_bytes(8192, 8192, 8192, 2), v5e)
print(f"{'chip':<22} {'TFLOP/s':>8} {'HBM GB/s':>9} {'ridge':>6} {'8192^3 ms':>10} "
      f"{'x+y ms':>7}")
for name in ("v4", "v5e", "v5p", "v6e", "7x", "a100", "h100", "h200"):
    chip = hardware.get(name)
    t_mm = roofline.estimate(mm.flops, mm.bytes_moved, chip).time_s
    t_add = roofline.estimate(2**28, 3 * 2**28 * 4, chip).time_s
    print(f"{chip.display_name:<22} {hardware.peak_flops_per_s(chip) / 1e12:>8,.0f} "
          f"{chip.hbm_bytes_per_s / 1e9:>9,.0f} {roofline.ridge_point(chip):>6,.0f} "
          f"{t_mm * 1e3:>10.2f} {t_add * 1e3:>7.2f}")

# %% [markdown] slideshow={"slide_type": "skip"}
# Read it by columns. The big matmul is compute-bound everywhere, so its time follows
# the peak. The `x + y` is memory-bound everywhere, so its time follows the bandwidth,
# and the chips rank differently. The ridge is the batch size (in tokens, for a bf16
# layer with large weights) below which a matmul cannot keep the chip busy: a few
# hundred on every modern chip, which is why small batches waste accelerators.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 2, "agenda": "half-day"}
# ## Takeaways
#
# * `jit` builds a jaxpr, then StableHLO, then an optimised HLO per backend:
#   `jax.jit(f).trace(*args)`, `.lower()`, `.compile()`, and the compiled program's
#   `as_text()`, `cost_analysis()` and `memory_analysis()` show them without running `f`.
#   With a compile-only topology (`jax.experimental.topologies`, and a libtpu that matches
#   jax) they show a real TPU program on any machine. `hlo.inspect` is the shortcut.
# * Fusion keeps intermediates out of HBM: the CPU's unfused matmul result costs 131,072
#   bytes that the TPU's fused kernel never moves. For memory-bound code the roofline
#   predicts that the bytes saved are the time saved.
# * $F$ and $B$ from XLA and from a hand count should agree; when they do not, the gap
#   (elementwise FLOPs, tiled traffic) is worth understanding.
# * The roofline, $\min(P, I \cdot W)$, says which resource binds; the ridge $P/W$ is a
#   few hundred FLOP/byte on current chips.
# * Time with warm-up, compile apart, `block_until_ready` on every output, no
#   recompiles, and enough repeats to know the spread: `bench.benchmark` does all five.
# * Shapes that are multiples of 128 (v5e) or 256 (v6e) fill the MXU; others pay for
#   padding, which the TPU compiler's layouts and memory analysis make visible.
