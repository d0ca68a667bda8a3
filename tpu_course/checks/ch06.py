"""Checkers for lab 6: FSDP of the chapter-5 model by annotations (predicted, written,
compiled for the simulated CPUs and for a v5e-8), a bidirectional ring all-reduce and a
hierarchical all-reduce across slices (both transfer), and a strategy choice.

Every checker compiles or runs the learner's code itself (on 8 simulated CPU devices, or
the compile-only v5e-8 for exercise 3), so the scorecard re-grades from the notebook's
namespace alone. Predictions are variables of that namespace.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from tpu_course import comms
from tpu_course.checks._core import CheckResult, Lab, as_number, fail, is_not_written, ok

LAB = Lab(6, "Scaling out: FSDP by annotations, collectives by hand, a plan")

#: Relative tolerance of a predicted byte count against the compiled HLO's. The learner's
#: count is of parameters; the HLO adds a few scalars (the loss and the accuracy), and the
#: TPU compiler pads some arrays (784 rows become 832): both stay inside 10%.
BYTES_TOLERANCE = 0.10

EX1 = "Exercise 1 (predict FSDP's collectives)"
EX2 = "Exercise 2 (FSDP of the chapter-5 model by annotations)"
EX3 = "Exercise 3 (FSDP on a v5e-8: predict, then compile)"
EX4 = "Exercise 4 (a bidirectional ring all-reduce)"
EX5 = "Exercise 5 (a hierarchical all-reduce across slices)"
EX6 = "Exercise 6 (choose a strategy)"

BATCH = 64  # the batch the checkers compile the step for (8 rows per device)


# ------------------------------------------------------------------ shared instruments


def _cpu_mesh(shape: tuple[int, ...] = (8,), names: tuple[str, ...] = ("data",)) -> Any:
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    cpus = jax.devices("cpu")
    n = int(np.prod(shape))
    if len(cpus) < n:
        raise RuntimeError(f"this lab needs {n} CPU devices and JAX sees {len(cpus)}: run "
                           "runtime.simulate_devices(8) in the first cell, before JAX starts "
                           "(restart the kernel first)")
    return Mesh(np.asarray(cpus[:n], dtype=object).reshape(shape), names,
                axis_types=(AxisType.Auto,) * len(shape))


@functools.lru_cache(maxsize=1)
def chapter5_problem() -> tuple[Any, Any, Any]:
    """``(step, state, batches)``: the chapter-5 MLP, its train step with Adam, two batches.

    The model is ``models.MLP()`` (784 -> 256 -> 256 -> 10), the step
    ``train.make_train_step``: exactly what chapter 5 trains. Random images keep it offline.
    """
    import numpy as np
    import optax
    from flax import nnx

    from tpu_course import models, train

    tx = optax.adam(1e-3)
    graphdef, state = train.init_state(models.MLP(rngs=nnx.Rngs(0)), tx)
    step = train.make_train_step(graphdef, tx)
    rng = np.random.default_rng(0)
    batches = [train.Batch(rng.integers(0, 255, (BATCH, 28, 28), dtype=np.uint8),
                           rng.integers(0, 10, (BATCH,)).astype(np.int32),
                           np.ones((BATCH,), np.float32)) for _ in range(2)]
    return step, state, batches


def fsdp_param_bytes(state: Any, devices: int = 8) -> tuple[int, int]:
    """``(gathered, reduced)``: bytes per device FSDP should all-gather (the shards of the
    parameters that split over ``devices``) and reduce (every parameter's full gradient)."""
    import jax
    import numpy as np

    gathered = reduced = 0
    for x in jax.tree.leaves(state.params):
        size = int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize
        reduced += size
        if any(d % devices == 0 for d in np.shape(x)):
            gathered += size // devices
    return gathered, reduced


def _compile_fsdp(shard_fsdp: Callable, mesh: Any, target: str | None = None) -> tuple[Any, Any]:
    """Run the learner's ``shard_fsdp`` on the chapter-5 step and compile what it returns.

    Returns ``(report, shardings)``, or raises ``_Answer`` carrying a failing result."""
    import jax

    from tpu_course import hlo, train

    step, state, _ = chapter5_problem()
    got = shard_fsdp(step, state, mesh)
    if not isinstance(got, tuple) or len(got) != 3:
        raise _Answer(fail(EX2, "shard_fsdp should return three things, (jitted_step, "
                               f"state_sharding, batch_sharding); it returned {type(got).__name__}",
                           hint="return jitted, state_sharding, batch_sharding"))
    jitted, s_state, s_batch = got
    if not hasattr(jitted, "lower"):
        raise _Answer(fail(EX2, "the first thing returned is not a jitted function",
                           hint="wrap the step in jax.jit(step, in_shardings=..., out_shardings=...)"))
    try:
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                state, s_state)
    except (TypeError, ValueError) as err:
        raise _Answer(fail(EX2, "state_sharding does not have the state's structure: "
                               f"{str(err)[:160]}",
                           hint="build it with jax.tree.map over the whole state (step, params, "
                                "opt_state), one NamedSharding per leaf")) from None
    batch = train.Batch(*(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s_batch)
                          for a in chapter5_problem()[2][0]))
    return hlo.inspect(jitted, abstract, batch, target=target), (s_state, s_batch)


class _Answer(Exception):
    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.message)
        self.result = result


def _prediction(title: str, predicted: Any) -> dict[str, float] | CheckResult:
    """``predicted`` as ``{kind: bytes}``, or a failing result saying what is wrong with it."""
    if not isinstance(predicted, Mapping) or not predicted:
        return fail(title, f"the prediction should be a dict {{kind: bytes per device}}, not "
                           f"{type(predicted).__name__}",
                    hint='for example {"all-gather": 1000, "all-reduce": 2000}')
    out = {}
    for kind, value in predicted.items():
        if kind not in comms.KINDS:
            return fail(title, f"{kind!r} is not a collective kind XLA emits",
                        hint=f"use the HLO names: {', '.join(comms.KINDS)}")
        number = as_number(title, value, f"the bytes of {kind!r}")
        if isinstance(number, CheckResult):
            return number
        out[kind] = number
    return out


def record_prediction(predicted: Any) -> None:
    """Check a prediction's form and echo it (it stays a variable of the notebook: the
    graders read it from there). Not graded here: exercise 1's check grades it."""
    if is_not_written(predicted):
        print(f"{EX1}: not written yet")
        return
    parsed = _prediction(EX1, predicted)
    if isinstance(parsed, CheckResult):
        print(parsed)
        return
    text = "recorded: " + ", ".join(f"{k} {v:,.0f} B per device" for k, v in parsed.items())
    print(text + ". Now write shard_fsdp; the compiled HLO grades this.")


def _grade_bytes(title: str, predicted: dict[str, float], compiled: dict[str, tuple[int, int]],
                 backend: str, devices: int) -> CheckResult:
    kinds = {k for k, (_, b) in compiled.items() if b > 0}
    if set(predicted) != kinds:
        msg = f"on {backend} the compiled step has {sorted(kinds)}; you predicted {sorted(predicted)}."
        hint = "which collective gathers a shard before use, which one sums the gradients?"
        if "reduce-scatter" in predicted and "reduce-scatter" not in kinds and "all-reduce" in kinds:
            msg += (" XLA's CPU backend does not emit FSDP's reduce-scatter: it all-reduces the "
                    "whole gradient and each device keeps its slice.")
            hint = "predict for the backend you compile for: the chapter's FSDP cell shows it"
        elif "all-reduce" in predicted and "reduce-scatter" in kinds:
            msg += " This compiler fuses the all-reduce and the slice into a reduce-scatter."
        return fail(title, msg, hint=hint, answer=str({k: compiled[k][1] for k in sorted(kinds)}))
    if all(abs(predicted[k] / compiled[k][1] - 8) < 0.8 for k in kinds):
        return fail(title, f"every count is about 8x what {backend} compiled",
                    hint="bits or bytes? XLA counts bytes (fp32: 4 bytes per element)",
                    answer=str({k: compiled[k][1] for k in sorted(kinds)}))
    for kind in sorted(kinds):
        want, got = compiled[kind][1], predicted[kind]
        if abs(got - want) <= BYTES_TOLERANCE * want:
            continue
        ratio = got / want
        hints = {8.0: "bits or bytes? and is it the shard or the whole array?",
                 float(devices): f"an all-gather's operand is the 1/{devices} shard each device "
                                 "holds, not the gathered array",
                 1 / devices: f"a gradient reduction's operand is the whole gradient; the "
                              f"1/{devices} shard is its result",
                 2.0: "fp32 parameters are 4 bytes each, not 8",
                 0.5: "fp32 parameters are 4 bytes each, not 2"}
        hint = next((h for r, h in hints.items() if abs(ratio - r) < 0.1 * r),
                    "add up the parameters' bytes leaf by leaf (weights and biases)")
        return fail(title, f"{kind}: your {got:,.0f} B per device is {ratio:.3g}x what {backend} "
                           f"compiled (tolerance {BYTES_TOLERANCE:.0%})",
                    hint=hint, answer=f"{kind}: {want:,} B per device")
    return ok(title, f"on {backend}: " + ", ".join(
        f"{k} {compiled[k][1]:,} B (you said {predicted[k]:,.0f})" for k in sorted(kinds))
        + f", within {BYTES_TOLERANCE:.0%}")


# ------------------------------------------------------------------------- exercises


@LAB.exercise(EX1, minutes=10, kind="predict", predicts=("predicted_fsdp",))
def check_fsdp_prediction(predicted_fsdp: Any, shard_fsdp: Callable) -> CheckResult:
    """Exercise 1: the predicted ``{kind: bytes per device}`` of the FSDP step on 8 simulated
    CPU devices, against the HLO of the learner's own ``shard_fsdp`` (exercise 2)."""
    from tpu_course import parallel

    parsed = _prediction(EX1, predicted_fsdp)
    if isinstance(parsed, CheckResult):
        return parsed
    try:
        report, _ = _compile_fsdp(shard_fsdp, _cpu_mesh())
    except _Answer as a:
        return fail(EX1, f"exercise 2's shard_fsdp does not compile yet: {a.result.message}",
                    hint="make exercise 2 pass first")
    return _grade_bytes(EX1, parsed, report.by_kind(), "8 simulated CPU "
                        "devices", 8)


@LAB.exercise(EX2, minutes=20, kind="write")
def check_shard_fsdp(shard_fsdp: Callable) -> CheckResult:
    """Exercise 2: ``shard_fsdp(step, state, mesh) -> (jitted, state_sharding, batch_sharding)``
    shards every parameter that splits, gathers weights (no resharded activations), and
    trains exactly like the single-device step."""
    import jax
    import numpy as np

    from tpu_course import parallel

    mesh = _cpu_mesh()
    step, state, batches = chapter5_problem()
    try:
        report, (s_state, s_batch) = _compile_fsdp(shard_fsdp, mesh)
    except _Answer as a:
        return a.result
    flat_s = dict(jax.tree_util.tree_flatten_with_path(s_state.params)[0])
    for path, x in jax.tree_util.tree_flatten_with_path(state.params)[0]:
        sharding = flat_s.get(path)
        name = jax.tree_util.keystr(path)
        splits = any(d % 8 == 0 for d in np.shape(x))
        if sharding is None or not hasattr(sharding, "is_fully_replicated"):
            return fail(EX2, f"the parameter {name} has no NamedSharding in state_sharding",
                        hint="one NamedSharding(mesh, spec) per leaf of the state")
        if splits and sharding.is_fully_replicated:
            return fail(EX2, f"{name} {np.shape(x)} is replicated: FSDP splits every parameter "
                            "that can be split over the 8 devices",
                        hint="shard the first dimension that 8 divides: P(None, 'data') for "
                             "a (10, 256)-like shape, P('data') for (256,)")
    if getattr(s_batch, "is_fully_replicated", True):
        return fail(EX2, "the batch is replicated: FSDP splits the batch like data parallelism",
                    hint="batch_sharding = NamedSharding(mesh, P('data'))")
    kinds = {c.kind for c in report.collectives}
    if kinds & {"all-to-all", "collective-permute"}:
        return fail(EX2, "the compiled step reshards activations (all-to-all or "
                        "collective-permute): the compiler chose to move the batch rather "
                        "than gather the weights",
                    hint="inside the step, constrain the parameters to be whole "
                         "(jax.lax.with_sharding_constraint with a replicated sharding) before "
                         "the chapter-5 step uses them, as the chapter's FSDP cell does")
    if "all-gather" not in kinds:
        return fail(EX2, "no all-gather in the compiled step: the weights are never gathered",
                    hint="FSDP keeps only a shard of each weight and gathers it before use")
    jitted = shard_fsdp(step, state, mesh)[0]
    ref = jax.jit(step)
    s_ref, s_got = state, jax.device_put(state, s_state)
    for b in batches:
        s_ref, m_ref = ref(s_ref, b)
        s_got, m_got = jitted(s_got, jax.device_put(b, s_batch))
        want, got = float(m_ref["loss"]), float(m_got["loss"])
        if not np.isclose(got, want, rtol=2e-5):
            return fail(EX2, f"the sharded step's loss {got:.6f} differs from the single-device "
                            f"step's {want:.6f}",
                        hint="the sharded step must compute the same thing: pass the chapter-5 "
                             "step's state and batch through unchanged")
    arg = report.argument_bytes
    return ok(EX2, f"parameters and Adam moments sharded, weights all-gathered, losses equal "
                  f"to the single-device step's; {arg:,} argument bytes per device"
              if arg else "parameters sharded, weights all-gathered, losses equal")


@LAB.exercise(EX3, minutes=10, needs="tpu-compiler", kind="predict",
              predicts=("predicted_v5e_kind",))
def check_v5e_kind(predicted_v5e_kind: Any, shard_fsdp: Callable) -> CheckResult:
    """Exercise 3: the kind of collective that carries the big gradients when the same
    annotated step is compiled for a v5e-8 (``v5e:2x4``), against its HLO."""
    import jax
    from jax.sharding import AxisType

    from tpu_course import hlo

    if not isinstance(predicted_v5e_kind, str) or predicted_v5e_kind not in comms.KINDS:
        return fail(EX3, f"predicted_v5e_kind should be one of the HLO kinds, not "
                        f"{predicted_v5e_kind!r}", hint=f"one of: {', '.join(comms.KINDS)}")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,),
                         devices=hlo.tpu_topology("v5e:2x4").devices)
    try:
        report, _ = _compile_fsdp(shard_fsdp, mesh, target="v5e:2x4")
    except _Answer as a:
        return fail(EX3, f"exercise 2's shard_fsdp does not compile yet: {a.result.message}")
    big = max(report.collectives, key=lambda c: c.bytes)
    kind = big.kind
    compiled = report.by_kind()
    if predicted_v5e_kind != kind:
        hint = ("the CPU backend all-reduces and slices; look at what the chapter's v5e cell "
                "printed for FSDP" if predicted_v5e_kind == "all-reduce" else
                "which collective sums gradients and leaves each device its shard?")
        return fail(EX3, f"on the v5e-8 the largest gradient ({big.dtype}{list(big.shape)}) "
                        f"goes through another kind than {predicted_v5e_kind!r}",
                    hint=hint, answer=kind)
    return ok(EX3, f"on the v5e-8 the gradients go through a {kind} (an all-reduce sliced to each "
                  f"shard in one fusion); its operand is the whole gradient, as on the CPU, but "
                  f"each chip receives only its shard: half the ring traffic of an all-reduce. "
                  f"All kinds: {dict(sorted(compiled.items()))}")


def _run_shard_map(fn: Callable, mesh: Any, in_spec: Any, x: Any) -> tuple[Any, Any]:
    import jax

    mapped = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_spec, out_specs=in_spec))
    return mapped, mapped(x)


@LAB.exercise(EX4, minutes=25, kind="transfer")
def check_bidirectional(bidirectional_all_reduce: Callable) -> CheckResult:
    """Exercise 4: ``bidirectional_all_reduce(x, axis, n)`` inside ``shard_map`` equals
    ``psum``, uses only ``ppermute``, sends both ways round the ring, and no single
    transfer is larger than half a chunk."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from tpu_course import hlo

    mesh = _cpu_mesh()
    n = 8
    x = np.random.default_rng(0).standard_normal((n, 4 * n + 3)).astype(np.float32)
    fn, got = _run_shard_map(lambda a: bidirectional_all_reduce(a, "data", n), mesh, P("data"), x)
    _, want = _run_shard_map(lambda a: jax.lax.psum(a, "data"), mesh, P("data"), x)
    got, want = np.asarray(got), np.asarray(want)
    cs = hlo.inspect(fn, x).collectives
    kinds = {c.kind for c in cs}
    if kinds - {"collective-permute"}:
        return fail(EX4, f"the compiled function contains {sorted(kinds - {'collective-permute'})}: "
                        "build the sum from jax.lax.ppermute steps only",
                    hint="no psum, pmean, all_gather or psum_scatter inside")
    if got.shape != want.shape:
        return fail(EX4, f"the result has shape {got.shape}, not the input's {want.shape}",
                    hint="pad to a multiple of 2n chunks, then cut the padding off and reshape")
    if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
        rows = int(np.isclose(got, want, rtol=1e-5, atol=1e-5).all(axis=1).sum())
        return fail(EX4, f"the result is not the sum over devices ({rows} of {n} devices got it)",
                    hint="run each half as its own ring; in the leftward ring the chunk index "
                         "moves the other way: (me + s) where the rightward ring has (me - s)")
    directions = set()
    for c in cs:
        for a, b in c.source_target_pairs:
            directions.add((b - a) % n)
    if directions != {1, n - 1}:
        return fail(EX4, "every transfer goes the same way round the ring",
                    hint="send half of the data right, i -> i+1, and the other half left, "
                         "i -> i-1: both directions of each link then carry traffic")
    largest = max(c.bytes for c in cs)
    chunk = x[0].size * 4 / n
    if largest > chunk / 2 + 64:
        return fail(EX4, f"one transfer moves {largest} B, more than half a chunk "
                        f"({chunk / 2:.0f} B): the array was not split into 2n pieces",
                    hint="cut the flat array into 2 halves of n chunks each")
    return ok(EX4, f"equals psum; {len(cs)} ppermutes, both directions, each at most half a "
                  "chunk: the same bytes per device as the one-way ring in half the time, "
                  "which is the book's W_ici (bidirectional) in the ring formula")


@LAB.exercise(EX5, minutes=20, kind="transfer")
def check_hierarchical(hierarchical_all_reduce: Callable) -> CheckResult:
    """Exercise 5: on a ``("slice", "chip")`` 2x4 mesh, ``hierarchical_all_reduce(x)`` equals
    ``psum`` over both axes while what crosses slices is a quarter of each device's array."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from tpu_course import hlo

    mesh = _cpu_mesh((2, 4), ("slice", "chip"))
    spec = P(("slice", "chip"))
    x = np.random.default_rng(1).standard_normal((8 * 16, 12)).astype(np.float32)
    fn, got = _run_shard_map(hierarchical_all_reduce, mesh, spec, x)
    _, want = _run_shard_map(lambda a: jax.lax.psum(a, ("slice", "chip")), mesh, spec, x)
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
        return fail(EX5, "the result is not the sum over all 8 devices",
                    hint="reduce-scatter over 'chip', all-reduce the piece over 'slice', "
                         "all-gather over 'chip'")
    slice_of = {d.id: i for i, row in enumerate(mesh.devices) for d in row}
    local = x.nbytes // 8
    crossing = 0
    for c in hlo.inspect(fn, x).collectives:
        groups = c.replica_groups or ()
        if c.kind == "collective-permute":
            spans = any(slice_of.get(a) != slice_of.get(b) for a, b in c.source_target_pairs)
        else:
            spans = any(len({slice_of.get(d) for d in g}) > 1 for g in groups)
        if spans:
            crossing += c.bytes
    if crossing > local / 4 + 64:
        return fail(EX5, f"{crossing:,} B per device cross the slow network, "
                        f"{crossing / local:.2f} of the array",
                    hint="sum inside each slice first (over 'chip', on ICI), so that only a "
                         "quarter of the array has to cross slices")
    return ok(EX5, f"equals psum over 8 devices; {crossing:,} of {local:,} B per device "
                  "cross slices (a quarter): the DCN carries 1/|chip| of the gradients")


@LAB.exercise(EX6, minutes=10, kind="transfer")
def check_strategy(choose: Callable[[str, float, float, int], tuple[str, str]]) -> CheckResult:
    """Exercise 6: ``choose(chip, params, tokens_per_slice, slices) -> (within, across)``."""
    cases = [("v5e", 1e8, 2e5, 1), ("v5e", 7e9, 1e6, 4), ("v5p", 7e10, 2e4, 2),
             ("v6e", 5e8, 5e5, 8), ("v5p", 2e9, 6e4, 16)]
    for chip, params, tokens, slices in cases:
        want = comms.recommend(chip, params, tokens, slices)
        got = choose(chip, params, tokens, slices)
        if not isinstance(got, tuple) or len(got) != 2:
            return fail(EX6, f"return a pair (within_slice, across_slices), got {got!r:.80}",
                        hint='for example ("fsdp", "pipeline")')
        if tuple(got) != (want.within_slice, want.across_slices):
            return fail(EX6, f"for {params:.3g} parameters on {chip} with {tokens:,.0f} tokens per "
                            f"slice and {slices} slice(s) you chose {got}",
                        hint="memory decides DP vs FSDP (10 bytes per parameter against HBM); "
                             "tokens per slice against comms.dcn_min_tokens_per_slice decides "
                             "DP vs pipeline across slices",
                        answer=str(want))
    return ok(EX6, "each plan matches the cost model (memory decides DP vs FSDP; tokens per "
                  "slice against the DCN threshold decides DP vs pipeline across slices).")
