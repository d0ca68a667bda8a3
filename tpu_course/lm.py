"""A small decoder-only transformer over bytes, in Flax NNX: chapter 8's language model.

The model reads bytes (a vocabulary of 256: no tokenizer to download) and predicts the
next one. It is the GPT-2 shape at toy size (Radford et al. 2019; Karpathy's nanoGPT):
token and learned position embeddings, ``layers`` pre-norm blocks of causal multi-head
self-attention and a two-layer MLP, each wrapped in a residual connection, a final
RMSNorm, and an output head (logits = x @ head). The head is separate from the token
embedding, not tied to it: its direct path embedding -> head is a full byte-to-byte
(bigram) table from the first step, which a tied head (logits = x @ embedding.T, a
symmetric table) cannot be.

Weights are plain ``nnx.Param`` arrays used with ``jnp.einsum``, shaped so that their
axes name what they mean: attention's query weight is ``(d_model, heads, head_dim)``,
so "shard the heads over the model axis" is ``P(None, "model", None)``. Parameters are
stored in float32 (the master weights the optimizer updates); each matmul runs in
``config.compute_dtype`` (bf16 by default), and the softmax and the norms in float32.

The same forward pass serves training and decoding:

* ``model(tokens)``: logits for every position of ``(batch, length)`` tokens;
* ``model.decode(tokens, cache)``: the same logits for ``tokens`` written after the
  ``cache.length`` tokens already in the key/value cache, and the cache with them
  added. A whole prompt at once is the *prefill*; one token at a time is *decoding*.

Parameter count of ``LMConfig.cpu()`` (checked in ``tests/test_lm.py``): per block
4 d^2 (attention) + 2 d f (MLP) + 2 d (two norm scales) = 65,536 + 131,072 + 256 =
196,864; five blocks 984,320; token embedding 256 x 128 = 32,768; positions 128 x 128 =
16,384; final norm 128; head 128 x 256 = 32,768: 1,066,368 in all.

>>> param_count(LMConfig.cpu())
1066368
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import warnings
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tpu_course import errors, hardware

VOCAB = 256  # one token per byte value
#: what LMConfig.remat accepts: no remat, or a policy of jax.checkpoint_policies
REMAT_POLICIES = ("none", "nothing_saveable", "dots_saveable",
                  "dots_with_no_batch_dims_saveable", "everything_saveable")


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """The model's shape. ``d_model`` must divide by ``heads`` (head_dim = d / heads)."""

    vocab: int = VOCAB
    d_model: int = 128
    heads: int = 4
    layers: int = 5
    d_ff: int = 512  # the MLP's hidden width, 4 x d_model as in GPT-2
    context: int = 128  # the longest sequence the position table covers
    compute_dtype: str = "bfloat16"  # matmuls; parameters stay float32
    # "none", or a jax.checkpoint_policies name ("nothing_saveable", "dots_saveable",
    # ...): each block's activations are recomputed in the backward pass except what
    # the policy saves
    remat: str = "none"

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "heads", "layers", "d_ff", "context"):
            errors.check_int(name, getattr(self, name), low=1, where="LMConfig")
        if self.vocab < VOCAB:
            raise errors.CourseValueError(
                f"LMConfig.vocab={self.vocab}: the model reads bytes, {VOCAB} token values "
                f"(0..{VOCAB - 1}); a table of {self.vocab} rows would turn every byte >= "
                f"{self.vocab} into another one. Leave vocab at {VOCAB} (the default).")
        if self.d_model % self.heads:
            raise errors.CourseValueError(
                f"LMConfig: d_model={self.d_model} does not divide into heads="
                f"{self.heads}; pick heads that divide d_model (head_dim = d_model / heads)")
        errors.check_choice("compute_dtype", self.compute_dtype,
                            ("bfloat16", "float32"), where="LMConfig")
        errors.check_choice("remat", self.remat, REMAT_POLICIES, where="LMConfig")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @classmethod
    def cpu(cls, **changes: Any) -> "LMConfig":
        """About a million parameters: trains ~100 steps in a minute on a 2-core CPU."""
        return dataclasses.replace(cls(), **changes)

    @classmethod
    def tpu(cls, **changes: Any) -> "LMConfig":
        """About 30 million parameters, for a v5e-8 (d 512, 8 layers, context 512)."""
        return dataclasses.replace(
            cls(d_model=512, heads=8, layers=8, d_ff=2048, context=512), **changes)


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


def check_config(config: Any) -> LMConfig:
    """``config`` if it is an :class:`LMConfig`, else a course error that says so."""
    if not isinstance(config, LMConfig):
        raise errors.CourseTypeError(
            f"config={config!r:.60}: expected an lm.LMConfig (the model's .config), got "
            f"{type(config).__name__}.")
    return config


def check_tokens(tokens: Any, config: LMConfig, start: int | None, *,
                 cache: KVCache | None = None, name: str = "tokens") -> None:
    """A course error unless ``tokens`` is a non-empty integer (batch, length) array of
    values ``0..vocab - 1`` (checked where the values are known: outside ``jax.jit``);
    with ``start`` given, also unless it fits the context.

    With ``start=None`` (``LM.decode``) the tokens go into ``cache``: a course error
    unless the cache was made for this model and batch and has room for them. Without these checks JAX clamps what does not fit (a byte 300 reads row 255, a
    token past a full cache overwrites the last slot) and returns wrong logits silently.
    ``name`` is what the messages call ``tokens`` (``generate`` says ``prompt``).
    """
    if start is not None:
        errors.check_int("start", start, low=0)
    check_config(config)
    if isinstance(tokens, (str, bytes, bytearray)):
        text = bytes(tokens, "utf-8") if isinstance(tokens, str) else bytes(tokens)
        raise errors.CourseTypeError(
            f"{name}={tokens!r} is text: the model reads byte values as integers. Pass "
            f"them as an array with a batch axis, e.g. jnp.array([list({text[:16]!r})]).")
    shape = getattr(tokens, "shape", None)
    dtype = getattr(tokens, "dtype", None)
    if shape is None or len(shape) != 2 or not jnp.issubdtype(dtype, jnp.integer):
        raise errors.CourseTypeError(
            f"expected {name} as an integer array (batch, length), got "
            f"{type(tokens).__name__} with shape {shape} and dtype {dtype}; add a batch "
            "axis (tokens[None]) and pass byte values 0..255 as integers")
    if shape[0] == 0 or shape[1] == 0:
        raise errors.CourseValueError(
            f"{name} of shape {tuple(shape)} hold no token: pass at least one byte per "
            "sequence (batch, length >= 1)")
    if start is not None and shape[1] > config.context:
        raise errors.CourseValueError(
            f"{name}: {shape[1]} tokens are longer than the model's context of {config.context}; "
            "cut the sequence, or build the model with a longer LMConfig(context=...)")
    values = _concrete(tokens)
    if values is not None:
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= config.vocab:
            bad = low if low < 0 else high
            where = tuple(int(i) for i in np.argwhere(values == bad)[0])
            raise errors.CourseValueError(
                f"{name} hold {bad} (at {list(where)}): token values must be 0.."
                f"{config.vocab - 1}, one per byte; JAX would clamp {bad} to "
                f"{0 if bad < 0 else config.vocab - 1} without a word. Pass bytes, e.g. "
                "list('text'.encode())")
    if start is None and cache is not None:
        _check_cache(cache, config, shape)


def _concrete(x: Any) -> np.ndarray | None:
    """``x``'s values as a numpy array, or None inside ``jax.jit`` (not known yet)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _check_cache(cache: Any, config: LMConfig, shape: tuple) -> None:
    """A course error unless ``cache`` fits the model and has room for ``shape`` tokens."""
    keys, length = getattr(cache, "keys", None), getattr(cache, "length", None)
    if not isinstance(keys, tuple) or length is None or not hasattr(cache, "values"):
        raise errors.CourseTypeError(
            f"cache: expected an lm.KVCache (lm.init_cache(config, batch)), got "
            f"{type(cache).__name__}.")
    want = (config.context, config.heads, config.head_dim)
    if len(keys) != config.layers or any(tuple(k.shape[1:]) != want for k in keys):
        got = tuple(keys[0].shape) if keys else ()
        raise errors.CourseValueError(
            f"cache: {len(keys)} layers of keys {got}, but this model has {config.layers} "
            f"layers of (batch, {', '.join(map(str, want))}): make the cache for this "
            "model, lm.init_cache(model.config, batch)")
    if keys[0].shape[0] != shape[0]:
        raise errors.CourseValueError(
            f"tokens have a batch of {shape[0]} but the cache was made for a batch of "
            f"{keys[0].shape[0]}: make it with lm.init_cache(config, batch={shape[0]})")
    room = config.context
    if shape[1] > room:
        raise errors.CourseValueError(
            f"{shape[1]} tokens do not fit a cache of {room} positions (the context); "
            "decode at most that many, or build the model with a longer "
            "LMConfig(context=...)")
    held = _concrete(length)
    if held is not None and int(held) + shape[1] > room:
        raise errors.CourseValueError(
            f"the cache holds {int(held)} of {room} positions: {shape[1]} more token(s) "
            f"would run past its end (JAX would overwrite the last slot and return wrong "
            "logits). Start again from a new cache (lm.init_cache), or build the model "
            "with a longer LMConfig(context=...)")


def generate(model: LM, prompt: Any, steps: int, *, temperature: float = 0.0,
             top_k: int | None = None, seed: int = 0) -> jax.Array:
    """``prompt`` (batch, p) bytes followed by ``steps`` new ones: (batch, p + steps).

    One prefill of the prompt fills the KV cache, then each step decodes one token
    from the cache (``lax.scan``: one compiled program). ``temperature`` 0 takes the
    most likely byte (greedy); above 0 it samples from softmax(logits / temperature),
    and with ``top_k`` only from the ``top_k`` most likely bytes (the rest get
    probability 0; Fan et al. 2018). ``top_k`` does not change a greedy pick.
    A 1-D prompt is one sequence. Text is refused: pass its bytes, ``list(b"def ")``.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, LMConfig) or not callable(getattr(model, "decode", None)):
        raise errors.CourseTypeError(
            f"model={model!r}: expected an lm.LM (lm.LM(config, rngs=nnx.Rngs(0)), or the "
            f"trained one), got {type(model).__name__}.")
    if isinstance(prompt, (str, bytes, bytearray)):
        text = bytes(prompt, "utf-8") if isinstance(prompt, str) else bytes(prompt)
        raise errors.CourseTypeError(
            f"prompt={prompt!r} is text: generate reads byte values. Pass "
            f"list({text[:16]!r}) (or a (batch, length) integer array of them).")
    try:
        prompt = jnp.asarray(prompt)
    except (TypeError, ValueError) as err:
        raise errors.CourseTypeError(
            f"prompt={prompt!r}: expected byte values 0..255 as integers, a list or a "
            f"(batch, length) array ({type(err).__name__}: {str(err)[:80]})") from None
    if prompt.ndim == 1:
        prompt = prompt[None]
    if prompt.size == 0:
        raise errors.CourseValueError(
            f"prompt of shape {tuple(prompt.shape)} is empty: give at least one byte to "
            "start from, e.g. list(b'def ')")
    steps = errors.check_int("steps", steps, low=1)
    temperature = errors.check_number("temperature", temperature, low=0)
    if top_k is not None:
        top_k = errors.check_int("top_k", top_k, low=1, high=config.vocab)
    seed = errors.check_int("seed", seed, low=0)
    check_tokens(prompt, config, 0, name="prompt")
    context = config.context
    if prompt.shape[1] + steps > context:
        raise errors.CourseValueError(
            f"prompt of {prompt.shape[1]} + steps={steps} exceeds the context of {context}"
            f"; ask for at most {context - prompt.shape[1]} steps or a shorter prompt")
    graphdef, state = nnx.split(model)
    # top_k is traced, not static: one compiled program serves every k (None: all bytes)
    keep = jnp.int32(config.vocab if top_k is None else top_k)
    return _generate(graphdef, state, prompt, jax.random.key(seed), steps, temperature,
                     keep)


@functools.partial(jax.jit, static_argnames=("graphdef", "steps", "temperature"))
def _generate(graphdef: Any, state: Any, prompt: jax.Array, key: jax.Array,
              steps: int, temperature: float, top_k: jax.Array) -> jax.Array:
    model = nnx.merge(graphdef, state)

    def pick(logits: jax.Array, key: jax.Array) -> jax.Array:
        if temperature == 0:
            return jnp.argmax(logits, axis=-1).astype(prompt.dtype)
        # keep the top_k largest logits (and ties with the k-th); top_k = vocab keeps all
        kth = jnp.take(jnp.sort(logits, axis=-1), logits.shape[-1] - top_k, axis=-1)
        logits = jnp.where(logits < kth[..., None], -jnp.inf, logits)
        return jax.random.categorical(key, logits / temperature).astype(prompt.dtype)

    cache = init_cache(model.config, prompt.shape[0])
    logits, cache = model.decode(prompt, cache)
    keys = jax.random.split(key, steps)
    first = pick(logits[:, -1], keys[0])

    def step(carry: tuple, key: jax.Array) -> tuple[tuple, jax.Array]:
        token, cache = carry
        logits, cache = model.decode(token[:, None], cache)
        nxt = pick(logits[:, -1], key)
        return (nxt, cache), token

    (last, _), tokens = jax.lax.scan(step, (first, cache), keys[1:])
    new = jnp.concatenate([tokens.T, last[:, None]], axis=1)
    return jnp.concatenate([prompt, new], axis=1)


# ---------------------------------------------------------------------------- training


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


def evaluate(graphdef: Any, params: Any, data: Any, *, batches: int = 4, batch: int = 32,
             length: int = 128, seed: int = 1_000_003) -> float:
    """Mean loss in bits per byte on ``batches`` fixed windows of ``data`` (held-out bytes).

    The windows depend only on (data, seed): every evaluation of a run, and of any
    other run, scores the same bytes. A diverged model's loss (NaN or infinite) comes
    back as it is, in bits.
    """
    from tpu_course import textdata

    batches = errors.check_int("batches", batches, low=1)
    total = 0.0
    for i in range(batches):
        inputs, targets = textdata.batch_at(data, i, batch, length, seed)
        total += float(_eval_loss(graphdef, params, inputs, targets))
    mean = total / batches
    return textdata.bits_per_byte(mean) if math.isfinite(mean) else mean / math.log(2)


@functools.partial(jax.jit, static_argnums=0)  # compiled once per model structure
def _eval_loss(graphdef: Any, params: Any, inputs: jax.Array,
               targets: jax.Array) -> jax.Array:
    return make_loss(graphdef)(params, inputs, targets)


@functools.lru_cache(maxsize=4)
def _compiled_step(graphdef: Any, steps: int, peak_lr: float) -> tuple[Any, Any]:
    """``(tx, jitted train step)`` for a model structure and schedule, made once per process:
    a run started again in the same process (a resume, a test) does not compile again."""
    tx = make_optimizer(steps, peak_lr=peak_lr)
    return tx, jax.jit(make_train_step(graphdef, tx))


def _check_config(config: Any) -> LMConfig:
    if not isinstance(config, LMConfig):
        raise errors.CourseTypeError(
            f"config={config!r}: expected an lm.LMConfig (LMConfig.cpu(), LMConfig.tpu() "
            f"or LMConfig(d_model=..., ...)), got {type(config).__name__}.")
    return config


def _save_steps(start: int, steps: int, every: int) -> list[int]:
    """The steps ``run`` saves after ``start``: every ``every``-th, and the last."""
    return sorted({s for s in range(every, steps + 1, every) if s > start} | {steps})


def _differences(saved: dict, settings: dict) -> list[str]:
    """``'name=<saved> there, <now> here'`` for each setting that differs (config fields by
    their own names)."""
    flat_saved = {**saved.get("config", {}), **{k: v for k, v in saved.items() if k != "config"}}
    flat_now = {**settings["config"], **{k: v for k, v in settings.items() if k != "config"}}
    return [f"{k}={flat_saved[k]!r} there, {v!r} here" for k, v in flat_now.items()
            if k in flat_saved and k != "steps" and flat_saved[k] != v]


def _resume_point(path: Any, settings: dict, steps: int, every: int) -> tuple[int, str]:
    """``(start, news)``: the step ``run`` continues from in ``path`` (0: nothing saved)
    and a line saying so. Refuses, before anything is trained, a checkpoint of a run with
    other settings, and folders without the course's manifest where this run would save."""
    from tpu_course.train import checkpoints

    start, planned = checkpoints.latest_step(path) or 0, None
    if start:
        meta = checkpoints.saved_metadata(path, start)
        saved = meta.get("settings", {"steps": meta.get("steps")})
        differ = _differences(saved, settings)
        if differ:
            raise errors.CourseValueError(
                f"the checkpoint in {path} (step {start}) was written by a run with other "
                f"settings: {'; '.join(differ)}. Resume with the settings that wrote it, or "
                "start a fresh run in another checkpoint_dir.")
        planned = saved.get("steps")
        if start < steps and planned not in (None, steps):
            raise errors.CourseValueError(
                f"the checkpoint in {path} (step {start}) belongs to a run of steps="
                f"{saved['steps']}, and this one asks for steps={steps}: the learning-rate "
                "schedule (warmup, then a cosine to the last step) is set by steps, so the "
                f"rest would follow neither run. Resume with steps={saved['steps']}, or start "
                "a fresh run in another checkpoint_dir.")
    if start >= steps:
        finish = (f"To finish that run, resume with steps={planned}; to train longer, "
                  if planned not in (None, start) else "To train longer, ")
        return start, (f"{path} holds step {start} already, at or past steps={steps}: "
                       f"nothing to train (step {start}'s parameters are the result). "
                       f"{finish}start a fresh run with a larger steps in another "
                       "checkpoint_dir")
    _, foreign = checkpoints.step_folders(path)
    saves = _save_steps(start, steps, every)
    clash = [s for s in saves if s in foreign]
    if clash:
        raise errors.CourseValueError(
            f"checkpoint_dir={str(path)!r} holds {', '.join(f'{s}/' for s in clash)} without "
            f"the course's manifest ({checkpoints.MANIFEST}: a save that did not finish, a "
            "manifest deleted, or a folder that is not the course's), where this run would "
            "save: the course never overwrites it. Move or delete it, or use another "
            "checkpoint_dir. Nothing was trained.")
    listed = ", ".join(map(str, saves)) if len(saves) <= 6 else (
        f"{saves[0]}, {saves[1]}, ..., {saves[-1]}")
    when = (f"only the last step, {steps} (checkpoint_every={every} is more than the "
            f"{steps - start} step(s) to train)" if saves == [steps] and steps % every
            else f"steps {listed}")
    where = (f"resuming from step {start} of {steps} saved in {path}" if start else
             f"no checkpoint in {path} yet: starting from step 0")
    return start, f"{where}; saving {when}"


def run(config: LMConfig, steps: int, *, batch: int = 32, seed: int = 0,
        peak_lr: float = 3e-3, checkpoint_dir: str | None = None,
        checkpoint_every: int = 50, eval_every: int | None = None,
        log: Any = None, notify: Callable[[str], None] | None = None) -> dict:
    """Train ``LM(config)`` on the standard-library corpus for ``steps`` steps, one device.

    With ``checkpoint_dir`` it saves (parameters, optimizer state) with Orbax every
    ``checkpoint_every`` steps and at the last step and, started again, resumes from the
    newest save: batch k is ``textdata.batch_at(train, k, ...)`` whichever process trains
    it, so a resumed run sees the data an uninterrupted one would. A checkpoint written
    with other settings (``config``, ``steps``, ``batch``, ``seed``, ``peak_lr``) is
    refused, naming them, before anything is trained; one at or past ``steps`` leaves
    nothing to train (a warning says so, the saved parameters are returned).
    ``log(record)`` gets a dict per step (``{"step": k, "loss": nats}``, and
    ``"heldout_bpb"`` every ``eval_every`` steps); ``notify(line)`` gets a line about the
    checkpoints (what was resumed or that nothing was saved yet, which steps will be
    saved, or that there is nothing to train). Returns ``{"steps", "losses",
    "eval_steps", "heldout_bpb", "resumed_from"}``.
    """
    from tpu_course import textdata
    from tpu_course.train import checkpoints

    config = _check_config(config)
    steps = errors.check_int("steps", steps, low=1)
    batch = errors.check_int("batch", batch, low=1)
    seed = errors.check_int("seed", seed, low=0)
    peak_lr = errors.check_number("peak_lr", peak_lr, low=0, low_open=True)
    checkpoint_every = errors.check_int("checkpoint_every", checkpoint_every, low=1)
    if eval_every is not None:
        eval_every = errors.check_int("eval_every", eval_every, low=1)
    for name, fn in (("log", log), ("notify", notify)):
        if fn is not None and not callable(fn):
            raise errors.CourseTypeError(f"{name}={fn!r}: expected a function of one "
                                         f"argument, or None; got {type(fn).__name__}.")
    settings = {"config": dataclasses.asdict(config), "steps": steps, "batch": batch,
                "seed": seed, "peak_lr": peak_lr}
    start, path = 0, None
    if checkpoint_dir is not None:
        path = checkpoints.check_directory(checkpoint_dir, "checkpoint_dir")
        start, news = _resume_point(path, settings, steps, checkpoint_every)
        if start >= steps and notify is None:
            warnings.warn(news, checkpoints.CheckpointWarning, stacklevel=2)
        elif notify is not None:
            notify(news)
    corpus = textdata.load() if start < steps else None
    graphdef, params = nnx.split(LM(config, rngs=nnx.Rngs(seed)))
    tx, train_step = _compiled_step(graphdef, steps, peak_lr)
    # placed on the device as a restored state is (committed), so that a fresh run and a
    # resumed one share one compiled step
    state = jax.device_put({"params": params, "opt_state": tx.init(params)}, jax.devices()[0])
    if start:
        state, _ = checkpoints.restore_checkpoint(path, state, step=start)
    history: dict = {"steps": [], "losses": [], "eval_steps": [], "heldout_bpb": [],
                     "resumed_from": start}
    for step in range(start, steps):
        inputs, targets = textdata.batch_at(corpus.train, step, batch, config.context, seed)
        params, opt_state, loss = train_step(state["params"], state["opt_state"],
                                             inputs, targets)
        state = {"params": params, "opt_state": opt_state}
        record = {"step": step + 1, "loss": float(loss)}
        history["steps"].append(step + 1)
        history["losses"].append(float(loss))
        if eval_every and (step + 1) % eval_every == 0:
            record["heldout_bpb"] = evaluate(graphdef, params, corpus.heldout,
                                             batch=batch, length=config.context)
            history["eval_steps"].append(step + 1)
            history["heldout_bpb"].append(record["heldout_bpb"])
        if path is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == steps):
            checkpoints.save_checkpoint(path, state, {"steps": steps, "settings": settings},
                                        step=step + 1)
        if log is not None:
            log(record)
    history["graphdef"], history["params"] = graphdef, state["params"]
    return history


#: The command line's flags that are run()'s arguments or LMConfig fields, by name.
_FLAGS = ("steps", "batch", "seed", "checkpoint_dir", "checkpoint_every", "eval_every",
          "d_model", "heads", "layers", "d_ff", "context")


def _as_flags(message: str) -> str:
    """``run``'s and ``LMConfig``'s names in ``message`` as the command line's flags:
    ``batch=8`` -> ``--batch=8``, ``LMConfig.d_model=0`` -> ``--d-model=0``.

    >>> _as_flags("LMConfig.d_model=0; batch=8 there, 4 here; another checkpoint_dir")
    '--d-model=0; --batch=8 there, 4 here; another --checkpoint-dir'
    """
    names = "|".join(_FLAGS)
    message = re.sub(rf"(?<![\w.-])(?:LMConfig\.)?({names})=",
                     lambda m: "--" + m.group(1).replace("_", "-") + "=", message)
    return re.sub(r"(?<![\w.-])checkpoint_dir\b", "--checkpoint-dir", message)


def main(argv: list[str] | None = None) -> int:
    """``python -m tpu_course.lm --steps 40 --checkpoint-dir DIR``: a run that prints
    one JSON line per step (what chapter 8 kills and resumes). Started again with the same
    flags it resumes from the newest checkpoint; what it resumed (or that nothing was
    saved yet), which steps it saves, and any refusal are one line each on stderr (a bad
    flag: exit code 2, nothing trained)."""
    import json

    from tpu_course.train.__main__ import ArgumentParser, refuse, say, warnings_as_lines

    prog = "python -m tpu_course.lm"
    parser = ArgumentParser(prog=prog, description=main.__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--eval-every", type=int)
    for name in ("d_model", "heads", "layers", "d_ff", "context"):
        parser.add_argument("--" + name.replace("_", "-"), type=int,
                            default=getattr(LMConfig.cpu(), name))
    args = parser.parse_args(argv)
    try:
        for name in ("steps", "batch", "checkpoint_every"):
            errors.check_int(name, getattr(args, name), low=1)
        errors.check_int("seed", args.seed, low=0)
        if args.eval_every is not None:
            errors.check_int("eval_every", args.eval_every, low=1)
        config = LMConfig(d_model=args.d_model, heads=args.heads, layers=args.layers,
                          d_ff=args.d_ff, context=args.context)
        with warnings_as_lines(prog):
            run(config, args.steps, batch=args.batch, seed=args.seed,
                checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                eval_every=args.eval_every, log=lambda r: print(json.dumps(r), flush=True),
                notify=lambda line: say(prog, _as_flags(line)))
    except errors.CourseError as err:  # the course's message says what to do: no traceback
        return refuse(prog, _as_flags(str(err)))
    return 0


# ---------------------------------------------------------------------------- counting


def param_count(config: LMConfig) -> int:
    """Parameters of ``LM(config)``: embeddings + blocks + final norm + head.

    >>> param_count(LMConfig(d_model=8, heads=2, layers=1, d_ff=16, context=4))
    4664
    """
    config = _check_config(config)
    d, f = config.d_model, config.d_ff
    block = 4 * d * d + 2 * d * f + 2 * d  # wq wk wv wo, w_in w_out, two norm scales
    embeddings = config.vocab * d + config.context * d  # tokens, positions
    return embeddings + config.layers * block + d + d * config.vocab  # norm, head


def flops_per_token(config: LMConfig, context: int | None = None) -> float:
    """Training FLOPs per token (forward + backward) at sequence length ``context``.

    ``6 N + 12 L d T``: the 6N rule (Kaplan et al. 2020, sec. 2.1: 2N forward, 4N
    backward, one multiply-add per parameter) with N the parameters that multiply
    (all but the two embedding tables, token and position, which are lookups; the
    output head multiplies), plus attention's scores and weighted sum, 2 x 2 T d per layer
    forward, times 3 with the backward pass, the full T x T square that the masked
    implementation computes (PaLM, Chowdhery et al. 2022, appendix B: 6N + 12 L H Q T,
    with H Q = d; nanoGPT's ``estimate_mfu`` uses the same formula). Norms, softmax and
    GELU (a few FLOPs per activation) are left out: XLA's count is a few per cent
    higher.

    >>> flops_per_token(LMConfig.cpu(), 128)  # 6 x 1,017,216 + 12 x 5 x 128 x 128
    7086336.0
    """
    config = _check_config(config)
    t = config.context if context is None else errors.check_int("context", context, low=1)
    n = param_count(config) - (config.vocab + config.context) * config.d_model
    return float(6 * n + 12 * config.layers * config.d_model * t)


# ------------------------------------------------------------------ the decode roofline


@dataclasses.dataclass(frozen=True)
class DecodeCost:
    """One decode step of ``batch`` sequences at position ``position``: FLOPs and the
    HBM bytes it must read (every weight once, and every sequence's cached keys and
    values)."""

    batch: int
    position: int
    flops: float
    weight_bytes: float
    cache_bytes: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.cache_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte: compare with the chip's ridge point."""
        return self.flops / self.bytes

    def time_s(self, chip: hardware.Chip | str) -> float:
        """The roofline's lower bound on one step: max(FLOPs / peak, bytes / bandwidth)."""
        chip = hardware.as_chip(chip)
        return max(self.flops / chip.peak_flops(), self.bytes / chip.hbm_bytes_per_s)


def decode_cost(config: LMConfig, batch: int, position: int, *,
                weight_bytes_per_param: float = 2, cache_bytes_per_value: float = 2
                ) -> DecodeCost:
    """FLOPs and bytes of one decode step (one new token per sequence).

    FLOPs: ``batch x (2 N + 4 L d t)``: a multiply-add per weight that multiplies, and
    per layer t d multiply-adds for the scores plus t d for the weighted sum over the
    t = ``position`` + 1 cached positions (the scaling book, "All about transformer
    inference"). Bytes: every parameter once (``weight_bytes_per_param``, 2 for bf16
    serving weights), plus keys and values, ``2 L d`` numbers per position per sequence.

    >>> c = decode_cost(LMConfig.cpu(), batch=1, position=0)
    >>> c.flops, c.weight_bytes, c.cache_bytes
    (2036992.0, 2132736.0, 2560.0)
    """
    config = _check_config(config)
    batch = errors.check_int("batch", batch, low=1)
    position = errors.check_int("position", position, low=0, high=config.context - 1)
    weight_bytes_per_param = errors.check_number("weight_bytes_per_param",
                                                 weight_bytes_per_param, low=0, low_open=True)
    cache_bytes_per_value = errors.check_number("cache_bytes_per_value",
                                                cache_bytes_per_value, low=0)
    t = position + 1
    n = param_count(config) - (config.vocab + config.context) * config.d_model
    flops = batch * (2 * n + 4 * config.layers * config.d_model * t)
    cache = batch * t * 2 * config.layers * config.d_model * cache_bytes_per_value
    return DecodeCost(batch, position, float(flops),
                      float(param_count(config) * weight_bytes_per_param), float(cache))


def decode_ridge_batch(config: LMConfig, chip: hardware.Chip | str, position: int, *,
                       weight_bytes_per_param: float = 2,
                       cache_bytes_per_value: float = 2) -> float:
    """The batch size at which a decode step at ``position`` turns compute-bound.

    Solves flops(b) / bytes(b) = the chip's ridge point I (peak bf16 / HBM bandwidth):
    b (2N + 4 L d t) = I (W + b C) with W the weight bytes and C one sequence's cache
    bytes, so b = I W / (2N + 4 L d t - I C). Where the cache alone keeps intensity
    below I (the denominator <= 0), no batch makes decode compute-bound: ``inf``.
    With bf16 weights and no cache this is about I itself (the scaling book's "batch
    > 240 on v5e"); every cached position adds bytes at about 1 FLOP per byte, so a
    longer cache pushes it up, and soon out of reach (the scaling book, "All about
    transformer inference": attention in decode is memory-bound at any batch).

    >>> round(decode_ridge_batch(LMConfig.cpu(), "v5e", position=0))
    361
    >>> decode_ridge_batch(LMConfig.cpu(), "v5e", position=63)
    inf
    """
    chip = hardware.as_chip(chip)
    one = decode_cost(config, 1, position, weight_bytes_per_param=weight_bytes_per_param,
                      cache_bytes_per_value=cache_bytes_per_value)
    ridge = chip.critical_intensity()
    denominator = one.flops - ridge * one.cache_bytes
    if denominator <= 0:
        return math.inf
    return ridge * one.weight_bytes / denominator


# ------------------------------------------------------- memory per chip, and decode table

#: The chapter's shardings (section 5), by parameter name: the mesh axis that cuts each
#: array axis (None: not cut). FSDP on "data", tensor parallelism on "model".
CHAPTER_SPECS: dict[str, tuple[str | None, ...]] = {
    "embed": ("data", None), "positions": ("data", None), "head": ("data", None),
    "wq": ("data", "model", None), "wk": ("data", "model", None),
    "wv": ("data", "model", None), "wo": ("model", None, "data"),
    "w_in": ("data", "model"), "w_out": ("model", "data"), "scale": (),
}
_ADAM_COUNTS_BYTES = 8  # make_optimizer's state: two int32 step counts (Adam's, the schedule's)


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """Predicted bytes per chip of one training step under :data:`CHAPTER_SPECS`.

    ``params_bytes``, ``grads_bytes``: float32, each chip's shard; ``optimizer_bytes``:
    Adam's two moments, sharded like the weights, and two int32 counts;
    ``batch_bytes``: inputs and targets (int32) of the chip's sequences;
    ``activations_bytes`` without remat and ``remat_activations_bytes`` with
    ``nothing_saveable`` (see :func:`memory_budget` for the model). Compare with XLA's
    ``memory_analysis()`` through :meth:`table`.
    """

    config: LMConfig
    mesh_shape: tuple[tuple[str, int], ...]
    batch: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    batch_bytes: float
    activations_bytes: float
    remat_activations_bytes: float

    def total_bytes(self, remat: bool = False) -> float:
        """Parameters + gradients + optimizer state + batch + activations."""
        acts = self.remat_activations_bytes if remat else self.activations_bytes
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes
                + self.batch_bytes + acts)

    def rows(self, grad: Any = None, init: Any = None, grad_remat: Any = None
             ) -> list[tuple[str, float, float | None]]:
        """(quantity, predicted bytes, XLA's bytes or None) per row.

        ``grad``: ``hlo.inspect`` of ``jax.grad(loss)`` compiled with the parameters'
        shardings in and out (arguments: parameters and batch; outputs: the gradients;
        temporaries: the activations and XLA's working space); ``grad_remat``: the same
        with ``remat="nothing_saveable"``; ``init``: ``hlo.inspect`` of the optimizer's
        ``init`` compiled with the moments' shardings (outputs: the optimizer state).
        """
        def get(report: Any, field: str, less: float = 0.0) -> float | None:
            value = None if report is None else getattr(report, field, None)
            if report is not None and not hasattr(report, "temp_bytes"):
                raise errors.CourseTypeError(
                    f"expected an hlo.inspect(...) report (argument_bytes, output_bytes, "
                    f"temp_bytes), got {type(report).__name__}")
            return None if value is None else float(value) - less

        return [
            ("parameters (f32)", self.params_bytes, get(grad, "argument_bytes",
                                                        self.batch_bytes)),
            ("gradients (f32)", self.grads_bytes, get(grad, "output_bytes")),
            ("optimizer state", self.optimizer_bytes, get(init, "output_bytes")),
            ("batch (int32)", self.batch_bytes, None),
            ("activations, no remat", self.activations_bytes, get(grad, "temp_bytes")),
            ("activations, nothing_saveable", self.remat_activations_bytes,
             get(grad_remat, "temp_bytes")),
        ]

    def table(self, grad: Any = None, init: Any = None, grad_remat: Any = None) -> str:
        """The rows as text: MiB predicted, MiB XLA reports, their ratio."""
        from tpu_course import tables

        out = []
        for name, predicted, xla in self.rows(grad, init, grad_remat):
            out.append((name, f"{predicted / 2**20:,.2f}",
                        "-" if xla is None else f"{xla / 2**20:,.2f}",
                        "-" if not xla or not predicted else f"{xla / predicted:.2f}"))
        mesh = " x ".join(f"{k} {v}" for k, v in self.mesh_shape)
        head = (f"per chip, mesh {mesh}, batch {self.batch} x {self.config.context}, "
                f"compute {self.config.compute_dtype}")
        return head + "\n" + tables.text(out, ("", "predicted MiB", "XLA MiB",
                                               "XLA / predicted"), right=True)

    def __str__(self) -> str:
        return self.table()


def memory_budget(config: LMConfig, mesh_shape: dict[str, int] | None = None, *,
                  batch: int = 32) -> MemoryBudget:
    """Bytes per chip of a training step of ``LM(config)`` on a ``(data, model)`` mesh,
    sharded as the chapter's section 5 shards it (:data:`CHAPTER_SPECS`).

    Parameters, gradients: float32, each array's shard (an axis of n cut k ways keeps
    ceil(n / k), as XLA pads it); Adam's two moments: the same again, twice, plus two
    int32 counts. Activations, in ``config.compute_dtype`` (c bytes), for the chip's
    ceil(``batch`` / data) x T tokens: per layer and token, the four d-vectors a block
    keeps whole on every ``model`` device (its input, the first norm's output, the
    residual after attention, the second norm's output) and, cut over ``model`` (m
    devices), query, key, value and attention's output (4 d / m) and the MLP's hidden
    layer before and after the GELU (2 F / m), plus the softmax's probabilities,
    H T / m numbers in float32: c (4 d + (4 d + 2 F) / m) + 4 H T / m bytes. Then the
    final norm's output (d, compute dtype) and the logits (256, float32). With
    ``nothing_saveable`` a layer keeps only its input (d), and the backward pass holds
    one layer's full set at a time. XLA's working space (gathered weights, bf16 copies,
    fused temporaries, reused buffers) is not modelled: XLA's temporaries differ from
    the activation rows by that (the ``table`` shows by how much).

    >>> b = memory_budget(LMConfig.cpu(compute_dtype="float32"), batch=32)
    >>> b.params_bytes, b.optimizer_bytes, round(b.activations_bytes / 2**20, 1)
    (579072.0, 1158152.0, 31.5)
    """
    config = _check_config(config)
    mesh_shape = {"data": 4, "model": 2} if mesh_shape is None else mesh_shape
    if not isinstance(mesh_shape, dict) or set(mesh_shape) != {"data", "model"}:
        raise errors.CourseValueError(
            f"mesh_shape={mesh_shape!r}: expected the chapter's mesh as a dict with the "
            "axes 'data' and 'model', e.g. {'data': 4, 'model': 2}")
    sizes = {k: errors.check_int(f"mesh_shape[{k!r}]", v, low=1) for k, v in mesh_shape.items()}
    batch = errors.check_int("batch", batch, low=1)
    d, f, h, k, t = config.d_model, config.d_ff, config.heads, config.head_dim, config.context
    shapes = [("embed", (config.vocab, d)), ("positions", (t, d)), ("scale", (d,)),
              ("head", (d, config.vocab))]
    shapes += config.layers * [("wq", (d, h, k)), ("wk", (d, h, k)), ("wv", (d, h, k)),
                               ("wo", (h, k, d)), ("w_in", (d, f)), ("w_out", (f, d)),
                               ("scale", (d,)), ("scale", (d,))]

    def shard(name: str, shape: tuple[int, ...]) -> int:
        spec = CHAPTER_SPECS[name] + (None,) * (len(shape) - len(CHAPTER_SPECS[name]))
        return math.prod(-(-n // (sizes[a] if a else 1)) for n, a in zip(shape, spec))

    params = 4.0 * sum(shard(name, shape) for name, shape in shapes)
    tokens = -(-batch // sizes["data"]) * t
    c = jnp.dtype(config.compute_dtype).itemsize
    m = sizes["model"]
    layer = c * (4 * d + (4 * d + 2 * f) / m) + 4 * h * t / m  # bytes per token
    head = c * d + 4 * config.vocab
    acts = tokens * (config.layers * layer + head)
    remat = tokens * (config.layers * c * d + layer + head)
    return MemoryBudget(config, tuple(sizes.items()), batch, params, params,
                        2 * params + _ADAM_COUNTS_BYTES, 2.0 * tokens * 4, float(acts),
                        float(remat))


@dataclasses.dataclass(frozen=True)
class DecodeTable:
    """Tokens/s per chip that the decode roofline allows: ``rows`` of (chip, batch,
    tokens/s, 'memory' or 'compute'), at cache position ``position``; ``measured``: a
    timed row to print beside it (label, {batch: tokens/s})."""

    config: LMConfig
    position: int
    rows: tuple[tuple[str, int, float, str], ...]
    measured: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()

    def beside(self, label: str, tokens_per_s: dict[int, float]) -> "DecodeTable":
        """The table with a measured row added (``label`` says where it was timed)."""
        if not isinstance(label, str) or not isinstance(tokens_per_s, dict):
            raise errors.CourseTypeError(
                "beside(label, tokens_per_s): expected a label (str) and a dict of "
                f"batch -> tokens/s, got {type(label).__name__}, "
                f"{type(tokens_per_s).__name__}")
        row = (label, tuple((int(b), float(v)) for b, v in tokens_per_s.items()))
        return dataclasses.replace(self, measured=self.measured + (row,))

    def tokens_per_s(self, chip: str, batch: int) -> float:
        for name, b, value, _ in self.rows:
            if (name, b) == (chip, batch):
                return value
        raise errors.CourseValueError(f"no row for chip {chip!r} at batch {batch} in "
                                      "this table: pass them to decode_table")

    def __str__(self) -> str:
        from tpu_course import tables

        batches = sorted({b for _, b, _, _ in self.rows})
        chips = list(dict.fromkeys(name for name, _, _, _ in self.rows))
        out = []
        for chip in chips:
            cells = {b: (v, kind) for name, b, v, kind in self.rows if name == chip}
            out.append([f"{chip} (bound)"] + [
                f"{cells[b][0]:,.0f}{'' if cells[b][1] == 'memory' else ' C'}"
                if b in cells else "-" for b in batches])
        for label, values in self.measured:
            got = dict(values)
            out.append([label] + [f"{got[b]:,.0f}" if b in got else "-" for b in batches])
        head = (f"tokens/s per chip, decode at cache position {self.position}\n"
                "(bounds: bf16 weights and cache; C: compute-bound, else memory-bound)")
        return head + "\n" + tables.text(out, [""] + [f"batch {b}" for b in batches],
                                         right=True)


def decode_table(config: LMConfig, chips: tuple[str, ...] = ("v5e", "v6e", "h200"),
                 batches: tuple[int, ...] = (1, 8, 64), *, position: int = 64,
                 weight_bytes_per_param: float = 2, cache_bytes_per_value: float = 2
                 ) -> DecodeTable:
    """The decode roofline's bound on tokens/s per chip: ``batch / time_s(chip)`` of
    :func:`decode_cost` (one chip holds the whole model and the cache; one new token
    per sequence per step), for each chip of ``tpu_course.hardware`` and batch.

    >>> t = decode_table(LMConfig.cpu(), ("v5e",), (1,), position=0)
    >>> round(t.tokens_per_s("v5e", 1))  # 819e9 B/s / 2,135,296 B per step
    383553
    """
    config = _check_config(config)
    if isinstance(chips, str) or not chips:
        raise errors.CourseTypeError(f"chips={chips!r}: expected a tuple of chip names, "
                                     "e.g. ('v5e', 'v6e', 'h200')")
    if isinstance(batches, int) or not batches:
        raise errors.CourseTypeError(f"batches={batches!r}: expected a tuple of batch "
                                     "sizes, e.g. (1, 8, 64)")
    rows = []
    for name in chips:
        chip = hardware.as_chip(name)
        for b in batches:
            cost = decode_cost(config, b, position,
                               weight_bytes_per_param=weight_bytes_per_param,
                               cache_bytes_per_value=cache_bytes_per_value)
            bound = ("compute" if cost.flops / chip.peak_flops()
                     > cost.bytes / chip.hbm_bytes_per_s else "memory")
            rows.append((chip.name, cost.batch, cost.batch / cost.time_s(chip), bound))
    return DecodeTable(config, position, tuple(rows))


if __name__ == "__main__":
    raise SystemExit(main())
