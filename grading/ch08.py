"""Lab 8's keys: references, hidden cases and known mistakes (see :mod:`grading`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grading import Key
from tpu_course import hardware, lm
from tpu_course.checks.ch08 import (
    DECODE_CHIP, DECODE_POSITION, _attention_case, _decode_case, decode_config, exercise1_config)
from tpu_course.checks.engine import Mistake

# Exercise 1: N parameters (M of them multiply), F the chapter's FLOPs per token, A attention's.
_C = exercise1_config()
N, F, V, D, T, L = (lm.param_count(_C), lm.flops_per_token(_C), _C.vocab, _C.d_model,
                    _C.context, _C.layers)
M, A, HEAD = N - (V + T) * D, 12 * L * D * T, V * D
EX1 = Key(mistakes=[Mistake(hint, answer) for answer, hint in [
    ((N - HEAD, F), "you left out one of the vocab x d_model tables: the token embedding and the "
                    "output head are separate parameters (not tied)"),
    ((N - 2 * HEAD, F), "you left out both vocab x d_model tables (token embedding, output head)"),
    ((N - T * D, F), "you left out the position table (context x d_model)"),
    ((N - 2 * D * L - D, F), "you left out the norms' scales (two per block, one final)"),
    ((M, F), "that is the parameters that multiply: count every parameter, the tables included"),
    ((N, 6 * N + A), "you counted both embedding tables as matmuls (6 x every parameter): a lookup "
                     "multiplies nothing (the output head does)"),
    ((N, F + 6 * HEAD), "you counted an embedding table as a matmul: the token and position "
                        "tables are lookups (the output head, a table of its own, multiplies)"),
    ((N, 6 * N), "that is 6N with every parameter and no attention term"),
    ((N, F - A), "you left out the attention term, 12 x layers x d_model x context per token: "
                 "the scores and the weighted sum grow with the context (PaLM, appendix B)"),
    ((N, F - A / 2), "that is half of attention's term: the masked implementation computes the "
                     "whole context x context square"),
    ((N, F / 2), "you counted a multiply-add as 1 FLOP: XLA (and the 6N rule) counts 2"),
    ((N, 2 * M + A / 3), "that is the forward pass alone (2N + attention): training adds the "
                         "backward pass, twice the forward"),
    ((N, 2 * M), "that is the forward pass alone (2N), without attention"),
    ((N, F - 6 * HEAD), "you left out the output head: it multiplies every token, 6 x d_model x "
                        "vocab")]])

# Exercise 2: the losses come from one device and the mistakes are rules on the shardings.
EX2 = Key(hidden=lambda rng: [_attention_case((128, 64, int(rng.choice([8, 16])), 8), (2, 4))])


def make_decode(mask="<=", scale=True, write="set", shift=0, feed_back=True, dtype=None):
    """Exercise 4's decode step: the right one by default, each other choice a known mistake."""
    def decode_step(weights, x, cache, pos):
        keys, values = cache
        if dtype is not None:
            keys, values, x = keys.astype(dtype), values.astype(dtype), x.astype(dtype)
            weights = {n: w.astype(dtype) for n, w in weights.items()}
        q, k, v = (jnp.einsum("bd,dhk->bhk", x, weights[n]) for n in ("wq", "wk", "wv"))
        if write == "batch axis":
            new_k, new_v = keys.at[pos + shift].set(k[0]), values.at[pos + shift].set(v[0])
        else:
            new_k = getattr(keys.at[:, pos + shift], write)(k.astype(keys.dtype))
            new_v = getattr(values.at[:, pos + shift], write)(v.astype(values.dtype))
        s = jnp.einsum("bhk,bthk->bht", q, new_k) / (q.shape[-1] ** 0.5 if scale else 1)
        t = jnp.arange(keys.shape[1])
        if mask != "none":
            s = jnp.where(t <= pos if mask == "<=" else t < pos, s, -1e30)
        probs = jax.nn.softmax(s.astype(jnp.float32), -1).astype(new_v.dtype)
        out = jnp.einsum("bht,bthk,hkd->bd", probs, new_v, weights["wo"])
        return out, ((new_k, new_v) if feed_back else (keys, values))
    return decode_step


def _ex4_hidden(rng):  # an odd batch, d_model not heads x head_dim, from 0 or near the end
    t = int(rng.choice([7, 11, 13]))
    shape = (3, t, int(rng.choice([1, 3, 5])), int(rng.choice([4, 6])), int(rng.choice([12, 20])))
    start, dtype = int(rng.choice([0, t - 2])), str(rng.choice(["float32", "bfloat16"]))
    return [_decode_case(shape, start, dtype, int(rng.integers(1 << 30)),
                         "an odd batch and d_model")]


EX4 = Key(reference=make_decode(), hidden=_ex4_hidden, mistakes=[
    Mistake(h, make_decode(**kw)) for kw, h in [
        ({"mask": "none"}, "you attended to every position of the cache, the stale ones after "
                           "pos included: mask positions > pos"),
        ({"mask": "<"}, "the new token attends to itself too: keep positions <= pos, not < pos"),
        ({"scale": False}, "scale the scores by 1 / sqrt(head_dim)"),
        ({"shift": 1}, "the new key and value go at index pos of the length axis, not pos + 1"),
        ({"write": "add"}, "you added the new key and value to the stale entry the cache held at "
                           "pos (.at[...].add): set it (.at[:, pos].set or dynamic_update_slice)"),
        ({"write": "batch axis"}, "you wrote at index pos of axis 0, the batch: the length axis "
                                  "is axis 1 (keys.at[:, pos])"),
        ({"feed_back": False}, "you return the cache that came in: return the one with the new "
                               "key and value written, since the next step reads it"),
        ({"dtype": "float32"}, "a bfloat16 cache came in and float32 goes out: keep the dtypes "
                               "that came in (compute in float32 inside if you like, then cast "
                               "back)")]])

# Exercise 5: _I the chip's ridge point (bf16 FLOPs per HBM byte).
_I = hardware.get(DECODE_CHIP).critical_intensity()
_ridge = lambda **kw: lm.decode_ridge_batch(decode_config(), DECODE_CHIP, DECODE_POSITION, **kw)
_NO_CACHE = ("you left out the KV cache: every sequence also reads its own cached keys and values "
             "(2 x layers x d_model numbers per position), bytes that grow with the batch; "
             "without them (and attention's FLOPs) the batch is about the ridge point")
EX5 = Key(mistakes=[Mistake(h, answer) for answer, h in [
    (_ridge(cache_bytes_per_value=0), _NO_CACHE),
    (_I, _NO_CACHE),
    (_ridge(weight_bytes_per_param=4), "you counted the weights as fp32 (4 bytes): serving reads "
                                       "bf16 weights, 2 bytes"),
    (_ridge(weight_bytes_per_param=4, cache_bytes_per_value=4), "twice bf16 serving's bytes per "
     "FLOP: the int8 peak (twice bf16's), or 4-byte weights and cache; the matmuls run at the "
     "bf16 peak and read 2 bytes per value"),
    (2 * _I, "that is twice the ridge point: the int8 peak (use the bf16 one) and no KV cache"),
    (_I / 2, "half the ridge point: a multiply-add is 2 FLOPs per weight, not 1"),
    (_ridge(cache_bytes_per_value=1), "every cached position holds a key and a value (2 x layers "
                                      "x d_model numbers, 2 bytes each): you counted one"),
    (_ridge(weight_bytes_per_param=1, cache_bytes_per_value=1), "1 byte per value is int8 "
     "serving: this model serves bf16 weights and cache, 2 bytes each")]])

KEYS = {"Exercise 1": EX1, "Exercise 2": EX2, "Exercise 4": EX4, "Exercise 5": EX5}
