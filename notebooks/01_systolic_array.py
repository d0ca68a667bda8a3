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
# # Chapter 1: Why TPUs: the systolic array
#
# A TPU is a matrix unit first and a processor second. This chapter builds that matrix
# unit in software, a grid of multiply-accumulate cells that pass values to their
# neighbours, watches it multiply two matrices cycle by cycle, counts the cycles and
# checks them against a formula, and then asks what the grid costs when the matrices do
# not fit it. It ends with the chip around the matrix unit and with bf16, the number
# format it computes in.
#
# **Notation** (one meaning per symbol, in every chapter that uses it):
#
# | symbol | meaning |
# | --- | --- |
# | Y[M x N] = A[M x K] @ B[K x N] | the matmul: `Y` the product (never `C`), `K` the contracted dimension |
# | `R`, `C` | the array's rows and columns of cells (128 x 128 on TPU v2 to v5p, 256 x 256 on v6e) |
# | MAC | one multiply-accumulate `y += a * b` |
# | cycle | one clock period: every cell does at most one MAC, every register passes its value one cell on |
# | `F` | folds: tiles of the problem that fit the array, run one after another |
# | `T` | vectors streamed through the array per fold |

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

print(runtime.describe().banner())

# %% [markdown] slideshow={"slide_type": "skip"}
# Everything in this chapter except the banner is computed by the course's simulator and
# models on the CPU: cycle counts, not seconds. A cycle count is the same on every
# runtime, so the numbers below do not depend on what this notebook ran on.

# %% slideshow={"slide_type": "skip"}
import textwrap

import numpy as np
import matplotlib.pyplot as plt

from tpu_course import hardware, systolic, viz

np.set_printoptions(linewidth=110)

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "half-day"}
# ## 1. Why a matrix unit: where does each multiply-accumulate get its operands?
#
# A matmul of size n does n³ MACs. What limits a machine is rarely the multiplier; it is
# getting the two operands to it and the running sum back.
#
# * A **von Neumann CPU** (one ALU, as the textbook draws it) loads `a[i,k]` and `b[k,j]`
#   from memory, loads the running sum, multiplies, adds and stores the sum back: four
#   memory accesses for every MAC.
# * A **GPU** has thousands of ALUs, fed from on-chip shared memory (SMEM). A thread
#   block stages tiles of A and B in SMEM. A naive kernel (one thread per output) then
#   reads both operands of every MAC from SMEM: 2 accesses per MAC. A real one keeps a
#   `t x t` tile of outputs in registers (a warp's tile of tensor-core fragments, 64 x 64
#   in CUTLASS's examples): each value loaded from SMEM feeds a whole row or column of
#   that tile, so the count falls to about `2/t + 1/n`.
# * A **systolic array** reads an operand from its edge buffer once and then passes it
#   from cell to cell: a weight is read once and used by every row of A that streams
#   past; an activation entering at the left edge is used by all `C` cells of its row;
#   a partial sum moves down to the next cell instead of going back to memory.
#
# What is counted, for all three alike: accesses to the memory that feeds the
# multipliers (the CPU's memory, the GPU's SMEM, the array's edge buffers), not registers
# and not the traffic from HBM into that memory (chapter 4's roofline).
# `systolic.memory_accesses_per_mac` holds the model and its formulas; its systolic
# counts are the traffic the simulator itself counts as it moves the values, checked in
# the tests.

# %% slideshow={"slide_type": "subslide"}
print(f"{'n':>5}  {'CPU':>5}  {'GPU, no tile':>12}  {'GPU, 64x64 tile':>15}  "
      f"{'systolic 128x128':>16}  {'2/128 + 1/n':>11}")
for n in (128, 1024, 8192):
    def per(machine, **kw):
        return systolic.memory_accesses_per_mac(n, machine, **kw).per_mac

    print(f"{n:5d}  {per('cpu'):5.2f}  {per('gpu', tile=1):12.4f}  "
          f"{per('gpu', tile=64):15.4f}  {per('systolic'):16.4f}  "
          f"{2 / 128 + 1 / n:11.4f}")

# %% slideshow={"slide_type": "slide"}
# Memory accesses per multiply-add vs matrix size, log scale: CPU, GPU, systolic array
viz.plot_accesses_per_mac([2 ** p for p in range(6, 15)])
plt.show()

# %% [markdown] slideshow={"slide_type": "skip"}
# The systolic array's accesses per MAC are `2/128 + 1/n` once n is a multiple of 128
# (the last two columns agree): each activation is read once per column tile (1/128 per
# MAC), each partial sum written once per row tile (1/128), each weight read once (1/n).
# A register-tiled GPU kernel reaches `2/t + 1/n`: with a 64 x 64 tile, about twice the
# systolic count. The difference is where the reuse lives: a GPU kernel buys it with
# registers and the instructions that fill them, tile by tile, and the naive kernel
# without them pays 2 per MAC; the systolic array has it in its wires, as wide as the
# array, with no register file to read for each MAC. That reuse, not a faster
# multiplier, is the point of the design.
#
# > **Takeaway.** A systolic array turns a memory problem into a wiring problem: values
# > move one cell per cycle over short wires instead of travelling to and from memory.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 8, "agenda": "half-day"}
# ## 2. The simulator at work: a 4 x 4 weight-stationary array
#
# The TPU's matrix unit (MXU) is **weight-stationary**: the cells hold a tile of B (the
# weights), rows of A (the activations) stream in from the left, and partial sums flow
# down and leave at the bottom. Here it is in numpy, for one fold (K <= R, N <= C):
#
# * cycles count from 0; the weights load in `R` cycles (a row of B enters each cycle);
# * row `k` of the left edge buffer starts `k` cycles late (the *skew*): `a[i,k]` enters
#   at cycle `R + i + k` and moves one column right per cycle;
# * each cell adds `activation x weight` to the partial sum from the cell above and
#   passes it down: `y[i,j]` leaves column `j` at the end of cycle `R + i + (R - 1) + j`.

# %% slideshow={"slide_type": "subslide"}
def skew(A, R):
    """The left edge buffer: row k of the array gets column k of A, k cycles late."""
    M, K = A.shape
    feed = np.zeros((M + R - 1, R), A.dtype)
    for k in range(K):
        feed[k:k + M, k] = A[:, k]
    return feed


def ws_array(A, B, R, C):
    """A @ B on an R x C weight-stationary array.

    Returns (product, cycles, registers per cycle)."""
    M, K = A.shape
    tile = np.zeros((R, C), A.dtype)
    tile[:K, :B.shape[1]] = B
    w = np.zeros((R, C), A.dtype)
    for t in range(R):                                   # load: last row of B first
        w = np.vstack([tile[R - 1 - t], w[:-1]])
    feed, top = skew(A, R), np.zeros((1, C), A.dtype)
    act, psum = np.zeros((R, C), A.dtype), np.zeros((R, C), A.dtype)
    out, done, registers = np.zeros((M, C), A.dtype), np.zeros((M, C), bool), []
    s = 0                                                # cycles since the stream began
    while not done.all():
        x = feed[s] if s < len(feed) else 0 * feed[0]
        act = np.hstack([x[:, None], act[:, :-1]])       # one cell right
        psum = np.vstack([top, psum[:-1]]) + act * w     # one cell down, + MAC
        i, j = s - (R - 1) - np.arange(C), np.arange(C)  # row of Y leaving each column
        ok = (i >= 0) & (i < M)
        out[i[ok], j[ok]], done[i[ok], j[ok]] = psum[R - 1, ok], True
        registers.append((act, psum))
        s += 1
    return out[:, :B.shape[1]], R + s, registers


# %% slideshow={"slide_type": "subslide"}
A = np.array([[1, 2, 0, 1], [3, 1, 2, 0], [0, 1, 1, 2], [2, 0, 3, 1], [1, 1, 1, 1]])
B = np.array([[1, 0, 2, 1], [0, 1, 1, 0], [2, 1, 0, 1], [1, 2, 1, 0]])
R = C = 4
print("the left edge buffer, skew(A, 4): line s enters the array at cycle R + s")
print(skew(A, R))
mine, my_cycles, registers = ws_array(A, B, R, C)
for s in range(4):
    act, psum = registers[s]
    print(f"\ncycle {R + s}: activations (moving right) | partial sums (moving down)")
    for row_a, row_p in zip(act, psum):
        print("   ", row_a, "  |  ", row_p)

# %% [markdown] slideshow={"slide_type": "skip"}
# Row 0 of A enters as a diagonal: `a[0,0]` in cycle 4, `a[0,1]` one row down in cycle 5,
# when the partial sum from cell (0, 0) arrives there too: that is what the skew is for.
# The course's `systolic.simulate(..., trace=True)` moves the same registers (and more:
# many folds, a double-buffered load path). Same product, cycles and registers? (An
# empty register of the simulator holds 0 here.)

# %% slideshow={"slide_type": "subslide"}
run = systolic.simulate(A, B, rows=R, cols=C, trace=True)
print("numpy array == simulate:", bool((mine == run.result).all()), "; equal to A @ B:",
      bool((mine == A @ B).all()))
print("cycles: numpy", my_cycles, ", simulate", run.cycles)
frames = run.trace[R:]  # the stream starts after the R load cycles
same = len(frames) == len(registers) and all(
    np.array_equal(np.nan_to_num(fr.horizontal), act)
    and np.array_equal(np.nan_to_num(fr.vertical), psum)
    for (act, psum), fr in zip(registers, frames))
print(f"every activation and partial sum equal in all {len(registers)} "
      "streaming cycles:", same)

# %% [markdown] slideshow={"slide_type": "skip"}
# From here on the chapter uses the package, for many folds, big arrays, three
# dataflows and the counts of phases and traffic.

# %% slideshow={"slide_type": "subslide"}
print(run.summary())

# %% [markdown] slideshow={"slide_type": "skip"}
# Below are key cycles of that run (a static strip, which is what GitHub and CI show).
# Bold: the weight a cell holds (a hatched cell holds none yet; a bold 0
# is a real zero of B); blue: the activation passing right; orange: the partial sum
# passing down. Watch the weights load column by column (each column of the
# load path starts one cycle after its left neighbour), then the activations enter as a
# diagonal wavefront, and the last results drain out of the bottom-right corner.

# %% slideshow={"slide_type": "slide"}
# Key cycles of the 4x4 array: the values each cell holds as weights load and data flows
viz.frame_strip(run)
plt.show()

# %% [markdown] slideshow={"slide_type": "skip"}
# The same run as a steppable animation (play/pause and a cycle slider). It needs a live
# kernel with ipywidgets (JupyterLab, Colab); `viz.export_animation(run, "systolic.gif")`
# (or `.html`) writes it to a file for slides.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
# A player that steps the 4x4 array cycle by cycle: each cell's weight, input and sum
viz.animate(run)

# %% [markdown] slideshow={"slide_type": "slide"}
# ### Counting the cycles
#
# One fold streaming `T` rows of A (here `T = M = 5`): `R` cycles of weight load, then
# the last activation enters `T - 1` cycles after the first, needs `R - 1` more cycles to
# reach the bottom row's skew and `C - 1` hops to the last column, and its result leaves
# at the end of that cycle. Counting from 0:
#
# `cycles = R + (T - 1) + (R - 1) + (C - 1) + 1 = R + T + R + C - 2`

# %% slideshow={"slide_type": "subslide"}
T = A.shape[0]
print(f"closed form: R + T + R + C - 2 = {R} + {T} + {R} + {C} - 2 = "
      f"{R + T + R + C - 2}")
print("systolic.cycle_count:", systolic.cycle_count(5, 4, 4, 4, 4))
print("simulate measured:   ", run.cycles)
print(f"phases: preload {run.preload_cycles}, fill {run.fill_cycles}, steady "
      f"{run.steady_cycles}, drain {run.drain_cycles}")

# %% [markdown] slideshow={"slide_type": "skip"}
# The phases are measured from the run: *fill* lasts until the first result leaves the
# array, *steady* until the last activation enters it, *drain* until the last result
# leaves. Useful work needs every cell busy, and this problem is tiny next to the fixed
# costs of loading and filling: `utilization` = useful MACs / (cells x cycles) counts how
# many of the array's MAC slots did useful work.

# %% slideshow={"slide_type": "skip"}
print(f"useful MACs {run.useful_macs}, cells x cycles {16 * run.cycles}, "
      f"utilisation {run.utilization:.3f}")
print("useful MACs per cycle:", run.macs_per_cycle.tolist())

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "self-paced"}
# ## 3. Three dataflows
#
# What stays in the cells is a design choice. For Y[M x N] = A[M x K] @ B[K x N] on `R`
# rows and `C` columns of cells:
#
# | dataflow | stays in the cells | streams through | array rows hold | array columns hold | vectors per fold `T` | folds |
# | --- | --- | --- | :-: | :-: | :-: | --- |
# | `"ws"` weight-stationary (the MXU) | B, the weights | rows of A from the left; partial sums down | K | N | M | ceil(K/R) x ceil(N/C) |
# | `"is"` input-stationary | A, transposed | columns of B from the left; partial sums down | K | M | N | ceil(K/R) x ceil(M/C) |
# | `"os"` output-stationary | Y, the accumulators | A from the left and B from the top | M | N | K | ceil(M/R) x ceil(N/C) |
#
# Input-stationary is the weight-stationary machine with the operands' roles swapped
# (it computes Y transposed). Output-stationary loads nothing before it streams, but its
# finished results must shift out of the bottom edge (`R` more cycles after the last
# fold). Every fold of every dataflow streams `T` vectors through the skewed array, so the
# cycle count of section 2 holds with this table's `T`. Same product, different costs:

# %% slideshow={"slide_type": "subslide"}
A2 = np.random.default_rng(0).integers(-3, 4, (12, 10))
B2 = np.random.default_rng(1).integers(-3, 4, (10, 6))
print(f"Y[12x6] = A[12x10] @ B[10x6] on a 4x4 array")
for df in systolic.DATAFLOWS:
    r = systolic.simulate(A2, B2, 4, 4, dataflow=df)
    assert (r.result == A2 @ B2).all()
    print(f"  {df}: {r.folds} folds, {r.cycles:3d} cycles, utilisation "
          f"{r.utilization:.3f}, {r.operand_reads} values in, "
          f"{r.result_writes} results out")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "one-day"}
# ## 4. Two timing conventions: SCALE-Sim's and the MXU's
#
# [SCALE-Sim](https://github.com/scalesim-project/scale-sim-v3) is the published
# systolic-array simulator. Its conventions (ideal memory) are one of the two
# `timing=` settings, and the course's tests check that `cycles`, utilisation and the
# operand traffic equal SCALE-Sim 3.0.0's reports on a spread of shapes, array sizes and
# dataflows (`tests/data/scalesim_cases.json`). In SCALE-Sim a weight-stationary fold loads its
# weights, streams, and drains before the next fold loads, and partial sums of every
# K tile leave the array. (It also reports the number of the last cycle, counting from
# 0, which is one less than the number of cycles.)
#
# The MXU does better: the next fold's weights load while the current fold computes
# (double buffering), so folds stream back to back, and partial sums of the K tiles are
# added in accumulators instead of being written out.

# %% slideshow={"slide_type": "subslide"}
rng = np.random.default_rng(0)
A3 = rng.integers(-3, 4, (256, 384))
B3 = rng.integers(-3, 4, (384, 256))
for timing in ("scalesim", "tpu"):
    r = systolic.simulate(A3, B3, 128, 128, timing=timing)
    assert (r.result == A3 @ B3).all()
    print(f"{timing:8s}: {r.cycles:5d} cycles = preload {r.preload_cycles} + fill "
          f"{r.fill_cycles} + steady {r.steady_cycles} + drain {r.drain_cycles}"
          f"{' - 1' if r.count_offset else ''}")
    print(f"{'':8s}  utilisation {r.utilization:.3f}; "
          f"results written {r.result_writes:,}")

# %% slideshow={"slide_type": "skip"}
M3, K3, N3 = 256, 384, 256
F = systolic.fold_count(M3, K3, N3, 128, 128)
ss = systolic.cycle_count(M3, K3, N3, 128, 128, timing="scalesim")
tpu = systolic.cycle_count(M3, K3, N3, 128, 128, timing="tpu")
print(f"{F} folds. SCALE-Sim: F * (R + T + R + C - 2) - 1 = "
      f"{F} * {128 + 256 + 128 + 128 - 2} - 1 = {ss}")
print(f"MXU: R + (F - 1) * max(T, R) + T + R + C - 2 = "
      f"128 + {F - 1} * 256 + {256 + 128 + 128 - 2} = {tpu}")
print(f"saved: {ss + 1 - tpu} cycles ({1 - tpu / (ss + 1):.0%}): "
      f"each of the {F - 1} later folds hides\nits {128} load cycles and its "
      f"{128 + 128 - 2} fill/drain cycles")

# %% [markdown] slideshow={"slide_type": "skip"}
# > **Takeaway.** Per fold, SCALE-Sim pays `R` cycles of load and `R + C - 2` of fill and
# > drain; double buffering pays them once for the whole matmul. The longer the stream
# > (`T = M`, the batch of rows), the less the fixed costs matter.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 4, "agenda": "half-day"}
# ## 5. Real MXUs: 128 x 128 and 256 x 256, and the padding staircase
#
# A 100 x 100 matmul on a 128 x 128 MXU fills only 100 x 100 of its 16,384 cells: the
# rest hold padding. It is also far too short to amortise loading and filling. A
# 10,000 x 10,000 matmul needs thousands of folds, the last row and column of them
# partly padding, but its stream of 10,000 rows per fold hides everything else.

# %% slideshow={"slide_type": "subslide"}
ones = np.ones((100, 100), np.int64)
small = systolic.simulate(ones, ones, 128, 128)
print(f"100^3 on 128x128 (simulated): {small.cycles} cycles, utilisation "
      f"{small.utilization:.3f}, padding waste {small.padding_waste:.3f}")
for side in (128, 256):
    for n in (100, 1000, 10_000):
        folds = systolic.fold_count(n, n, n, side, side)
        util = systolic.utilization(n, n, n, side, side)
        print(f"{n:6d}^3 on {side}x{side}: {folds:5d} folds, "
              f"utilisation {util:.3f} (closed form)")

# %% [markdown] slideshow={"slide_type": "skip"}
# Utilisation against size shows the staircase: each time n passes a multiple of the
# array side, a new row and column of folds appears, mostly padding, and utilisation
# drops; it then climbs back as the new folds fill. The 256-wide array (v6e) has
# four times the cells, so it needs larger matrices to keep them busy.

# %% slideshow={"slide_type": "slide"}
# Utilisation vs matrix size n on 128x128 and 256x256 arrays: a staircase from padding
viz.plot_utilization_vs_size(list(range(32, 2049, 8)), arrays=(128, 256))
plt.show()

# %% [markdown] slideshow={"slide_type": "skip"}
# And the cycle count against size: the closed form as a line, the simulator as dots
# (on an 8 x 8 array so the simulations are quick). They agree at every size, as the
# property test in `tests/test_systolic.py` checks for random shapes, arrays and all
# three dataflows.

# %% slideshow={"slide_type": "slide"}
# Cycles vs matrix size on an 8x8 array: the closed form as a line, simulations as dots
viz.plot_cycles_vs_size(list(range(1, 65)), [4, 8, 9, 16, 17, 24, 32, 33, 48, 64],
                        rows=8, cols=8)
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "two-days"}
# ## 6. The chip around the MXU
#
# The MXU only multiplies matrices. Around it (per TensorCore):
#
# * the **VPU**, a vector unit for elementwise work (activations, normalisation,
#   the optimizer update), much slower in FLOP/s than the MXU;
# * **VMEM**, a software-managed on-chip memory that feeds the MXU and VPU; the compiler
#   (XLA) decides what goes in it and when;
# * **HBM**, the chip's high-bandwidth memory that holds weights and activations;
# * **ICI**, the inter-chip interconnect that links neighbouring chips into a torus;
# * the **host**, a CPU that feeds the chip input data over PCIe and runs Python.
#
# The course's hardware table (`tpu_course.hardware`, every number with its source):

# %% slideshow={"slide_type": "subslide"}
print(f"{'chip':18s} {'MXUs':>4s} {'MXU size':>8s} {'bf16 TFLOP/s':>12s} {'HBM':>7s} "
      f"{'HBM GB/s':>8s} {'VMEM MiB':>8s} {'devices':>7s}")
for name in hardware.names():
    chip = hardware.get(name)
    if chip.kind != "tpu":
        continue
    mxu = f"{chip.mxu_size}x{chip.mxu_size}"
    print(f"{chip.display_name:18s} {chip.mxu_count:4d} {mxu:>8s} "
          f"{hardware.peak_flops_per_s(chip) / 1e12:12,.0f} {chip.hbm_label:>7s} "
          f"{chip.hbm_bytes_per_s / 1e9:8,.0f} {chip.vmem_bytes / 2**20:8.0f} "
          f"{chip.devices_per_chip:7d}")
print("(devices: JAX devices per chip)")
for name in ("v5e",):
    note = f"note: {name} HBM: {hardware.get(name).alt_values['hbm_unit']}"
    print(textwrap.fill(note, 88, subsequent_indent="  "))

# %% [markdown] slideshow={"slide_type": "skip"}
# HBM is printed in the unit each source uses (GB = 10⁹ bytes, GiB = 2³⁰ bytes, about 7%
# more). "JAX devices" is how many devices one chip shows: on v2, v3 and 7x each
# TensorCore is its own device, so one device has half the chip's peak; on v4 and v5p
# the two cores act as one ("megacore").
#
# Peak FLOP/s comes from the table, never from MXU count x clock: for v6e and 7x the
# published MXU counts and the published peaks do not imply a plausible clock, so the
# simulator counts cycles and stops there.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 6, "agenda": "half-day"}
# ## 7. bf16: the number format of the MXU
#
# bfloat16 keeps float32's 8 exponent bits and cuts the significand from 23 bits to 7.
# float16 spends its 16 bits differently: 5 exponent bits, 10 significand bits.

# %% slideshow={"slide_type": "subslide"}
import ml_dtypes

FORMATS = (("float32", np.float32), ("float16", np.float16),
           ("bfloat16", ml_dtypes.bfloat16))
print(f"{'format':9s} {'sign':>4s} {'exponent':>8s} {'significand':>11s} "
      f"{'largest':>12s} {'gap above 1':>12s}")
for name, dt in FORMATS:
    fi = ml_dtypes.finfo(dt)
    print(f"{name:9s} {1:4d} {fi.nexp:8d} {fi.nmant:11d} {float(fi.max):12.4g} "
          f"{float(fi.eps):12.4g}")

# %% [markdown] slideshow={"slide_type": "skip"}
# The same number, π, in the three formats, bit by bit (sign | exponent | significand).
# bf16 is simply the top half of the float32 pattern, rounded.

# %% slideshow={"slide_type": "skip"}
def bits(value, dtype):
    x = np.array(value, np.float32).astype(dtype)
    width = x.dtype.itemsize * 8
    raw = format(int(x.view(np.uint32 if width == 32 else np.uint16)), f"0{width}b")
    exp = ml_dtypes.finfo(dtype).nexp
    return f"{raw[0]} | {raw[1:1 + exp]} | {raw[1 + exp:]}"


for name, dt in FORMATS:
    rounded = float(np.array(np.pi, np.float32).astype(dt))
    print(f"{name:9s} {bits(np.pi, dt):38s} = {rounded:.7f}")

# %% [markdown] slideshow={"slide_type": "skip"}
# **Range.** A value of 70,000 (a large activation or an un-normalised gradient sum)
# overflows float16 to infinity; bf16 keeps it, coarsely. **Precision.** bf16's gap above
# 1 is 2⁻⁷ ≈ 0.008: about 2 to 3 significant decimal digits.

# %% slideshow={"slide_type": "skip"}
x = np.array([70_000.0, 1 / 3, 3.14159265, 1e-8], np.float32)
with np.errstate(over="ignore"):
    print("float32 :", x)
    print("float16 :", x.astype(np.float16))
print("bfloat16:", x.astype(ml_dtypes.bfloat16))
back = x.astype(ml_dtypes.bfloat16).astype(np.float32)
print("relative error of bf16:", np.abs(back / x - 1).round(5))

# %% [markdown] slideshow={"slide_type": "skip"}
# **Accumulation.** A matmul adds up K products. With the running sum in bf16, once the
# sum is large each new small term falls below half a gap and is lost. The plainest case
# is a sum of ones:

# %% slideshow={"slide_type": "skip"}
ones = ml_dtypes.bfloat16(0)
for _ in range(1000):
    ones = ml_dtypes.bfloat16(np.float32(ones) + np.float32(1))
print("1000 ones summed in a bf16 accumulator:", float(ones))
print("gap between bf16 numbers at 256:", float(np.spacing(ml_dtypes.bfloat16(256))))

# %% [markdown] slideshow={"slide_type": "skip"}
# At 256 the gap is 2, so 256 + 1 lies halfway between 256 and 258 and rounds to the
# even one, 256: the sum stops there. With random terms the loss is gradual. With bf16
# inputs and a float32 accumulator, the MXU's choice, only the inputs are rounded.

# %% slideshow={"slide_type": "skip"}
rng = np.random.default_rng(0)
terms = rng.uniform(0, 1, 4096).astype(np.float32)
exact = np.cumsum(terms.astype(np.float64))
bf_in = terms.astype(ml_dtypes.bfloat16)
acc32 = np.cumsum(bf_in.astype(np.float32))          # bf16 inputs, fp32 accumulator
acc16 = np.zeros(len(terms), np.float32)             # bf16 inputs, bf16 accumulator
s = ml_dtypes.bfloat16(0)
for i, t in enumerate(bf_in):
    s = ml_dtypes.bfloat16(np.float32(s) + np.float32(t))
    acc16[i] = np.float32(s)
for n in (16, 256, 4096):
    print(f"sum of {n:4d} terms: exact {exact[n - 1]:8.3f}, fp32 accumulator "
          f"{acc32[n - 1]:8.3f}, bf16 accumulator {acc16[n - 1]:8.3f}")

# %% slideshow={"slide_type": "slide"}
# Relative error vs number of terms summed, fp32 vs bf16 accumulator, log-log
steps = np.arange(1, len(terms) + 1)
plt.figure(figsize=(7, 3.4))
plt.loglog(steps, np.abs(acc32 / exact - 1) + 1e-9,
           label="bf16 inputs, fp32 accumulator")
plt.loglog(steps, np.abs(acc16 / exact - 1) + 1e-9,
           label="bf16 inputs, bf16 accumulator")
plt.xlabel("number of terms summed")
plt.ylabel("relative error")
plt.legend()
plt.grid(alpha=0.3, which="both")
plt.title("Error growth over a long sum")
plt.show()

# %% [markdown] slideshow={"slide_type": "skip"}
# With a bf16 accumulator the error grows with the length of the sum until the sum stops
# moving at all; with a float32 accumulator it stays at the size of the input rounding.
# That is why the MXU takes bf16 inputs (half the bytes to move and store, and smaller
# multipliers: a multiplier's area grows roughly with the square of the significand
# width) and accumulates in fp32.
#
# > **Takeaway.** bf16 has float32's range and about 3 significant digits. Use it for
# > the inputs of a matmul, keep the sums in float32.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 2, "agenda": "self-paced"}
# ## 8. Where the real MXU differs from the toy
#
# * It takes bf16 (and on newer chips int8/fp8) inputs and accumulates in fp32; the
#   simulator computes in whatever dtype it is given (int64 for integers).
# * Its tiles are chosen and fed by the compiler: XLA pads shapes to multiples of the
#   MXU size, lays out operands in VMEM, and decides the loop order over folds. The
#   simulator's fold order (column tile outer, K tile inner) is one such choice.
# * Its weights are loaded through a dedicated path and double-buffered, as the
#   `timing="tpu"` convention idealises; memory stalls (HBM bandwidth) are not modelled
#   here: chapter 4 brings them in with the roofline, and measures what `jit` produces
#   on a real chip.
#
# **Try it.** Change `rows`/`cols` in section 2, or the dataflow in section 3, and
# predict the cycle count before you run the cell. The lab (`labs/01_systolic_array.ipynb`)
# turns this into exercises with checks, starting with one cycle of the array written by
# you.
