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
# # Lab 6: Shard the chapter-5 model and explain every collective
#
# About 110 minutes, seven exercises, on 8 simulated CPU devices (the same code runs on a
# TPU slice):
#
# 1. **predict** (10 min) the bytes of every collective FSDP needs for the chapter-5 MLP,
#    before compiling anything;
# 2. **write** (20 min) FSDP for that model by annotations alone: the `PartitionSpec`s, a
#    sharding constraint and `jax.jit`; its compiled HLO then shows what exercise 1 predicts;
# 3. **predict** (10 min) what the TPU compiler makes of the same step on a v5e-8
#    (compile-only: needs `libtpu` matching your jax, skipped otherwise);
# 4. **transfer** (25 min) a *bidirectional* ring all-reduce from `ppermute`;
# 5. **transfer** (20 min) a hierarchical all-reduce across slices;
# 6. **transfer** (10 min) choose a parallelism plan with the chapter's two rules, written
#    yourself;
# 7. **transfer** (15 min) the rows of the global batch each process feeds, graded in a
#    real two-process `jax.distributed` run.
#
# Each exercise is followed by a check cell: pass, or a hint (the expected value only
# through `checks.reveal("Exercise N")`). The last cell is the scorecard.
#
# **Predictions first.** Exercises 1 and 3 are predictions: a cell after each records
# yours (`ch06.LAB.predict(...)`), and the compiled answer is shown only after that. Once
# it has been shown in this session your prediction is locked: the check grades the one
# you recorded, not a value edited afterwards. (`tpu-course grade` re-runs the notebook
# and grades the value in the cell.)

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

runtime.simulate_devices(8)  # before anything starts JAX
print(runtime.describe().banner())

# %%
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from tpu_course import checks, comms, hardware, hlo, models, parallel, train
from tpu_course.checks import NotWritten, ch06

# the simulated tier: 8 CPU devices on one axis, Auto axes (XLA chooses the collectives)
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,),
                     devices=jax.devices("cpu")[:8])
print("mesh:", dict(mesh.shape))
ch06.LAB

# %% [markdown]
# ## The model: chapter 5's MLP and train step, unchanged
#
# `models.MLP()` (784 -> 256 -> 256 -> 10) and `train.make_train_step` with Adam, as
# chapter 5 trains them. FSDP will shard the parameters **and** Adam's two moments.

# %%
tx = optax.adam(1e-3)
graphdef, state = train.init_state(models.MLP(rngs=nnx.Rngs(0)), tx)
step = train.make_train_step(graphdef, tx)
for path, x in jax.tree_util.tree_flatten_with_path(state.params)[0]:
    print(f"{jax.tree_util.keystr(path):<28} {str(x.shape):<12} {x.dtype}")

# %% [markdown] workshop={"agenda": "half-day"}
# ## Exercise 1: predict FSDP's collectives (before compiling)
#
# Under FSDP each parameter that splits over the 8 devices lives as a 1/8 shard (split
# its first dimension that 8 divides; a parameter with none stays whole) and the batch is
# split too. Each step gathers every sharded weight before the forward pass and sums
# every gradient over the devices.
#
# Predict, **per device**, the bytes that go into each kind of collective on **8 simulated
# CPU devices**, as a dict `{kind: bytes}` with the HLO's kind names (`"all-gather"`,
# `"all-reduce"`, `"reduce-scatter"`, ...) and the operand convention of chapter 6: an
# all-gather's operand is the shard a device holds; a gradient reduction's operand is
# the whole gradient. The chapter's FSDP section says which kind sums the gradients on
# the CPU backend. Parameters are fp32. (A few scalars, the loss and the accuracy, ride
# along: the tolerance is 10%.)

# %%
# Exercise 1 (predict FSDP's collectives): write your code here
leaves = NotWritten("Exercise 1 (predict FSDP's collectives)")
predicted_fsdp = NotWritten("Exercise 1 (predict FSDP's collectives)")

# %%
ch06.LAB.predict("Exercise 1", predicted_fsdp)

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 2: FSDP of the chapter-5 model, by annotations alone
#
# Write `shard_fsdp(step, state, mesh)` returning `(jitted_step, state_sharding,
# batch_sharding)`:
#
# * `state_sharding`: a `NamedSharding` for every leaf of the whole `TrainState` (step
#   counter, parameters, Adam's moments): the first dimension that the mesh's `"data"`
#   axis divides is split over it, anything else replicated;
# * `batch_sharding`: the batch split over `"data"`;
# * `jitted_step`: the chapter-5 `step`, unchanged inside, under `jax.jit` with
#   `in_shardings`/`out_shardings`, plus the one annotation FSDP needs (the chapter's FSDP
#   cell): the parameters constrained to be whole where the step uses them. Without it
#   XLA may move the batch around instead (the check says so).
#
# The check looks at every leaf's sharding and at the bytes each device takes in and
# gives back, then trains two steps beside the single-device step. The grader also runs
# it on another mesh size and model width: take the sizes from `mesh` and the state.

# %%
def shard_fsdp(step, state, mesh):
    raise NotImplementedError(
        "Exercise 2 (FSDP of the chapter-5 model by annotations): "
        "write your code here")


# %%
ch06.check_shard_fsdp(shard_fsdp)

# %% [markdown]
# The compiled step, on this backend: every collective XLA inserted, with its bytes per
# device (shown once your exercise-1 prediction is recorded). Then exercise 1's prediction
# is graded against the course's FSDP step compiled on the same 8 devices: the same
# program as a right exercise 2, so the two numbers agree once your step is right.

# %%
if ch06.LAB.predicted("Exercise 1"):
    with checks.skip_if_not_written():
        jitted, s_state, s_batch = shard_fsdp(step, state, mesh)
        abstract = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            state, s_state)
        batch = train.Batch(*(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s_batch)
                              for a in ch06.chapter5_problem()[2][0]))
        fsdp_report = hlo.inspect(jitted, abstract, batch)
        for c in fsdp_report.collectives:
            print(f"[sim] {c}")
        print("[sim] per kind:", fsdp_report.by_kind())
        print(f"[sim] argument bytes per device: {fsdp_report.argument_bytes:,}")

# %%
if ch06.LAB.predicted("Exercise 1"):
    display(ch06.check_fsdp_prediction(predicted_fsdp))

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 3: the same step for a v5e-8 (compile-only)
#
# The TPU compiler runs here without a TPU (where `libtpu` matches your jax). Compile
# *your* `shard_fsdp` for a `v5e:2x4` topology. Before running the check, predict the
# HLO kind (a string) of the collective that carries the large gradients there. Think
# about what each device keeps of a gradient under FSDP, and what the CPU backend did
# to get there.

# %%
# Exercise 3 (FSDP on a v5e-8: predict, then compile): write your code here
predicted_v5e_kind = NotWritten("Exercise 3 (FSDP on a v5e-8: predict, then compile)")

# %%
ch06.LAB.predict("Exercise 3", predicted_v5e_kind)

# %% [markdown]
# The check compiles the chapter's FSDP step for the v5e-8 and compares the kind the TPU
# compiler chose with yours; then every collective of that program is printed. It runs
# once your prediction is recorded (and locks it).

# %%
if ch06.LAB.predicted("Exercise 3"):
    display(ch06.check_v5e_kind(predicted_v5e_kind))
    if hlo.tpu_compiler_problem() is None:
        print("[v5e-8] bytes per device by kind:")
        for kind, size in ch06.fsdp_collectives("v5e:2x4").items():
            print(f"  {kind:<16} {size:>12,}")

# %% [markdown] workshop={"agenda": "self-paced"}
# **The lesson.** The same annotations give different programs on different backends.
# The CPU backend all-reduces every gradient and each device then keeps its slice; the
# TPU compiler fuses that into a reduce-scatter ("all-reduce-scatter"): the same operand
# bytes per device, but each chip receives only its shard, so the ring moves half the
# data (the cost model's `reduce_scatter_time` against `all_reduce_time`). Grade a
# prediction against the backend it was compiled for.
#
# The v5e-8 program also holds one **collective-permute** (43,008 bytes per device) that
# the CPU program does not. The TPU keeps a 32-bit array in tiles of 8 rows (chapter 4).
# The first weight's 784 rows split into shards of 98, not a whole number of tiles, so
# the compiler pads the gradient to 832 rows and reduce-scatters 8 pieces of 104. Piece
# *k* starts at row 104*k while the state's shard *k* starts at 98*k: each device passes
# its neighbour the rows it holds but does not own, at most 7 x 6 = 42 rows of 256
# floats, 43,008 bytes. It is layout bookkeeping, not the batch moving (the check's
# message derives it from your step's shapes). Weights whose shards are whole tiles need
# none.
#
# ## Exercise 4 (apply): a bidirectional ring all-reduce
#
# The chapter's ring sends every chunk one way round. ICI links carry traffic both ways
# at once (the book's $W_{ici}$ is bidirectional), so a ring that sends half the data
# right and half left finishes in half the time. Write
# `bidirectional_all_reduce(x, axis, n)` for use inside `jax.shard_map` (as the chapter's
# ring): only `jax.lax.ppermute` and `jax.lax.axis_index`; split the flat array into two
# halves of `n` chunks each, run the rightward ring on one half and a leftward ring on the
# other, and return the full sum with `x`'s shape. The grader also runs it on rings of
# other sizes and other block shapes.

# %%
def bidirectional_all_reduce(x, axis: str, n: int):
    raise NotImplementedError(
        "Exercise 4 (a bidirectional ring all-reduce): "
        "write your code here")


# %%
ch06.check_bidirectional(bidirectional_all_reduce)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 5 (apply): a hierarchical all-reduce across slices
#
# Two slices of 4 chips: a `("slice", "chip")` mesh of shape 2x4, where `"chip"` is ICI
# and `"slice"` the data-centre network, 14-29x slower than one ICI axis (chapter 6,
# section 5).
# A flat `psum` over both axes would push every byte across slices. Write
# `hierarchical_all_reduce(x)` (inside `jax.shard_map` on that mesh; `x` is one device's
# block, whose first dimension the number of chips divides) that returns the same sum
# while only **a quarter** of each device's array (1/|chip| on other meshes) crosses
# slices. Collectives allowed: `psum`, `psum_scatter`, `all_gather` with an axis name
# each. The grader also runs it on other meshes and block sizes.

# %%
def hierarchical_all_reduce(x):
    raise NotImplementedError(
        "Exercise 5 (a hierarchical all-reduce across slices): "
        "write your code here")


# %%
ch06.check_hierarchical(hierarchical_all_reduce)

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 6 (apply): choose a strategy
#
# For `params` parameters on `chip` (`'v5e'`, `'v5p'`, `'v6e'`) trained with Adam, with
# `tokens_per_slice` tokens per step on each of `slices` slices, return
# `(within_slice, across_slices)`:
#
# * inside a slice, `'dp'` or `'fsdp'`: does a full replica, 10 bytes per parameter in
#   the scaling book's count, fit in the chip's HBM?
# * across slices, `'none'` (one slice), `'dp'` or `'pipeline'`: is DP across slices
#   compute-bound? Use the **course's variant** of the DCN rule from the chapter (fp32
#   gradients all-reduced by a ring over the $S$ slices, the backward pass's 4 FLOPs per
#   parameter per token hiding it), not the book's $C/W_{dcn}$: the two agree at two
#   slices and part beyond. DP when the tokens per slice reach the threshold.
#
# Write both rules yourself, with the chip's numbers from `tpu_course.hardware`
# (`hardware.get(chip)`: `hbm_bytes`, `peak_bf16_flops_per_s`, `dcn_bytes_per_s`).
# (`comms.recommend` makes the same plan: the cell after the check sets yours beside it.)
# The grader also tries other chips, sizes and slice counts.

# %%
def choose(chip: str, params: float, tokens_per_slice: float, slices: int):
    raise NotImplementedError("Exercise 6 (choose a strategy): write your code here")


# %%
ch06.check_strategy(choose)

# %% [markdown]
# **Justify it.** Your plan beside the cost model's reasoning for two cases the check
# does not use: the second has more tokens per slice than the book's $C/W_{dcn}$ asks
# for, and still too few for DP across eight slices.

# %%
for case in [("v5p", 8e10, 3e4, 2), ("v5p", 4e9, 1e5, 8)]:
    with checks.skip_if_not_written():
        print(f"{case}: yours {choose(*case)}")
        print(comms.recommend(*case))

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 7 (apply): each process's rows of the global batch
#
# In the chapter's two-process run each process fed one contiguous block of every global
# batch, `x[process_index * per:(process_index + 1) * per]`: right there because
# `jax.make_mesh` put each process's devices next to each other on the mesh. Meshes need
# not be laid out so. The check runs a two-process job like the chapter's (2 CPU devices
# each, `jax.distributed` over gloo on 127.0.0.1) on a `data` axis whose devices
# alternate between the processes (process 0, process 1, process 0, process 1), so each
# process holds blocks 0 and 2, or 1 and 3, of a 16-row batch.
#
# Write `process_rows(global_batch, sharding)`: the rows of `global_batch` (a numpy array)
# that this process hands to `jax.make_array_from_process_local_data(sharding, rows,
# global_batch.shape)`: each block its devices hold, once, in the order of the global
# batch. Ask the sharding: `sharding.addressable_devices_indices_map(global_batch.shape)`
# maps each of this process's devices to the index (a tuple of slices) of the block it
# holds. Each worker process runs your function from its source, with `np` and `jax`
# imported: keep any helper inside it. The check gathers the assembled array back with
# `process_allgather` and compares it with the global batch. The grader also runs a
# `(data, model)` mesh where both devices of a process hold the same block.

# %%
def process_rows(global_batch, sharding):
    raise NotImplementedError(
        "Exercise 7 (each process's rows of the global batch): "
        "write your code here")


# %%
ch06.check_process_rows(process_rows)

# %% [markdown]
# ## Scorecard

# %%
ch06.LAB.scorecard(globals())


# %% [markdown]
# ## Hand in
#
# Write the id your instructor asked for (your course login or e-mail) between the quotes
# and run the cell: it records who hands the lab in, inside the notebook itself. Then save
# the notebook as the cell says and hand in the `.ipynb` file.

# %%
from tpu_course import checks

MY_ID = ""
checks.hand_in(checks.lab(6), MY_ID)
