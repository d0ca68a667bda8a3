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
# # Lab 8 (solution): Train, shard, fit and serve the chapter-8 language model
#
# About 125 minutes, seven exercises, on 8 simulated CPU devices (the same code runs on a
# TPU slice):
#
# 1. **predict** (15 min) the parameter count and the training FLOPs per token of a
#    model the chapter did not build; then the model is counted and XLA compiles it;
# 2. **write** (15 min) causal attention's forward pass: scores, causal mask, softmax,
#    weighted values, in the dtype that came in;
# 3. **write** (25 min) the sharded train step: a mesh you build, `jax.jit` with
#    `in_shardings`/`out_shardings` for tensor parallelism of attention (heads on
#    `"model"`) with FSDP on `"data"`, Adam's moments and the batch included; graded by
#    the compiled shardings and collectives and by two steps against one device;
# 4. **predict** (15 min) which `jax.checkpoint` policy fits a memory budget while
#    recomputing the least; then each policy's step is compiled and measured with
#    `memory_analysis()`;
# 5. **write** (20 min) a training loop that resumes from its latest Orbax checkpoint and
#    continues exactly as an uninterrupted run would;
# 6. **write** (25 min) the decode loop: prefill the KV cache, then one byte at a time,
#    greedy or sampled with a temperature and top-k;
# 7. **predict** (10 min) the batch size at which decoding turns compute-bound on a v5e.
#
# Each exercise is followed by a check cell: pass, or a hint (the expected value only
# through `checks.reveal("Exercise N")`). The last cell is the scorecard.
#
# **Predictions first.** Exercises 1, 4 and 7 are predictions: a cell after each records
# yours (`ch08.LAB.predict(...)`), and the measurement is shown only after that. Once it
# has been shown in this session your prediction is locked: the check grades the one you
# recorded, not a value edited afterwards. (`tpu-course grade` re-runs the notebook and
# grades the value in the cell.)

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
import math
import pprint

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tpu_course import hardware, lm
from tpu_course.checks import NotWritten, ch08

ch08.LAB

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 1: predict the size and the FLOPs of a model the chapter did not build
#
# The chapter's model is `lm.LM(lm.LMConfig.cpu())`: token and position embeddings,
# pre-norm blocks (attention with `wq`, `wk`, `wv` of shape (d, heads, head_dim) and
# `wo` of (heads, head_dim, d); an MLP d -> d_ff -> d without biases; two RMSNorm
# scales), a final norm, and an output head (d, vocab) of its own. Predict, for the
# configuration below, **before** anything counts or compiles it:
#
# * `predicted_params`: its number of parameters;
# * `predicted_flops_per_token`: the FLOPs of one training step (forward and backward)
#   per token, on sequences of the full context: the 6N rule over the parameters that
#   multiply (the two embedding tables are lookups) plus attention's term, as in the
#   chapter.
#
# The check counts the model's leaves (exactly) and compares your FLOPs with the
# chapter's count (tolerance 2 %); XLA's count of the compiled step is shown beside it, a
# few per cent higher, since XLA also counts norms, softmax and GELU.

# %%
config = ch08.exercise1_config()
pprint.pp(config, width=88)

# %%
### BEGIN SOLUTION Exercise 1 (predict the parameters and FLOPs per token)
d, f, L, V, T = config.d_model, config.d_ff, config.layers, config.vocab, config.context
block = 4 * d * d + 2 * d * f + 2 * d  # attention, MLP, two norm scales
predicted_params = V * d + T * d + L * block + d + d * V  # tables, blocks, norm, head
multiplying = predicted_params - (V + T) * d  # the two tables are lookups
predicted_flops_per_token = 6 * multiplying + 12 * L * d * T  # 6N + attention
### END SOLUTION

# %%
ch08.LAB.predict("Exercise 1", predicted_params, predicted_flops_per_token)

# %% [markdown]
# The model's own count and XLA's, shown once your prediction is recorded:

# %% tags=["nbval-ignore-output"]
if ch08.LAB.predicted("Exercise 1"):
    print(f"parameters: {ch08.real_param_count(config):,}")
    print(f"FLOPs per token (XLA): {ch08.xla_flops_per_token(config):,.0f}")
    display(ch08.check_size_prediction(predicted_params, predicted_flops_per_token))

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 2: causal attention
#
# Write `causal_attention(q, k, v)`: `q`, `k` and `v` are (batch, length, heads,
# head_dim). For every head, query position i scores each key j with
# q_i . k_j / sqrt(head_dim); keys after the query (j > i) are masked out (their score
# set to -inf); a softmax over the keys turns the scores into weights; the output at i is
# the weighted sum of the values. Return (batch, length, heads, head_dim) **in the dtype
# that came in** (bfloat16 in, bfloat16 out; computing the softmax in float32 inside is
# fine). The check tries a float32 and a bfloat16 case; the grader also tries other
# (odd) lengths, head counts and widths.

# %%
def causal_attention(q, k, v):
    ### BEGIN SOLUTION Exercise 2 (causal attention)
    length = q.shape[1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])
    causal = jnp.tril(jnp.ones((length, length), bool))  # key j <= query i
    scores = jnp.where(causal, scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # over the keys
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v).astype(q.dtype)
    ### END SOLUTION


# %%
ch08.check_causal_attention(causal_attention)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 3: the sharded train step: FSDP x tensor parallelism
#
# The chapter's section 5 shards the whole model's step; here you write the sharded step
# yourself, for a model the chapter did not shard: one attention block shaped like
# `lm.Attention`, with a tied embedding (vocab, d), trained with AdamW. Its state is
# `(params, opt_state)`; `step(state, tokens) -> (state, loss)`.
#
# Write `sharded_step(step, state, mesh_shape)` that builds a mesh of `mesh_shape` with
# the axes `("data", "model")` from `jax.devices()` and returns
# `jax.jit(step, in_shardings=..., out_shardings=...)` where
# * each weight is cut for **tensor parallelism** on `"model"`, the heads axis of `wq`,
#   `wk`, `wv` (d, heads, head_dim) and `wo` (heads, head_dim, d), and for **FSDP** on
#   `"data"`, their d axis and the embedding's rows (not its features);
# * Adam's `mu` and `nu` are laid out like their parameters, scalars replicated;
# * the tokens (batch, length) are cut on `"data"`;
# * the state comes back laid out as it went in, the loss replicated.
#
# The check compiles your step, reads the shardings it takes and returns and its
# collectives, and trains two steps beside one device. The grader also runs another mesh
# shape and head count, so build from `mesh_shape`, not from (4, 2).

# %%
step, state, tokens, tx = ch08.attention_problem()
pprint.pp(jax.tree.map(jnp.shape, state[0]), width=88)


# %%
def sharded_step(step, state, mesh_shape):
    ### BEGIN SOLUTION Exercise 3 (the sharded train step: FSDP x tensor parallelism)
    auto = (jax.sharding.AxisType.Auto,) * 2
    n = mesh_shape[0] * mesh_shape[1]
    mesh = jax.make_mesh(mesh_shape, ("data", "model"), axis_types=auto,
                         devices=jax.devices()[:n])
    layout = {"embed": P("data", None), "wo": P("model", None, "data")}
    for name in ("wq", "wk", "wv"):
        layout[name] = P("data", "model", None)

    def place(path, leaf):
        keys = [getattr(k, "key", None) for k in path]
        name = next((k for k in keys if k in layout), None)
        if name is None or np.ndim(leaf) == 0:
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, layout[name])

    # the parameters and Adam's moments, by the name in each leaf's path
    state_shardings = jax.tree_util.tree_map_with_path(place, state)
    batch = NamedSharding(mesh, P("data"))
    return jax.jit(step, in_shardings=(state_shardings, batch),
                   out_shardings=(state_shardings, NamedSharding(mesh, P())))
    ### END SOLUTION


# %%
ch08.check_sharded_step(sharded_step)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 4: a remat policy that fits the budget
#
# The check compiles the training step of a stack of 4 pre-norm blocks (attention and an
# MLP, as `lm.Block`), scanned over the layers, with each block under
# `jax.checkpoint(block, policy=...)`, for batch 8 x 64 tokens. The budget is
# **10 MB of temporary memory** (`compiled.memory_analysis().temp_size_in_bytes`).
#
# Predict which policy fits the budget **and** recomputes the least (the fewest FLOPs of
# those that fit): one of `ch08.POLICIES`, the names in `jax.checkpoint_policies`
# (`"none"` for no remat). Think about which matmul outputs are large: the weight
# matmuls give (batch, length, d) activations, attention's scores are (batch, heads,
# length, length).

# %%
pprint.pp(ch08.POLICIES, width=88)
print("layers, batch, length, d_model, d_ff, heads:", ch08.REMAT_SHAPE)

# %%
### BEGIN SOLUTION Exercise 4 (a remat policy that fits the budget)
chosen_policy = "dots_with_no_batch_dims_saveable"  # weight matmuls, not the scores
### END SOLUTION

# %%
ch08.LAB.predict("Exercise 4", chosen_policy)

# %% [markdown]
# Every policy compiled, once your prediction is recorded (a few seconds each):

# %% tags=["nbval-ignore-output"]
if ch08.LAB.predicted("Exercise 4"):
    for name in ch08.POLICIES:
        temp, flops = ch08.remat_measurement(name)
        print(f"{name:<34} {temp / 1e6:6.1f} MB temporaries  {flops / 1e6:8.1f} MFLOPs")
    display(ch08.check_remat_policy(chosen_policy))

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 5: resume training from a checkpoint
#
# `ch08.resume_problem()` hands over a small model to train: `problem.init()` gives a
# fresh `(params, opt_state)`, `problem.step(params, opt_state, inputs, targets)` is one
# compiled training step returning `(params, opt_state, loss)`, and the batch of step k
# is `textdata.batch_at(problem.corpus, k, problem.batch, problem.length, problem.seed)`.
#
# Write `train(directory, steps, problem)` that trains up to `steps` steps and returns
# the params: with `ocp.CheckpointManager(directory)` find the latest saved step
# (`latest_step()`, None when there is none), restore the params **and** the optimizer
# state saved there, train the steps from there to `steps` (call `problem.step` once
# per step, on that step's own batch), save the state under the number of steps trained,
# and return the params. The check runs `train` to 5 steps in one folder, and in
# another to 2 steps, then again to 5 (a restart): both must give the same parameters,
# bit for bit, and the restarted call must run only the 3 steps left. The grader also
# tries other lengths and stopping points.

# %%
import orbax.checkpoint as ocp

from tpu_course import textdata

problem = ch08.resume_problem()
problem


# %%
def train(directory, steps, problem):
    ### BEGIN SOLUTION Exercise 5 (resume training from a checkpoint)
    manager = ocp.CheckpointManager(directory)
    params, opt_state = problem.init()
    start = manager.latest_step() or 0  # steps already trained
    if start:
        state = manager.restore(start, args=ocp.args.StandardRestore(
            {"params": params, "opt_state": opt_state}))
        params, opt_state = state["params"], state["opt_state"]
    for step in range(start, steps):
        inputs, targets = textdata.batch_at(problem.corpus, step, problem.batch,
                                            problem.length, problem.seed)
        params, opt_state, loss = problem.step(params, opt_state, inputs, targets)
    if steps > start:
        manager.save(steps, args=ocp.args.StandardSave(
            {"params": params, "opt_state": opt_state}))
    manager.wait_until_finished()
    manager.close()
    return params
    ### END SOLUTION


# %%
ch08.check_resume(train)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 6: the decode loop with a KV cache
#
# Write `generate(model, prompt, steps, key, temperature, top_k)` returning the `steps`
# new bytes, (batch, steps), of an `lm.LM` continuing `prompt` (batch, length):
#
# * **prefill**: `logits, cache = model.decode(prompt, lm.init_cache(model.config,
#   batch))`, once; the next byte comes from `logits[:, -1]`;
# * **new byte i** (i = 0, 1, ...): at `temperature == 0`, the argmax of the logits
#   (greedy); otherwise, with `top_k` given, every logit below the `top_k`-th largest set
#   to `-inf`, then `jax.random.categorical(jax.random.fold_in(key, i), logits /
#   temperature)`;
# * then `model.decode(byte[:, None], cache)` with the cache the last call returned,
#   for the next logits.
#
# That key protocol makes sampling checkable exactly. The check runs a greedy and a
# sampled case on `ch08.decode_model()`; the grader also tries other prompts,
# temperatures and `top_k`.

# %%
def generate(model, prompt, steps, key, temperature=0.0, top_k=None):
    ### BEGIN SOLUTION Exercise 6 (the decode loop with a KV cache)
    cache = lm.init_cache(model.config, prompt.shape[0])
    logits, cache = model.decode(prompt, cache)  # prefill: the whole prompt at once
    new = []
    for i in range(steps):
        last = logits[:, -1]
        if temperature == 0:
            byte = jnp.argmax(last, axis=-1)
        else:
            if top_k is not None:
                kth = jax.lax.top_k(last, top_k)[0][:, -1:]
                last = jnp.where(last >= kth, last, -jnp.inf)
            step_key = jax.random.fold_in(key, i)
            byte = jax.random.categorical(step_key, last / temperature)
        new.append(byte)
        logits, cache = model.decode(byte[:, None].astype(jnp.int32), cache)
    return jnp.stack(new, axis=1)
    ### END SOLUTION


# %%
ch08.check_generate(generate)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 7: the batch where decoding turns compute-bound
#
# One decode step reads every weight once (bf16: 2 bytes per parameter) and each
# sequence's KV cache (bf16 keys and values: 2 x layers x d_model numbers per cached
# position), and does 2 FLOPs per multiplying parameter plus attention's 4 x layers x
# d_model x t per sequence (t = position + 1 cached positions). Predict the batch size
# at which that step reaches the ridge point of a **v5e** (bf16 peak / HBM bandwidth,
# from `tpu_course.hardware`) for the model below at **position 15**. Beyond it,
# decoding is compute-bound.

# %%
pprint.pp(ch08.decode_config(), width=88)
print(ch08.DECODE_CHIP, "at position", ch08.DECODE_POSITION)
print(hardware.get(ch08.DECODE_CHIP).summary())

# %%
### BEGIN SOLUTION Exercise 7 (the batch where decoding turns compute-bound)
chip = hardware.get("v5e")
t = 15 + 1
d, L, V, T = 2048, 24, 256, 2048  # width, layers, bytes, context
tables = V * d + T * d  # token and position embeddings: lookups, no FLOPs
block = 4 * d * d + 2 * d * 4 * d + 2 * d  # attention, MLP (d_ff = 4 d), norms
weights_n = L * block + tables + d + d * V  # blocks, tables, final norm, head
flops_one = 2 * (weights_n - tables) + 4 * L * d * t
cache_one = 2 * L * d * t * 2  # bytes of one sequence's keys and values
ridge = chip.peak_bf16_flops_per_s / chip.hbm_bytes_per_s
predicted_batch = ridge * 2 * weights_n / (flops_one - ridge * cache_one)
### END SOLUTION

# %%
ch08.LAB.predict("Exercise 7", predicted_batch)

# %% [markdown]
# The course's roofline (`lm.decode_cost`) at batch sizes around it, once your
# prediction is recorded:

# %%
if ch08.LAB.predicted("Exercise 7"):
    for b in (1, 64, 256, 351, 1024):
        cost = lm.decode_cost(ch08.decode_config(), b, ch08.DECODE_POSITION)
        ridge_v5e = hardware.get(ch08.DECODE_CHIP).critical_intensity()
        bound = "compute" if cost.intensity >= ridge_v5e else "memory"
        print(f"batch {b:>5}: {cost.intensity:6.1f} FLOPs/byte, {bound}-bound")
    display(ch08.check_ridge_batch(predicted_batch))

# %% [markdown]
# ## Scorecard

# %%
ch08.LAB.scorecard(globals())


# %% [markdown]
# ## Hand in
#
# Write the id your instructor asked for (your course login or e-mail) between the quotes
# and run the cell: it records who hands the lab in, inside the notebook itself. Then save
# the notebook as the cell says and hand in the `.ipynb` file.

# %%
from tpu_course import checks

MY_ID = ""
checks.hand_in(checks.lab(8), MY_ID)
