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

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 5, "agenda": "self-paced"}
# # Chapter 8: A language model across chips: train, profile, survive, serve
#
# The course ends where most TPU work starts: a transformer language model. This
# chapter writes a small decoder-only transformer over bytes in Flax NNX, predicts its
# parameter count and FLOPs per token and checks them against XLA, trains it on text
# every machine has (the Python standard library's own source), shards it over a mesh
# of 8 devices with FSDP and tensor parallelism written as annotations, compiles it for
# a TPU v5e-8 without one, reads a profile of a step without TensorBoard, survives a
# real preemption (a training process killed mid-run and resumed from Orbax), and serves
# it with a KV cache against the decode roofline. Chapters 1-7 all come back.
#
# Where this runs on a CPU, the 8 devices are simulated (`[sim]`) and every timing is a
# CPU timing, never a TPU timing. Sizes: 0.48 million parameters here
# (`LMConfig.cpu(layers=2)`: a 2-core CPU trains its 400 steps in 1.5-3 minutes,
# about 160 CPU-seconds); the same code takes `LMConfig.tpu()` (25.7 million) on a
# v5e-8.
#
# **Notation** (chapter 6's, plus the model's):
#
# | symbol | meaning |
# | --- | --- |
# | $N$ | parameters that multiply (all but the two embedding tables) |
# | $L$, $d$, $F$, $H$ | layers, d_model, the MLP's hidden width, attention heads |
# | $T$ | sequence length (context), $t$: positions in the KV cache |
# | $B$ | sequences in a batch; $C$: peak FLOP/s per chip; $W_{hbm}$: HBM bytes/s |

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

runtime.simulate_devices(8)  # before anything starts JAX: the 8 simulated CPU devices
rt = runtime.describe()
print(rt.banner())

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
import dataclasses
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from importlib import resources
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from tpu_course import bench, comms, costs, errors, hardware, hlo, lm, profiling
from tpu_course import textdata
from tpu_course.lm import KVCache, LMConfig, check_config, check_tokens

HAVE_TPU_COMPILER = hlo.tpu_compiler_available()
print(f"jax {jax.__version__}, flax {flax.__version__}; "
      f"{len(jax.devices())} devices: {jax.devices()[0].platform}")
print("aot tier:", "the TPU compiler is available" if HAVE_TPU_COMPILER
      else f"unavailable: {hlo.tpu_compiler_problem()}")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 12, "agenda": "self-paced"}
# ## 1. The model
#
# GPT-2's shape at toy size (Radford et al. 2019; Karpathy's nanoGPT): bytes in, a
# token embedding plus a learned position embedding, $L$ pre-norm blocks of causal
# multi-head self-attention and an MLP, each inside a residual connection, a final
# RMSNorm, and an output head to 256 logits. The weights are plain `nnx.Param` arrays
# used with `jnp.einsum`, shaped so their axes say what they are: a query weight is
# `(d, heads, head_dim)`, so "put the heads on the model axis" will be one
# `PartitionSpec`. Parameters are float32 (the master weights); the matmuls run in
# `config.compute_dtype` (bf16 on a chip, section 4), the softmax and norms in float32.
#
# `decode` is the same forward pass over tokens placed after a **KV cache**: section 8
# uses it to serve. This is `tpu_course.lm`'s code (the lab and the tests reuse it):

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.lm.RMSNorm, tpu_course.lm.Attention, tpu_course.lm.MLP
class RMSNorm(nnx.Module):
    """x / rms(x) * scale, in float32 (Zhang and Sennrich 2019)."""

    def __init__(self, d: int):
        self.scale = nnx.Param(jnp.ones((d,), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        rms = jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        return (x32 / rms * self.scale[...]).astype(x.dtype)



class Attention(nnx.Module):
    """Causal multi-head self-attention; weights shaped (d, heads, head_dim)."""

    def __init__(self, config: LMConfig, rngs: nnx.Rngs):
        d, h, k = config.d_model, config.heads, config.head_dim
        init = nnx.initializers.normal(stddev=d ** -0.5)
        self.wq = nnx.Param(init(rngs.params(), (d, h, k)))
        self.wk = nnx.Param(init(rngs.params(), (d, h, k)))
        self.wv = nnx.Param(init(rngs.params(), (d, h, k)))
        # the output projection starts small so each block starts near the identity
        depth = math.sqrt(2 * config.layers)
        self.wo = nnx.Param(init(rngs.params(), (h, k, d)) / depth)
        self.dtype = jnp.dtype(config.compute_dtype)

    def __call__(self, x: jax.Array, cache: tuple | None = None,
                 start: jax.Array | int = 0) -> tuple[jax.Array, tuple]:
        """x (batch, s, d) at positions start..start+s-1 -> (out, (keys, values)).

        Without a cache, queries attend to the s keys of x itself. With a cache
        ``(keys, values)`` of (batch, context, heads, head_dim), x's keys and values
        are written at ``start`` and the queries attend to every cached position up to
        their own.
        """
        dt = self.dtype
        q = jnp.einsum("bsd,dhk->bshk", x, self.wq[...].astype(dt))
        k = jnp.einsum("bsd,dhk->bshk", x, self.wk[...].astype(dt))
        v = jnp.einsum("bsd,dhk->bshk", x, self.wv[...].astype(dt))
        query_pos = start + jnp.arange(x.shape[1])
        if cache is None:
            keys, values = k, v
            key_pos = jnp.arange(x.shape[1])
        else:
            at = (0, start, 0, 0)
            update = jax.lax.dynamic_update_slice
            keys = update(cache[0], k.astype(cache[0].dtype), at)
            values = update(cache[1], v.astype(cache[1].dtype), at)
            key_pos = jnp.arange(keys.shape[1])
        scores = jnp.einsum("bshk,bthk->bhst", q, keys.astype(dt))
        scores = scores.astype(jnp.float32) / math.sqrt(q.shape[-1])
        causal = key_pos[None, :] <= query_pos[:, None]  # (s, t): no peeking ahead
        scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        out = jnp.einsum("bhst,bthk->bshk", probs, values.astype(dt))
        return jnp.einsum("bshk,hkd->bsd", out, self.wo[...].astype(dt)), (keys, values)



class MLP(nnx.Module):
    """d -> d_ff -> d with a GELU; weights (d, d_ff) and (d_ff, d)."""

    def __init__(self, config: LMConfig, rngs: nnx.Rngs):
        d, f = config.d_model, config.d_ff
        self.w_in = nnx.Param(nnx.initializers.normal(d ** -0.5)(rngs.params(), (d, f)))
        self.w_out = nnx.Param(nnx.initializers.normal(f ** -0.5)(rngs.params(), (f, d))
                               / math.sqrt(2 * config.layers))
        self.dtype = jnp.dtype(config.compute_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", x, self.w_in[...].astype(self.dtype)))
        return jnp.einsum("bsf,fd->bsd", h, self.w_out[...].astype(self.dtype))

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.lm.Block, tpu_course.lm.LM
class Block(nnx.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)): a pre-norm transformer block."""

    def __init__(self, config: LMConfig, rngs: nnx.Rngs):
        self.norm1 = RMSNorm(config.d_model)
        self.attention = Attention(config, rngs)
        self.norm2 = RMSNorm(config.d_model)
        self.mlp = MLP(config, rngs)

    def __call__(self, x: jax.Array, cache: tuple | None = None,
                 start: jax.Array | int = 0) -> tuple[jax.Array, tuple]:
        attended, cache = self.attention(self.norm1(x), cache, start)
        x = x + attended
        return x + self.mlp(self.norm2(x)), cache



class LM(nnx.Module):
    """The decoder-only transformer: bytes (batch, length) -> logits (batch, length,
    256)."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        self.config = check_config(config)
        d = config.d_model
        init = nnx.initializers.normal
        self.embed = nnx.Param(init(1.0)(rngs.params(), (config.vocab, d)))
        self.positions = nnx.Param(init(0.5)(rngs.params(), (config.context, d)))
        # nnx.data: a list of submodules is part of the model's state (flax >= 0.12)
        self.blocks = nnx.data([Block(config, rngs) for _ in range(config.layers)])
        self.norm = RMSNorm(d)
        # a separate output head, zero at the start: every byte equally likely, 8 bits
        self.head = nnx.Param(jnp.zeros((d, config.vocab), jnp.float32))

    def _forward(self, tokens: jax.Array, caches: list | None,
                 start: jax.Array | int) -> tuple[jax.Array, list]:
        dt = jnp.dtype(self.config.compute_dtype)
        positions = start + jnp.arange(tokens.shape[1])
        x = (self.embed[...][tokens] + self.positions[...][positions]).astype(dt)
        new_caches = []
        for i, block in enumerate(self.blocks):
            if caches is None and self.config.remat != "none":
                # training: keep only what the policy saves, recompute the rest
                policy = getattr(jax.checkpoint_policies, self.config.remat)
                x, layer_cache = nnx.remat(Block.__call__, policy=policy)(block, x)
            else:
                x, layer_cache = block(x, None if caches is None else caches[i], start)
            new_caches.append(layer_cache)
        x = self.norm(x)
        logits = jnp.einsum("bsd,dv->bsv", x, self.head[...].astype(dt))
        return logits.astype(jnp.float32), new_caches

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits (batch, length, vocab), float32; position i sees tokens 0..i only."""
        check_tokens(tokens, self.config, 0)
        return self._forward(tokens, None, 0)[0]

    def decode(self, tokens: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """Logits for ``tokens`` placed after the cache's ``length`` tokens, and the
        cache with their keys and values added. Equals ``model(all so far)[:, -s:]``."""
        check_tokens(tokens, self.config, None, cache=cache)
        caches = list(zip(cache.keys, cache.values))
        logits, new = self._forward(tokens, caches, cache.length)
        keys, values = zip(*new)
        length = cache.length + tokens.shape[1]
        return logits, KVCache(tuple(keys), tuple(values), length)

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 10, "agenda": "self-paced"}
# ## 2. Parameters and FLOPs per token: predicted, then compiled
#
# **Parameters.** Per block: $4d^2$ (query, key, value, output) $+ 2dF$ (the MLP)
# $+ 2d$ (two norm scales); plus $256d$ (token embedding), $Td$ (positions), $d$ (the
# final norm) and $256d$ (the head).
#
# **Training FLOPs per token** (forward + backward): $6N + 12LdT$. The $6N$ rule:
# a multiply-add per parameter forward ($2N$), twice that backward (Kaplan et al. 2020,
# sec. 2.1); $N$ leaves out the embedding tables, which are lookups, not matmuls. The
# attention term: per layer, scores $QK^\top$ and the weighted sum $PV$ are
# $2 \cdot 2Td$ FLOPs per token forward, times 3 with the backward pass (PaLM,
# Chowdhery et al. 2022, appendix B: $6N + 12LHQT$ with $HQ = d$; nanoGPT's
# `estimate_mfu` uses it). XLA counts the norms, softmax and GELU too, so its figure
# should be a few per cent higher.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
# the matmuls' dtype: bf16 where a matrix unit takes it, float32 on a CPU (section 4)
compute = "float32" if jax.default_backend() == "cpu" else "bfloat16"
# LMConfig.cpu()'s width and context with 2 layers instead of 5: a CPU trains 3.4
# times as many steps in the same time, which counts for more here (section 5)
config = LMConfig.cpu(layers=2, compute_dtype=compute)
d, L, F, T = config.d_model, config.layers, config.d_ff, config.context
by_hand = (256 * d + T * d + L * (4 * d * d + 2 * d * F + 2 * d) + d + d * 256)
model = LM(config, rngs=nnx.Rngs(0))
graphdef, params = nnx.split(model)
real = sum(x.size for x in jax.tree.leaves(params))
print(f"parameters: by hand {by_hand:,}, lm.param_count {lm.param_count(config):,}, "
      f"the model's arrays {real:,}")
N = real - (256 + T) * d
per_token = 6 * N + 12 * L * d * T
print(f"N = {N:,}; predicted training FLOPs per token at T={T}: "
      f"6N + 12LdT = {per_token:,}")


def loss_fn(params, inputs, targets):
    logits = nnx.merge(graphdef, params)(inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


tokens = jax.ShapeDtypeStruct((8, T), jnp.int32)
report = hlo.inspect(jax.grad(loss_fn), params, tokens, tokens)
xla_per_token = report.flops / (8 * T)
print(f"XLA's cost analysis: {xla_per_token:,.0f} FLOPs per token, "
      f"{xla_per_token / per_token:.3f} x the prediction")
attention = 12 * L * d * T
print(f"attention's 12LdT = {attention:,}: {attention / (6 * N):.1%} of 6N, "
      f"{attention / per_token:.1%} of 6N + 12LdT")

# %% [markdown] slideshow={"slide_type": "skip"}
# XLA's count is a few per cent above $6N + 12LdT$ (the exact ratio depends on the jax
# version: the tests allow 1.0-1.2). At this size the attention term is
# $12LdT / 6N$ = 393,216 / 2,559,744 = 15 % of $6N$, and so $0.15 / 1.15$ = 13 % of
# the total $6N + 12LdT$ (for `LMConfig.cpu()`'s 5 layers: 16 % and 14 %); it grows
# with $T$, which is why long contexts cost more than their parameter count says.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 6, "agenda": "self-paced"}
# ## 3. Data that every machine has
#
# Bytes of the Python standard library (`tpu_course.textdata`): every `*.py` of the
# running interpreter's library, without the `test/` and `tests/` folders, in sorted
# order. Its size depends on the interpreter (about 11-12 MB on CPython 3.12 and 3.13;
# 31.7 MB with the test suites, as measured for this chapter). Files are split by a hash of
# their path: about 10 % are held out, the same ones on every machine. No tokenizer:
# a token is a byte, so the loss in bits per byte is comparable across tokenizers.
# Where the runtime has internet, `textdata.download()` gives a public text the same way
# (Tiny Shakespeare, 1.1 MB, checked against its SHA-256 and cached; its last 10 % held
# out): pass it instead of `corpus` below.
#
# Two baselines to beat, from counts on the training files, scored on the held-out
# files: the **unigram** model (each byte's frequency) and the **bigram** model (the
# next byte given this one), both add-one smoothed. Uniform guessing is 8 bits.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
corpus = textdata.load()
print(textwrap.fill(str(corpus), 88))
unigram = textdata.unigram_bits_per_byte(corpus.train, corpus.heldout)
bigram = textdata.bigram_bits_per_byte(corpus.train, corpus.heldout)
print(f"held-out bits per byte: uniform 8.00, unigram {unigram:.2f}, "
      f"bigram {bigram:.2f}")
inputs, targets = textdata.batch_at(corpus.train, step=0, batch=2, length=48)
print(repr(bytes(inputs[0].astype(np.uint8))))
print(repr(bytes(targets[0].astype(np.uint8))), "<- the same, one byte later")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 10, "agenda": "self-paced"}
# ## 4. The training recipe: AdamW, a schedule, bf16, accumulation
#
# What large-model training adds to chapter 5's loop, all in the train step:
#
# * **bf16 compute, float32 master weights**: the model casts each weight to bf16
#   where it multiplies; the parameters, their gradients and Adam's two moments stay
#   float32 (a bf16 weight would lose small updates: bf16 stores 7 mantissa bits, 8
#   with the implicit leading one, against float32's 23 and 24: an update below
#   $2^{-8}$ of the weight rounds away).
#   bf16 pays where a matrix unit multiplies it natively (a TPU's MXU, a GPU's tensor
#   cores). Some CPUs have bf16 instructions too (x86's AVX512-BF16 dot products and
#   AMX tiles on recent Xeons, Arm's BF16 extension; the cell below reads what this
#   one has), but XLA's CPU backend does not promise to use them: this chapter's step
#   took longer in bf16 than in float32 on the 2-core CPU that measured it: 1.8 times
#   as long on Colab's jax 0.7.2, 1.1 times on jax 0.12
#   (committed: `bench/results/lm-dtypes-cpu-jax*.json`). On a CPU the chapter
#   therefore trains in float32 (`compute`, section 2): same recipe, same code.
# * **A learning-rate schedule**: linear warmup over 10 % of the steps, then a cosine
#   decay to a tenth of the peak; AdamW with weight decay, gradients clipped to norm 1.
# * **Gradient accumulation**: $k$ micro-batches' gradients summed in a `lax.scan`
#   and averaged: one micro-batch of activations alive at a time, the same update.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
# bf16 instructions of this CPU, as the kernel lists them (Linux: /proc/cpuinfo)
BF16_FLAGS = {"avx512_bf16": "AVX512-BF16 dot products", "amx_bf16": "AMX bf16 tiles",
              "bf16": "Arm BF16 (ARMv8.6)"}
cpuinfo = pathlib.Path("/proc/cpuinfo")
flags = set()
if cpuinfo.exists():
    for line in cpuinfo.read_text().splitlines():
        if line.startswith(("flags", "Features")):  # x86 names it flags, Arm Features
            flags |= set(line.split(":", 1)[1].split())
if flags:
    found = [what for flag, what in BF16_FLAGS.items() if flag in flags]
    print("this CPU: "
          + (", ".join(found) if found else "no bf16 instructions (none of "
             + ", ".join(BF16_FLAGS) + " in /proc/cpuinfo)"))
else:
    print("no /proc/cpuinfo here: this host's bf16 instructions are not listed "
          "(on a TPU or GPU runtime the matmuls run on the accelerator anyway)")

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.lm.make_optimizer, tpu_course.lm.make_loss
def make_optimizer(steps: int, *, peak_lr: float = 3e-3,
                   warmup_steps: int | None = None,
                   weight_decay: float = 0.1) -> optax.GradientTransformation:
    """AdamW on a warmup-cosine schedule, gradients clipped to global norm 1.

    The learning rate rises linearly from 0 to ``peak_lr`` over ``warmup_steps``
    (default: 10 % of ``steps``), then follows a cosine down to ``peak_lr / 10`` at
    ``steps``. Adam's two moments are float32, like the parameters they update.
    """
    steps = errors.check_int("steps", steps, low=1)
    peak_lr = errors.check_number("peak_lr", peak_lr, low=0, low_open=True)
    weight_decay = errors.check_number("weight_decay", weight_decay, low=0)
    warmup = steps // 10 if warmup_steps is None else errors.check_int(
        "warmup_steps", warmup_steps, low=0, high=steps - 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, peak_lr, warmup, steps, end_value=peak_lr / 10)
    adamw = optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay)
    return optax.chain(optax.clip_by_global_norm(1.0), adamw)



def make_loss(graphdef: Any) -> Any:
    """``loss(params, inputs, targets)``: mean next-byte cross-entropy, in nats."""

    def loss(params: Any, inputs: jax.Array, targets: jax.Array) -> jax.Array:
        logits = nnx.merge(graphdef, params)(inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    return loss

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.lm.make_train_step
def make_train_step(graphdef: Any, tx: optax.GradientTransformation,
                    accum_steps: int = 1) -> Any:
    """``step(params, opt_state, inputs, targets) -> (params, opt_state, loss)``.

    With ``accum_steps`` k > 1 the batch is cut into k micro-batches whose gradients
    are summed one after the other (``lax.scan``: one micro-batch's activations alive
    at a time) and averaged: the same update as the whole batch at once, for about
    1 / k of the activation memory.
    """
    accum_steps = errors.check_int("accum_steps", accum_steps, low=1)
    grad_fn = jax.value_and_grad(make_loss(graphdef))

    def step(params: Any, opt_state: Any, inputs: jax.Array,
             targets: jax.Array) -> tuple[Any, Any, jax.Array]:
        if accum_steps == 1:
            loss, grads = grad_fn(params, inputs, targets)
        else:
            micro = (accum_steps, inputs.shape[0] // accum_steps) + inputs.shape[1:]

            def add(total: tuple, batch: tuple) -> tuple[tuple, None]:
                loss, grads = grad_fn(params, *batch)
                return jax.tree.map(jnp.add, total, (loss, grads)), None

            zero = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
            (loss, grads), _ = jax.lax.scan(
                add, zero, (inputs.reshape(micro), targets.reshape(micro)))
            loss, grads = jax.tree.map(lambda g: g / accum_steps, (loss, grads))
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step

# %% [markdown] slideshow={"slide_type": "skip"}
# Accumulation is the same update: two micro-batches of 4 against one batch of 8, on
# a small float32 model (bf16 rounding would blur the comparison):

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
small = LMConfig(d_model=32, heads=2, layers=1, d_ff=64, context=32,
                 compute_dtype="float32")
model_small = LM(small, rngs=nnx.Rngs(1))
# the head starts at zero, so only it would get a gradient: make it random
model_small.head[...] = 0.1 * jax.random.normal(jax.random.key(2), (32, 256))
g_small, p_small = nnx.split(model_small)
tx_small = optax.sgd(1.0)  # the update is then minus the gradient itself
x8, y8 = textdata.batch_at(corpus.train, 0, 8, small.context)
whole = jax.jit(make_train_step(g_small, tx_small))(
    p_small, tx_small.init(p_small), x8, y8)
accum = jax.jit(make_train_step(g_small, tx_small, accum_steps=2))(
    p_small, tx_small.init(p_small), x8, y8)
gap = max(float(jnp.abs(a - b).max()) for a, b in
          zip(jax.tree.leaves(whole[0]), jax.tree.leaves(accum[0])))
print(f"loss {float(whole[2]):.5f} vs {float(accum[2]):.5f}; "
      f"largest parameter difference {gap:.0e} (< 1e-5: {gap < 1e-5})")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 15, "agenda": "self-paced"}
# ## 5. Across chips by annotation: FSDP x tensor parallelism on a (4, 2) mesh
#
# A mesh with a `data` axis of 4 and a `model` axis of 2 (axis types stated: jax 0.7.2
# defaults to `Auto`, jax 0.8+ to `Explicit`; `Auto` lets XLA's partitioner insert the
# collectives, as in chapter 6). Every weight gets a `PartitionSpec`:
#
# * **tensor parallelism** on `model` (Megatron, Shoeybi et al. 2019): attention's
#   *heads* (query, key, value by their head axis, the output projection by its first)
#   and the MLP's hidden dimension $F$ (`w_in` by columns, `w_out` by rows). Each
#   sub-block, attention and the MLP, then ends in an all-reduce of its output
#   activations over `model`: two per block in the forward pass (and two more in the
#   backward pass, for their input gradients: section 6 counts them);
# * **FSDP** on `data`: every weight's $d$ axis is also cut 4 ways, and XLA gathers it
#   where it is used. The embedding tables are cut by **rows** (bytes, positions): cut
#   by features, XLA warned of an "involuntary full rematerialization";
# * the batch is cut on `data`; the norms' scales are small and replicated.
#
# Adam's moments must follow the weights: `jax.jit(tx.init)` alone would leave them
# replicated (the whole optimizer state on every chip). `optax.tree_map_params` maps
# each parameter's sharding onto the moments built from it.

# %% slideshow={"slide_type": "subslide"}
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
SPECS = {
    "embed": P("data", None), "positions": P("data", None),  # rows, not features
    "wq": P("data", "model", None), "wk": P("data", "model", None),  # heads on model
    "wv": P("data", "model", None), "wo": P("model", None, "data"),
    "w_in": P("data", "model"), "w_out": P("model", "data"),  # F on model
    "head": P("data", None), "scale": P(),
}


def sharding_of(path, leaf):
    name = [k.key for k in path if isinstance(getattr(k, "key", None), str)][-1]
    return NamedSharding(mesh, SPECS[name])


STEPS, PEAK_LR, WARMUP = 400, 5e-3, 20  # section 5's run: measured choices, see below
param_shardings = jax.tree_util.tree_map_with_path(sharding_of, params)
tx = make_optimizer(STEPS, peak_lr=PEAK_LR, warmup_steps=WARMUP)
replicated = NamedSharding(mesh, P())
opt_shardings = optax.tree_map_params(
    tx, lambda _, sharding: sharding, jax.eval_shape(tx.init, params),
    param_shardings, transform_non_params=lambda _: replicated)
batch_sharding = NamedSharding(mesh, P("data", None))
train_step = jax.jit(
    make_train_step(graphdef, tx),
    in_shardings=(param_shardings, opt_shardings, batch_sharding, batch_sharding),
    out_shardings=(param_shardings, opt_shardings, replicated))
with jax.set_mesh(mesh):
    params = jax.device_put(params, param_shardings)
    opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
wq = params["blocks"][0]["attention"]["wq"]
mu = jax.tree.leaves(opt_state)[len(jax.tree.leaves(opt_state)) // 2]
print(f"[sim] wq {wq.shape}: each device holds {wq.addressable_shards[0].data.shape}")
print(f"[sim] an Adam moment {mu.shape}: split by {tuple(mu.sharding.spec)}")

# %% [markdown] slideshow={"slide_type": "skip"}
# ### Training: 400 steps, counted in steps
#
# Batch 32 x 128 bytes, matmuls in `compute` (float32 on a CPU), the warmup-cosine
# schedule of section 4 with a peak of `PEAK_LR` reached after `WARMUP` steps. The
# target: held-out bits per byte at least 0.3 under the bigram baseline of section 3,
# which a model that ignores everything but the last byte cannot beat; getting there
# means using the context. These numbers were chosen by measuring, on this mesh and
# this step, outside the notebook:
#
# * a step of `LMConfig.cpu()` (5 layers) cost 1.34 CPU-seconds, one with 2 layers
#   0.39: in the same CPU time the 2-layer model takes 3.4 times as many steps, and
#   this early in training steps matter more than depth (at step 150 of longer runs,
#   2 layers were at 3.23 bits per byte, 5 layers at 3.25);
# * with 2 layers, 300 steps ended at 3.07 with a peak of 6e-3 (just short of the
#   target) and at 3.01 with 5e-3; over 400 steps a peak of 5e-3 was at 2.95 by step
#   300 where 8e-3 was at 3.13. 400 steps leave room for
#   another jax version or machine to land a little higher, and cost about what 115
#   steps of the 5-layer model would.
#
# The run is capped by a step count, never by time (on a busy 2-core machine the same
# minute reached step 73 in one run and 140 in another), and is seeded: the same
# numbers on every run with the same jax. The held-out bits per byte are measured every
# 100 steps on the same 4 fixed held-out batches.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
losses, evals = [], {}
t0, cpu0 = time.perf_counter(), time.process_time()
with jax.set_mesh(mesh):
    for step in range(STEPS):
        x, y = textdata.batch_at(corpus.train, step, batch=32, length=T)
        params, opt_state, loss = train_step(params, opt_state, x, y)
        losses.append(float(loss))
        if (step + 1) % 100 == 0 or step + 1 == STEPS:
            evals[step + 1] = lm.evaluate(graphdef, params, corpus.heldout, length=T)
train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
print(f"[sim, CPU timing] {STEPS} steps in {train_s:.0f} s, {train_cpu_s:.0f} CPU-s "
      "(compile included)")
for step, bpb in evals.items():
    print(f"step {step}: held-out {bpb:.2f} bits per byte")
margin = bigram - evals[STEPS]
print(f"bigram {bigram:.2f}: the model is {margin:.2f} bits per byte below it")

# %% slideshow={"slide_type": "subslide"}
print(f"held-out at step {STEPS} at least 0.3 bits per byte below the bigram: "
      f"{margin >= 0.3}")
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(np.arange(1, STEPS + 1), np.array(losses) / math.log(2), label="train batch")
ax.plot(list(evals), list(evals.values()), "o", label="held-out")
ax.axhline(unigram, ls=":", color="grey", label="unigram")
ax.axhline(bigram, ls="--", color="grey", label="bigram")
ax.set(xlabel="step", ylabel="bits per byte", ylim=(2, 8.2))
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "skip"}
# ### What it writes
#
# `lm.generate` continues a prompt one byte at a time (a prefill, then decode steps
# from a KV cache: section 10). **Greedy** takes the most likely byte each time;
# **sampling** draws from softmax(logits / temperature), here at 0.8 (sharper than the
# model's own distribution) and at 1.0 (the model's distribution itself), the first
# from the 20 most likely bytes only (top-k: the long tail of unlikely bytes, which
# at 1.0 now and then puts an odd byte into the text, is cut off). Seeded: the same
# text on every run of the same model.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
trained = nnx.merge(graphdef, jax.device_get(params))  # the trained model, one device
for label, how in [("greedy", {}),
                   ("temperature 0.8, top-k 20", dict(temperature=0.8, top_k=20)),
                   ("temperature 1.0", dict(temperature=1.0))]:
    out = lm.generate(trained, list(b"def "), steps=100, seed=0, **how)
    print(f"--- {label}:")
    text = bytes(np.asarray(out[0], np.uint8)).decode("utf-8", errors="replace")
    for line in text.splitlines():  # as it would print, control bytes shown as a '?'
        line = "".join(c if c.isprintable() else "?" for c in line)
        print("\n".join(line[i:i + 88] for i in range(0, max(len(line), 1), 88)))

# %% [markdown] slideshow={"slide_type": "skip"}
# Greedy decoding falls into loops. The next byte is a function of the bytes before
# it, and argmax always takes the same one: once the text reaches a run of likely
# bytes that leads back to a context it has seen (a line that starts like the last
# one, a word after the same word), argmax takes the same path through it again, and
# again, with nothing in the rule that could leave. Sampling leaves: now and then it draws a
# less likely byte, and the context changes. The price is errors, bytes the model
# thought unlikely for good reason; a lower temperature and top-k trade some variety
# for fewer of them.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 12, "agenda": "self-paced"}
# ## 6. Compiled for a v5e-8 without one: the collectives against the cost model
#
# The same train step, compiled for a `v5e:2x4` topology (a Kaggle v5e-8) where the
# TPU compiler is installed: nothing runs, XLA's TPU backend only compiles. Before
# looking, **predict** each kind of collective from the shardings of section 5 (bytes
# are per device, bf16 once XLA moves the cast before the collective, as chapter 6 saw):
#
# * **all-gather** (FSDP): every weight cut over `data` is gathered where it is used,
#   in the forward pass and again in the backward pass (the FSDP trade: the whole
#   weight is not kept alive in between). A device sends its shard, $1/8$ of a
#   TP-cut weight: $2 \times 2 \times$ parameters $/ 8$ bytes in all.
# * **reduce-scatter** (FSDP): each weight's gradient, summed over `data` and cut back
#   to the shards: the operand is the gradient on one `model` half, $2 \times$
#   parameters $/ 2$ bytes.
# * **all-reduce** (tensor parallelism): attention and the MLP each end in a sum over
#   `model` of a $(B/4, T, d)$ activation, and so does each of their input gradients in
#   the backward pass: $4L$ all-reduces of $2 \cdot (B/4) T d$ bytes.
#
# Then each compiled kind is timed with chapter 6's cost model (`tpu_course.comms`,
# the scaling book's formulas: $V/W_{ici}$ per gather on a wrapped axis), beside the
# step's compute at the chip's peak. (The TPU compiler lets one gather progress inside
# several of the matmul fusions that follow it, a copy of the instruction in each;
# `hlo` counts a collective once, by its `channel_id`.)

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
def devices_cutting(spec, axes=("data", "model")):
    """How many devices of the mesh one array is cut over, on the named axes."""
    return math.prod(mesh.shape[a] for a in jax.tree.leaves(tuple(spec)) if a in axes)


weights = [(x.size, s.spec) for x, s in zip(jax.tree.leaves(params),
                                            jax.tree.leaves(param_shardings))
           if "data" in jax.tree.leaves(tuple(s.spec))]
predicted = {
    "all-gather": 2 * sum(2 * n / devices_cutting(s) for n, s in weights),
    "reduce-scatter": sum(2 * n / devices_cutting(s, ("model",)) for n, s in weights),
    "all-reduce": 4 * L * 2 * (32 // 4) * T * d,
}
if HAVE_TPU_COMPILER:
    topo = hlo.tpu_topology("v5e:2x4")
    tpu_mesh = jax.make_mesh((4, 2), ("data", "model"),
                             axis_types=(AxisType.Auto,) * 2, devices=topo.devices)

    def on_tpu(tree):
        return jax.tree.map(
            lambda s: NamedSharding(tpu_mesh, s.spec), tree,
            is_leaf=lambda s: isinstance(s, NamedSharding))

    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        (params, opt_state), on_tpu((param_shardings, opt_shardings)))
    batch = jax.ShapeDtypeStruct((32, T), jnp.int32,
                                 sharding=NamedSharding(tpu_mesh, P("data", None)))
    # on the chip the matmuls run in bf16, whatever this runtime trains in
    config_bf16 = dataclasses.replace(config, compute_dtype="bfloat16")
    graphdef_bf16, _ = nnx.split(LM(config_bf16, rngs=nnx.Rngs(0)))
    tpu_step = jax.jit(make_train_step(graphdef_bf16, tx), out_shardings=on_tpu(
        (param_shardings, opt_shardings, replicated)))
    t0 = time.perf_counter()
    v5e_report = hlo.inspect(tpu_step, *abstract, batch, batch, target="v5e:2x4")
    print(f"[aot v5e:2x4] compiled in {time.perf_counter() - t0:.1f} s on this host")
    v5e = hardware.get("v5e")
    print(f"  {'collective':<18} {'arrays':>6} {'predicted':>10} {'compiled':>10} "
          f"{'cost model':>11}")
    model_s = 0.0
    for kind, (arrays, nbytes) in sorted(v5e_report.by_kind().items()):
        formula = comms.COLLECTIVES[kind][0]
        t = sum(formula(c.bytes, c.group_size, v5e) for c in v5e_report.collectives
                if c.kind == kind) if formula else float("nan")
        model_s += 0 if math.isnan(t) else t
        guess = f"{predicted[kind] / 1e3:,.0f} kB" if kind in predicted else "-"
        timed = f"{t * 1e6:.1f} us" if formula else "no formula"
        print(f"  {kind:<18} {arrays:>6} {guess:>10} {nbytes / 1e3:>7,.0f} kB "
              f"{timed:>11}")
    print("the largest by bytes (kind, dtype, shape on one device, devices per group):")
    for (kind, dtype, shape, group), (count, nbytes) in list(
            v5e_report.by_shape().items())[:6]:
        print(f"  {count:>3} x {kind:<15} {dtype}{list(shape)} over {group} devices: "
              f"{nbytes / 1e3:,.0f} kB")
    compute_s = v5e_report.flops / v5e.peak_flops()
    print(f"cost model: collectives {model_s * 1e6:.0f} us vs compute at peak "
          f"{compute_s * 1e6:.0f} us per step")
    mfu_bound = compute_s / (compute_s + model_s)
    print(f"MFU if nothing overlapped: {mfu_bound:.0%} (compile-only estimate)")
else:
    print("predicted:", {k: f"{v / 1e3:,.0f} kB" for k, v in predicted.items()})
    print(f"[aot] skipped: {hlo.tpu_compiler_problem()}")

# %% [markdown] slideshow={"slide_type": "skip"}
# What the compiler did, read from the program's collectives (`v5e_report.collectives`,
# shape and group of each): the gathers and reduce-scatters are the predicted ones,
# one gather per weight and pass, in bf16, 10-20 % under the prediction (a few
# weights gathered in the forward pass are kept for the backward pass instead of
# gathered again; the embedding tables are looked up with small float32 gathers and a
# `collective-permute`). The all-reduces are the $4L$ = 8 predicted activation
# sums ($8 \times 128 \times 128$ bf16 over groups of 2, the `model` axis), plus one of
# the same shape in float32 (the residual stream's gradient) and many small ones, more
# arrays than the predicted ones but few bytes: the norms' scales (they are
# replicated, so their gradients are summed over `data`) and scalars (the loss, the
# gradient norm for clipping).
#
# At this size (half a million parameters over 8 chips: 32 sequences of 128 bytes), a
# step is microseconds of compute and the collectives' fixed costs dominate: a v5e-8
# would be wasted on it. The scaling book's rule for FSDP is a batch of about $C/W_{ici}$
# tokens per chip before the gathers hide behind compute (chapter 6's
# `comms.dp_min_tokens_per_chip`): that is what `LMConfig.tpu()` and a real batch are
# for. MFU from a measured step needs a real TPU.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
print(f"v5e: FSDP wants >= {comms.dp_min_tokens_per_chip('v5e'):,.0f} tokens per chip; "
      f"this step has {32 * T // 8:,}")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 8, "agenda": "self-paced"}
# ## 7. Rematerialisation: memory for FLOPs
#
# Backpropagation keeps each block's activations until the backward pass. With
# `jax.checkpoint` (here `nnx.remat` on each block, `LMConfig(remat=...)`) a **policy**
# says what to keep: `nothing_saveable` keeps only each block's input and recomputes
# the rest; `dots_saveable` keeps the matmul outputs. XLA's `memory_analysis()` of the
# compiled step shows the temporary memory each policy needs. The saving grows with
# the activations (batch x length x width x layers) against everything else (weights,
# optimizer state): we measured a 3.3M model at batch 64 x 256 compiled for a
# v5e:2x4 going from 53.5 to 19.7 MiB of temporary memory per chip with
# `nothing_saveable`, for 23 % more FLOPs (a compile of 14-73 s on this machine, too
# long for this notebook), and the 5-layer `LMConfig.cpu()` (1M parameters) at batch
# 32 x 128 saving almost nothing.
# Below, a size that compiles in seconds (the chapter's width, 2 layers, batch 8 x 256)
# on this machine's CPU backend, one device:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
remat_rows = {}
for policy in ("none", "nothing_saveable"):
    cfg = LMConfig.cpu(layers=2, context=256, remat=policy)
    g_r, p_r = nnx.split(nnx.eval_shape(lambda: LM(cfg, rngs=nnx.Rngs(0))))
    step_r = make_train_step(g_r, make_optimizer(10))
    opt_r = jax.eval_shape(make_optimizer(10).init, p_r)
    batch_r = jax.ShapeDtypeStruct((8, 256), jnp.int32)
    rep = hlo.inspect(step_r, p_r, opt_r, batch_r, batch_r)
    remat_rows[policy] = (rep.temp_bytes, rep.flops)
base_bytes, base_flops = remat_rows["none"]
for policy, (temp, flops) in remat_rows.items():
    print(f"[cpu compile] remat={policy:<17} temporaries {temp / 2**20:6.1f} MiB "
          f"({temp / base_bytes:.0%}), FLOPs {flops / base_flops:.2f} x")

# %% [markdown] slideshow={"slide_type": "skip"}
# ### A memory budget per chip, predicted and compiled
#
# Under section 5's shardings each chip holds an eighth of most weights: float32
# parameters, float32 gradients and Adam's two moments, all cut the same way.
# `lm.memory_budget` predicts them, and the activations a step keeps for the
# backward pass (its docstring lists which tensors, in the compute dtype), without
# remat and with `nothing_saveable`. Beside it, XLA's `memory_analysis()` of the
# gradient (arguments: parameters and batch; outputs: gradients; temporaries:
# activations and XLA's working space) and of the optimizer's `init`, compiled on the
# 8 simulated devices:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
def memory_reports(cfg, on_mesh, batch, target=None):
    """XLA's memory analysis, sharded as in section 5: gradient, optimizer's init."""
    g_m, p_m = nnx.split(nnx.eval_shape(lambda: LM(cfg, rngs=nnx.Rngs(0))))
    shardings = jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(on_mesh, sharding_of(path, leaf).spec), p_m)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), p_m, shardings)
    cut = NamedSharding(on_mesh, P("data", None))
    seqs = jax.ShapeDtypeStruct((batch, cfg.context), jnp.int32, sharding=cut)
    grad = jax.jit(jax.grad(make_loss(g_m)), out_shardings=shardings)
    grad_report = hlo.inspect(grad, abstract, seqs, seqs, target=target)
    moments = optax.tree_map_params(
        tx, lambda _, s: s, jax.eval_shape(tx.init, p_m), shardings,
        transform_non_params=lambda _: NamedSharding(on_mesh, P()))
    init_report = hlo.inspect(jax.jit(tx.init, out_shardings=moments), abstract,
                              target=target)
    return grad_report, init_report


budget = lm.memory_budget(config, {"data": 4, "model": 2}, batch=32)
grad_r, init_r = memory_reports(config, mesh, 32)
grad_remat, _ = memory_reports(dataclasses.replace(config, remat="nothing_saveable"),
                               mesh, 32)
print("[sim, CPU compile]", budget.table(grad_r, init_r, grad_remat))
big_budget = lm.memory_budget(LMConfig.tpu(), {"data": 4, "model": 2}, batch=32)
print("[prediction] LMConfig.tpu() on a v5e-8:")
print(big_budget)
v5e = hardware.get("v5e")
print(f"in all {big_budget.total_bytes() / 2**30:.2f} GiB per chip without remat, "
      f"{big_budget.total_bytes(remat=True) / 2**30:.2f} GiB with nothing_saveable;\n"
      f"a v5e chip has {v5e.hbm_bytes / 2**30:.1f} GiB")

# %% [markdown] slideshow={"slide_type": "skip"}
# Parameters, gradients and optimizer state agree with XLA to within 1 % (the tests
# hold them to that). Activations are a model, not an account: on the CPU backend
# XLA's temporaries came out about 1.6 times the prediction without remat and 1.5
# times with it (its working space: gathered weights, fused temporaries), and for
# `LMConfig.tpu()` compiled for a `v5e:2x4` (once for this chapter: about 5 minutes
# on a 2-core machine, too long for the notebook) parameters, gradients and optimizer
# state matched to the byte (12.53, 12.53, 25.07 MiB) and the temporaries were 0.76
# times the predicted 584 MiB: the TPU compiler keeps less than the model lists
# (it recomputes cheap elementwise work instead of storing it).

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 8, "agenda": "self-paced"}
# ## 8. A profile, read in the notebook
#
# `jax.profiler.trace(directory)` records what every thread did during a few steps and
# writes a Chrome-format trace (`*.trace.json.gz`: gzip + JSON) beside an `xplane.pb`.
# TensorBoard and xprof can show it; so can twenty lines of Python:
# `tpu_course.profiling.read` loads the events, computes each one's *self* time (its
# duration minus what ran nested inside it), and sorts them into compute, collectives,
# host and other by patterns on their names (op names differ between jax versions, so
# nothing is matched exactly). Threads run at once, so the categories add up to more
# than the wall time.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
trace_dir = tempfile.mkdtemp(prefix="ch8-trace-")
with jax.set_mesh(mesh):
    x, y = textdata.batch_at(corpus.train, STEPS, batch=32, length=T)
    with jax.profiler.trace(trace_dir):
        params, opt_state, loss = train_step(params, opt_state, x, y)
        loss.block_until_ready()
profile = profiling.read(trace_dir, steps=1)
print("[sim, CPU]", profile)
print(profile.ops_table(8))

# %% [markdown] slideshow={"slide_type": "skip"}
# The same step by **kind of work**: matmuls, attention's own work (scaling, mask,
# softmax), collectives, the optimizer's update, host transfers. Names alone do not
# say which fusion belongs to attention or to Adam, but the compiled program does:
# `profiling.op_kinds` reads each instruction's call stack from the HLO's metadata.
# Each row is the wall time during which at least one device did that kind of work
# (the union over threads, per step), and the collectives row is set beside section
# 6's predicted bytes:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
with jax.set_mesh(mesh):
    compiled_text = train_step.lower(params, opt_state, x, y).compile().as_text()
    kinds = profiling.op_kinds(compiled_text)
    print("[sim, CPU]")
    print(profile.by_kind(kinds, collective_bytes=sum(predicted.values())))

# %% [markdown] slideshow={"slide_type": "skip"}
# On 8 simulated devices sharing two CPU cores, most of a collective is waiting for
# the other devices to arrive, so the collectives row is a CPU artefact, not what ICI
# would take; section 6's predicted bytes (bf16 on a chip, twice that in this
# float32 run) are what a TPU profile's collectives row should be checked against.

# %% slideshow={"slide_type": "skip"}
profile.plot(max_threads=10)
plt.title("[sim, CPU] one train step, by thread")
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 12, "agenda": "self-paced"}
# ## 9. A preemption survived
#
# Spot TPUs are cheaper because they can be taken away mid-run. A real training
# process (`python -m tpu_course.lm`, the same model and recipe on one device at a
# small size) saves its parameters and optimizer state with Orbax every 10 steps.
# Below it is **killed with SIGKILL** once it has logged step 15 (no clean-up runs,
# like a preempted VM), then started again: it restores the newest save (step 10) and
# goes on to step 30. The batch of step $k$ is a pure function of $k$
# (`textdata.batch_at`), so the resumed run reads the data an uninterrupted run would.
# The check: steps 11-15 ran in both processes, from the same state and the same data,
# so their losses must be equal, bit for bit.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
tiny = dict(d_model=64, heads=2, layers=2, d_ff=128, context=64)
ckpt_dir = tempfile.mkdtemp(prefix="ch8-ckpt-")
command = [sys.executable, "-m", "tpu_course.lm", "--steps", "30", "--batch", "8",
           "--checkpoint-dir", ckpt_dir, "--checkpoint-every", "10"]
command += [f"--{k.replace('_', '-')}={v}" for k, v in tiny.items()]
env = runtime.cpu_subprocess_env(1)


def launch(kill_after=None):
    """Run the training process; SIGKILL it once it logs step ``kill_after``."""
    logged = {}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, env=env) as proc:
        for line in proc.stdout:
            record = json.loads(line)
            logged[record["step"]] = record["loss"]
            if record["step"] == kill_after:
                proc.send_signal(signal.SIGKILL)
                break
    print(f"process ended with {proc.wait()}; logged steps "
          f"{min(logged)}-{max(logged)}")
    return logged


first = launch(kill_after=15)
second = launch()

# %% slideshow={"slide_type": "subslide"}
print(f"killed (-9 = SIGKILL) after step {max(first)}; resumed at step {min(second)}")
both = sorted(set(first) & set(second))
same = all(first[k] == second[k] for k in both)
print(f"steps {both[0]}-{both[-1]} ran twice; equal losses, bit for bit: {same}")
shutil.rmtree(ckpt_dir)  # the saves served their purpose: nothing left in /tmp
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.plot(list(first), list(first.values()), "-", lw=5, label="first process (killed)")
ax.plot(list(second), list(second.values()), "-", label="second process (resumed)")
ax.axvline(max(first), ls=":", color="red")
ax.set(xlabel="step", ylabel="loss (nats)")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "skip"}
# The work since the last save (steps 11-15) is what a preemption costs, so
# the save interval trades that loss against the time a save blocks (we measured
# 0.2-0.25 s per async save: every 50 steps cost 1.5-4 % of this run's time).

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 15, "agenda": "self-paced"}
# ## 10. Serving: a KV cache and the decode roofline
#
# Generating a byte needs the model's output at the last position only; the keys and
# values of every earlier position do not change, so a **KV cache** keeps them: a
# *prefill* runs the prompt once, then each *decode* step runs one token through the
# model, writes its key and value at position $t$, and attends to the $t+1$ cached
# ones. `LM.decode` (section 1) is that; the cache is a tuple per layer:

# %% slideshow={"slide_type": "skip"}
# Same code as tpu_course.lm.KVCache, tpu_course.lm.init_cache
class KVCache(NamedTuple):
    """Keys and values of every position decoded so far, one array per layer.

    ``keys[i]`` and ``values[i]`` are ``(batch, context, heads, head_dim)``; positions
    from ``length`` on are still empty (zeros) and masked out of attention.
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    length: jax.Array  # int32 scalar: how many positions hold real keys



def init_cache(config: LMConfig, batch: int, dtype: Any = jnp.float32) -> KVCache:
    """An empty cache for ``batch`` sequences of up to ``config.context`` tokens."""
    config, batch = check_config(config), errors.check_int("batch", batch, low=1)
    shape = (batch, config.context, config.heads, config.head_dim)
    empty = tuple(jnp.zeros(shape, dtype) for _ in range(config.layers))
    return KVCache(keys=empty, values=empty, length=jnp.zeros((), jnp.int32))

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
model = nnx.merge(graphdef, jax.device_get(params))  # the trained model, one device
prompt = jnp.asarray(np.frombuffer(b"def __init__(self", np.uint8), jnp.int32)[None]
forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
decode = jax.jit(lambda s, x, c: nnx.merge(graphdef, s).decode(x, c))
state = nnx.state(model)
logits, cache = decode(state, prompt, init_cache(config, 1))  # prefill
steps_logits = [logits]
sequence = prompt
for _ in range(8):
    sequence = jnp.concatenate(
        [sequence, jnp.argmax(steps_logits[-1][:, -1:], -1).astype(jnp.int32)], 1)
    logits, cache = decode(state, sequence[:, -1:], cache)
    steps_logits.append(logits)
full = forward(state, sequence)[:, -9:]
cached = jnp.concatenate([steps_logits[0][:, -1:]] + steps_logits[1:], 1)
tolerance = 2e-2 if compute == "bfloat16" else 1e-4
print(f"cached decoding == full recomputation ({compute}, within {tolerance:g}):",
      bool(jnp.abs(cached - full).max() < tolerance))
sample = lm.generate(model, prompt, steps=60)
print(repr(bytes(np.asarray(sample[0], np.uint8))))

# %% [markdown] slideshow={"slide_type": "slide"}
# ### The decode roofline
#
# One decode step of $B$ sequences at cache length $t$ reads every weight that
# multiplies once ($2N$ bytes in bf16; of the two embedding tables only one row each,
# its token's and its position's) and each sequence's cache ($2Ld$ numbers per
# position, keys and values), and does $B(2N + 4Ldt)$ FLOPs. (`lm.decode_cost` charges
# the whole embedding tables, $(256 + T)d$ numbers more: 1.5 % of `LMConfig.tpu()`'s
# weight bytes, an upper bound.) Its arithmetic intensity
# is about $B$ for the weights, and about 1 FLOP per byte for the cache: decode is
# **memory-bound** until $B$ reaches the chip's ridge point $C / W_{hbm}$, and the cache
# term can keep it there at any $B$ (the scaling book, "All about transformer
# inference"). `lm.decode_ridge_batch` solves $\mathrm{FLOPs}(B) / \mathrm{bytes}(B) =
# C/W_{hbm}$ for $B$ ("never" when the cache alone is below the ridge):

# %% slideshow={"slide_type": "subslide"}
print("batch size where decode turns compute-bound (bf16 weights and cache):")
CACHE_LENGTHS = (1, 4, 16, 64)
print(f"{'chip':<6} {'C/W_hbm':>8} "
      + " ".join(f"{f't={t}':>8}" for t in CACHE_LENGTHS))
for name in ("v4", "v5e", "v5p", "v6e", "7x"):
    chip = hardware.get(name)
    cells = []
    for t in CACHE_LENGTHS:
        b = lm.decode_ridge_batch(LMConfig.tpu(), chip, position=t - 1)
        cells.append(f"{b:8,.0f}" if math.isfinite(b) else f"{'never':>8}")
    print(f"{name:<6} {chip.critical_intensity():8.0f} " + " ".join(cells))
big = LMConfig.tpu()
print(f"(LMConfig.tpu(): {lm.param_count(big) / 1e6:.1f}M parameters, d={big.d_model})")

# %% [markdown] slideshow={"slide_type": "skip"}
# With an empty cache the answer is about the ridge point itself (the book's "batch >
# 240 on v5e"). Each cached position adds $4Ld$ bytes per sequence for $4Ld$ FLOPs,
# so once $C/W_{hbm} \cdot 4Ldt \ge 2N + 4Ldt$, that is from
# $t = 2N / (4Ld\,(C/W_{hbm} - 1))$ on, no batch makes decode compute-bound. For
# `LMConfig.tpu()` on a v5e: $2 \times 25{,}305{,}600 / (4 \cdot 8 \cdot 512 \cdot
# 239.5)$ = 12.9, so after about 13 cached positions (`lm.decode_ridge_batch` returns
# `inf`: "never" in the table's $t$=16 column). With $N \approx 12Ld^2$ the bound is
# about $6d / (C/W_{hbm})$ positions: a wider model stays reachable longer. That is
# why serving systems shrink the cache: grouped-query attention (fewer key/value heads),
# int8 caches, paged attention to pack many sequences. Measured here, on the CPU:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
where = rt.platform.upper()
measured = {}
for batch in (1, 8, 64):
    # a cache that says 64 positions are filled (their values do not change the time)
    cache_b = init_cache(config, batch)._replace(length=jnp.int32(64))
    one = jnp.zeros((batch, 1), jnp.int32)
    result = bench.benchmark(decode, state, one, cache_b, warmup=1, repeats=3,
                             min_time=0.1, warn=False)
    cost = lm.decode_cost(config, batch, position=64, weight_bytes_per_param=4,
                          cache_bytes_per_value=4)
    print(f"[{where}] batch {batch:>2}: {batch / result.min_s:6,.0f} tokens/s, "
          f"{result.min_s * 1e3:5.2f} ms a step, "
          f"{cost.flops / result.min_s / 1e9:4.1f} GFLOP/s, "
          f"{cost.bytes / result.min_s / 1e9:.2f} GB/s read")
    measured[batch] = batch / result.min_s

# %% [markdown] slideshow={"slide_type": "skip"}
# The roofline's bound per chip beside it: `lm.decode_table` divides the batch by
# `decode_cost(...).time_s(chip)` for chips of `tpu_course.hardware`, with the whole
# model and cache on one chip. The measured row is this machine's CPU timing, not a
# TPU's:

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
for cfg, label in ((config, "the chapter's model"), (LMConfig.tpu(), "LMConfig.tpu()")):
    table = lm.decode_table(cfg, ("v5e", "v6e", "h200"), (1, 8, 64), position=64)
    if cfg is config:
        table = table.beside(f"[{where}] measured, float32", measured)
    print(f"{label}, {lm.param_count(cfg) / 1e6:.1f}M parameters:")
    print(table)

# %% [markdown] slideshow={"slide_type": "skip"}
# Every bound in the tables is memory-bound (no `C`): at 65 cached positions the cache's
# bytes keep decode below the ridge at any of these batches, and tokens/s grows less
# than the batch does. A CPU has no HBM roofline to compare with: here tokens/s first
# grows with the batch because each step's fixed cost (dispatch, a small program, a
# few MB of weights) is shared by more sequences, and the CPU's own arithmetic limits
# it after that. On a TPU the same cell measures the memory-bound regime the table
# predicts: time per step about flat in $B$ until the ridge batch. That needs a real
# TPU to confirm.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 6, "agenda": "self-paced"}
# ## 11. Where vLLM and Pathways fit
#
# **vLLM's TPU backend.** vLLM serves models with continuous batching (new requests join
# the running batch each step, so $B$ stays high: the roofline above is why that
# matters) and PagedAttention (the KV cache in fixed-size blocks, so sequences of
# different lengths share memory without fragmentation). On TPUs there are two
# plugins: vLLM JAX (`vllm-jax`, formerly `tpu-inference`) serves JAX models, and
# PyTorch models run through their own plugin, `vllm-torchtpu`
# (docs.vllm.ai/projects/vllm-jax; github.com/vllm-project/vllm-torchtpu); v5e, v6e
# and v7x are the recommended generations (docs.vllm.ai/projects/tpu).
# For this chapter's model it would replace `generate`: the same prefill and decode
# steps, with a paged cache and a scheduler around them.
#
# **Pathways.** Every multi-chip run in this course is *multi-controller* (chapter 6:
# one Python process per host, the same SPMD program on each). Pathways is Google's
# single-controller runtime for JAX: one client process sees every chip of one or more
# slices as one system, and a CPU-only control plane compiles and dispatches the work
# to workers on the TPU VMs; it is how Google trains Gemini, offered on Cloud as
# "Pathways on Cloud" (docs.cloud.google.com/ai-hypercomputer/docs/workloads/
# pathways-on-cloud/pathways-intro). Its resilience features still save and restore
# state, as section 9 does: *suspend-resume* saves the state when the chips are about
# to be taken and restores it when they come back, which needs that advance notice (a
# SIGKILL without one leaves the last checkpoint, as here); *elastic training* goes on
# with fewer slices when one fails, with recovery code the user writes (reshard the
# state, adjust the batch). What Pathways spares is the restart of every process: the
# single client keeps running while the slices under it change.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 4, "agenda": "self-paced"}
# ## 12. A cost audit
#
# What the 400-step run above and a real run would cost. Prices are the course's dated
# **examples** (`costs.PRICES_USD_PER_CHIP_HOUR`): pass yours as `usd_per_chip_hour=`.
# Hours come from $6 \times$ parameters $\times$ tokens FLOPs at an assumed MFU.

# %% slideshow={"slide_type": "skip"}
tokens_run = STEPS * 32 * T
print(f"this chapter's run: {tokens_run:,} tokens, "
      f"{lm.param_count(config):,} parameters")
print(" ", costs.training_cost("v5e", 8, params=lm.param_count(config),
                               tokens=tokens_run, mfu=0.3))
print(f"LMConfig.tpu() ({lm.param_count(big) / 1e6:.0f}M) on 1B tokens at 30 % MFU:")
for name in ("v5e", "v6e", "v5p"):
    print(" ", costs.training_cost(name, 8, params=lm.param_count(big), tokens=1e9,
                                   mfu=0.3))

# %% [markdown] slideshow={"slide_type": "skip"}
# The 6N estimate leaves out attention's $12LdT$ (13 % of the total at this size,
# section 2), and
# the MFU is an assumption: a real run measures it (on a TPU runtime, section 6's
# compile and a timed step give it). Below a minute a chip-hour is rounded up by some
# billing: the 400-step run costs nothing worth counting, which is why it runs on a CPU.

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 4, "agenda": "self-paced"}
# ## 13. The longer run: a committed measurement
#
# 600 steps of the same model, `LMConfig.cpu(layers=2)`, with the same batch and peak
# learning rate, on one CPU device (`python -m tools.lm_reference` wrote it with
# `lm.run`, whose warmup is 10 % of the steps: 60 here, against section 5's 20),
# shipped with the package as `tpu_course/reference/lm-cpu-600.json`. **Not run by
# this notebook**: read from the file, with the runtime that measured it and what it
# trained.

# %% slideshow={"slide_type": "subslide"}
reference = json.loads(resources.files("tpu_course").joinpath(
    "reference/lm-cpu-600.json").read_text())
print("committed measurement:")
print(" ", reference["runtime"].splitlines()[0])
print(textwrap.fill(reference["what"], 88, initial_indent="  ", subsequent_indent="  "))
print(f"held-out bits per byte: " + ", ".join(
    f"{s}: {b:.2f}" for s, b in zip(reference["eval_steps"], reference["heldout_bpb"])
    if s % 100 == 0))
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(reference["steps"], np.array(reference["losses"]) / math.log(2), lw=0.8,
        label="train batch (committed)")
ax.plot(reference["eval_steps"], reference["heldout_bpb"], "o-", label="held-out")
ax.axhline(reference["bigram_bpb"], ls="--", color="grey", label="bigram")
ax.set(xlabel="step", ylabel="bits per byte", ylim=(1.5, 8.2))
ax.legend()
plt.show()
print("a greedy sample after 600 steps:")
for line in reference["sample"][:300].splitlines():  # its own lines, cut to the page
    print(line[:88])

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "self-paced"}
# ## Takeaways
#
# * A transformer's parameters and training FLOPs are predictable before anything
#   runs: $6N + 12LdT$ per token, a few per cent under XLA's count.
# * Multi-chip training is annotations: a `(data, model)` mesh, FSDP on `data`, heads
#   and the MLP's hidden width on `model`, embedding tables cut by rows, optimizer
#   state sharded like its parameters (`optax.tree_map_params`).
# * bf16 compute (where a matrix unit takes bf16) with float32 master weights, a
#   warmup-cosine schedule and gradient accumulation live in the train step; remat
#   trades FLOPs for activation memory, by policy, and `memory_analysis()` says how
#   much.
# * A profile is a file: read it, split self time into compute, collectives and host.
# * A run that saves every N steps and derives its data from the step number survives
#   a SIGKILL with the same losses.
# * Decode is memory-bound: batch up to the ridge point, and the KV cache's bytes can
#   keep it memory-bound at any batch; vLLM batches continuously and pages the cache.
