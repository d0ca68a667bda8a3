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

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 8, "agenda": "half-day"}
# # Chapter 6: Scaling out: meshes, collectives, the cost model, many hosts
#
# One program, many chips. This chapter lays arrays out over a *mesh* of devices, lets
# XLA insert the communication that data parallelism, FSDP and tensor parallelism need,
# finds every collective in the compiled program, and checks its bytes against a cost
# model written in the scaling book's notation (`tpu_course.comms`). Then it writes a
# collective by hand, compares torus and switch topologies, crosses slices over the
# data-centre network, runs a pipeline, runs as two processes, proves the sharded runs
# equal the single-device run, and prices the result. Where this runs on a CPU, the 8
# devices are simulated: every timing printed is a CPU timing, never a TPU timing.
#
# **Three tiers, one notebook.** Each output says which tier produced it:
#
# | tier | what | where |
# | --- | --- | --- |
# | **sim** | 8 simulated CPU devices | everywhere (forced onto the CPU platform) |
# | **real** | the chips of this runtime | only when it has several |
# | **aot** | compile-only TPU topologies (`v5e:2x4` = a Kaggle v5e-8) | where `libtpu` matching this jax is installed |
#
# **Notation** (the scaling book's; one meaning per symbol in this chapter):
#
# | symbol | meaning |
# | --- | --- |
# | $V$ | bytes in a collective (its operand, per device) |
# | $X$, $Y$ | mesh axes; $\lvert X \rvert$ is the number of devices on axis $X$ |
# | $W_{ici}$ | the *bidirectional* ICI bandwidth of one axis, bytes/s per chip |
# | $W_{dcn}$ | the data-center network's bandwidth per chip, bytes/s |
# | $C$ | peak FLOP/s per chip |
# | $B$ | tokens in the batch (per step; "per slice" where said) |
# | $D$, $F$ | d_model and d_ff of the MLP block |

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

runtime.simulate_devices(8)  # before anything starts JAX: the sim tier's 8 CPU devices
rt = runtime.describe()
print(rt.banner())

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from tpu_course import comms, costs, hardware, hlo, multihost, parallel, plans

STRATEGIES = parallel.STRATEGIES
real_chips = rt.device_count if rt.platform != "cpu" else 0
HAVE_TPU_COMPILER = hlo.tpu_compiler_available()
print(f"jax {jax.__version__}; sim tier: {len(jax.devices('cpu'))} CPU devices")
if real_chips > 1:
    print(f"real tier: {real_chips} {rt.device_kind} chips")
else:
    print("real tier: not available (fewer than 2 chips)")
if HAVE_TPU_COMPILER:
    print("aot tier: the TPU compiler is available")
else:
    print(f"aot tier: unavailable: {hlo.tpu_compiler_problem()}")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "half-day"}
# ## 1. Meshes, `NamedSharding`, `PartitionSpec`
#
# A **mesh** names the axes of a grid of devices: `jax.make_mesh((2, 4), ("x", "y"))`.
# A `PartitionSpec` says, per array dimension, which mesh axis splits it (`None`: not
# split, so every device along that axis holds a copy). `NamedSharding(mesh, spec)` joins
# the two, and `jax.device_put` lays the array out. `jax.debug.visualize_array_sharding`
# draws which device holds each block.
#
# **Axis types, on purpose.** With `AxisType.Auto` axes, `jax.jit` with shardings lets
# XLA's partitioner choose the collectives: what this chapter reads in the HLO. With
# `AxisType.Explicit` the sharding becomes part of each array's type and JAX decides at
# trace time. `jax.make_mesh`'s default changed between the versions the course supports
# (jax 0.7.2: `Auto`; jax 0.8 and later: `Explicit`), so this chapter always passes
# `axis_types`. Both kinds exist from the course's floor, jax 0.7.2, onward.

# %% slideshow={"slide_type": "slide"}
# Which of 8 devices holds each block of an 8x8 array, under three PartitionSpecs
cpus = jax.devices("cpu")[:8]  # the sim tier: the simulated CPU devices, even by a TPU
mesh2d = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2,
                       devices=cpus)
a = jnp.arange(64.0).reshape(8, 8)
for spec in (P("x", "y"), P("x", None), P()):
    placed = jax.device_put(a, NamedSharding(mesh2d, spec))
    print(f"[sim] {spec}: each device holds {placed.addressable_shards[0].data.shape}")
    jax.debug.visualize_array_sharding(placed)

# %% [markdown] slideshow={"slide_type": "skip"}
# `P('x', 'y')` cuts the 8x8 array into a 2x4 grid of 4x2 blocks, one per device.
# `P('x', None)` cuts only the rows, so the 4 devices along `y` hold copies of the same
# half; `P()` replicates everything. With an **explicit** axis the sharding shows in the
# array's type (`16@data`: 16 rows split over `data`), and a jitted matmul's result
# carries its own:

# %% slideshow={"slide_type": "skip"}
emesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,), devices=cpus)
xe = jax.device_put(jnp.ones((16, 4)), NamedSharding(emesh, P("data")))
product = jax.jit(jnp.matmul)(xe, jnp.ones((4, 4)))
print("[sim] input:", jax.typeof(xe), "  x @ w:", jax.typeof(product))

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 17, "agenda": "half-day"}
# ## 2. Sharding by annotations: the collectives XLA inserts
#
# The model of this section is a transformer's feed-forward block, `relu(x @ w1) @ w2`
# with `w1: [D, F]`, `w2: [F, D]`, trained one SGD step on a squared error. The step is
# the single-device one; the strategies differ only in the `PartitionSpec`s handed to
# `jax.jit` (`in_shardings`, `out_shardings`). FSDP adds one annotation inside the loss:
# each weight is constrained to be whole where it is used, which is FSDP's "gather it
# before use". This code is the package's (`tpu_course.parallel`), shown here because the
# lab and the tests reuse it:

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.parallel.mlp_block, tpu_course.parallel.block_loss
def mlp_block(w1: jax.Array, w2: jax.Array, x: jax.Array,
              precision: Any = jax.lax.Precision.HIGHEST) -> jax.Array:
    """``relu(x @ w1) @ w2``: the feed-forward block of a transformer layer.

    The matmuls ask for ``Precision.HIGHEST`` (true fp32) so that every strategy's
    result equals the single-device one. With ``precision=None`` (JAX's default) the TPU
    compiler feeds the matrix units bf16 and moves that conversion before FSDP's
    all-gathers, which then move half the bytes (chapter 6 shows it in the HLO).
    """
    hidden = jax.nn.relu(jnp.matmul(x, w1, precision=precision))
    return jnp.matmul(hidden, w2, precision=precision)


def block_loss(params: dict, x: jax.Array, y: jax.Array,
               precision: Any = jax.lax.Precision.HIGHEST) -> jax.Array:
    """The mean squared error of ``mlp_block`` on one batch."""
    return jnp.mean((mlp_block(params["w1"], params["w2"], x, precision) - y) ** 2)

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.parallel.mlp_block_specs
def mlp_block_specs(strategy: str, axis: str = "data") -> tuple[dict, P]:
    """(parameter specs, batch spec) of the MLP block under a strategy.

    ``w1`` is ``[D, F]``, ``w2`` is ``[F, D]``, the batch ``x`` is ``[B, D]``.
    """
    if strategy == "dp":  # replicate the weights, split the batch
        return {"w1": P(), "w2": P()}, P(axis)
    if strategy == "fsdp":  # split the weights (first axis) and the batch
        return {"w1": P(axis), "w2": P(axis)}, P(axis)
    if strategy == "tp":  # Megatron: w1 by columns, w2 by rows; batch on every device
        return {"w1": P(None, axis), "w2": P(axis, None)}, P()
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.parallel.sharded_block_step
def sharded_block_step(strategy: str, mesh: Mesh, lr: float = 0.1,
                       axis: str | None = None,
                       precision: Any = jax.lax.Precision.HIGHEST) -> Callable:
    """One SGD step of the MLP block, sharded by annotations only: XLA writes the
    collectives.

    The step is the single-device one; ``jax.jit``'s ``in_shardings`` and
    ``out_shardings`` say where each array lives. FSDP adds one more annotation: inside
    the loss each weight is constrained to be whole (replicated), which is FSDP's
    "gather the weight before using it"; the gradient then flows back to the shards.
    """
    axis = axis or mesh.axis_names[0]
    param_specs, batch_spec = mlp_block_specs(strategy, axis)
    param_sharding = {name: NamedSharding(mesh, spec)
                      for name, spec in param_specs.items()}
    batch_sharding = NamedSharding(mesh, batch_spec)
    replicated = NamedSharding(mesh, P())

    def loss(params, x, y):
        if strategy == "fsdp":  # use each weight whole: XLA all-gathers the shards here
            params = jax.lax.with_sharding_constraint(params, replicated)
        return block_loss(params, x, y, precision)

    def step(params, x, y):
        loss_value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss_value

    return jax.jit(step, in_shardings=(param_sharding, batch_sharding, batch_sharding),
                   out_shardings=(param_sharding, replicated))

# %% [markdown] slideshow={"slide_type": "skip"}
# `hlo.inspect` compiles a step at abstract arguments (`jax.ShapeDtypeStruct`s that carry
# their shardings: nothing runs) and lists every collective in the optimised HLO, with
# its operand bytes on one device; `plans.collective_bytes` is the cost model's
# prediction for the same step. **Data parallelism** first: weights replicated, batch
# split, so each device's gradient covers its slice of the batch and the gradients must
# be summed over devices: an **all-reduce**.

# %% slideshow={"slide_type": "skip"}
B, D, F = 64, 256, 1024
SHAPES = {"w1": (D, F), "w2": (F, D)}
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=cpus)


def compare(step_fn, strategy, mesh, target=None, **kw):
    """Compile one strategy's step; return the report, its collectives and the cost
    model's."""
    args = parallel.mlp_block_abstract(strategy, mesh, B, D, F)
    report = hlo.inspect(step_fn(strategy, mesh, **kw), *args, target=target)
    plan = plans.collective_bytes(strategy, SHAPES, devices=mesh.devices.size, batch=B,
                                  d_out=D)
    return report, report.by_kind(), plan


dp_report, dp_compiled, dp_plan = compare(sharded_block_step, "dp", mesh)
print("[sim] the collective lines of the optimised HLO:")
for line in dp_report.lines("all-reduce"):
    print(hlo.wrap_lines("    " + line))
print("[sim] what XLA inserted:")
for c in dp_report.collectives:
    print("   ", c)
print(dp_plan)
print("[sim] compiled", dp_compiled, "== predicted:", dp_compiled == dp_plan.by_kind())

# %% [markdown] slideshow={"slide_type": "skip"}
# Three arrays are summed: the two gradients (1 MiB each in fp32) and the scalar loss.
#
# **What it costs on real chips.** A ring all-reduce of $V$ bytes over $|X|$ chips on a
# wrapped axis takes $T = 2V\,(|X|-1)/|X| \,/\, W_{ici}$ (the book's $2V/W_{ici}$), with a
# latency floor of about 1 µs per hop. The same prediction, scaled to a real layer
# ($D = 8192$, $F = 32768$, bf16), over 16 chips of one axis:

# %% slideshow={"slide_type": "skip"}
big = plans.collective_bytes("dp", {"w1": (8192, 32768), "w2": (32768, 8192)},
                             devices=16, bytes_per_elem=2, loss_bytes=0)
print(f"an all-reduce of {big.total_bytes / 1e9:.2f} GB over 16 chips, predicted:")
for name in ("v5e", "v6e", "v5p"):
    chip = hardware.get(name)
    t = big.time_s(chip, 16)
    print(f"  {chip.display_name:<20} W_ici = {comms.w_ici(chip) / 1e9:5.0f} GB/s "
          f"per axis: {t * 1e3:6.1f} ms")

# %% [markdown] slideshow={"slide_type": "skip"}
# DP hides that time behind the backward pass when each chip's batch is large enough:
# compute-bound iff $B/X > C/W_{ici}$ (scaling book, training chapter).

# %% slideshow={"slide_type": "skip"}
for name in ("v5e", "v6e", "v5p"):
    one = comms.dp_min_tokens_per_chip(name)
    two = comms.dp_min_tokens_per_chip(name, axes=2)
    print(f"{name}: DP compute-bound above {one:,.0f} tokens per chip on one axis, "
          f"{two:,.0f} on two")

# %% [markdown] slideshow={"slide_type": "slide"}
# ### FSDP: all-gather, then a reduce-scatter (or what the backend makes of it)
#
# FSDP (ZeRO-3) shards the weights (and optimizer state) like the batch. Before a layer
# runs, its weight is **all-gathered**; its gradient only has to be summed for the shard a
# device owns: a **reduce-scatter**. An all-reduce *is* a reduce-scatter plus an
# all-gather, so FSDP moves the gradient bytes of DP plus the forward gathers (the book:
# $4DF + 8DF$ per layer against $8DF$).

# %% slideshow={"slide_type": "subslide"}
fsdp_report, fsdp_compiled, fsdp_plan = compare(sharded_block_step, "fsdp", mesh)
for c in fsdp_report.collectives:
    print("[sim]   ", c)
print(fsdp_plan)
print("[sim] compiled:", fsdp_compiled)

# %% [markdown] slideshow={"slide_type": "skip"}
# **The prediction, by hand.** `plans.collective_bytes` is arithmetic on the parameter
# shapes: the operand bytes one device puts into each collective, in fp32 (4 bytes per
# element). For a weight of $V$ bytes on $|X|$ devices:
#
# * **all-gather**: a device hands over the shard it holds, $V/|X|$; it gets back all $V$;
# * **reduce-scatter**: a device puts in its whole gradient, $V$, and gets back the summed
#   shard, $V/|X|$ (an all-reduce puts in the same $V$ and gets back the whole sum);
# * the mean loss: one 4-byte all-reduce.
#
# On a ring, each device *sends* $(|X|-1)/|X| \cdot V$ for an all-gather or a
# reduce-scatter ($|X|-1$ steps of one shard), and twice that for an all-reduce, which is
# the two in a row: hence $T = V/W_{ici}$ and $2V/W_{ici}$ in the book.

# %% slideshow={"slide_type": "skip"}
n_dev = mesh.devices.size
# fp32, w1 then w2
weight_bytes = [int(np.prod(shape)) * 4 for shape in SHAPES.values()]
by_hand = {  # shards in, whole gradients in, the mean loss
    "all-gather": (len(weight_bytes), sum(v // n_dev for v in weight_bytes)),
    "reduce-scatter": (len(weight_bytes), sum(weight_bytes)),
    "all-reduce": (1, 4)}
print("by hand:\n ", by_hand)
print("cost model:\n ", fsdp_plan.by_kind())
print("equal:", by_hand == fsdp_plan.by_kind())
print("[sim] compiled all-gathers equal the hand count:",
      fsdp_compiled["all-gather"] == by_hand["all-gather"])
for kind, (_, v) in by_hand.items():
    if kind != "all-reduce":
        whole = v * (n_dev if kind == "all-gather" else 1)
        print(f"ring: each device sends {(n_dev - 1) / n_dev * whole:,.0f} B "
              f"in the {kind} (V = {whole:,} B whole)")

# %% [markdown] slideshow={"slide_type": "skip"}
# The all-gathers match the model exactly (each device hands over its 1/8 shard). The
# gradients do not come out as reduce-scatters: **XLA's CPU backend all-reduces each
# whole gradient and every device then keeps its slice**. The operand bytes per device
# are the same (the whole gradient goes in either way), but an all-reduce delivers the
# whole sum to every device, twice the ring traffic of a reduce-scatter. The TPU
# compiler does what the model says: it fuses the all-reduce with the slice into one
# "all-reduce-scatter" (the report counts it as the reduce-scatter it is).
# Compile-only, for a v5e-8 (`v5e:2x4`), where `libtpu` matching this jax is installed:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
import time

if HAVE_TPU_COMPILER:
    aot_mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,),
                             devices=hlo.tpu_topology("v5e:2x4").devices)
    t0 = time.perf_counter()
    rep, got, plan = compare(sharded_block_step, "fsdp", aot_mesh, target="v5e:2x4")
    print("[aot v5e:2x4] FSDP compiled:\n ", got, "\n  == predicted:",
          got == plan.by_kind())
    print("[aot v5e:2x4] the fused gradient reduction in the HLO:")
    for line in rep.hlo.splitlines():
        if "calls=%all-reduce-scatter" in line:
            print(hlo.wrap_lines("    " + hlo.clean_line(line)))
    print(f"(compiled in {time.perf_counter() - t0:.1f} s on this host)")
else:
    print(f"[aot] skipped: {hlo.tpu_compiler_problem()}")

# %% [markdown] slideshow={"slide_type": "skip"}
# **bf16 before gathering.** With JAX's *default* matmul precision (`precision=None`)
# the v5e feeds its matrix units bf16, and the TPU compiler moves that conversion in
# front of FSDP's all-gathers: they move bf16 shards, half the bytes. The cell compiles
# the same FSDP step with the default precision and prints the gathers:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
if HAVE_TPU_COMPILER:
    rep, got, plan = compare(sharded_block_step, "fsdp", aot_mesh, target="v5e:2x4",
                             precision=None)
    print("[aot v5e:2x4, default precision]")
    for c in rep.collectives:
        if c.kind == "all-gather":
            print(f"  {c}")
    for line in rep.lines("all-gather")[:2]:
        print(hlo.wrap_lines("    " + line))
    print(f"all-gather bytes: {got['all-gather'][1]:,} "
          f"(fp32 shards would be {plan.by_kind()['all-gather'][1]:,})")
else:
    print(f"[aot] skipped: {hlo.tpu_compiler_problem()}")

# %% [markdown] slideshow={"slide_type": "skip"}
# (On the CPU backend the gathers stay fp32: the CPU has no bf16 matrix unit to feed.)
#
# **Memory per device falls as devices grow.** XLA's memory analysis of the compiled FSDP
# step: the argument bytes (weights + batch) per device, for 1, 2 and 8 devices.

# %% slideshow={"slide_type": "skip"}
for n in (1, 2, 8):
    m = jax.make_mesh((n,), ("data",), axis_types=(AxisType.Auto,), devices=cpus[:n])
    abstract = parallel.mlp_block_abstract("fsdp", m, B, D, F)
    rep = hlo.inspect(sharded_block_step("fsdp", m), *abstract)
    print(f"[sim] FSDP over {n} device(s): arguments "
          f"{rep.argument_bytes / 2**20:5.2f} MiB per device")

# %% [markdown] slideshow={"slide_type": "slide"}
# ### Tensor parallelism: activations move, not weights
#
# Megatron splits `w1` by columns and `w2` by rows. Each device computes a slice of the
# hidden layer with no communication, multiplies by its rows of `w2`, and the partial
# outputs `[B, D]` are summed once: an all-reduce of **activations**.

# %% slideshow={"slide_type": "subslide"}
tp_report, tp_compiled, tp_plan = compare(sharded_block_step, "tp", mesh)
print(hlo.wrap_lines("\n".join("[sim]    " + line
                               for line in tp_report.lines("all-reduce"))))
print(tp_plan)
print("[sim] compiled:", tp_compiled, "== predicted:", tp_compiled == tp_plan.by_kind())

# %% [markdown] slideshow={"slide_type": "skip"}
# TP's bytes grow with the batch, not with the weights, and they sit on the critical path
# of every layer, so TP needs the fastest links: it stays inside a slice, on ICI. It is
# compute-bound while $Y < M_Y F\,W_{ici}/C$:

# %% slideshow={"slide_type": "skip"}
for name in ("v5e", "v6e", "v5p"):
    print(f"{name}: with F = 32768, TP stays compute-bound up to about "
          f"{comms.tp_max_shards(name, 32768):.0f}-way on one axis")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 17, "agenda": "two-days"}
# ## 3. The same block by hand: `jax.shard_map`
#
# Inside `jax.shard_map` each device runs the function on its own block of every array
# and talks to the others only through the collectives written in it: `jax.lax.psum`
# (all-reduce), `all_gather`, `psum_scatter` (reduce-scatter), `ppermute` (send to a
# chosen neighbour). `jax.shard_map` is public on every JAX the course supports (0.7.2
# on); code written for older JAX imports `jax.experimental.shard_map.shard_map`, now
# deprecated. First the three collectives on a toy array, one row per device:

# %% slideshow={"slide_type": "skip"}
shard_map = getattr(jax, "shard_map", None)
if shard_map is None:  # JAX older than the course's floor
    from jax.experimental.shard_map import shard_map

rows = jnp.arange(8.0 * 4).reshape(8, 4)  # device i holds row i


def three(v):  # v: this device's [1, 4] block
    total = jax.lax.psum(v, "data")  # every device: the sum of all rows
    everything = jax.lax.all_gather(v, "data", tiled=True)  # every device: all 8 rows
    mine = jax.lax.psum_scatter(everything, "data", scatter_dimension=0, tiled=True)
    # mine: row i of the sum of 8 copies, i.e. 8 x row i
    return total, everything[None], mine


t, e, mine = jax.jit(shard_map(three, mesh=mesh, in_specs=P("data"),
                               out_specs=(P("data"), P("data"), P("data"))))(rows)
print("[sim] psum on device 0:", np.asarray(t[0]).tolist())
print("[sim] all_gather on device 3 holds", e.shape[1:], "(all rows)")
print("[sim] psum_scatter: device i gets 8 x row i:", bool(np.allclose(mine, 8 * rows)))

# %% [markdown] slideshow={"slide_type": "skip"}
# The block's step with those collectives written out. FSDP gathers each weight with
# `all_gather`; JAX's derivative of an all-gather is a `psum_scatter`, so the gradients
# come back as reduce-scatters without a line for them. DP needs no line for its
# gradients either: the weights are the same on every device while the loss came from
# split data, and the derivative of that broadcast is a `psum`.

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.parallel.mlp_block_step
def mlp_block_step(strategy: str, mesh: Mesh, lr: float = 0.1,
                   axis: str | None = None) -> Callable:
    """The same SGD step with every collective written by hand, under ``jax.shard_map``.

    Inside ``shard_map`` each device sees only its own block of every array and talks to
    the others only through the collectives written here:

    * ``"dp"``: the loss is ``pmean``-ed (an all-reduce of a scalar); differentiating
      through it sums the replicated weights' gradients over devices (one all-reduce).
    * ``"fsdp"``: each weight ``all_gather``-ed before use; JAX's transpose of that
      all-gather is a ``psum_scatter``, so the gradients come back as reduce-scatters.
    * ``"tp"``: ``w1`` split by columns, ``w2`` by rows; one ``psum`` (all-reduce) of
      the ``[batch, d_model]`` partial outputs. The batch is replicated.
    """
    axis = axis or mesh.axis_names[0]
    param_specs, batch_spec = mlp_block_specs(strategy, axis)

    def local_loss(p, x, y):  # p, x, y: this device's blocks
        if strategy == "fsdp":
            w1 = jax.lax.all_gather(p["w1"], axis, tiled=True)
            w2 = jax.lax.all_gather(p["w2"], axis, tiled=True)
            out = mlp_block(w1, w2, x)
        elif strategy == "tp":
            out = jax.lax.psum(mlp_block(p["w1"], p["w2"], x), axis)
        else:
            out = mlp_block(p["w1"], p["w2"], x)
        loss = jnp.mean((out - y) ** 2)
        return loss if strategy == "tp" else jax.lax.pmean(loss, axis)

    def local_step(p, x, y):
        # No explicit pmean of the gradients: the parameters are replicated (the same
        # on every device) while the loss came from sharded data, so JAX's transpose of
        # that broadcast is a psum: the all-reduce of data parallelism appears by
        # itself.
        loss, g = jax.value_and_grad(local_loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - lr * b, p, g), loss

    return jax.jit(jax.shard_map(local_step, mesh=mesh,
                                 in_specs=(param_specs, batch_spec, batch_spec),
                                 out_specs=(param_specs, P())))

# %% [markdown] slideshow={"slide_type": "skip"}
# The collectives written by hand are the cost model's exactly, on the CPU too: this
# time the reduce-scatter is in the program because we (through the derivative) put it
# there. The jaxpr shows JAX's own `reduce_scatter` line before XLA sees anything.

# %% slideshow={"slide_type": "skip"}
for strategy in ("dp", "fsdp", "tp"):
    _, got, plan = compare(mlp_block_step, strategy, mesh)
    print(f"[sim] shard_map {strategy:<4}:\n  {got}\n"
          f"  == predicted: {got == plan.by_kind()}")
fsdp_args = parallel.mlp_block_abstract("fsdp", mesh, B, D, F)
jaxpr = str(jax.make_jaxpr(mlp_block_step("fsdp", mesh))(*fsdp_args))
found = re.findall(r"\b(all_gather|reduce_scatter|psum\w*)\[", jaxpr)
print("[sim] collectives in the FSDP jaxpr:", sorted(set(found)))

# %% [markdown] slideshow={"slide_type": "slide"}
# ### A ring all-reduce from `ppermute`
#
# A ring all-reduce over $n$ devices: cut the array into $n$ chunks; for $n-1$ steps each
# device passes one chunk right and adds what arrives (reduce-scatter); then $n-1$ more
# steps pass the finished chunks round (all-gather). Each device sends $2(n-1)/n$ of the
# array: the ring's cost in section 2.

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.parallel.ring_all_reduce
def ring_all_reduce(x: jax.Array, axis: str, axis_size: int) -> jax.Array:
    """Sum ``x`` over ``axis`` with a ring of ``ppermute``s (call inside ``shard_map``).

    The array is cut into ``n`` chunks. Reduce-scatter: for ``n-1`` steps every device
    sends one chunk to its right-hand neighbour, which adds it to its own copy; after
    that device ``i`` holds the full sum of chunk ``(i+1) mod n``. All-gather: ``n-1``
    more steps pass the finished chunks around. Each device sends ``2 (n-1)/n`` of the
    array in all: the ring all-reduce's cost.
    """
    n = axis_size
    if n == 1:
        return x
    flat = x.reshape(-1)
    pad = (-flat.size) % n
    chunks = jnp.pad(flat, (0, pad)).reshape(n, -1)
    me = jax.lax.axis_index(axis)
    right = [(i, (i + 1) % n) for i in range(n)]
    for s in range(n - 1):  # reduce-scatter
        send = chunks[(me - s) % n]
        got = jax.lax.ppermute(send, axis, right)
        chunks = chunks.at[(me - 1 - s) % n].add(got)  # the chunk index travels with it
    for s in range(n - 1):  # all-gather
        send = chunks[(me + 1 - s) % n]
        got = jax.lax.ppermute(send, axis, right)
        chunks = chunks.at[(me - s) % n].set(got)
    return chunks.reshape(-1)[: flat.size].reshape(x.shape)

# %% slideshow={"slide_type": "skip"}
x = np.random.default_rng(0).standard_normal((8, 1000)).astype(np.float32)
ring = jax.jit(shard_map(lambda v: ring_all_reduce(v, "data", 8), mesh=mesh,
                         in_specs=P("data"), out_specs=P("data")))
psum = jax.jit(shard_map(lambda v: jax.lax.psum(v, "data"), mesh=mesh,
                         in_specs=P("data"), out_specs=P("data")))
diff = float(np.abs(np.asarray(ring(x)) - np.asarray(psum(x))).max())
ring_cs = hlo.inspect(ring, x).collectives
print(f"[sim] ring equals psum (largest difference below 1e-5): {diff < 1e-5};\n"
      f"{len(ring_cs)} {ring_cs[0].kind}s of {ring_cs[0].bytes} B each "
      f"= {sum(c.bytes for c in ring_cs) / (x[0].nbytes):.3f} of the array = 2(n-1)/n")

# %% [markdown] slideshow={"slide_type": "skip"}
# Step by step on 4 devices (`parallel.ring_schedule`): device $i$ starts with $10^i$ in
# each chunk, so each digit of an entry says whose value has been added in.

# %% slideshow={"slide_type": "skip"}
for step, frame in enumerate(parallel.ring_schedule(4)):
    phase = "start" if step == 0 else ("reduce-scatter" if step <= 3 else "all-gather")
    print(f"step {step} ({phase}):")  # then each device's 4 chunks
    print(" ", " | ".join(" ".join(f"{v:4d}" for v in row) for row in frame))

# %% [markdown] slideshow={"slide_type": "slide"}
# ### The three strategies on a compile-only v5e-8 and on real chips
#
# On TPU the compiler splits one asynchronous collective into a start, a body and a done
# part; `hlo.inspect` counts it once.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
if HAVE_TPU_COMPILER:
    for fn in (sharded_block_step, mlp_block_step):
        for strategy in ("dp", "fsdp", "tp"):
            _, got, plan = compare(fn, strategy, aot_mesh, target="v5e:2x4")
            print(f"[aot v5e:2x4] {fn.__name__:<18} {strategy:<4}:\n  {got}\n"
                  f"  == predicted: {got == plan.by_kind()}")
else:
    print(f"[aot] skipped: {hlo.tpu_compiler_problem()}")

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
if real_chips > 1 and all(n % real_chips == 0 for n in (B, D, F)):
    real_mesh = jax.make_mesh((real_chips,), ("data",), axis_types=(AxisType.Auto,))
    for strategy in ("dp", "fsdp", "tp"):
        rep, got, plan = compare(sharded_block_step, strategy, real_mesh)
        step = sharded_block_step(strategy, real_mesh)
        pspec, xspec = mlp_block_specs(strategy)
        prm = parallel.place(parallel.mlp_block_params(D, F), real_mesh, pspec)
        xr = parallel.place(np.ones((B, D), np.float32), real_mesh, xspec)
        jax.block_until_ready(step(prm, xr, xr))  # compile and warm up
        t0 = time.perf_counter()
        for _ in range(10):
            out = step(prm, xr, xr)
        jax.block_until_ready(out)
        print(f"[real {real_chips} x {rt.device_kind}] {strategy}: collectives {got};\n"
              f"  step {(time.perf_counter() - t0) / 10 * 1e6:.0f} us (measured)")
else:
    print(f"[real] skipped: this runtime has {max(real_chips, 1)} accelerator chip(s) "
          "or none;\nthe sim and aot tiers stand in for it")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "one-day"}
# ## 4. Topology: torus vs switch
#
# A TPU slice is a 2D (v5e, v6e) or 3D (v4, v5p) torus: each chip has links to its
# neighbours only, and an axis closes into a ring (*wraparound*) only for full pod sides
# (v5e/v6e: 16 chips) or whole 4x4x4 cubes (v4/v5p). Without wraparound the ring
# collective runs one way and takes twice as long; more axes add bandwidth. An NVSwitch
# node connects every GPU to every other in one hop. A 1 GB all-gather:

# %% slideshow={"slide_type": "subslide"}
cases = [("v5e", 16, None, "one 16-chip axis, wrapped"),
         ("v5e", 8, None, "one 8-chip axis of an 8x8 v5e slice (no wrap)"),
         ("v5e", (16, 16), None, "a 16x16 pod, both axes"),
         ("v5p", (4, 4, 4), None, "a 4x4x4 v5p cube, three axes"),
         ("h100", 8, None, "8 H100s behind NVSwitch")]
for name, axes, wrap, what in cases:
    chip = hardware.get(name)
    hops = 1  # a switch: one hop between any two GPUs
    if chip.kind == "tpu":
        wraps = [comms.wraps(chip, a) for a in np.atleast_1d(axes)]
        hops = comms.ring_hops(axes, wraps)
    t = comms.all_gather_time(1e9, axes, chip, wraparound=wrap)
    print(f"{what:<42} latency hops {hops:>3}, time {t * 1e3:6.2f} ms")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 9, "agenda": "two-days"}
# ## 5. Across slices: the data-centre network
#
# Slices talk over DCN (host NICs and the data-centre network), not ICI. How much slower,
# per chip, by the course's own table:

# %% slideshow={"slide_type": "subslide"}
for name in ("v5e", "v5p", "v6e"):
    chip = hardware.get(name)
    axis, ports, dcn = comms.w_ici(chip), chip.ici_bytes_per_s, chip.dcn_bytes_per_s
    print(f"{chip.display_name:<18} DCN {dcn / 1e9:5.2f} GB/s per chip; "
          f"ICI {axis / 1e9:4.0f} GB/s per axis ({axis / dcn:3.0f}x DCN),\n{'':18} "
          f"{ports / 1e9:5,.0f} GB/s all ports ({ports / dcn:3.0f}x)")

# %% [markdown] slideshow={"slide_type": "skip"}
# Which ratio matters depends on the collective. One collective along one mesh axis gets
# that axis's ICI bandwidth, $W_{ici}$ (the convention of every collective time in this
# chapter): per axis DCN is about 30x slower on v5e and v5p and about 15x on v6e. A step
# that moves data on every axis at once uses all of a chip's ports, and against those DCN
# is 64-192x slower. Either way it is more than an order of magnitude, so only the cheapest
# strategy crosses slices. Data parallelism across $S$ slices all-reduces the gradients
# once per step; FSDP would also gather the weights over DCN every step (worse); a
# pipeline sends only activations between slices.
#
# **The minimum batch per slice, as the scaling book states it** (training chapter,
# "across pods"): per layer the backward pass does $8BDF/M$ FLOPs per chip in a slice of
# $M$ chips while the bf16 gradients ($2DF$ parameters, 2 bytes each, all-reduced: twice)
# cross DCN in $8DF/(M\,W_{dcn})$ seconds; compute hides the network when
# **tokens per slice $B > C/W_{dcn}$**. The book's v5p example uses $C = 4.46\times10^{14}$
# FLOP/s; the course's table (Cloud TPU's v5p page) has $4.59\times10^{14}$:

# %% slideshow={"slide_type": "skip"}
v5p = hardware.get("v5p")
book_c = comms.BOOK_V5P_FLOPS_PER_S  # the C of the book's v5p example, not the table's
book_b = comms.dcn_book_min_tokens_per_slice(v5p, flops_per_s=book_c)
print(f"book:   C / W_dcn = {book_c:.3g} / {v5p.dcn_bytes_per_s:.3g} = "
      f"{book_b:,.0f} tokens per slice (the book's C)")
print(f"course: C / W_dcn = {v5p.peak_bf16_flops_per_s:.3g} / "
      f"{v5p.dcn_bytes_per_s:.3g} = "
      f"{comms.dcn_book_min_tokens_per_slice(v5p):,.0f} tokens per slice "
      "(the table's C)")

# %% [markdown] slideshow={"slide_type": "skip"}
# **The course's variant** (`comms.dcn_min_tokens_per_slice`) keeps the book's overlap
# assumption (only the backward pass, 4 of the 6 FLOPs per parameter per token, can hide a
# gradient all-reduce: the gradients exist only once it has run) and changes two others,
# stated here: gradients all-reduced in **fp32**, by a ring over $S$ slices, so each slice
# sends $2(S-1)/S \times 32$ bits per parameter (32 bits at two slices, approaching 64):
# $B > (\text{bits}/8)\,C/(4\,W_{dcn})$. The last column shows how much an optimistic
# reading (all 6 FLOPs overlapping) would understate it.

# %% slideshow={"slide_type": "skip"}
print("slices  bits/param  v5p variant (4 FLOPs overlap)  if all 6 overlapped  "
      "book (bf16)")
for s in (2, 4, 64):
    four = comms.dcn_min_tokens_per_slice("v5p", s)
    book = comms.dcn_book_min_tokens_per_slice("v5p")
    print(f"{s:>6}  {comms.dcn_bits_per_param(s):10.1f}  {four:>28,.0f}  "
          f"{four * 4 / 6:>19,.0f}  {book:>11,.0f}")
print(comms.recommend("v5e", 7e9, 1e6, slices=4))

# %% [markdown] slideshow={"slide_type": "skip"}
# A figure of "350k-700k tokens per pod" circulates in notes on multislice training. Its
# "theoretical minimum" of 176k-352k matches the variant above on a TPU7x (184,560 at two
# slices, up to 369,120 with many) within 5%, and 350k-700k is that doubled as a margin;
# the chip throughput behind it is not given in any source, so treat it as **unverified**.

# %% slideshow={"slide_type": "slide"}
# GPipe's idle fraction vs micro-batches for 2, 4, 8 and 16 stages: it falls as m grows
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.2))
m = np.arange(1, 65)
for p in (2, 4, 8, 16):
    ax.plot(m, [comms.pipeline_bubble(p, k) for k in m], label=f"{p} stages")
ax.set_xlabel("micro-batches m")
ax.set_ylabel("bubble (p-1)/(m+p-1)")
ax.legend()
ax.set_title("GPipe bubble fraction")
plt.show()

# %% [markdown] slideshow={"slide_type": "skip"}
# **GPipe, written out.** Cut the model into $p$ stages, one per device on a `stage` mesh
# axis, and the batch into $m$ micro-batches. Inside `jax.shard_map` each device holds
# its own stage's weights; at tick $t$ stage $s$ works on micro-batch $t - s$ (when there
# is one) and `ppermute`s its output to stage $s+1$, which uses it at the next tick. The
# schedule has $m + p - 1$ ticks; stage $s$ is idle for the first $s$ of them (waiting
# for the pipe to fill) and the last $p - 1 - s$ (the pipe draining).

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.parallel.gpipe_forward
def gpipe_forward(stage_fn: Callable, stage_params: jax.Array, microbatches: jax.Array,
                  mesh: Mesh, axis: str = "stage") -> tuple[jax.Array, jax.Array]:
    """Run a GPipe forward pass: stage ``s`` (device ``s`` on ``axis``) applies its
    layer.

    ``stage_params`` has a leading axis of size ``p`` (one slice per stage),
    ``microbatches`` is ``[m, ...]``. At tick ``t`` stage ``s`` works on micro-batch
    ``t - s`` when ``0 <= t - s < m``, then passes its output to stage ``s + 1`` with a
    ``ppermute``. There are ``m + p - 1`` ticks.

    Returns ``(outputs [m, ...], timeline [p, m + p - 1])`` where the timeline holds the
    micro-batch each stage worked on at each tick, or ``-1`` when it sat idle: the
    bubble, ``(p-1)/(m+p-1)`` of the cells (``tpu_course.comms.pipeline_bubble``).
    """
    p = mesh.shape[axis]
    m = microbatches.shape[0]
    ticks = m + p - 1

    def local(w, mbs):
        w = w[0]
        s = jax.lax.axis_index(axis)
        carry = jnp.zeros_like(mbs[0])
        outs = jnp.zeros_like(mbs)
        line = []
        for t in range(ticks):
            k = t - s
            active = (k >= 0) & (k < m)
            inp = jnp.where(s == 0, mbs[jnp.clip(t, 0, m - 1)], carry)
            y = jnp.where(active, stage_fn(w, inp), jnp.zeros_like(inp))
            last = active & (s == p - 1)
            outs = jnp.where(last, outs.at[jnp.clip(k, 0, m - 1)].set(y), outs)
            line.append(jnp.where(active, k, -1))
            carry = jax.lax.ppermute(y, axis, [(i, i + 1) for i in range(p - 1)])
        # only the last stage wrote: the sum is its outputs
        outs = jax.lax.psum(outs, axis)
        return outs, jnp.stack(line)[None]

    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(axis), P()),
                       out_specs=(P(), P(axis)))
    return jax.jit(fn)(stage_params, microbatches)

# %% [markdown] slideshow={"slide_type": "skip"}
# 4 stages (a `tanh` layer each) and 6 micro-batches on the simulated devices. The timeline
# says which micro-batch each stage worked on at each tick (`.` = idle: the bubble).

# %% slideshow={"slide_type": "skip"}
pmesh = parallel.cpu_mesh((4,), ("stage",))
rng = np.random.default_rng(1)
w = jnp.asarray(rng.standard_normal((4, 16, 16)).astype(np.float32) / 4)
mbs = jnp.asarray(rng.standard_normal((6, 8, 16)).astype(np.float32))
layer = lambda wi, a: jnp.tanh(a @ wi)
outs, timeline = gpipe_forward(layer, w, mbs, pmesh)
seq = np.asarray(mbs)  # the reference: the 4 layers one after another, in numpy (fp32)
for i in range(4):
    seq = np.tanh(seq @ np.asarray(w[i]))
tl = np.asarray(timeline)
for s, row in enumerate(tl):
    print(f"[sim] stage {s}: " + " ".join("." if v < 0 else str(v) for v in row))
print(f"outputs equal the sequential model: {np.allclose(outs, seq, atol=1e-4)}")

# %% [markdown] slideshow={"slide_type": "skip"}
# **Count the bubble.** Timing 8 simulated devices on a 2-core CPU says nothing about a
# pipeline, so count instead: the schedule has $p\,(m+p-1)$ stage-steps, of which
# $p\,m$ do work; the idle ones are $p\,(p-1)$, whatever $m$ is, a fraction
# $(p-1)/(m+p-1)$. The timelines of the function above, for a few $p$ and $m$:

# %% slideshow={"slide_type": "skip"}
print("  p   m   ticks   idle stage-steps   p(p-1)   idle fraction   (p-1)/(m+p-1)")
for p_, m_ in ((4, 2), (4, 6), (8, 8)):
    ws = jnp.asarray(rng.standard_normal((p_, 16, 16)).astype(np.float32) / 4)
    xs = jnp.asarray(rng.standard_normal((m_, 8, 16)).astype(np.float32))
    _, line = gpipe_forward(layer, ws, xs, parallel.cpu_mesh((p_,), ("stage",)))
    line = np.asarray(line)
    idle = int((line < 0).sum())
    print(f"{p_:>3} {m_:>3} {line.shape[1]:>7} {idle:>18} {p_ * (p_ - 1):>8} "
          f"{idle / line.size:>15.3f} {(p_ - 1) / (m_ + p_ - 1):>15.3f}")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 7, "agenda": "two-days"}
# ## 6. Many hosts: `jax.distributed`
#
# On a pod slice every host runs the *same* script; nothing in it says "if I am the
# coordinator, send work to the others". What differs per process is only what
# `jax.process_index()` returns, and what each process does with it. The worker, as each
# process runs it:
#
# * `jax.distributed.initialize(...)` joins this process to the others (on a TPU pod
#   slice with no arguments: it reads the slice's metadata). After it `jax.devices()`
#   lists the devices of *every* process and `jax.local_devices()` this one's;
# * the mesh spans all devices; every process compiles the same jitted step;
# * **data per process**: each process holds only its rows of every global batch and
#   `jax.make_array_from_process_local_data(sharding, local_rows, global_shape)` makes
#   one global array of them (no process ever holds the whole batch);
# * **results**: a sharded array cannot become numpy in a process that holds only some of
#   its shards; `multihost_utils.process_allgather` gathers it to every process;
# * **checkpoints**: one writer: process 0 (here, after gathering). Orbax instead has
#   every process call `save`, and each writes the shards it holds.

# %% slideshow={"slide_type": "skip"}
# the small regression every process trains on
multihost_problem = multihost.multihost_problem

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.multihost.train_data_parallel, tpu_course.multihost.worker
def train_data_parallel(mesh: Mesh, steps: int, process_index: int = 0,
                        process_count: int = 1, lr: float = 0.1) -> dict:
    """Data-parallel training of the MLP block over every device of ``mesh``, in every
    process.

    Every process runs this same function. Each one makes the same global batch here (a
    real job would have each host read only its own files) and hands only its rows to
    ``jax.make_array_from_process_local_data``, which assembles one global array whose
    shards live on the devices of all processes. The step is the chapter's shard_map
    data-parallel step; its psum crosses processes like any other device.

    Returns the losses and the trained parameters, gathered to every process with
    ``process_allgather`` (a sharded array cannot be turned into numpy by a process that
    holds only some of its shards).
    """
    params, x, y = multihost_problem(steps=steps)
    axis = mesh.axis_names[0]
    pspec, xspec = parallel.mlp_block_specs("dp", axis)
    step = parallel.mlp_block_step("dp", mesh, lr)
    p = parallel.place(params, mesh, pspec)
    sharding = NamedSharding(mesh, xspec)
    # This process's devices come one after another in the mesh (jax.make_mesh orders
    # them so), so its rows of the global batch are one contiguous block.
    per = x.shape[1] // process_count
    rows = slice(process_index * per, (process_index + 1) * per)
    losses = []
    for t in range(steps):
        xb = jax.make_array_from_process_local_data(sharding, x[t, rows], x.shape[1:])
        yb = jax.make_array_from_process_local_data(sharding, y[t, rows], y.shape[1:])
        p, loss = step(p, xb, yb)
        losses.append(float(loss))  # the loss is replicated: every process has it whole
    from jax.experimental import multihost_utils

    trained = {k: np.asarray(multihost_utils.process_allgather(v, tiled=True))
               for k, v in p.items()}
    return {"losses": losses, "params": trained}


def worker(coordinator: str | None = None, num_processes: int | None = None,
           process_id: int | None = None, steps: int = 5,
           checkpoint_dir: str | None = None) -> dict:
    """What each process of a multi-process run executes: the same program on every
    host.

    ``jax.distributed.initialize`` joins this process to the others (on a TPU pod slice
    it takes no arguments: it reads the slice's metadata). After it, ``jax.devices()``
    lists the devices of every process and ``jax.local_devices()`` this process's own;
    the mesh spans them all. Only process 0 writes the checkpoint: every process holds
    the same gathered parameters, and one writer is enough.
    """
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        # CPU devices of different processes talk through gloo (JAX's default on recent
        # versions; set explicitly for older ones).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id)
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    out = train_data_parallel(mesh, steps, jax.process_index(), jax.process_count())
    if checkpoint_dir is not None and jax.process_index() == 0:
        path = os.path.join(checkpoint_dir, f"mlp_block_step{steps}.npz")
        np.savez(path, **out["params"])
    return {"losses": out["losses"],
            "w1_sum": float(np.sum(out["params"]["w1"], dtype=np.float64)),
            "process_index": jax.process_index(), "process_count": jax.process_count(),
            "local_devices": jax.local_device_count(),
            "global_devices": jax.device_count()}

# %% [markdown] slideshow={"slide_type": "skip"}
# Here: two processes on 127.0.0.1 with 2 CPU devices each, talking through gloo.
# `multihost.launch_local` starts `python -m tpu_course.multihost` twice (the worker
# above, behind a command line) and stops both if either fails or hangs.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
t0 = time.perf_counter()
results = multihost.launch_local(num_processes=2, local_devices=2, steps=4,
                                 timeout_s=120)
print(f"(two processes, {time.perf_counter() - t0:.1f} s including start-up)")

# %% slideshow={"slide_type": "skip"}
single = train_data_parallel(jax.make_mesh((1,), ("data",), axis_types=(AxisType.Auto,),
                                           devices=jax.devices("cpu")[:1]), steps=4)
for r in results:
    print(f"[sim, 2 processes] process {r['process_index']} of {r['process_count']}: "
          f"{r['local_devices']} local / {r['global_devices']} global devices,\n"
          f"  losses {np.round(r['losses'], 5).tolist()}")
print(f"[sim, 1 device]   losses {np.round(single['losses'], 5).tolist()}")
print("equal within 1e-5:",
      all(np.allclose(r["losses"], single["losses"], rtol=1e-5) for r in results))
w1_sum = float(np.sum(single["params"]["w1"], dtype=np.float64))
print("gathered w1 equal:", all(abs(r["w1_sum"] - w1_sum) < 1e-3 for r in results))

# %% [markdown] slideshow={"slide_type": "skip"} workshop={"minutes": 5, "agenda": "two-days"}
# On a TPU pod slice, the same worker started on every host at once (no coordinator
# address needed there):
#
# ```
# gcloud compute tpus tpu-vm ssh my-v5e-32 --zone=us-west4-a --worker=all \
#     --command="python -m tpu_course.multihost --steps 5 --checkpoint-dir /tmp/ckpt"
# ```
#
# ## 7. Prove parity before scaling
#
# The chapter-5 model and train step, unchanged, under each strategy: only the shardings
# differ. For FSDP that means three things, all in the function below: the parameters
# **and the optimizer's moments** are stored sharded (`strategy_placement` gives every
# leaf of the `TrainState` its spec: FSDP splits the first dimension the axis divides),
# and inside the step the parameters are constrained to be whole where they are used,
# FSDP's "gather before use". Without that constraint XLA may keep the weights sharded
# and move activations instead (all-to-alls), which is not FSDP.

# %% slideshow={"slide_type": "skip"}
# every leaf's NamedSharding under a strategy
strategy_placement = parallel.strategy_placement

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.parallel.make_sharded_train_step
def make_sharded_train_step(step: Callable, strategy: str, state: Any, mesh: Mesh,
                            axis: str | None = None) -> tuple[Callable, Any, Any]:
    """Jit a pure ``(state, batch) -> (state, metrics)`` step with a strategy's
    shardings.

    Returns ``(jitted_step, state_sharding, batch_sharding)``; place the state with
    ``jax.device_put(state, state_sharding)`` and each batch with ``batch_sharding``.
    The step itself is unchanged. Under ``"fsdp"`` the parameters and the optimizer's
    moments are stored sharded (``strategy_placement``), and inside the step the
    parameters are constrained to be whole where the step uses them: that is FSDP's
    "gather before use", so XLA all-gathers each weight and sums each gradient back to
    its shard. Without that constraint XLA is free to keep the weights sharded and move
    the activations instead (all-to-alls), which is not FSDP.
    """
    place = strategy_placement(strategy, mesh, axis)(state)
    whole = NamedSharding(mesh, P())

    def fsdp_step(state, batch):  # gather the parameters, then the unchanged step
        params = jax.lax.with_sharding_constraint(state.params, whole)
        return step(state._replace(params=params), batch)

    jitted = jax.jit(fsdp_step if strategy == "fsdp" else step,
                     in_shardings=(place.state, place.batch),
                     out_shardings=(place.state, place.scalars))
    return jitted, place.state, place.batch

# %% [markdown] slideshow={"slide_type": "skip"}
# The shardings, on the chapter-5 MLP with one hidden layer of 128 and Adam (whose two
# moments have the parameters' shapes), and what XLA compiled for the FSDP step: gathers
# and gradient sums only, no all-to-all, and each device takes in 1/8 of the state.

# %% slideshow={"slide_type": "skip"}
import optax
from flax import nnx

from tpu_course import models, train

tx = optax.adam(1e-3)
graphdef, state5 = train.init_state(models.MLP((128,), rngs=nnx.Rngs(0)), tx)
fsdp5, state_sharding, batch_sharding = make_sharded_train_step(
    train.make_train_step(graphdef, tx), "fsdp", state5, mesh)
for path, sh in jax.tree_util.tree_flatten_with_path(state_sharding)[0]:
    print(f"{jax.tree_util.keystr(path).replace('.value', ''):<44} {sh.spec}")
def abstract(shape, dtype, sharding=batch_sharding):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


abstract5 = (jax.tree.map(lambda x, sh: abstract(x.shape, x.dtype, sh),
                          state5, state_sharding),
             train.Batch(abstract((B, 28, 28), jnp.uint8), abstract((B,), jnp.int32),
                         abstract((B,), jnp.float32)))
rep5 = hlo.inspect(fsdp5, *abstract5)
whole_bytes = sum(x.nbytes for x in jax.tree.leaves(state5))
print("[sim] collectives:", rep5.by_kind())
print("[sim] no all-to-all or collective-permute:",
      not {"all-to-all", "collective-permute"} & set(rep5.by_kind()))
print(f"[sim] arguments per device {rep5.argument_bytes:,} B; "
      f"the whole state is {whole_bytes:,} B")

# %% [markdown] slideshow={"slide_type": "skip"}
# Then training: MNIST, a few SGD steps, the single-device step against the same step
# under each strategy (`parallel.train_chapter5` runs the loop with
# `make_sharded_train_step`). The losses must agree to float rounding: **relative
# tolerance 2e-5**.

# %% slideshow={"slide_type": "skip"}
from tpu_course import data

ds = data.load_mnist(download=not os.environ.get("TPU_COURSE_DATA"))
imgs, labels = ds.train_images[:320], ds.train_labels[:320]
curves = {}
for s in (None, "dp", "fsdp", "tp"):
    curves[s or "single"] = parallel.train_chapter5(s, mesh, imgs, labels, steps=4,
                                                    hidden=(128,))
for s, losses in curves.items():
    ok = np.allclose(losses, curves["single"], rtol=2e-5)
    print(f"[sim] {s:<6} losses {np.round(losses, 4).tolist()}  "
          f"matches single device: {ok}")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 4, "agenda": "one-day"}
# ## 8. A cost audit
#
# Chips x hours x price. The prices below are the course's dated **examples**
# (`costs.PRICES_USD_PER_CHIP_HOUR`, unverified; chapter 2): pass today's price for your
# region as `usd_per_chip_hour=` and the totals are yours. MFU is model FLOPs per second
# over the chips' peak. The sim tier's CPU has
# no TPU peak, so its MFU is not defined: it is computed only on a TPU runtime.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
fn = jax.jit(parallel.mlp_block_reference_step())
params = {k: jnp.asarray(v) for k, v in parallel.mlp_block_params(D, F).items()}
xb = jnp.ones((B, D)); yb = jnp.zeros((B, D))
fn(params, xb, yb)[1].block_until_ready()
t0 = time.perf_counter()
for _ in range(20):
    params, loss = fn(params, xb, yb)
loss.block_until_ready()
step_s = (time.perf_counter() - t0) / 20
flops = 6 * B * 2 * D * F  # forward 2BDF per matrix, backward twice that
where = "TPU" if rt.platform == "tpu" else rt.platform.upper()
print(f"[{where}] MLP-block step: {step_s * 1e6:.0f} us "
      f"({flops / step_s / 1e9:.1f} GFLOP/s measured on {where})")
if rt.chip is not None and rt.platform == "tpu":
    print(f"MFU on {rt.chip.display_name}: {costs.mfu(flops, step_s, 1, rt.chip):.1%}")
else:
    print("MFU: not defined on this runtime (no TPU peak to divide by)")

# %% slideshow={"slide_type": "skip"}
print("This notebook's runs on a v5e-8 for 2 minutes:")
print(" ", costs.training_cost("v5e", 8, hours=2 / 60))
print("A larger job (1B params, 20B tokens, 40% MFU):")
for name in ("v5e", "v6e", "v5p"):
    print("   ", costs.training_cost(name, 256, params=1e9, tokens=20e9, mfu=0.4))

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 2, "agenda": "half-day"}
# ## Takeaways
#
# * Sharding is written as annotations: a mesh (`jax.make_mesh`, with its axis types
#   stated), `PartitionSpec`s, `NamedSharding`, and `jax.jit`'s `in_shardings` /
#   `out_shardings`; FSDP adds a constraint that uses each weight whole. XLA inserts the
#   collectives: DP all-reduces gradients; FSDP all-gathers weights and reduce-scatters
#   gradients (XLA's CPU backend all-reduces and slices instead, the TPU compiler fuses
#   them into a reduce-scatter); TP all-reduces activations.
# * With `jax.shard_map` every collective is written by hand (`psum`, `all_gather`,
#   `psum_scatter`, `ppermute`), and a ring all-reduce is $2(n-1)$ `ppermute`s.
# * Every collective compiled here matched the cost model's kinds, counts and bytes,
#   except where the backend chose another kind, and the HLO said so.
# * Time per collective: $V/W_{ici}$ for a gather on a wrapped axis, twice without
#   wraparound, divided by the number of axes used, never below the hop latency.
# * DCN is 14-29x slower than one ICI axis (64-192x slower than all of a chip's ICI
#   ports): data parallelism across slices needs about
#   $C/W_{dcn}$ tokens per slice (71k-73k on v5p, the book's rule); otherwise pipeline,
#   and pay the bubble $(p-1)/(m+p-1)$.
