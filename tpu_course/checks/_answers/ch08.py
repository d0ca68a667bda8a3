"""The course's answers to lab 8 (private: only ``checks.ch08`` imports them).

A learner's answer that is, or calls, one of these is refused by its checker.
"""

from __future__ import annotations

import math
from typing import Any

from tpu_course import hardware


def attention_shardings(state: Any, mesh: Any) -> Any:
    """Exercise 2: FSDP on "data" and the heads on "model" for every attention weight;
    embedding rows (not features) on "data"; Adam's moments like their parameters."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    specs = {"embed": P("data", None), "wq": P("data", "model", None),
             "wk": P("data", "model", None), "wv": P("data", "model", None),
             "wo": P("model", None, "data")}

    def place(path: Any, leaf: Any) -> Any:
        names = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
        spec = next((specs[n] for n in reversed(names) if n in specs), P())
        return NamedSharding(mesh, spec if getattr(leaf, "ndim", 0) else P())

    return jax.tree_util.tree_map_with_path(place, state)


def decode_step(weights: dict, x: Any, cache: dict, pos: Any) -> tuple[Any, dict]:
    """Exercise 4: one token's attention with a KV cache: write k, v at ``pos``, attend to
    positions ``0..pos``."""
    import jax
    import jax.numpy as jnp

    q = jnp.einsum("bd,dhk->bhk", x, weights["wq"])
    k = jnp.einsum("bd,dhk->bhk", x, weights["wk"])
    v = jnp.einsum("bd,dhk->bhk", x, weights["wv"])
    ck = jax.lax.dynamic_update_slice_in_dim(cache["k"], k[:, None].astype(cache["k"].dtype),
                                             pos, axis=1)
    cv = jax.lax.dynamic_update_slice_in_dim(cache["v"], v[:, None].astype(cache["v"].dtype),
                                             pos, axis=1)
    scores = jnp.einsum("bhk,bthk->bht", q, ck) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    seen = jnp.arange(ck.shape[1]) <= pos
    scores = jnp.where(seen, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
    out = jnp.einsum("bht,bthk->bhk", probs, cv)
    return jnp.einsum("bhk,hkd->bd", out, weights["wo"]), {"k": ck, "v": cv}


def decode_flops_per_token(params: float, layers: int, d_model: int, context: int) -> float:
    """FLOPs of one decoded token: 2 per parameter (a multiply and an add) and the
    attention over ``context`` cached positions, q.k and p.v: 2 x 2 x context x d_model
    per layer."""
    return 2 * params + 4 * layers * context * d_model


def compute_bound_batch(chip: str, params: float, layers: int, d_model: int, context: int,
                        weight_bytes: int = 2, cache_bytes: int = 2) -> float:
    """Exercise 5: the smallest decode batch whose FLOPs per byte reach the chip's ridge
    point (bf16 peak / HBM bandwidth); ``math.inf`` when the KV cache keeps it below the
    ridge at every batch size."""
    ridge = hardware.get(chip).critical_intensity("bf16")
    flops = decode_flops_per_token(params, layers, d_model, context)
    kv = 2 * layers * context * d_model * cache_bytes
    weights = params * weight_bytes
    room = flops - ridge * kv  # FLOPs / bytes >= ridge  <=>  b (flops - ridge kv) >= ridge w
    if room <= 0:
        return math.inf
    return float(math.ceil(ridge * weights / room))
