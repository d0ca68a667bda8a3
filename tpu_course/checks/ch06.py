"""Checkers for lab 6: shardings, predicted collectives against the compiled HLO, a ring
all-reduce from ``ppermute``, and a parallelism plan justified by the cost model."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from tpu_course import comms
from tpu_course.checks._core import CheckResult, fail, ok

_SPEC_HINT = {
    "dp": "data parallelism replicates both weights, P(), and splits the batch, P(axis)",
    "fsdp": "FSDP splits every weight (its first axis, P(axis)) and the batch, P(axis)",
    "tp": "Megatron TP splits w1 by columns, P(None, axis), w2 by rows, P(axis, None), "
          "and gives every device the whole batch, P()",
}


def check_block_specs(block_specs: Callable[[str, str], tuple[Mapping[str, Any], Any]],
                      axis: str = "data") -> CheckResult:
    """Exercise 1: the PartitionSpecs of the MLP block's weights and batch per strategy."""
    from jax.sharding import PartitionSpec as P

    from tpu_course import parallel

    name = "Exercise 1 (shardings for DP, FSDP, TP)"

    def norm(spec: Any) -> tuple:
        t = tuple(spec) if spec is not None else ()
        while t and t[-1] is None:
            t = t[:-1]
        return t

    for strategy in ("dp", "fsdp", "tp"):
        want_p, want_x = parallel.mlp_block_specs(strategy, axis)
        got = block_specs(strategy, axis)
        if not isinstance(got, tuple) or len(got) != 2:
            return fail(name, f"block_specs({strategy!r}, {axis!r}) should return (param_specs, "
                              f"batch_spec); got {got!r}")
        got_p, got_x = got
        for k in ("w1", "w2"):
            if k not in got_p:
                return fail(name, f"{strategy}: no spec for {k!r}; expected keys 'w1' and 'w2'.")
            if norm(got_p[k]) != norm(want_p[k]):
                extra = ""
                if strategy == "tp" and norm(got_p[k]) == norm(want_p["w2" if k == "w1" else "w1"]):
                    extra = (" You swapped the column and row splits: then the hidden activations "
                             "would need an all-to-all between the two matmuls.")
                return fail(name, f"{strategy}: {k} is {P(*norm(got_p[k]))}, expected "
                                  f"{P(*norm(want_p[k]))}. Hint: {_SPEC_HINT[strategy]}.{extra}")
        if norm(got_x) != norm(want_x):
            return fail(name, f"{strategy}: the batch is {P(*norm(got_x))}, expected "
                              f"{P(*norm(want_x))}. Hint: {_SPEC_HINT[strategy]}.")
    return ok(name, "DP replicates the weights, FSDP shards them and the batch, TP splits "
                    "w1 by columns and w2 by rows.")


def _explain(kind: str, got: tuple[int, int], want: tuple[int, int], devices: int) -> str:
    (ga, gb), (wa, wb) = got, want
    if ga != wa:
        return (f"{kind}: you predicted {ga} array(s), the compiled step has {wa}. Count one per "
                "parameter for gradient collectives, plus the scalar loss where it is averaged.")
    if wb == 0 or gb == 0:
        return f"{kind}: you predicted {gb:,} bytes, the compiled step moves {wb:,}."
    r = gb / wb
    hints = {2.0: "twice too many: fp32 is 4 bytes per element, bf16 2; check the dtype",
             0.5: "half too few: fp32 is 4 bytes per element, not 2",
             float(devices): f"{devices}x too many: an all-gather's operand is the 1/{devices} "
                             "shard each device holds, not the gathered array",
             1 / devices: f"{devices}x too few: a reduce-scatter's operand is the whole "
                          "gradient on each device; the 1/N shard is its result",
             (devices - 1) / devices: f"off by (N-1)/N = {(devices - 1) / devices:.3f}: that "
                                      "factor belongs in the ring's time, not in the bytes "
                                      "each device hands to the collective"}
    for ratio, hint in hints.items():
        if math.isclose(r, ratio, rel_tol=1e-6):
            return f"{kind}: you predicted {gb:,} bytes, XLA's has {wb:,} per device: {hint}."
    return f"{kind}: you predicted {gb:,} bytes per device, the compiled step has {wb:,}."


def check_prediction(strategy: str, predicted: Mapping[str, tuple[int, int]],
                     compiled: Mapping[str, tuple[int, int]], devices: int) -> CheckResult:
    """Exercise 2: a predicted ``{kind: (arrays, bytes per device)}`` against the HLO's.

    ``compiled`` is ``tpu_course.parallel.observed_collectives(report)`` of the step.
    """
    name = f"Exercise 2 (predict the collectives: {strategy.upper()})"
    predicted = {k: (int(a), int(b)) for k, (a, b) in dict(predicted).items()}
    compiled = dict(compiled)
    if set(predicted) != set(compiled):
        missing = sorted(set(compiled) - set(predicted))
        extra = sorted(set(predicted) - set(compiled))
        msg = f"the compiled step has {sorted(compiled)}, you predicted {sorted(predicted)}."
        if strategy == "fsdp" and "all-reduce" in predicted and "reduce-scatter" in missing:
            msg += (" FSDP does not all-reduce the gradients: each device only needs the sum "
                    "for its own shard, so XLA reduce-scatters them (and all-gathers the "
                    "weights before use); the one all-reduce left is the scalar loss.")
        elif strategy == "tp" and ("all-gather" in extra or "reduce-scatter" in extra):
            msg += (" With Megatron's column-then-row split the hidden activations never "
                    "leave their device; only the [batch, d_model] output is summed once.")
        elif missing:
            msg += f" Missing: {missing}."
        if extra:
            msg += f" Not in the HLO: {extra}."
        return fail(name, msg)
    for kind in compiled:
        if predicted[kind] != compiled[kind]:
            return fail(name, _explain(kind, predicted[kind], compiled[kind], devices))
    total = sum(b for _, b in compiled.values())
    return ok(name, f"matches the compiled HLO: {dict(sorted(compiled.items()))}, "
                    f"{total:,} bytes per device per step.")


def check_ring(ring_all_reduce: Callable, mesh: Any, axis: str | None = None) -> CheckResult:
    """Exercise 3: ``ring_all_reduce(x, axis, n)`` inside ``shard_map`` equals ``psum``,
    and is made of ``collective-permute``s (no all-reduce hidden inside)."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from tpu_course import hlo, parallel

    name = "Exercise 3 (ring all-reduce from ppermute)"
    axis = axis or mesh.axis_names[0]
    n = mesh.shape[axis]
    x = np.random.default_rng(0).standard_normal((n, 3 * n + 1)).astype(np.float32)
    ring = jax.jit(parallel._shard_map(lambda a: ring_all_reduce(a, axis, n), mesh, P(axis), P(axis)))
    ref = jax.jit(parallel._shard_map(lambda a: jax.lax.psum(a, axis), mesh, P(axis), P(axis)))
    try:
        got = np.asarray(ring(x))
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 -- a learner's trace error: say what happened
        return fail(name, f"calling it under shard_map failed: {type(err).__name__}: {err}")
    want = np.asarray(ref(x))
    kinds = {c.kind for c in hlo.inspect(ring, x).collectives}
    if "all-reduce" in kinds:
        return fail(name, "the compiled function contains an all-reduce: build the sum from "
                          "jax.lax.ppermute steps only (no psum/pmean).")
    if "collective-permute" not in kinds:
        return fail(name, "no collective-permute in the compiled function: each step should "
                          "send a chunk to the right-hand neighbour with jax.lax.ppermute.")
    if got.shape != want.shape:
        return fail(name, f"result shape {got.shape}, expected {want.shape} (the input's).")
    if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
        worst = float(np.abs(got - want).max())
        rows_ok = int(np.isclose(got, want, rtol=1e-5, atol=1e-5).all(axis=1).sum())
        close_to = (" (it returned its input unchanged)" if np.allclose(got, x) else
                    f" ({rows_ok} of {n} devices got the full sum)")
        return fail(name, f"does not equal psum: largest difference {worst:.3g}{close_to}. "
                          "Check which chunk each device sends at step s and that the receiver "
                          "adds it to the same chunk index.")
    return ok(name, f"equals psum over {n} devices, with {2 * (n - 1)} ppermute steps.")


def check_strategy(choose: Callable[[str, float, float, int], tuple[str, str]]) -> CheckResult:
    """Exercise 4: ``choose(chip, params, tokens_per_slice, slices) -> (within, across)``."""
    name = "Exercise 4 (choose a strategy)"
    cases = [("v5e", 1e8, 2e5, 1), ("v5e", 7e9, 1e6, 4), ("v5p", 7e10, 2e4, 2),
             ("v6e", 5e8, 5e5, 8), ("v5p", 2e9, 6e4, 16)]
    for chip, params, tokens, slices in cases:
        want = comms.recommend(chip, params, tokens, slices)
        got = choose(chip, params, tokens, slices)
        if not isinstance(got, tuple) or len(got) != 2:
            return fail(name, f"return a pair (within_slice, across_slices), got {got!r}")
        if tuple(got) != (want.within_slice, want.across_slices):
            return fail(name, f"for {params:.3g} parameters on {chip} with {tokens:,.0f} tokens per "
                              f"slice and {slices} slice(s) you chose {got}, the cost model says "
                              f"{(want.within_slice, want.across_slices)}:\n{want}")
    return ok(name, "each plan matches the cost model (memory decides DP vs FSDP; tokens per "
                    "slice against the DCN threshold decides DP vs pipeline across slices).")
