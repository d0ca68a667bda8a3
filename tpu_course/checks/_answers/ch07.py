"""The course's answers to lab 7 (private: only ``checks.ch07`` and the tests import them).

A learner's answer that is, or calls, one of these is refused by its checker.
"""

from __future__ import annotations

import functools
import math
from typing import Any


def dense_relu_kernel(x_ref: Any, w_ref: Any, b_ref: Any, o_ref: Any, acc_ref: Any) -> None:
    """Exercise 1, one (i, j, k) step: the chapter's accumulator, then at the last K step
    the bias and the ReLU on the float32 sum, and one cast."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    @pl.when(pl.program_id(2) == 0)
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _epilogue():
        z = acc_ref[...] + b_ref[...].astype(jnp.float32)
        o_ref[...] = jnp.maximum(z, 0).astype(o_ref.dtype)


def dense_relu_reference(x: Any, w: Any, b: Any, bm: int, bk: int, bn: int,
                         interpret: Any = False) -> Any:
    """Exercise 1: ``relu(x @ w + b)`` (``b`` of shape (1, N)) in one K-tiled kernel."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    m, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        dense_relu_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(x, w, b)


def dense_relu_xla(x: Any, w: Any, b: Any) -> Any:
    """Exercise 1's operation in plain JAX (XLA fuses it into one matmul fusion)."""
    import jax
    import jax.numpy as jnp

    z = jnp.dot(x, w, preferred_element_type=jnp.float32) + b.astype(jnp.float32)
    return jax.nn.relu(z).astype(x.dtype)


def footprint(bm: int, bk: int, bn: int, itemsize: int) -> int:
    """Exercise 2's model: the x, y and output blocks, each double-buffered, plus the
    float32 accumulator (single: it stays in VMEM for the whole K loop).

    >>> footprint(512, 512, 512, 2) / 2**20
    4.0
    """
    return 2 * (bm * bk + bk * bn + bm * bn) * itemsize + 4 * bm * bn


@functools.lru_cache(maxsize=None)
def candidate_verdict(blocks: tuple[int, int, int], problem: tuple[int, int, int],
                      target: str) -> Any:
    """Exercise 3: the TPU compiler's verdict on the chapter's K-tiled kernel
    (:func:`tpu_course.pallas_tools.matmul_ktiled`) with ``blocks`` for ``problem`` in bf16
    (cached)."""
    import jax
    import jax.numpy as jnp

    from tpu_course import pallas_tools

    bm, bk, bn = blocks
    m, k, n = problem
    fn = functools.partial(pallas_tools.matmul_ktiled, bm=bm, bk=bk, bn=bn)
    S = jax.ShapeDtypeStruct
    return pallas_tools.compile_verdict(fn, S((m, k), jnp.bfloat16), S((k, n), jnp.bfloat16),
                                        target=target)


def scores_reference(q: Any, k: Any) -> Any:
    """Exercise 4's operation: ``softmax(q @ k.T / sqrt(d))`` over the keys, in float32
    (XLA's version, not a kernel)."""
    import jax
    import jax.numpy as jnp

    s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    return jax.nn.softmax(s, axis=-1).astype(q.dtype)


def attention_scores_reference(q: Any, k: Any, bq: int, interpret: Any = False) -> Any:
    """Exercise 4: the fused kernel, one step per block of ``bq`` queries."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    lq, d = q.shape
    lk = k.shape[0]

    def kernel(q_ref: Any, k_ref: Any, o_ref: Any) -> None:
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) / math.sqrt(d)
        e = jnp.exp(s - s.max(axis=-1, keepdims=True))
        o_ref[...] = (e / e.sum(axis=-1, keepdims=True)).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((lq, lk), q.dtype),
        grid=(lq // bq,),
        in_specs=[pl.BlockSpec((bq, d), lambda i: (i, 0)),
                  pl.BlockSpec((lk, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((bq, lk), lambda i: (i, 0)),
        interpret=interpret,
    )(q, k)
