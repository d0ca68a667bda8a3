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

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 6, "agenda": "two-days"}
# # Chapter 7: Write a kernel for the MXU (Pallas)
#
# The six chapters so far let XLA decide everything: how a matmul is cut into tiles,
# what stays in on-chip memory, which ops are fused. Most TPU users stop there. The step
# after it is writing a kernel yourself, when XLA's is not enough. JAX's tool for that
# is **Pallas**: you write the body of one tile's work in `jax.numpy`, say how the
# arrays are cut into blocks, and Pallas's TPU compiler (Mosaic) turns it into one
# custom call in the program.
#
# This chapter runs anywhere. On a CPU (or a GPU) the kernels run in Pallas's **TPU
# interpreter**, which follows a TPU's rules step by step and gives the right numbers,
# not TPU speed. With the course's `aot` extra the real TPU compiler compiles the same
# kernels for a v5e or v6e this machine does not have, and grades your block choices:
# it rejects misaligned blocks and blocks too big for VMEM. On a TPU runtime the kernels
# run for real and are timed.
#
# **Versions.** The code here needs **jax 0.7.2 or newer** (Colab's in 2026 and the
# course's floor), where the names are `pl.pallas_call`, `pl.BlockSpec(block_shape,
# index_map)`, `pltpu.CompilerParams` and `pltpu.InterpretParams`; older jax (before
# 0.6) called the last two `TPUCompilerParams` and `TPUInterpretParams`.

# %% slideshow={"slide_type": "skip"}
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

# %% slideshow={"slide_type": "slide"}
from tpu_course import runtime

rt = runtime.describe()
print(rt.banner())

# %% slideshow={"slide_type": "skip"}
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_course import bench, hardware, hlo, kernels, roofline

INTERPRET = kernels.interpret_mode()  # False on a TPU, the TPU interpreter elsewhere
AOT = hlo.compile_only_available()  # can this machine compile for a TPU target?
print(kernels.where_kernels_run())
print("TPU compiler here:", "yes" if AOT else f"no: {hlo.tpu_compiler_problem()}")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 6, "agenda": "two-days"}
# ## 1. From the systolic array to a kernel
#
# Chapter 1's lab tiled a big matmul onto a fixed 128 x 128 array: fold the output into
# array-sized tiles, and for each tile stream the matching rows of $x$ and columns of
# $y$ through the array. A Pallas kernel is that tiling written down:
#
# * the **grid** is the loop over tiles: `grid=(M // bm, N // bn)` runs the kernel once
#   per output tile, with `pl.program_id(0)`, `pl.program_id(1)` saying which;
# * a **`BlockSpec(block_shape, index_map)`** says which block of an array one step sees:
#   `index_map(i, j)` returns the block's *block* coordinates (block row, block column),
#   not element offsets;
# * the kernel body gets **refs** to those blocks, already copied from HBM into **VMEM**
#   (the core's vector memory), reads them (`x_ref[...]`), computes with `jnp`, and
#   writes its output block; `jnp.dot` on two blocks goes to the **MXU**.
#
# Pallas runs the copies for you and **double-buffers** them: while the MXU works on
# step $s$'s blocks, the DMA engine fetches step $s+1$'s, so every block costs twice its
# size in VMEM. Two rules follow from the hardware:
#
# * **the (8, 128) tile.** A vector register holds 8 x 128 32-bit values (8 sublanes,
#   128 lanes), and VMEM is laid out in such tiles (chapter 4 saw the `T(8,128)` layout in
#   HBM). So a block's last two dimensions must be multiples of 8 and 128 (or the whole
#   array's dimensions);
# * **VMEM is small.** A few tens of MiB per core, against GBs of HBM:

# %% slideshow={"slide_type": "subslide"}
for name in ("v5e", "v6e"):
    chip = hardware.get(name)
    print(f"{chip.display_name}: VMEM {chip.vmem_bytes / 2**20:.0f} MiB per core, "
          f"MXU {chip.mxu_size} x {chip.mxu_size}, HBM {chip.hbm_bytes / 1e9:.0f} GB")

# %% [markdown] slideshow={"slide_type": "skip"}
# (From `tpu_course.hardware`, which cites its sources: JAX's own chip table and Google's
# documentation.) A matmul block as wide as the MXU (128 on a v5e, 256 on a v6e) keeps
# the array full; a narrower one wastes it, as chapter 1's utilisation plot showed.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 10, "agenda": "two-days"}
# ## 2. A first kernel: a matmul on a 2-D grid
#
# Each grid step $(i, j)$ computes one `bm x bn` output tile from a `bm x K` slab of $x$
# and a `K x bn` slab of $y$: the whole $K$ in one block. Read the three index maps:
# $x$'s block depends on $i$ only, $y$'s on $j$ only.

# %% slideshow={"slide_type": "subslide"}
def matmul_kernel(x_ref, y_ref, o_ref):
    # one output tile: (bm, K) @ (K, bn) on the MXU, accumulated in float32
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...],
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)


def matmul(x, y, bm=128, bn=128, interpret=False, vmem_limit_bytes=None):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),   # rows i of x, all of K
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],  # all of K, columns j of y
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=vmem_limit_bytes),
        interpret=interpret,
    )(x, y)


# %% [markdown] slideshow={"slide_type": "skip"}
# Run it on small float32 arrays (the interpreter walks the grid step by step, so CPU
# sizes stay small) and compare with `jnp.dot`:

# %% slideshow={"slide_type": "skip"}
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((256, 384)), jnp.float32)
y = jnp.asarray(rng.standard_normal((384, 256)), jnp.float32)
z = matmul(x, y, bm=128, bn=128, interpret=INTERPRET)
err = float(jnp.abs(z - jnp.dot(x, y, precision="highest")).max())
print(f"grid {(256 // 128, 256 // 128)}, result {z.shape}: matches jnp.dot: {err < 1e-2}")

# %% [markdown] slideshow={"slide_type": "skip"}
# Now compile it for a TPU v5e and a v6e (compile-only where there is no TPU: the real
# TPU compiler runs here). The whole kernel is one `custom-call` to `tpu_custom_call`
# in the optimised HLO: XLA treats it as a black box.

# %% slideshow={"slide_type": "subslide"}
S = jax.ShapeDtypeStruct
big = (S((1024, 1024), jnp.bfloat16), S((1024, 1024), jnp.bfloat16))
if AOT:
    for target in ("v5e:1x1", "v6e:1x1"):
        report = hlo.inspect(functools.partial(matmul, bm=256, bn=256), *big, target=target)
        print(f"{target}: top-level ops {report.compute_ops}")
        print("   ", report.lines("custom-call")[0][:110], "...")
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 8, "agenda": "two-days"}
# ## 3. The compiler grades your blocks
#
# Two block choices that the interpreter runs happily but a TPU cannot:
#
# * a block of 100 rows breaks the (8, 128) rule;
# * with the whole $K = 4096$ in one block, two 1024-wide bf16 slabs plus the output tile,
#   double-buffered, need $2 \times (1024 \cdot 4096 + 4096 \cdot 1024 + 1024 \cdot 1024)
#   \times 2$ bytes = 36 MiB.
#
# `kernels.compile_verdict` compiles a function for a TPU target and reports the
# compiler's verdict: *fits*, *misaligned* (Pallas's `ValueError`) or *too big* (the
# compiler's `RESOURCE_EXHAUSTED ... CompileTimeScopedVmemOom`, with the bytes asked for).

# %% slideshow={"slide_type": "subslide"}
if AOT:
    odd = (S((400, 1024), jnp.bfloat16), S((1024, 256), jnp.bfloat16))
    print("bm=100:", kernels.compile_verdict(functools.partial(matmul, bm=100, bn=128), *odd))
    wide = (S((4096, 4096), jnp.bfloat16), S((4096, 4096), jnp.bfloat16))
    blocks = functools.partial(matmul, bm=1024, bn=1024)
    print("whole K, 1024 blocks:", kernels.compile_verdict(blocks, *wide, target="v5e:1x1"))
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# 36 MiB is far less than a v5e's 128 MiB of VMEM, yet the compiler refuses: a kernel's
# buffers must fit the compiler's **scoped VMEM limit**, a default share of VMEM set
# aside for one kernel (the rest holds what XLA keeps there between ops). We measure
# that default from the compiler itself: compile a kernel far too big and read the limit
# from its refusal.

# %% slideshow={"slide_type": "skip"}
if AOT:
    for target in ("v5e:1x1", "v6e:1x1"):
        chip = hardware.get(target.split(":")[0])
        print(f"{target}: default scoped VMEM limit {kernels.scoped_vmem_limit(target) / 2**20:.0f}"
              f" MiB of {chip.vmem_bytes / 2**20:.0f} MiB VMEM")
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# One kernel can ask for more with `compiler_params=pltpu.CompilerParams(
# vmem_limit_bytes=...)` (our `matmul` passes it through). Raise it above what the
# kernel needs (and below the chip's VMEM) and the same blocks compile:

# %% slideshow={"slide_type": "subslide"}
if AOT:
    roomy = functools.partial(matmul, bm=1024, bn=1024, vmem_limit_bytes=64 * 2**20)
    print("whole K, 1024 blocks, 64 MiB limit:",
          kernels.compile_verdict(roomy, *wide, target="v5e:1x1"))
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# That the blocks fit does not make them a good idea: a kernel holding 36 MiB leaves
# XLA's other buffers less room, and the real fix for a long $K$ is to tile $K$ too,
# keeping a float32 accumulator in VMEM across the $K$ steps. That kernel is yours to
# write in the lab.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 8, "agenda": "two-days"}
# ## 4. Block size against the MXU and the roofline
#
# How big should `bm` and `bn` be? Count HBM traffic. On the 2-D grid, each of the
# $N/b_n$ columns of tiles reads all of $x$ again, and each of the $M/b_m$ rows reads all
# of $y$ again:
#
# $$B = \left(MK \cdot \frac{N}{b_n} + KN \cdot \frac{M}{b_m} + MN\right) \times
# \text{itemsize}, \qquad F = 2MKN.$$
#
# Bigger tiles re-read less. Set the intensity $F/B$ against each chip's ridge point:

# %% slideshow={"slide_type": "subslide"}
def kernel_hbm_bytes(m, k, n, bm, bn, itemsize):
    """HBM bytes of the 2-D-grid matmul: x re-read per column of tiles, y per row."""
    return (m * k * (n // bn) + k * n * (m // bm) + m * n) * itemsize


m = k = n = 4096
for name in ("v5e", "v6e"):
    chip = hardware.get(name)
    ridge = roofline.ridge_point(chip)
    for b in (128, 256, 512, 1024):
        ai = roofline.matmul_flops(m, k, n) / kernel_hbm_bytes(m, k, n, b, b, 2)
        verdict = "compute-bound" if ai >= ridge else "memory-bound"
        print(f"{chip.display_name:>18} tiles {b:>4}: {ai:6.1f} FLOP/byte vs ridge "
              f"{ridge:6.1f}: {verdict}")

# %% [markdown] slideshow={"slide_type": "skip"}
# Intensity grows with the tile: $F/B pprox 2/(1/b_n + 1/b_m)$ FLOP per element moved
# when $K$ is large. 128-wide tiles leave a v5e far short of its ridge; 512-wide tiles
# just reach it. A v6e's ridge is more than twice as high, so even 1024-wide tiles leave
# it memory-bound at this size, and its 256-wide MXU needs tiles of at least 256 to be
# full anyway. Big tiles cost VMEM, which section 3 showed is the constraint. XLA's cost
# analysis cannot check this model: for a custom call it knows the operands' sizes, not
# how often the kernel re-reads them. See for yourself on the 1024-cube matmul of
# section 2 with 256-wide tiles:

# %% slideshow={"slide_type": "skip"}
if AOT:
    report = hlo.inspect(functools.partial(matmul, bm=256, bn=256), *big, target="v5e:1x1")
    per_operand = {k: v for k, v in sorted(report.cost.items()) if k.startswith("bytes accessed")}
    print("XLA's cost analysis, per operand:", {k: f"{v / 2**20:.0f} MiB" for k, v in per_operand.items()})
    print(f"total {sum(per_operand.values()) / 2**20:.0f} MiB; FLOPs reported: {report.flops}")
    print(f"the traffic model: {kernel_hbm_bytes(1024, 1024, 1024, 256, 256, 2) / 2**20:.0f} MiB")
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# The compiler counts each operand once (2 MiB each) and no FLOPs at all: the kernel is
# opaque to it. The model's 18 MiB (x and y each read 4 times) is what a real chip's
# time can check (section 6).

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 10, "agenda": "two-days"}
# ## 5. A fused kernel: a row-wise softmax
#
# A kernel earns its keep when it does in one pass what XLA does in several. A softmax
# over rows needs each row's maximum, then the exponentials and their sum, then a
# division: XLA compiles it for a v5e as more than one fusion, and each fusion reads
# the input from HBM again. A Pallas kernel holds a block of whole rows in VMEM and does
# all of it there: one read, one write.

# %% slideshow={"slide_type": "subslide"}
def softmax_kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    e = jnp.exp(x - x.max(axis=-1, keepdims=True))
    o_ref[...] = (e / e.sum(axis=-1, keepdims=True)).astype(o_ref.dtype)


def softmax(x, block_rows=64, interpret=False):
    rows, cols = x.shape
    return pl.pallas_call(
        softmax_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, cols), lambda i: (i, 0))],  # whole rows
        out_specs=pl.BlockSpec((block_rows, cols), lambda i: (i, 0)),
    interpret=interpret)(x)


def xla_softmax(x):
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


a = jnp.asarray(rng.standard_normal((256, 512)), jnp.float32)
err = float(jnp.abs(softmax(a, interpret=INTERPRET) - xla_softmax(a)).max())
print(f"matches jax.nn.softmax: {err < 1e-5}")

# %% slideshow={"slide_type": "subslide"}
if AOT:
    arg = S((4096, 1024), jnp.bfloat16)
    xla_r = hlo.inspect(xla_softmax, arg, target="v5e:1x1")
    ours = hlo.inspect(functools.partial(softmax, block_rows=256), arg, target="v5e:1x1")
    print(f"XLA's softmax on v5e: {len(xla_r.fusions)} fusions, top-level ops {xla_r.compute_ops}")
    for f in xla_r.fusions:
        print("   ", f)
    print(f"the Pallas softmax: top-level ops {ours.compute_ops}")
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# When is a kernel worth writing? When the fusion you want is one XLA does not make
# (here: a reduction followed by work that needs its result, over the same rows), the
# operation is memory-bound so the saved HBM passes are the time, and the blocks fit
# VMEM. The opposite case: a matmul followed by a bias and an activation is already one
# fusion on a v5e (chapter 4's HLO showed it), and a hand-written kernel would at best
# tie it. Measure before and after on a real chip.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "self-paced"}
# ## 6. On a GPU, and on a real TPU
#
# **GPU.** Pallas has GPU backends too, with the same `pallas_call`, grid and
# `BlockSpec` ideas. **Mosaic GPU** needs Hopper or newer (H100, H200; it uses their TMA
# copies and warpgroup matmuls); the older **Triton** backend goes down to Ampere (A100),
# is kept on a best-effort basis, and is deprecated from jax 0.11 on (JAX's Pallas
# quickstart and changelog, docs.jax.dev/en/latest/pallas). So a Colab **T4** (Turing,
# older than Ampere, and without bf16 arithmetic) runs no Pallas GPU kernel at all. What
# differs on a GPU: the grid's steps run in parallel on the SMs (no sequential steps whose
# scratch carries over, so a K loop lives inside the kernel), shared memory per SM is far
# smaller than a TPU core's VMEM (`hardware.get("h100").vmem_bytes` is 256 KiB), and block
# shapes follow the GPU's rules, not (8, 128). This chapter's kernels are TPU kernels:
# on a GPU runtime they run in the TPU interpreter, like on a CPU.
#
# **TPU.** On a TPU runtime the kernels above ran for real. Here we time the 2-D-grid
# matmul against `jnp.dot` with the harness, as a fraction of the chip's peak:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
if rt.platform == "tpu":
    shape = 4096
    xb = jax.random.normal(jax.random.key(0), (shape, shape), jnp.bfloat16)
    flops = roofline.matmul_flops(shape, shape, shape)
    for label, fn in (("jnp.dot", jax.jit(jnp.dot)),
                      ("Pallas 512 tiles", jax.jit(functools.partial(
                          matmul, bm=512, bn=512, vmem_limit_bytes=64 * 2**20)))):
        r = bench.benchmark(fn, xb, xb, flops=flops, warn=False)
        print(f"{label:>17}: {r.median_s * 1e3:.3f} ms, {r.fraction_of_peak:.0%} of peak "
              f"({r.peak_name}, {rt.device_kind})")
else:
    print(f"Not timed: this is a {rt.platform.upper()} runtime, where the kernels run in the "
          "TPU interpreter; its time says nothing about a TPU.")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 2, "agenda": "two-days"}
# ## Summary
#
# * A Pallas kernel is chapter 1's tiling written down: a grid of steps, a `BlockSpec`
#   per array whose index map picks each step's block, and a body that works on blocks
#   in VMEM; `jnp.dot` in it runs on the MXU.
# * Blocks obey the (8, 128) tile and the compiler's scoped VMEM limit (measured above),
#   counted double-buffered; `pltpu.CompilerParams(vmem_limit_bytes=...)` raises it.
# * Block size sets HBM re-reads, so intensity: your own traffic model places a block
#   choice on the roofline; XLA's cost analysis cannot.
# * A kernel is worth writing for a fusion XLA will not make; the TPU interpreter checks
#   its numbers anywhere, the TPU compiler its HLO, a real chip its time.
#
# The lab: tile $K$ with an accumulator, predict which blocks compile, and fuse
# softmax($QK^T$) for a block of queries.
