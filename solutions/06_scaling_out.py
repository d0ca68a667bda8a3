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
# # Lab 6 (solution): shard a model and explain every collective
#
# Four exercises on 8 simulated CPU devices (the same code runs on a TPU slice):
#
# 1. write the shardings of an MLP block for data parallelism, FSDP and tensor
#    parallelism;
# 2. predict, for each, the collectives XLA will emit and their bytes, and check the
#    prediction against the compiled HLO;
# 3. write a ring all-reduce from `ppermute` and show it equals `psum`;
# 4. choose a parallelism plan for a model, a batch and a slice count, from the cost model.
#
# Each exercise is followed by a checker cell that says whether the answer is right and,
# if not, what the mistake looks like. Then the chapter-5 model is sharded three ways.

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

runtime.simulate_devices(8)  # before anything starts JAX
print(runtime.describe().banner())

# %%
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from tpu_course import checks, comms, hlo, parallel
from tpu_course.checks import ch06

mesh = parallel.cpu_mesh((8,), ("data",))  # the simulated tier, even beside a TPU
print("mesh:", dict(mesh.shape))

# %% [markdown]
# ## Exercise 1: shardings
#
# The block is `relu(x @ w1) @ w2` with `w1: [D, F]` and `w2: [F, D]`; the batch `x` is
# `[B, D]`. Return `(param_specs, batch_spec)`: a dict `{'w1': spec, 'w2': spec}` of
# `PartitionSpec`s and the batch's spec, for `strategy` in `'dp'`, `'fsdp'`, `'tp'`
# (Megatron: `w1` by columns, `w2` by rows), over the mesh axis `axis`.

# %%
def block_specs(strategy: str, axis: str):
    ### BEGIN SOLUTION Exercise 1 (shardings)
    if strategy == "dp":
        return {"w1": P(), "w2": P()}, P(axis)
    if strategy == "fsdp":
        return {"w1": P(axis), "w2": P(axis)}, P(axis)
    return {"w1": P(None, axis), "w2": P(axis, None)}, P()
    ### END SOLUTION


# %%
ch06.check_block_specs(block_specs)

# %% [markdown]
# ## Exercise 2: predict the collectives, then compile
#
# `parallel.mlp_block_step(strategy, mesh)` is one SGD step on a squared error, written
# with `shard_map` (read its docstring for what each strategy communicates). Predict,
# per device, `{kind: (arrays, bytes)}` where `kind` is `'all-reduce'`, `'all-gather'`,
# `'reduce-scatter'` ..., `arrays` how many arrays go through that kind of collective in
# one step, and `bytes` the sum of their **operands** on one device (an all-gather's
# operand is the device's shard; a reduce-scatter's the whole array). The parameters
# and data are fp32 (4 bytes); the mean loss is one fp32 scalar.

# %%
def predict(strategy: str, devices: int, batch: int, d_model: int, d_ff: int,
            bytes_per_elem: int = 4) -> dict:
    ### BEGIN SOLUTION Exercise 2 (predict the collectives)
    weights = 2 * d_model * d_ff * bytes_per_elem  # w1 and w2
    loss = bytes_per_elem
    if strategy == "dp":  # both gradients and the loss are summed over the batch shards
        return {"all-reduce": (3, weights + loss)}
    if strategy == "fsdp":  # gather the shards, reduce-scatter the gradients, average the loss
        return {"all-gather": (2, weights // devices), "reduce-scatter": (2, weights),
                "all-reduce": (1, loss)}
    return {"all-reduce": (1, batch * d_model * bytes_per_elem)}  # TP: the partial outputs
    ### END SOLUTION


# %%
B, D, F = 64, 256, 1024
results = []
for strategy in ("dp", "fsdp", "tp"):
    args = parallel.mlp_block_abstract(strategy, mesh, B, D, F)
    report = hlo.inspect(parallel.mlp_block_step(strategy, mesh), *args)
    compiled = parallel.observed_collectives(report)
    results.append(ch06.check_prediction(strategy, predict(strategy, 8, B, D, F), compiled, 8))
for r in results:
    print(r)

# %% [markdown]
# ## Exercise 3: a ring all-reduce from `ppermute`
#
# Inside `shard_map`, `x` is this device's block. Return the sum of `x` over the `n`
# devices of `axis`, using only `jax.lax.ppermute` (and `jax.lax.axis_index`): cut `x`
# into `n` chunks; `n-1` reduce-scatter steps (send one chunk right, add what arrives to
# the same chunk index), then `n-1` all-gather steps (pass the finished chunks on).

# %%
def ring_all_reduce(x, axis: str, n: int):
    ### BEGIN SOLUTION Exercise 3 (ring all-reduce)
    flat = x.reshape(-1)
    pad = (-flat.size) % n
    chunks = jnp.pad(flat, (0, pad)).reshape(n, -1)
    me = jax.lax.axis_index(axis)
    right = [(i, (i + 1) % n) for i in range(n)]
    for s in range(n - 1):
        got = jax.lax.ppermute(chunks[(me - s) % n], axis, right)
        chunks = chunks.at[(me - 1 - s) % n].add(got)
    for s in range(n - 1):
        got = jax.lax.ppermute(chunks[(me + 1 - s) % n], axis, right)
        chunks = chunks.at[(me - s) % n].set(got)
    return chunks.reshape(-1)[: flat.size].reshape(x.shape)
    ### END SOLUTION


# %%
ch06.check_ring(ring_all_reduce, mesh)

# %% [markdown]
# ## Exercise 4: choose a strategy
#
# For `params` parameters on `chip` (`'v5e'`, `'v5p'`, `'v6e'`) trained with Adam, with
# `tokens_per_slice` tokens per step on each of `slices` slices, return
# `(within_slice, across_slices)`: `'dp'` or `'fsdp'` inside a slice (does a full replica,
# 10 bytes per parameter in the scaling book's count, fit in HBM?), and `'none'` (one
# slice), `'dp'` or `'pipeline'` across slices (is the batch above
# `comms.dcn_min_tokens_per_slice`?). Use `tpu_course.hardware` and `tpu_course.comms`.

# %%
from tpu_course import hardware


def choose(chip: str, params: float, tokens_per_slice: float, slices: int):
    ### BEGIN SOLUTION Exercise 4 (choose a strategy)
    within = "fsdp" if 10 * params > hardware.get(chip).hbm_bytes else "dp"
    if slices == 1:
        return within, "none"
    enough = tokens_per_slice >= comms.dcn_min_tokens_per_slice(chip, slices)
    return within, ("dp" if enough else "pipeline")
    ### END SOLUTION


# %%
ch06.check_strategy(choose)

# %% [markdown]
# **Justify it.** The cost model's own reasoning for one case (compare with yours):

# %%
print(comms.recommend("v5p", 7e10, 2e4, slices=2))

# %% [markdown]
# ## The chapter-5 model, sharded three ways
#
# The chapter-5 `models.MLP` and its `train.make_train_step`, unchanged, jitted with each
# strategy's shardings (`parallel.make_sharded_train_step`): the losses of a few steps
# must equal the single-device run's (relative tolerance 2e-5). Random images keep this
# lab offline-proof; the chapter does the same on MNIST.

# %%
rng = np.random.default_rng(0)
imgs = rng.integers(0, 255, (192, 28, 28), dtype=np.uint8)
labels = rng.integers(0, 10, (192,)).astype(np.int32)
reference = parallel.train_chapter5(None, mesh, imgs, labels, steps=3)
for strategy in ("dp", "fsdp", "tp"):
    losses = parallel.train_chapter5(strategy, mesh, imgs, labels, steps=3)
    print(f"{strategy:<5} {np.round(losses, 4).tolist()} equal to single device: "
          f"{np.allclose(losses, reference, rtol=2e-5)}")
