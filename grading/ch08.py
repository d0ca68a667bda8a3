"""Lab 8's keys: references, hidden cases and known mistakes (see :mod:`grading`)."""

from __future__ import annotations

import math

from grading import Key
from tpu_course import hardware, lm
from tpu_course.checks.ch08 import (
    DECODE_CHIP, DECODE_POSITION, _attention_case, _decode_case,
    decode_config, exercise1_config,
)
from tpu_course.checks.engine import Mistake

# -- Exercise 1 ----------------------------------------------------------------------------

_C = exercise1_config()
N, F = lm.param_count(_C), lm.flops_per_token(_C)
V, D, T, L = _C.vocab, _C.d_model, _C.context, _C.layers
MULTIPLYING = N - (V + T) * D

EX1 = Key(mistakes=[
    Mistake("you left out one of the two vocab x d_model tables: the token embedding and the "
            "output head are separate parameters (not tied)", (N - V * D, F)),
    Mistake("you left out both vocab x d_model tables (the token embedding and the output "
            "head)", (N - 2 * V * D, F)),
    Mistake("you left out the position table (context x d_model)", (N - T * D, F)),
    Mistake("you left out the norms' scales (two per block and the final one, d_model each)",
            (N - 2 * D * L - D, F)),
    Mistake("that is the parameters that multiply: predicted_params counts every parameter, "
            "the two embedding tables included", (MULTIPLYING, F)),
    Mistake("you counted both embedding tables as matmuls (6 x every parameter): a lookup "
            "reads a row and multiplies nothing, so only the parameters that multiply count "
            "(the output head does)", (N, 6 * N + 12 * L * D * T)),
    Mistake("you counted an embedding table as a matmul: the token and position tables are "
            "lookups (the output head, a table of its own, multiplies)",
            (N, F + 6 * V * D)),
    Mistake("that is 6N with every parameter and no attention term", (N, 6 * N)),
    Mistake("you left out the attention term: the scores and the weighted sum grow with the "
            "context, 12 x layers x d_model x context per token (PaLM, appendix B)",
            (N, F - 12 * L * D * T)),
    Mistake("that is half of attention's term: the masked implementation computes the whole "
            "context x context square, 12 x layers x d_model x context", (N, F - 6 * L * D * T)),
    Mistake("you counted a multiply-add as 1 FLOP: XLA (and the 6N rule) counts 2", (N, F / 2)),
    Mistake("that is the forward pass alone (2N + attention): training adds the backward "
            "pass, twice the forward", (N, 2 * MULTIPLYING + 4 * L * D * T)),
    Mistake("that is the forward pass alone (2N), without attention", (N, 2 * MULTIPLYING)),
    Mistake("you left out the output head: it multiplies every token, 6 x d_model x vocab",
            (N, F - 6 * V * D)),
])


# -- Exercise 2 ----------------------------------------------------------------------------


# The expected losses come from one device (expect=) and the mistakes are the exercise's
# rules on the shardings' data, so the checking process needs no 8-device mesh.
EX2 = Key(hidden=lambda rng: [
    _attention_case((128, 64, int(rng.choice([8, 16])), 8), (2, 4))])


# -- Exercise 4 ----------------------------------------------------------------------------


def make_decode(mask="<=", scale=True, write="set", shift=0, feed_back=True, dtype=None):
    """A decode step: the right one by default, each other choice a known mistake."""
    import jax
    import jax.numpy as jnp

    def decode_step(weights, x, cache, pos):
        keys, values = cache
        if dtype is not None:
            keys, values, x = keys.astype(dtype), values.astype(dtype), x.astype(dtype)
            weights = {n: w.astype(dtype) for n, w in weights.items()}
        q, k, v = (jnp.einsum("bd,dhk->bhk", x, weights[n]) for n in ("wq", "wk", "wv"))
        at = pos + shift
        if write == "batch axis":
            new_k, new_v = keys.at[at].set(k[0]), values.at[at].set(v[0])
        else:
            new_k = getattr(keys.at[:, at], write)(k.astype(keys.dtype))
            new_v = getattr(values.at[:, at], write)(v.astype(values.dtype))
        s = jnp.einsum("bhk,bthk->bht", q, new_k) / (math.sqrt(q.shape[-1]) if scale else 1)
        t = jnp.arange(keys.shape[1])
        if mask != "none":
            s = jnp.where(t <= pos if mask == "<=" else t < pos, s, -1e30)
        probs = jax.nn.softmax(s.astype(jnp.float32), -1).astype(new_v.dtype)
        out = jnp.einsum("bht,bthk,hkd->bd", probs, new_v, weights["wo"])
        return out, ((new_k, new_v) if feed_back else (keys, values))

    return decode_step


def _ex4_hidden(rng):
    """One case unlike the visible ones: an odd batch, d_model not heads x head_dim, from the
    first position or near the end, in either dtype."""
    t = int(rng.choice([7, 11, 13]))
    shape = (3, t, int(rng.choice([1, 3, 5])), int(rng.choice([4, 6])), int(rng.choice([12, 20])))
    start = int(rng.choice([0, t - 2]))
    return [_decode_case(shape, start, str(rng.choice(["float32", "bfloat16"])),
                         int(rng.integers(1 << 30)), "an odd batch and d_model")]


EX4 = Key(reference=make_decode(), hidden=_ex4_hidden, mistakes=[
    Mistake("you attended to every position of the cache, including the ones after pos "
            "(stale entries): mask positions > pos", make_decode(mask="none")),
    Mistake("the new token must attend to itself too: the mask keeps positions <= pos, not "
            "< pos", make_decode(mask="<")),
    Mistake("scale the scores by 1 / sqrt(head_dim)", make_decode(scale=False)),
    Mistake("the new key and value go at index pos of the length axis, not pos + 1",
            make_decode(shift=1)),
    Mistake("you added the new key and value to what the cache held at pos (.at[...].add): "
            "that slot holds a stale entry; set it (.at[:, pos].set or dynamic_update_slice)",
            make_decode(write="add")),
    Mistake("you wrote at index pos of axis 0, the batch: the length axis is axis 1 "
            "(keys.at[:, pos])", make_decode(write="batch axis")),
    Mistake("you return the cache that came in: return the one with the new key and value "
            "written, since the next step reads it", make_decode(feed_back=False)),
    Mistake("a bfloat16 cache came in and float32 goes out: keep the dtypes that came in "
            "(write k.astype(keys.dtype); compute in float32 inside if you like, then cast "
            "back)", make_decode(dtype="float32")),
])


# -- Exercise 5 ----------------------------------------------------------------------------


def _ridge(**kw):
    return lm.decode_ridge_batch(decode_config(), DECODE_CHIP, DECODE_POSITION, **kw)


_I = hardware.get(DECODE_CHIP).critical_intensity()
_NO_CACHE = ("you left out the KV cache: every sequence also reads its own cached keys and "
             "values (2 x layers x d_model numbers per position), bytes that grow with the "
             "batch; without them (and attention's FLOPs) the batch is about the ridge point")

EX5 = Key(mistakes=[
    Mistake(_NO_CACHE, _ridge(cache_bytes_per_value=0)),
    Mistake(_NO_CACHE, _I),
    Mistake("you counted the weights as fp32 (4 bytes): serving reads bf16 weights, 2 bytes",
            _ridge(weight_bytes_per_param=4)),
    Mistake("twice the bytes per FLOP that bf16 serving has: either the int8 peak (twice "
            "bf16's) in the ridge point, or fp32 (4-byte) weights and cache; the matmuls run "
            "at the bf16 peak and read 2 bytes per value",
            _ridge(weight_bytes_per_param=4, cache_bytes_per_value=4)),
    Mistake("that is twice the ridge point: the int8 peak (use the bf16 one) and no KV cache",
            2 * _I),
    Mistake("half the ridge point: a multiply-add is 2 FLOPs per weight, not 1", _I / 2),
    Mistake("every cached position holds a key and a value (2 x layers x d_model numbers, "
            "2 bytes each): you counted one of them", _ridge(cache_bytes_per_value=1)),
    Mistake("1 byte per value is int8 serving: this model serves bf16 weights and cache, 2 "
            "bytes each", _ridge(weight_bytes_per_param=1, cache_bytes_per_value=1)),
])

KEYS = {"Exercise 1": EX1, "Exercise 2": EX2, "Exercise 4": EX4, "Exercise 5": EX5}
