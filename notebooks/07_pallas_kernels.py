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
# index_map)`, `pltpu.CompilerParams` and `pltpu.InterpretParams`. Those two public names first
# shipped in jax 0.6.2 (JAX's changelog lists the rename under 0.7.0); 0.6.0 and 0.6.1
# export `TPUCompilerParams`, and `TPUInterpretParams` was never public in a release.

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

# %% slideshow={"slide_type": "slide"}
from tpu_course import runtime

rt = runtime.describe()
print(rt.banner())

# %% slideshow={"slide_type": "skip"}
import dataclasses
import functools
import math
import os
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_course import bench, hardware, hlo, pallas_tools, roofline

INTERPRET = pallas_tools.interpret_mode()  # False on a TPU, else the TPU interpreter
AOT = hlo.compile_only_available()  # can this machine compile for a TPU target?
print(textwrap.fill(pallas_tools.where_kernels_run(), 88))
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
# * **VMEM is small.** 16 MiB per core on v2-v4, 64 MiB on v5p and 7x, 128 MiB on v5e and
#   v6e (JAX's `tpu_info.py`, the course's `hardware` table), against tens of GB of HBM:

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
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),   # rows i of x, all K
                  pl.BlockSpec((k, bn), lambda i, j: (0, j))],  # all K, columns j of y
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
print(f"grid {(256 // 128, 256 // 128)}, result {z.shape}: "
      f"matches jnp.dot: {err < 1e-2}")

# %% [markdown] slideshow={"slide_type": "skip"}
# Now compile it for a TPU v5e and a v6e (compile-only where there is no TPU: the real
# TPU compiler runs here). The whole kernel is one `custom-call` to `tpu_custom_call`
# in the optimised HLO: XLA treats it as a black box.

# %% slideshow={"slide_type": "subslide"}
S = jax.ShapeDtypeStruct
big = (S((1024, 1024), jnp.bfloat16), S((1024, 1024), jnp.bfloat16))
if AOT:
    for target in ("v5e:1x1", "v6e:1x1"):
        report = hlo.inspect(functools.partial(matmul, bm=256, bn=256), *big,
                             target=target)
        print(f"{target}: top-level ops {report.compute_ops}")
        print("   ", report.lines("custom-call")[0][:80], "...")
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
# `pallas_tools.compile_verdict` compiles a function for a TPU target and reports the
# compiler's verdict: *fits*, *misaligned* (Pallas's `ValueError`) or *too big* (the
# compiler's `RESOURCE_EXHAUSTED ... CompileTimeScopedVmemOom`, with the bytes asked for).

# %% slideshow={"slide_type": "subslide"}
if AOT:
    odd = (S((400, 1024), jnp.bfloat16), S((1024, 256), jnp.bfloat16))
    narrow = functools.partial(matmul, bm=100, bn=128)
    print("bm=100:", pallas_tools.compile_verdict(narrow, *odd))
    wide = (S((4096, 4096), jnp.bfloat16), S((4096, 4096), jnp.bfloat16))
    blocks = functools.partial(matmul, bm=1024, bn=1024)
    print("whole K, 1024 blocks:\n ",
          pallas_tools.compile_verdict(blocks, *wide, target="v5e:1x1"))
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# **How a compile-only TPU target is made.** `compile_verdict` is a few lines around JAX's
# own API, which you can call yourself: `jax.experimental.topologies.get_topology_desc`
# describes a TPU slice (`"v5e:2x2"`: four v5e chips) whose `devices` are compile-only
# devices; put a `sharding` on one of them in each placeholder, and `jit`'s usual
# `trace(...).lower().compile()` runs the real TPU compiler (Mosaic included) on this
# machine. A block choice the compiler refuses is an exception from `compile()`. This needs
# `libtpu` (the course's `aot` extra) of the build this jax pins: a mismatched one crashes
# the whole process (a segmentation fault, not an exception) when it compiles for a
# topology. Colab's TPU runtime ships jax 0.7.2 with libtpu 0.0.21.1, which does, so the
# cell asks the course's guard `hlo.tpu_compiler_problem()` first (None: safe here).

# %% slideshow={"slide_type": "subslide"}
# None, or why compiling for a TPU target is unsafe here
problem = hlo.tpu_compiler_problem()
if problem is None:
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    if rt.platform != "tpu":
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # no chips to lock
    with runtime.quiet_libtpu():  # drops libtpu's "no TPU metadata" start-up warnings
        v5e_slice = topologies.get_topology_desc("v5e:2x2", "tpu")
    chip0 = SingleDeviceSharding(v5e_slice.devices[0])
    placed = [S(a.shape, a.dtype, sharding=chip0) for a in wide]
    big_blocks = jax.jit(functools.partial(matmul, bm=1024, bn=1024))
    lowered = big_blocks.trace(*placed).lower()
    try:
        lowered.compile()
        print("compiled for", v5e_slice.devices[0].device_kind)
    except Exception as err:  # noqa: BLE001 - JaxRuntimeError: RESOURCE_EXHAUSTED
        # the compiler's words, not the HLO
        first = str(err).splitlines()[0].split(" = ")[0]
        print(f"compile() for {v5e_slice.devices[0].device_kind} raised "
              f"{type(err).__name__}:\n    {first[:84]}")
else:
    print("skipped:", problem)

# %% [markdown] slideshow={"slide_type": "skip"}
# 36 MiB is far less than a v5e's 128 MiB of VMEM, yet the compiler refuses: a kernel's
# buffers must fit the compiler's **scoped VMEM limit**, a default share of VMEM that one
# kernel may use (libtpu's flag `--xla_tpu_scoped_vmem_limit_kib` sets it for a whole
# program). We measure that default from the compiler itself: compile a copy kernel too
# big for it and read the limit from its refusal (`pallas_tools.scoped_vmem_limit` grows
# the kernel until the compiler refuses it, since how many buffers the compiler counts
# differs between libtpu builds).

# %% slideshow={"slide_type": "skip"}
if AOT:
    for target in ("v5e:1x1", "v6e:1x1"):
        chip = hardware.get(target.split(":")[0])
        scoped = pallas_tools.scoped_vmem_limit(target)
        print(f"{target}: default scoped VMEM limit {scoped / 2**20:.0f}"
              f" MiB of {chip.vmem_bytes / 2**20:.0f} MiB VMEM")
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# One kernel can ask for more with `compiler_params=pltpu.CompilerParams(
# vmem_limit_bytes=...)` (our `matmul` passes it through). Raise it above what the
# kernel needs (and below the chip's VMEM) and the same blocks compile. JAX documents
# the parameter together with the flag: "this must be used in conjunction with the
# --xla_tpu_scoped_vmem_limit_kib=N flag with N*1kib > vmem_limit_bytes" (the docstring
# of `pltpu.CompilerParams`, jax 0.7.2 to 0.12). Here the compiler accepts 64 MiB without
# the flag, so the compile-only check needs none; on a real chip, if a kernel with a
# raised limit is refused, set the flag as well (`LIBTPU_INIT_ARGS=
# "--xla_tpu_scoped_vmem_limit_kib=..."` before jax starts).

# %% slideshow={"slide_type": "subslide"}
if AOT:
    roomy = functools.partial(matmul, bm=1024, bn=1024, vmem_limit_bytes=64 * 2**20)
    print("whole K, 1024 blocks, 64 MiB limit:",
          pallas_tools.compile_verdict(roomy, *wide, target="v5e:1x1"))
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# That the blocks fit does not make them a good idea: 36 MiB of VMEM for one kernel's
# blocks grows with $K$, and the real fix for a long $K$ is to tile $K$ too.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 10, "agenda": "two-days"}
# ## 4. Tile K too: an accumulator in VMEM
#
# Cut $K$ into blocks of `bk` and make it a third grid axis, **last**: step $(i, j, k)$
# reads x's block $(i, k)$ and y's block $(k, j)$, both small whatever $K$ is. The output
# block $(i, j)$ is now a sum over $K / b_k$ steps, so it needs somewhere to live between
# them: a **scratch** buffer, `pltpu.VMEM((bm, bn), jnp.float32)` in `scratch_shapes`,
# which the kernel gets as one more ref after the output's. Three rules make it right:
#
# * the grid runs **in order** on a TPU core, and scratch **persists** from step to step:
#   all of one output block's K steps run back to back, because K is the innermost axis;
# * so the accumulator is **zeroed at the first K step** (`pl.when(pl.program_id(2) ==
#   0)`), gets each step's product **added** (`+=`), and is **written out at the last**
#   (`pl.num_programs(2) - 1`), cast once;
# * it is **float32** even for bf16 inputs: the MXU sums in float32, and a bf16 sum over
#   many K steps would round at every step.
#
# `dimension_semantics` says which axes carry a dependence: section 5.

# %% slideshow={"slide_type": "subslide"}
# Same code as tpu_course.pallas_tools.ktiled_kernel
def ktiled_kernel(x_ref, y_ref, o_ref, acc_ref):
    """One grid step (i, j, k): add x's block (i, k) times y's block (k, j) into a
    float32 accumulator that stays in VMEM across the K steps; zero it at the first K
    step, write the output block (i, j) at the last."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    @pl.when(pl.program_id(2) == 0)  # a new output block starts: clear the accumulator
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # the MXU multiplies bf16 blocks and sums in float32: keep the float32 sums
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)  # all of K is in: write once
    def _write():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

# %% slideshow={"slide_type": "-"}
# Same code as tpu_course.pallas_tools.matmul_ktiled
def matmul_ktiled(x, y, bm=512, bk=512, bn=512, interpret=False, vmem_limit_bytes=None,
                  dimension_semantics=("parallel", "parallel", "arbitrary")):
    """``x @ y`` on a 3-D grid (M / bm, N / bn, K / bk), K innermost: each step reads a
    (bm, bk) block of x and a (bk, bn) block of y, whatever K is.
    ``dimension_semantics`` tells the compiler which grid axes are independent
    ("parallel": M and N blocks) and which carry a dependence from step to step
    ("arbitrary": K, through the accumulator)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        ktiled_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],  # the accumulator, float32
        compiler_params=pltpu.CompilerParams(dimension_semantics=dimension_semantics,
                                             vmem_limit_bytes=vmem_limit_bytes),
        interpret=interpret,
    )(x, y)

# %% [markdown] slideshow={"slide_type": "skip"}
# One grid step, drawn from the kernel's own `BlockSpec`s: the block of each operand that
# step $(i, j, k)$ works on, and what VMEM holds meanwhile. Pallas keeps **two** buffers
# per block (while the kernel computes on one, the next block's copy lands in the other:
# the pipeline of section 1), and the accumulator once, for the whole grid.

# %% slideshow={"slide_type": "subslide"}
# The K-tiled matmul at grid step (1, 2, 1): its block of each array, and VMEM's buffers
fig = pallas_tools.plot_blocks(functools.partial(matmul_ktiled, bm=256, bk=128, bn=256),
                               jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16),
                               jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16),
                               step=(1, 2, 1))

# %% [markdown] slideshow={"slide_type": "skip"}
# The same numbers as `jnp.dot` in the interpreter, over four K steps and four output
# blocks (the interpreter fills fresh VMEM with NaN, so a forgotten zeroing would show):

# %% slideshow={"slide_type": "skip"}
xk = jnp.asarray(rng.standard_normal((16, 512)), jnp.float32)
yk = jnp.asarray(rng.standard_normal((512, 256)), jnp.float32)
zk = matmul_ktiled(xk, yk, bm=8, bk=128, bn=128, interpret=INTERPRET)
err = float(jnp.abs(zk - jnp.dot(xk, yk, precision="highest")).max())
print(f"grid {(16 // 8, 256 // 128, 512 // 128)}: matches jnp.dot: {err < 1e-3}")

# %% [markdown] slideshow={"slide_type": "skip"}
# And section 3's problem, $K = 4096$ with 1024-wide output blocks, which needed 36 MiB
# with all of $K$ in one block: with $K$ in blocks of 512 it fits the default limit.

# %% slideshow={"slide_type": "subslide"}
if AOT:
    tiled = functools.partial(matmul_ktiled, bm=1024, bk=512, bn=1024)
    print("K in 512-blocks, 1024 output blocks:",
          pallas_tools.compile_verdict(tiled, *wide, target="v5e:1x1"))
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 6, "agenda": "two-days"}
# ## 5. `dimension_semantics`: which axes may run in any order
#
# `pltpu.CompilerParams(dimension_semantics=...)` gives each grid axis a promise:
# **`"parallel"`**: the steps along this axis are independent, so they may run in any
# order or on different cores; **`"arbitrary"`**: no promise, so they run in order on one
# core. In the K-tiled matmul the M and N blocks are independent and K is not (each step
# adds to what the previous one left in the accumulator), hence `("parallel", "parallel",
# "arbitrary")`. The parallel axes must come first.
#
# Who uses the promise? A **megacore** chip: two TensorCores behind one JAX device, on
# TPU v4 and v5p. There Mosaic splits the grid's parallel axes between the two cores, and
# each core runs its share in order, with its own VMEM, so its own scratch (JAX's Pallas
# TPU pipelining guide, docs.jax.dev/en/latest/pallas/tpu/pipelining.html; "for recent TPU
# chips (v4, v5p), every JAX device may contain 2 TensorCores (aka. a Megacore)", its
# core_map guide). A v5e or a v6e has one TensorCore per chip, so nothing is split there:

# %% slideshow={"slide_type": "skip"}
for name in ("v5e", "v6e", "v5p"):
    chip = hardware.get(name)
    megacore = chip.tensorcores_per_chip > chip.devices_per_chip
    kind = "megacore" if megacore else "one core each"
    print(f"{chip.display_name:>18}: {chip.tensorcores_per_chip} TensorCore(s) per "
          f"chip, {chip.devices_per_chip} JAX device(s) per chip: {kind}")

# %% [markdown] slideshow={"slide_type": "skip"}
# So what does marking K `"parallel"` do? Measure it in the interpreter, which keeps the
# promise literally: it runs each parallel axis in a shuffled order (a permutation from
# `random_seed`), and with `num_cores` simulated cores it hands each core a contiguous
# share of the parallel steps, with its own scratch (its source:
# `jax/_src/pallas/mosaic/interpret`). The field that sets the core count was renamed
# after jax 0.7, hence the small helper.

# %% slideshow={"slide_type": "subslide"}
def interpreter(cores=1, seed=None):
    """Pallas's TPU interpreter with ``cores`` simulated TensorCores per device."""
    names = {f.name for f in dataclasses.fields(pltpu.InterpretParams)}
    field = ("num_cores_or_threads" if "num_cores_or_threads" in names
             else "num_cores_per_device")
    return pltpu.InterpretParams(random_seed=seed, **{field: cores})


want = np.asarray(xk, np.float64) @ np.asarray(yk, np.float64)
for k_axis in ("arbitrary", "parallel"):
    semantics = ("parallel", "parallel", k_axis)
    for cores, seed in ((1, 0), (1, 1), (2, 0)):
        got = np.asarray(matmul_ktiled(xk, yk, bm=8, bk=128, bn=128,
                                       interpret=interpreter(cores, seed),
                                       dimension_semantics=semantics), np.float64)
        blocks = [(got[i:i + 8, j:j + 128], want[i:i + 8, j:j + 128])
                  for i in (0, 8) for j in (0, 128)]
        nan = sum(bool(np.isnan(g).any()) for g, _ in blocks)
        wrong = sum(not np.allclose(g, w, atol=1e-3) for g, w in blocks)
        print(f"K {semantics[2]:>9}, {cores} core(s), seed {seed}: {wrong} of 4 output "
              f"blocks wrong ({nan} NaN)")

# %% [markdown] slideshow={"slide_type": "skip"}
# With K `"arbitrary"`, every order and core count gives the right product. With K
# `"parallel"`, every output block is wrong: the K steps ran shuffled, so the step that
# zeroes the accumulator ($k = 0$) no longer comes first and the one that writes the
# output ($k$ last) no longer comes last. A block holds some of its own products plus
# what the previous block left in the accumulator, or NaN where the first steps read
# fresh memory; the wrong blocks change with the seed. On a real megacore chip K marked
# parallel could be split between the two cores, and each core would add half of K's
# steps into its own accumulator: a wrong answer with no error. On a v5e or v6e, with one
# core, the grid would still run in order and the answer would be right by luck: the
# interpreter's shuffle is there to catch that before a v5p does.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 8, "agenda": "two-days"}
# ## 6. Block size against the MXU and the roofline
#
# How big should `bm` and `bn` be? Count HBM traffic, with one rule of the Pallas
# pipeline: when the next grid step uses the **same block** of an input, its copy from
# HBM is skipped (JAX's Pallas TPU docs, "Pipelining": "the HBM transfer for the second
# iteration is skipped"). So what matters is how often each input's block *changes* as
# the grid runs, last axis fastest:
#
# * **2-D grid** $(i, j)$, K whole (section 2's `matmul`): x's block $(i, 0)$ stays the
#   same while $j$ runs, so x is read **once**; y's block $(0, j)$ changes every step, so
#   all of y is read again for each of the $M/b_m$ rows of tiles.
# * **3-D grid** $(i, j, k)$, K tiled (section 4's `matmul_ktiled`): both blocks change
#   at every step, so x is read again for each of the $N/b_n$ columns of tiles, and y for
#   each of the $M/b_m$ rows.
#
# $$B_{2D} = \left(MK + KN \cdot \frac{M}{b_m} + MN\right) s, \qquad
# B_{3D} = \left(MK \cdot \frac{N}{b_n} + KN \cdot \frac{M}{b_m} + MN\right) s, \qquad
# F = 2MKN,$$
#
# with $s$ the itemsize. Bigger tiles re-read less. Set the intensity $F/B$ against each
# chip's ridge point:

# %% slideshow={"slide_type": "subslide"}
def kernel_hbm_bytes(m, k, n, bm, bn, itemsize, k_tiled=False):
    """HBM bytes of a tiled matmul. Pallas skips a copy when the next grid step uses
    the same block: on the 2-D grid x's block stays while j runs (x read once) and y is
    read once per row of tiles; on the 3-D K-tiled grid x is read once per column of
    tiles as well."""
    x_reads = n // bn if k_tiled else 1
    return (m * k * x_reads + k * n * (m // bm) + m * n) * itemsize


m = k = n = 4096
print("FLOP/byte at square tiles of 128, 256, 512 and 1024:")
for grid, k_tiled in (("2-D", False), ("3-D", True)):
    for name in ("v5e", "v6e"):
        chip = hardware.get(name)
        ridge = roofline.ridge_point(chip)
        line = []
        for b in (128, 256, 512, 1024):
            nbytes = kernel_hbm_bytes(m, k, n, b, b, 2, k_tiled)
            ai = roofline.matmul_flops(m, k, n) / nbytes
            line.append(f"{ai:5.1f}{'*' if ai >= ridge else ' '}")
        print(f"{grid} grid, {chip.display_name:>18} (ridge {ridge:5.1f}): "
              + ", ".join(line))
print("(* = compute-bound: at or above the chip's ridge point)")

# %% [markdown] slideshow={"slide_type": "skip"}
# The model is a claim about the pipeline; the kernel can answer for itself.
# `pallas_tools.block_copies` walks a kernel's grid in the order the TPU runs it and
# evaluates its own index maps at every step, counting a copy whenever an operand's block
# index changes (no kernel runs, so it works here). Both grids, 4096-cubed bf16, 256-wide
# tiles, against the model:

# %% slideshow={"slide_type": "skip"}
big_args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((k, n), jnp.bfloat16))
two_d = functools.partial(matmul, bm=256, bn=256)
three_d = functools.partial(matmul_ktiled, bm=256, bk=256, bn=256)
for grid, fn, k_tiled in (("2-D", two_d, False), ("3-D", three_d, True)):
    schedule = pallas_tools.block_copies(fn, *big_args)
    print(f"{grid} grid: "
          + "; ".join(f"{r.operand} copied {r.copies:,}x" for r in schedule))
    print(f"   {sum(r.bytes for r in schedule) / 2**20:,.0f} MiB moved; the model says "
          f"{kernel_hbm_bytes(m, k, n, 256, 256, 2, k_tiled) / 2**20:,.0f} MiB")

# %% [markdown] slideshow={"slide_type": "skip"}
# On the 2-D grid the intensity is about $2 b_m$ FLOP per element moved when K and N are
# large: $b_n$ does not change the traffic at all, since x is read once whatever the
# column width. On the 3-D grid it is about $2/(1/b_n + 1/b_m)$, so both widths count,
# and the same tiles move more bytes. The table shows where each chip crosses its ridge
# on each grid; a v6e's ridge is more than twice a v5e's, so it needs bigger tiles, and
# its 256-wide MXU needs tiles of at least 256 to be full anyway. Big tiles cost VMEM,
# which section 3 showed is the constraint (and why the 3-D grid exists). XLA's cost
# analysis cannot check this model: for a custom call it knows the operands' sizes, not
# how often the kernel re-reads them. See for yourself on the 1024-cube matmul of
# section 2 with 256-wide tiles:

# %% slideshow={"slide_type": "skip"}
if AOT:
    report = hlo.inspect(functools.partial(matmul, bm=256, bn=256), *big,
                         target="v5e:1x1")
    per_operand = {k: v for k, v in sorted(report.cost.items())
                   if k.startswith("bytes accessed")}
    print("XLA's cost analysis, per operand:")
    for key, v in per_operand.items():
        print(f"  {key}: {v / 2**20:.0f} MiB")
    print(f"total {sum(per_operand.values()) / 2**20:.0f} MiB; "
          f"FLOPs reported: {report.flops}")
    print("the traffic model (2-D grid): "
          f"{kernel_hbm_bytes(1024, 1024, 1024, 256, 256, 2) / 2**20:.0f} MiB")
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# The compiler counts each operand once and no FLOPs at all: the kernel is opaque to it.
# The model's count (x once, y once per row of tiles, the output once) is what a real
# chip's time can check (section 10).

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 10, "agenda": "two-days"}
# ## 7. A fused kernel: a row-wise softmax
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
    ours = hlo.inspect(functools.partial(softmax, block_rows=256), arg,
                       target="v5e:1x1")
    print(f"XLA's softmax on v5e: {len(xla_r.fusions)} fusions, "
          f"top-level ops {xla_r.compute_ops}")
    for f in xla_r.fusions:
        print(" ", f)
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

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 10, "agenda": "self-paced"}
# ## 8. Attention over blocks of keys: the online softmax
#
# Attention is `softmax(q @ k.T / sqrt(d)) @ v` for `q` of shape `[Lq, d]` and `k`, `v`
# of shape `[Lk, d]`. Section 7's kernel, extended to it, would hold a block of queries
# against **all** `Lk` keys: all of `k` and `v` in VMEM, and a whole `[bq, Lk]` row of
# float32 scores. That grows with the sequence. The way out is the one section 4 took for
# the matmul: walk the keys in blocks of `bk` on an `"arbitrary"` grid axis and carry
# what is needed in scratch. A softmax seems to need the whole row (its max, its sum)
# before anything can be written, but it can be **rescaled as it goes** (the online
# softmax of flash attention). Per query row, keep the max so far $m$, the sum so far
# $\ell$ of $e^{s - m}$, and the unnormalised output so far $a$; for each new block of
# scores $s$:
#
# $$m' = \max(m, \max_j s_j), \quad
# \ell' = e^{m - m'} \ell + \sum_j e^{s_j - m'}, \quad
# a' = e^{m - m'} a + e^{s - m'} v_{\text{block}},$$
#
# and at the last block, output $a / \ell$. The factor $e^{m - m'}$ rescales what was
# summed against the old max to the new one; nothing overflows, since every exponent is
# at most 0.

# %% slideshow={"slide_type": "subslide"}
def flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
    kv = pl.program_id(1)  # which block of keys

    @pl.when(kv == 0)  # a new block of queries: empty running max, sum and output
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    q = q_ref[...]
    s = jax.lax.dot_general(q, k_ref[...], (((1,), (1,)), ((), ())),  # q @ k_block.T
                            preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
    rescale = jnp.exp(m_prev - m_new)  # what was summed against the old max
    p = jnp.exp(s - m_new)
    l_ref[...] = rescale * l_ref[...] + p.sum(axis=-1, keepdims=True)
    acc_ref[...] = rescale * acc_ref[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                                                    preferred_element_type=jnp.float32)
    m_ref[...] = m_new

    @pl.when(kv == pl.num_programs(1) - 1)  # all keys seen: normalise once
    def _out():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def flash_attention(q, k, v, bq=128, bk=128, interpret=False):
    lq, d = q.shape
    lk = k.shape[0]
    return pl.pallas_call(
        flash_kernel,
        out_shape=jax.ShapeDtypeStruct((lq, d), q.dtype),
        grid=(lq // bq, lk // bk),  # query blocks (parallel), then key blocks, in order
        in_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
                  pl.BlockSpec((bk, d), lambda i, j: (j, 0)),
                  pl.BlockSpec((bk, d), lambda i, j: (j, 0))],
        out_specs=pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
        scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32),   # m: running max per row
                        pltpu.VMEM((bq, 1), jnp.float32),   # l: running sum per row
                        pltpu.VMEM((bq, d), jnp.float32)],  # a: running output
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(q, k, v)


def naive_attention(q, k, v):
    s = q.astype(jnp.float32) @ k.astype(jnp.float32).T / math.sqrt(q.shape[-1])
    return (jax.nn.softmax(s, axis=-1) @ v.astype(jnp.float32)).astype(q.dtype)


qa, ka, va = (jnp.asarray(rng.standard_normal(shape), jnp.float32)
              for shape in ((64, 128), (512, 128), (512, 128)))
out = flash_attention(qa, ka, va, bq=32, bk=128, interpret=INTERPRET)
err = float(jnp.abs(out - naive_attention(qa, ka, va)).max())
print(f"grid {(64 // 32, 512 // 128)}: matches the naive softmax(q k^T / sqrt(d)) v: "
      f"{err < 1e-4}")

# %% [markdown] slideshow={"slide_type": "skip"}
# What each version keeps in VMEM, from its block shapes ($s$ bytes per element, bf16
# here, $d = 128$, 256 queries per block, 512 keys per block). The whole-row version:
# the q and output blocks double-buffered, `k` and `v` whole (one buffer each: their block
# never changes from step to step, and the compiler below asks for one), and a float32
# score row. The online version: q, k, v and output blocks double-buffered, and its
# scratch: the float32 accumulator and `m` and `\ell`, each `(bq, 1)` float32 padded to
# a 128-lane tile in VMEM. One grows with $L_k$; the other does not:

# %% slideshow={"slide_type": "subslide"}
def whole_row_vmem(bq, lk, d, itemsize):
    return 2 * 2 * bq * d * itemsize + 2 * lk * d * itemsize + 4 * bq * lk


def online_vmem(bq, bk, d, itemsize):
    return 2 * (2 * bq * d + 2 * bk * d) * itemsize + 4 * bq * d + 2 * 4 * bq * 128


v5e = hardware.get("v5e")
limit = pallas_tools.scoped_vmem_limit("v5e:1x1") if AOT else None
print(f"against a v5e core's {v5e.vmem_bytes / 2**20:.0f} MiB of VMEM"
      + (f" and the compiler's default {limit / 2**20:.0f} MiB scoped limit"
         if limit else ""))
for lk in (1024, 4096, 16384, 65536, 262144):
    whole, online = whole_row_vmem(256, lk, 128, 2), online_vmem(256, 512, 128, 2)
    over = ("over all of VMEM" if whole > v5e.vmem_bytes else
            "over the scoped limit" if limit and whole > limit else
            "under the scoped limit" if limit else "under VMEM")
    print(f"Lk {lk:>6}: whole row {whole / 2**20:8.2f} MiB ({over}); online "
          f"{online / 2**20:.2f} MiB")

# %% [markdown] slideshow={"slide_type": "skip"}
# The compiler agrees (compile-only for a v5e, 1024 queries): the whole-row kernel at
# 16384 keys is refused, with its count beside the model's, while the online kernel
# compiles at 16 times as many keys.

# %% slideshow={"slide_type": "skip"}
def whole_row_attention(q, k, v, bq=256):
    lq, d = q.shape
    lk = k.shape[0]

    def kernel(q_ref, k_ref, v_ref, o_ref):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) / math.sqrt(d)
        e = jnp.exp(s - s.max(axis=-1, keepdims=True))
        p = (e / e.sum(axis=-1, keepdims=True)).astype(v_ref.dtype)
        out = jnp.dot(p, v_ref[...], preferred_element_type=jnp.float32)
        o_ref[...] = out.astype(o_ref.dtype)

    whole = pl.BlockSpec((lk, d), lambda i: (0, 0))  # all keys, at every step
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((lq, d), q.dtype), grid=(lq // bq,),
        in_specs=[pl.BlockSpec((bq, d), lambda i: (i, 0)), whole, whole],
        out_specs=pl.BlockSpec((bq, d), lambda i: (i, 0)))(q, k, v)


if AOT:
    def qkv(lk):
        kv = S((lk, 128), jnp.bfloat16)
        return S((1024, 128), jnp.bfloat16), kv, kv

    model_mib = whole_row_vmem(256, 16384, 128, 2) / 2**20
    print(f"whole row, Lk 16384 (model {model_mib:.2f} MiB):\n ",
          pallas_tools.compile_verdict(whole_row_attention, *qkv(16384)))
    print("online, Lk 262144:\n ", pallas_tools.compile_verdict(
        functools.partial(flash_attention, bq=256, bk=512), *qkv(262144)))
else:
    print("skipped (no TPU compiler here):", hlo.tpu_compiler_problem())

# %% [markdown] slideshow={"slide_type": "skip"}
# The online kernel's VMEM is set by `bq`, `bk` and `d` alone; the keys' length only adds
# grid steps. This is the core of flash attention; the production kernels
# (`jax.experimental.pallas.ops.tpu.flash_attention`) add batches and heads as grid axes,
# causal masking that skips whole blocks, and the backward pass.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "self-paced"}
# ## 9. A kernel in training: `jax.custom_vjp`
#
# A model trains with `jax.grad`, and a `pallas_call` is opaque to it. Try it on section
# 7's softmax kernel:

# %% slideshow={"slide_type": "skip"}
xs = jnp.asarray(rng.standard_normal((128, 256)), jnp.float32)
ts = jnp.asarray(rng.standard_normal((128, 256)), jnp.float32)
try:
    jax.grad(lambda a: (softmax(a, interpret=INTERPRET) * ts).sum())(xs)
    print("jax.grad went through the kernel")
except Exception as err:  # noqa: BLE001 - whatever jax says, show it
    print(f"jax.grad through the kernel raised {type(err).__name__}:\n "
          f"{str(err).splitlines()[0][:86]}")

# %% [markdown] slideshow={"slide_type": "skip"}
# So give it the derivative yourself. `jax.custom_vjp` pairs a forward function (here the
# kernel, which also returns what the backward pass needs: the softmax's output $y$) with
# a backward one that maps the output's cotangent $g$ to the input's. For a softmax over
# rows, $\partial L / \partial x = y \odot (g - \sum_j g_j y_j)$ per row: plain JAX,
# which XLA fuses (a kernel for it is the next step, not needed for correctness).

# %% slideshow={"slide_type": "subslide"}
@jax.custom_vjp
def softmax_trainable(x):
    return softmax(x, interpret=INTERPRET)


def softmax_fwd(x):
    y = softmax(x, interpret=INTERPRET)
    return y, y  # the output, and what the backward pass keeps: y itself


def softmax_bwd(y, g):
    return (y * (g - (g * y).sum(axis=-1, keepdims=True)),)  # one cotangent per input


softmax_trainable.defvjp(softmax_fwd, softmax_bwd)

mine = jax.grad(lambda a: (softmax_trainable(a) * ts).sum())(xs)
xla = jax.grad(lambda a: (xla_softmax(a) * ts).sum())(xs)
print("gradient matches jax.grad of jax.nn.softmax:",
      float(jnp.abs(mine - xla).max()) < 1e-5)

# %% [markdown] slideshow={"slide_type": "skip"}
# `softmax_trainable` now goes anywhere a JAX function goes in a train step: under `jit`,
# inside `jax.value_and_grad`, in an Optax update. The same pattern wraps the online
# softmax of section 8, whose backward pass is itself a kernel in production
# implementations (it recomputes the scores block by block rather than storing them).

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "self-paced"}
# ## 10. On a GPU, and on a real TPU
#
# **GPU.** Pallas has GPU backends too, with the same `pallas_call`, grid and
# `BlockSpec` ideas. **Mosaic GPU** was written for Hopper (H100, H200: their TMA copies
# and warpgroup matmuls), and jax 0.11.0 added Ampere to it (`plgpu.mma`, `cp.async`;
# JAX's changelog); the older **Triton** backend goes down to Ampere (A100),
# is kept on a best-effort basis, and is deprecated from jax 0.11 on (JAX's Pallas
# quickstart and changelog, docs.jax.dev/en/latest/pallas). So a Colab **T4** (Turing,
# older than Ampere, and without bf16 arithmetic) runs no Pallas GPU kernel at all. What
# differs on a GPU: the grid's steps run in parallel on the SMs (no sequential steps whose
# scratch carries over, so a K loop lives inside the kernel), shared memory per SM is far
# smaller than a TPU core's VMEM (`hardware.get("h100").vmem_bytes`: 228 KiB, carved from
# a 256 KiB pool shared with the L1 cache; A100 164 of 192, T4 64 of 96; NVIDIA's CUDA
# tuning guides for Hopper, Ampere and Turing), and block
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
        print(f"{label:>17}: {r.median_s * 1e3:.3f} ms, {r.fraction_of_peak:.0%} of "
              f"peak ({r.peak_name}, {rt.device_kind})")
else:
    print(f"Not timed: this is a {rt.platform.upper()} runtime, where the kernels run "
          "in the TPU interpreter;\nits time says nothing about a TPU.")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 2, "agenda": "two-days"}
# ## Summary
#
# * A Pallas kernel is chapter 1's tiling written down: a grid of steps, a `BlockSpec`
#   per array whose index map picks each step's block, and a body that works on blocks
#   in VMEM; `jnp.dot` in it runs on the MXU.
# * Blocks obey the (8, 128) tile and the compiler's scoped VMEM limit (measured above),
#   counted double-buffered; `pltpu.CompilerParams(vmem_limit_bytes=...)` raises it.
# * A long $K$ becomes a grid axis, last and `"arbitrary"`, with a float32 accumulator in
#   VMEM scratch: zeroed at the first K step, written at the last.
# * `dimension_semantics` promises which axes are independent; a megacore chip (v4, v5p)
#   splits the `"parallel"` ones between its two cores, so an axis that carries a sum
#   must be `"arbitrary"` (the interpreter shuffles parallel axes to catch it).
# * Block size sets HBM re-reads, so intensity: your own traffic model places a block
#   choice on the roofline; XLA's cost analysis cannot.
# * A kernel is worth writing for a fusion XLA will not make; the TPU interpreter checks
#   its numbers anywhere, the TPU compiler its HLO (through JAX's topology API, once the
#   guard says libtpu matches jax), a real chip its time.
# * The online softmax walks the keys in blocks, so attention's VMEM stops growing with
#   the sequence; `jax.custom_vjp` gives a kernel the gradient `jax.grad` cannot derive.
#
# The lab: fuse a dense layer's bias and ReLU into the K-tiled kernel, predict its VMEM
# and which blocks compile, fuse softmax($QK^T$) for a block of queries, and race XLA's
# own fused layer on a real chip.
