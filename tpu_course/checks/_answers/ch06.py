"""The course's answers to lab 6 (private: only ``checks.ch06`` imports them).

A learner's answer that is, or calls, one of these is refused by its checker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpu_course import hardware


def fsdp_spec(shape: tuple[int, ...], axis: str, n: int) -> Any:
    """FSDP's spec for one array: its first dimension that ``n`` divides, split over ``axis``."""
    from jax.sharding import PartitionSpec as P

    for d, size in enumerate(shape):
        if size % n == 0:
            return P(*([None] * d), axis)
    return P()


def shard_fsdp(step: Callable, state: Any, mesh: Any) -> tuple[Callable, Any, Any]:
    """Exercise 2: the chapter-5 step under FSDP, by annotations alone."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = mesh.shape["data"]
    state_sharding = jax.tree.map(
        lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), "data", n)), state)
    batch_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    def fsdp_step(state: Any, batch: Any) -> Any:
        params = jax.lax.with_sharding_constraint(state.params, replicated)
        return step(state._replace(params=params), batch)

    jitted = jax.jit(fsdp_step, in_shardings=(state_sharding, batch_sharding),
                     out_shardings=(state_sharding, replicated))
    return jitted, state_sharding, batch_sharding


def bidirectional_all_reduce(x: Any, axis: str, n: int) -> Any:
    """Exercise 4: half the chunks round the ring rightwards, half leftwards."""
    import jax
    import jax.numpy as jnp

    flat = x.reshape(-1)
    halves = jnp.pad(flat, (0, (-flat.size) % (2 * n))).reshape(2, n, -1)
    me = jax.lax.axis_index(axis)
    right = [(i, (i + 1) % n) for i in range(n)]
    left = [(i, (i - 1) % n) for i in range(n)]
    a, b = halves[0], halves[1]
    for s in range(n - 1):
        a = a.at[(me - 1 - s) % n].add(jax.lax.ppermute(a[(me - s) % n], axis, right))
        b = b.at[(me + 1 + s) % n].add(jax.lax.ppermute(b[(me + s) % n], axis, left))
    for s in range(n - 1):
        a = a.at[(me - s) % n].set(jax.lax.ppermute(a[(me + 1 - s) % n], axis, right))
        b = b.at[(me + s) % n].set(jax.lax.ppermute(b[(me - 1 + s) % n], axis, left))
    return jnp.stack([a, b]).reshape(-1)[: flat.size].reshape(x.shape)


def hierarchical_all_reduce(x: Any) -> Any:
    """Exercise 5: reduce-scatter over ICI, all-reduce the piece over DCN, gather over ICI."""
    import jax

    part = jax.lax.psum_scatter(x, "chip", scatter_dimension=0, tiled=True)
    return jax.lax.all_gather(jax.lax.psum(part, "slice"), "chip", axis=0, tiled=True)


#: Training bytes per parameter with Adam, the scaling book's count the chapter uses.
BYTES_PER_PARAM = 10
#: FLOPs per parameter per token of the backward pass (the part that hides the all-reduce).
BACKWARD_FLOPS = 4


def dcn_threshold(chip: str, slices: int) -> float:
    """The course's variant of the DCN rule: fp32 gradients, a ring over ``slices`` slices
    (each sends ``2 (S-1)/S`` times them), the backward pass's 4 FLOPs per parameter per
    token overlapping: ``2 (S-1)/S x 4 B / 4 x C / W_dcn`` tokens per slice."""
    c = hardware.get(chip)
    ring_bytes = 2 * (slices - 1) / slices * 4
    return ring_bytes / BACKWARD_FLOPS * c.peak_bf16_flops_per_s / c.dcn_bytes_per_s


def choose(chip: str, params: float, tokens_per_slice: float, slices: int) -> tuple[str, str]:
    """Exercise 6: DP or FSDP inside a slice (memory), none / DP / pipeline across (DCN)."""
    within = "fsdp" if BYTES_PER_PARAM * params > hardware.get(chip).hbm_bytes else "dp"
    if slices == 1:
        return within, "none"
    return within, ("dp" if tokens_per_slice >= dcn_threshold(chip, slices) else "pipeline")


def process_rows(global_batch: Any, sharding: Any) -> Any:
    """Exercise 7: the rows this process's devices hold, each block once, in order."""
    import numpy as np

    index = sharding.addressable_devices_indices_map(global_batch.shape)
    blocks = sorted({(i[0].start or 0, i[0].stop or len(global_batch)) for i in index.values()})
    return np.concatenate([global_batch[a:b] for a, b in blocks])
