"""Checkers for lab 6: FSDP of the chapter-5 model by annotations (predicted, written,
compiled for the simulated CPUs and for a v5e-8), a bidirectional ring all-reduce and a
hierarchical all-reduce across slices (both transfer), a strategy choice, and the rows of
the global batch each process feeds in a two-process ``jax.distributed`` run.

Every checker compiles or runs the learner's code itself (on simulated CPU devices, or
the compile-only v5e-8 for exercise 3), so the scorecard re-grades from the notebook's
namespace alone. The predictions (exercises 1 and 3) are graded against the learner's
own compiled FSDP step, once exercise 2's check passes on it: a wrong FSDP step would
otherwise grade a right prediction against the wrong program.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tpu_course import comms
from tpu_course.checks._answers import ch06 as _ref
from tpu_course.checks._core import (
    CheckResult,
    Lab,
    Verdict,
    as_number,
    not_written,
    ok,
    refuse,
    refuse_course_code,
)

LAB = Lab(6, "Shard the chapter-5 model and explain every collective", cpu_devices=8)

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
EX7 = "Exercise 7 (each process's rows of the global batch)"

BATCH = 64  # the batch the checkers compile the step for (8 rows per device)
WIDTH = 256  # the chapter-5 MLP's hidden width


# ------------------------------------------------------------------ shared instruments


def _mesh(title: str, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """``parallel.cpu_mesh(shape, names)``, or a failure saying how to get the devices."""
    import jax

    from tpu_course import parallel

    have, need = len(jax.devices("cpu")), math.prod(shape)
    if have < need:
        refuse(title, f"this check needs {need} CPU devices and JAX sees {have}",
               hint="run runtime.simulate_devices(8) in the first cell, before JAX starts "
                    "(restart the kernel first)")
    return parallel.cpu_mesh(shape, names)


@functools.lru_cache(maxsize=4)
def chapter5_problem(width: int = WIDTH) -> tuple[Any, Any, Any]:
    """``(step, state, batches)``: the chapter-5 MLP, its train step with Adam, two batches.

    The model is ``models.MLP()`` (784 -> 256 -> 256 -> 10; ``width`` changes the hidden
    width), the step ``train.make_train_step``: exactly what chapter 5 trains. Random
    images keep it offline.
    """
    import numpy as np
    import optax
    from flax import nnx

    from tpu_course import models, train

    tx = optax.adam(1e-3)
    graphdef, state = train.init_state(models.MLP((width, width), rngs=nnx.Rngs(0)), tx)
    step = train.make_train_step(graphdef, tx)
    rng = np.random.default_rng(0)
    batches = [train.Batch(rng.integers(0, 255, (BATCH, 28, 28), dtype=np.uint8),
                           rng.integers(0, 10, (BATCH,)).astype(np.int32),
                           np.ones((BATCH,), np.float32)) for _ in range(2)]
    return step, state, batches


@functools.lru_cache(maxsize=4)
def _reference_losses(width: int = WIDTH) -> tuple[float, ...]:
    """The single-device step's losses on :func:`chapter5_problem`'s two batches."""
    import jax

    step, state, batches = chapter5_problem(width)
    ref, losses = jax.jit(step), []
    for b in batches:
        state, metrics = ref(state, b)
        losses.append(float(metrics["loss"]))
    return tuple(losses)


def _splits(shape: Sequence[int], n: int) -> bool:
    """Whether FSDP splits an array of ``shape`` over ``n`` devices (a dimension ``n`` divides)."""
    return n > 1 and any(d % n == 0 and d >= n for d in shape)


def _leaf_name(path: Any) -> str:
    import jax

    name = jax.tree_util.keystr(path)
    return name.removesuffix(".value").lstrip(".")


def _moment(path: Any) -> str | None:
    """``"mu"`` or ``"nu"`` when ``path`` is one of Adam's moments, else None."""
    names = [str(getattr(k, "name", "")) for k in path]
    return next((m for m in ("mu", "nu") if m in names), None)


def _fsdp_bytes(state: Any, batch: Any, n: int) -> tuple[int, int]:
    """``(state, batch)`` bytes per device when every array that splits over ``n`` is split."""
    import jax
    import numpy as np

    def per_device(x: Any) -> int:
        size = int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize
        return size // n if _splits(np.shape(x), n) else size

    return (sum(per_device(x) for x in jax.tree.leaves(state)),
            sum(per_device(x) for x in jax.tree.leaves(batch)))


def _sharded(shard_fsdp: Callable, mesh: Any, width: int) -> tuple[Any, Any, Any, Any]:
    """Call the learner's ``shard_fsdp`` on the chapter-5 step; check what it returns.

    Returns ``(jitted, state_sharding, batch_sharding, abstract_state)``; anything wrong
    ends exercise 2's check (:class:`Verdict`)."""
    import jax

    step, state, _ = chapter5_problem(width)
    got = shard_fsdp(step, state, mesh)
    if not isinstance(got, tuple) or len(got) != 3:
        refuse(EX2, "shard_fsdp should return three things, (jitted_step, state_sharding, "
                    f"batch_sharding); it returned {type(got).__name__}",
               hint="return jitted, state_sharding, batch_sharding")
    jitted, s_state, s_batch = got
    if not hasattr(jitted, "lower"):
        refuse(EX2, "the first thing returned is not a jitted function",
               hint="wrap the step in jax.jit(step, in_shardings=..., out_shardings=...)")
    try:
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                state, s_state)
    except (TypeError, ValueError) as err:
        refuse(EX2, f"state_sharding does not have the state's structure: {str(err)[:160]}",
               hint="build it with jax.tree.map over the whole state (step, params, "
                    "opt_state), one NamedSharding per leaf")
    return jitted, s_state, s_batch, abstract


def _check_leaves(state: Any, s_state: Any, mesh: Any) -> None:
    """Every leaf of the state has a sharding on ``mesh``, and every array that splits
    (parameters and Adam's moments alike) is split: otherwise a failure naming which."""
    import jax
    import numpy as np

    n = mesh.shape["data"]
    devices = {d.id for d in mesh.devices.flat}
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    shardings = jax.tree.leaves(s_state)
    params, moments, others = [], {"mu": [], "nu": []}, []
    for (path, x), s in zip(leaves, shardings):
        name = _leaf_name(path)
        if not hasattr(s, "is_fully_replicated") or not hasattr(s, "device_set"):
            refuse(EX2, f"{name} has no NamedSharding in state_sharding (it has "
                        f"{type(s).__name__})",
                   hint="one NamedSharding(mesh, spec) per leaf of the state")
        if {d.id for d in s.device_set} != devices:
            refuse(EX2, f"the sharding of {name} is on other devices than the mesh passed to "
                        "shard_fsdp",
                   hint="build every NamedSharding on shard_fsdp's mesh argument, not on a "
                        "mesh of your own")
        if _splits(np.shape(x), n) and s.is_fully_replicated:
            moment = _moment(path)
            if name.startswith("params"):
                params.append(f"{name} {np.shape(x)}")
            elif moment:
                moments[moment].append(name)
            else:
                others.append(f"{name} {np.shape(x)}")
    if params:
        refuse(EX2, f"{params[0]} is replicated ({len(params)} parameter(s) in all): FSDP "
                    f"splits every parameter that can be split over the {n} devices",
               hint="shard the first dimension that the mesh's 'data' axis divides: "
                    "P(None, 'data') for a (10, 256)-like shape, P('data') for (256,)")
    both = moments["mu"] and moments["nu"]
    if both or moments["mu"] or moments["nu"]:
        which = ("Adam's moments are replicated" if both else
                 "Adam's first moment (mu) is replicated" if moments["mu"] else
                 "Adam's second moment (nu) is replicated")
        names = moments["mu"] + moments["nu"]
        refuse(EX2, f"{which}: {names[0]} ({len(names)} moment array(s) in all) is whole on "
                    "every device, so each device still holds the full optimizer state, "
                    "twice the parameters' bytes",
               hint="FSDP shards the optimizer state like the parameters: build "
                    "state_sharding with jax.tree.map over the whole state (opt_state's mu "
                    "and nu have the parameters' shapes), not only over state.params")
    if others:
        refuse(EX2, f"{others[0]} is replicated: FSDP splits every array of the state that "
                    f"can be split over the {n} devices",
               hint="one rule for every leaf of the state: split its first dimension that "
                    "the 'data' axis divides")


def _fsdp_verdict(shard_fsdp: Callable, width: int = WIDTH, devices: int = 8, *,
                  train_steps: bool = True) -> Any:
    """Exercise 2's check of ``shard_fsdp``: ends with a failure (:class:`Verdict`) or
    returns the compiled step's ``hlo.inspect`` report on ``devices`` CPU devices.
    ``train_steps=False`` leaves out the two training steps (the predictions need only
    the compiled program)."""
    import jax
    import numpy as np

    from tpu_course import hlo, parallel, train

    refuse_course_code(EX2, shard_fsdp, _ref.shard_fsdp, parallel.make_sharded_train_step,
                       parallel.state_shardings, parallel.strategy_placement,
                       parallel.param_specs)
    mesh = _mesh(EX2, (devices,), ("data",))
    _, state, batches = chapter5_problem(width)
    jitted, s_state, s_batch, abstract = _sharded(shard_fsdp, mesh, width)
    _check_leaves(state, s_state, mesh)
    if getattr(s_batch, "is_fully_replicated", True):
        refuse(EX2, "the batch is replicated: FSDP splits the batch like data parallelism",
               hint="batch_sharding = NamedSharding(mesh, P('data'))")
    batch = train.Batch(*(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s_batch)
                          for a in batches[0]))
    report = hlo.inspect(jitted, abstract, batch)

    want_state, want_batch = _fsdp_bytes(state, batches[0], devices)
    arg, out = report.argument_bytes, report.output_bytes
    if arg is not None and arg > 1.02 * (want_state + want_batch) + 256:
        refuse(EX2, f"the compiled step takes {arg:,} argument bytes per device, "
                    f"{arg / (want_state + want_batch):.2f}x what a device holds when every "
                    "array of the state that splits is split",
               hint="jit's in_shardings must be the state_sharding you return, for every "
                    "leaf (the parameters and Adam's moments), and the batch's sharding",
               answer=f"{want_state + want_batch:,} argument bytes per device")
    if out is not None and out > 1.02 * want_state + 1024:
        refuse(EX2, f"the compiled step returns {out:,} bytes per device: the new state comes "
                    "back whole (or partly whole) on every device",
               hint="out_shardings=(state_sharding, replicated): the new state keeps the "
                    "input's FSDP shardings, only the metrics are replicated",
               answer=f"about {want_state:,} bytes of state per device")

    kinds = {c.kind for c in report.collectives}
    if kinds & {"all-to-all", "collective-permute"}:
        refuse(EX2, "the compiled step moves activations between devices (all-to-all or "
                    "collective-permute): without whole parameters where the step uses them, "
                    "XLA reshards the batch's activations to meet the weight shards instead "
                    "of gathering the weights (on this CPU mesh a right FSDP step has only "
                    "all-gathers and all-reduces)",
               hint="inside the step, constrain the parameters to be whole "
                    "(jax.lax.with_sharding_constraint with a replicated sharding) before "
                    "the chapter-5 step uses them, as the chapter's FSDP cell does")
    if "all-gather" not in kinds:
        refuse(EX2, "no all-gather in the compiled step: the weights are never gathered",
               hint="FSDP keeps only a shard of each weight and gathers it before use")
    if not train_steps:
        return report
    s_got = jax.device_put(state, s_state)
    for b, want in zip(batches, _reference_losses(width)):
        s_got, m_got = jitted(s_got, jax.device_put(b, s_batch))
        got = float(m_got["loss"])
        if not np.isclose(got, want, rtol=2e-5):
            refuse(EX2, f"the sharded step's loss {got:.6f} differs from the single-device "
                        f"step's {want:.6f}",
                   hint="the sharded step must compute the same thing: pass the chapter-5 "
                        "step's state and batch through unchanged")
    return report


def _needs_exercise2(title: str, shard_fsdp: Callable, **kwargs: Any) -> Any:
    """:func:`_fsdp_verdict`, with exercise 2's failure retold for ``title``."""
    try:
        return _fsdp_verdict(shard_fsdp, train_steps=False, **kwargs)
    except Verdict as stop:
        if stop.result.status != "failed":
            raise Verdict(not_written(title, "exercise 2's shard_fsdp is not written yet")) from None
        refuse(title, f"exercise 2 does not pass yet ({stop.result.message})",
               hint="this prediction is graded against your own compiled FSDP step, so it "
                    "waits for a right one: make exercise 2's check pass first")


def _prediction(title: str, predicted: Any) -> dict[str, float]:
    """``predicted`` as ``{kind: bytes}``; anything else ends the check saying what is wrong."""
    if not isinstance(predicted, Mapping) or not predicted:
        refuse(title, f"the prediction should be a dict {{kind: bytes per device}}, not "
                      f"{type(predicted).__name__}",
               hint='for example {"all-gather": 1000, "all-reduce": 2000}')
    out = {}
    for kind, value in predicted.items():
        if kind not in comms.KINDS:
            refuse(title, f"{kind!r} is not a collective kind XLA emits",
                   hint=f"use the HLO names: {', '.join(comms.KINDS)}")
        out[kind] = as_number(title, value, f"the bytes of {kind!r}")
    return out


def _grade_bytes(title: str, predicted: dict[str, float], compiled: dict[str, tuple[int, int]],
                 backend: str, devices: int) -> CheckResult:
    kinds = {k for k, (_, b) in compiled.items() if b > 0}
    answer = str({k: compiled[k][1] for k in sorted(kinds)})
    if set(predicted) != kinds:
        msg = f"on {backend} the compiled step has {sorted(kinds)}; you predicted {sorted(predicted)}."
        hint = "which collective gathers a shard before use, which one sums the gradients?"
        if "reduce-scatter" in predicted and "reduce-scatter" not in kinds and "all-reduce" in kinds:
            msg += (" XLA's CPU backend does not emit FSDP's reduce-scatter: it all-reduces the "
                    "whole gradient and each device keeps its slice.")
            hint = "predict for the backend you compile for: the chapter's FSDP cell shows it"
        elif "all-reduce" in predicted and "reduce-scatter" in kinds:
            msg += " This compiler fuses the all-reduce and the slice into a reduce-scatter."
        refuse(title, msg, hint=hint, answer=answer)
    if all(abs(predicted[k] / compiled[k][1] - 8) < 0.8 for k in kinds):
        refuse(title, f"every count is about 8x what {backend} compiled",
               hint="bits or bytes? XLA counts bytes (fp32: 4 bytes per element)", answer=answer)
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
        refuse(title, f"{kind}: your {got:,.0f} B per device is {ratio:.3g}x what {backend} "
                      f"compiled (tolerance {BYTES_TOLERANCE:.0%})",
               hint=hint, answer=f"{kind}: {want:,} B per device")
    return ok(title, f"on {backend}: " + ", ".join(
        f"{k} {compiled[k][1]:,} B (you said {predicted[k]:,.0f})" for k in sorted(kinds))
        + f", within {BYTES_TOLERANCE:.0%}")


# ------------------------------------------------------------------------- exercises


@LAB.exercise(EX1, minutes=10, kind="predict", predicts=("predicted_fsdp",))
def check_fsdp_prediction(predicted_fsdp: Any, shard_fsdp: Callable) -> CheckResult:
    """Exercise 1: the predicted ``{kind: bytes per device}`` of the FSDP step on 8 simulated
    CPU devices, against the HLO of the learner's own ``shard_fsdp`` (once exercise 2's
    check passes on it)."""
    parsed = _prediction(EX1, predicted_fsdp)
    report = _needs_exercise2(EX1, shard_fsdp)
    return _grade_bytes(EX1, parsed, report.by_kind(), "8 simulated CPU devices", 8)


def _fsdp_cases(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    devices = int(rng.choice([2, 4]))
    width = int(rng.choice([100, 196, 324]))  # 4 divides them, 8 does not
    return [(f"a {devices}-device mesh and an MLP {width} wide",
             {"devices": devices, "width": width})]


@LAB.exercise(EX2, minutes=20, kind="write", hidden=_fsdp_cases)
def check_shard_fsdp(shard_fsdp: Callable, width: int = WIDTH, devices: int = 8) -> CheckResult:
    """Exercise 2: ``shard_fsdp(step, state, mesh) -> (jitted, state_sharding, batch_sharding)``
    shards every array of the state that splits (parameters and Adam's moments), takes and
    returns a device's share of them only, gathers weights (no resharded activations), and
    trains exactly like the single-device step."""
    report = _fsdp_verdict(shard_fsdp, width=width, devices=devices)
    return ok(EX2, f"parameters and Adam's moments sharded on {devices} devices, weights "
                   f"all-gathered, losses equal to the single-device step's; "
                   f"{report.argument_bytes:,} argument bytes per device")


@LAB.exercise(EX3, minutes=10, needs="tpu-compiler", kind="predict",
              predicts=("predicted_v5e_kind",))
def check_v5e_kind(predicted_v5e_kind: Any, shard_fsdp: Callable) -> CheckResult:
    """Exercise 3: the kind of collective that carries the big gradients when the same
    annotated step is compiled for a v5e-8 (``v5e:2x4``), against its HLO."""
    import jax
    from jax.sharding import AxisType

    from tpu_course import hlo, train

    if not isinstance(predicted_v5e_kind, str) or predicted_v5e_kind not in comms.KINDS:
        refuse(EX3, f"predicted_v5e_kind should be one of the HLO kinds, not "
                    f"{predicted_v5e_kind!r}", hint=f"one of: {', '.join(comms.KINDS)}")
    _needs_exercise2(EX3, shard_fsdp)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,),
                         devices=hlo.tpu_topology("v5e:2x4").devices)
    jitted, _, s_batch, abstract = _sharded(shard_fsdp, mesh, WIDTH)
    batch = train.Batch(*(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s_batch)
                          for a in chapter5_problem()[2][0]))
    report = hlo.inspect(jitted, abstract, batch, target="v5e:2x4")
    big = max(report.collectives, key=lambda c: c.bytes)
    kind = big.kind
    compiled = report.by_kind()
    if predicted_v5e_kind != kind:
        hint = ("the CPU backend all-reduces and slices; look at what the chapter's v5e cell "
                "printed for FSDP" if predicted_v5e_kind == "all-reduce" else
                "which collective sums gradients and leaves each device its shard?")
        refuse(EX3, f"on the v5e-8 the largest gradient ({big.dtype}{list(big.shape)}) "
                    f"goes through another kind than {predicted_v5e_kind!r}",
               hint=hint, answer=kind)
    return ok(EX3, f"on the v5e-8 the gradients go through a {kind} (an all-reduce sliced to each "
                   f"shard in one fusion); its operand is the whole gradient, as on the CPU, but "
                   f"each chip receives only its shard: half the ring traffic of an all-reduce. "
                   f"All kinds: {dict(sorted(compiled.items()))}. "
                   + _permute_note(report, abstract, 8))


#: Rows of a TPU tile for 32-bit data: the second-to-last dimension of an array in
#: memory comes in multiples of 8 (the sublanes of a vreg, chapter 4 section 3).
_SUBLANES = 8


def _permute_note(report: Any, state: Any, devices: int) -> str:
    """What a collective-permute in an FSDP step compiled for a TPU is, computed from the
    state's shapes: a leaf whose shard has a row count that is not a multiple of 8 (784 / 8
    = 98 rows) is padded to whole 8-row tiles for the reduce-scatter (8 x 104 = 832 rows);
    the reduce-scatter's 104-row pieces then sit 6 rows further along per device than the
    98-row shards the state keeps, so each device passes the rows it does not own to its
    neighbour: up to 7 x 6 = 42 rows (42 x 256 x 4 B = 43,008 B). ``""`` when there is no
    permute, or when it is not that (the message then says nothing it cannot back)."""
    import jax

    permutes = [c for c in report.collectives if c.kind == "collective-permute"]
    if not permutes:
        return ""
    for leaf in jax.tree.leaves(state):
        shape = tuple(getattr(leaf, "shape", ()))
        if len(shape) < 2 or shape[0] % devices:
            continue
        shard = shape[0] // devices
        padded = -(-shard // _SUBLANES) * _SUBLANES
        moved = (devices - 1) * (padded - shard)
        for c in permutes:
            if padded != shard and tuple(c.shape) == (moved, *shape[1:]):
                return (f"The {c.bytes:,}-byte collective-permute realigns shards: the TPU "
                        f"keeps arrays in tiles of {_SUBLANES} rows, so the reduce-scatter of "
                        f"the {list(shape)} gradient works on {devices} pieces of {padded} rows "
                        f"({devices * padded} rows, padded), while the state keeps shards of "
                        f"{shard} rows; each device passes its neighbour the rows it holds "
                        f"but does not own, at most {devices - 1} x {padded - shard} = {moved} "
                        f"rows. Parameters whose shards are whole tiles need no permute.")
    return ""


def _run_shard_map(fn: Callable, mesh: Any, in_spec: Any, x: Any) -> tuple[Any, Any]:
    import jax

    mapped = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_spec, out_specs=in_spec))
    return mapped, mapped(x)


def _ring_cases(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for n in rng.choice([4, 5, 6], size=2, replace=False):
        block = (int(rng.integers(1, 4)), int(rng.integers(5, 40)))
        cases.append((f"a ring of {n} devices, blocks of {block[0]}x{block[1]}",
                      {"n": int(n), "block": block}))
    return cases


@LAB.exercise(EX4, minutes=25, kind="apply", hidden=_ring_cases)
def check_bidirectional(bidirectional_all_reduce: Callable, n: int = 8,
                        block: tuple[int, int] = (1, 35)) -> CheckResult:
    """Exercise 4: ``bidirectional_all_reduce(x, axis, n)`` inside ``shard_map`` (on a ring of
    ``n`` devices, each holding a ``block``) equals ``psum``, uses only ``ppermute``, sends
    both ways round the ring, and no single transfer is larger than half a chunk."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from tpu_course import hlo, parallel

    refuse_course_code(EX4, bidirectional_all_reduce, _ref.bidirectional_all_reduce,
                       parallel.ring_all_reduce)
    mesh = _mesh(EX4, (n,), ("data",))
    x = np.random.default_rng(0).standard_normal((n * block[0], block[1])).astype(np.float32)
    fn, got = _run_shard_map(lambda a: bidirectional_all_reduce(a, "data", n), mesh, P("data"), x)
    _, want = _run_shard_map(lambda a: jax.lax.psum(a, "data"), mesh, P("data"), x)
    got, want = np.asarray(got), np.asarray(want)
    cs = hlo.inspect(fn, x).collectives
    kinds = {c.kind for c in cs}
    if kinds - {"collective-permute"}:
        refuse(EX4, f"the compiled function contains {sorted(kinds - {'collective-permute'})}: "
                    "build the sum from jax.lax.ppermute steps only",
               hint="no psum, pmean, all_gather or psum_scatter inside")
    if got.shape != want.shape:
        refuse(EX4, f"the result has shape {got.shape}, not the input's {want.shape}",
               hint="pad to a multiple of 2n chunks, then cut the padding off and reshape")
    if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
        rows = np.isclose(got, want, rtol=1e-5, atol=1e-5).reshape(n, -1).all(axis=1).sum()
        refuse(EX4, f"the result is not the sum over devices ({int(rows)} of {n} devices got it)",
               hint="run each half as its own ring; in the leftward ring the chunk index "
                    "moves the other way: (me + s) where the rightward ring has (me - s)")
    directions = {(b - a) % n for c in cs for a, b in c.source_target_pairs}
    if directions != {1, n - 1}:
        refuse(EX4, "every transfer goes the same way round the ring",
               hint="send half of the data right, i -> i+1, and the other half left, "
                    "i -> i-1: both directions of each link then carry traffic")
    largest = max(c.bytes for c in cs)
    chunk = x[: block[0]].size * 4 / n
    if largest > chunk / 2 + 64:
        refuse(EX4, f"one transfer moves {largest} B, more than half a chunk "
                    f"({chunk / 2:.0f} B): the array was not split into 2n pieces",
               hint="cut the flat array into 2 halves of n chunks each")
    return ok(EX4, f"equals psum; {len(cs)} ppermutes, both directions, each at most half a "
                   "chunk: the same bytes per device as the one-way ring in half the time, "
                   "which is the book's W_ici (bidirectional) in the ring formula")


def _slice_cases(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for i in rng.choice(3, size=2, replace=False):
        slices, chips = [(4, 2), (2, 3), (2, 2)][int(i)]
        block = (chips * int(rng.integers(1, 5)), int(rng.integers(3, 20)))
        cases.append((f"{slices} slices of {chips} chips, blocks of {block[0]}x{block[1]}",
                      {"mesh_shape": (slices, chips), "block": block}))
    return cases


@LAB.exercise(EX5, minutes=20, kind="apply", hidden=_slice_cases)
def check_hierarchical(hierarchical_all_reduce: Callable, mesh_shape: tuple[int, int] = (2, 4),
                       block: tuple[int, int] = (16, 12)) -> CheckResult:
    """Exercise 5: on a ``("slice", "chip")`` mesh (2x4 in the notebook),
    ``hierarchical_all_reduce(x)`` equals ``psum`` over both axes while what crosses slices
    is ``1/|chip|`` of each device's array (a quarter on 2x4)."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from tpu_course import hlo

    refuse_course_code(EX5, hierarchical_all_reduce, _ref.hierarchical_all_reduce)
    slices, chips = mesh_shape
    mesh = _mesh(EX5, (slices, chips), ("slice", "chip"))
    spec = P(("slice", "chip"))
    x = np.random.default_rng(1).standard_normal(
        (slices * chips * block[0], block[1])).astype(np.float32)
    fn, got = _run_shard_map(hierarchical_all_reduce, mesh, spec, x)
    _, want = _run_shard_map(lambda a: jax.lax.psum(a, ("slice", "chip")), mesh, spec, x)
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
        refuse(EX5, f"the result is not the sum over all {slices * chips} devices",
               hint="reduce-scatter over 'chip', all-reduce the piece over 'slice', "
                    "all-gather over 'chip'")
    slice_of = {d.id: i for i, row in enumerate(mesh.devices) for d in row}
    local = x.nbytes // (slices * chips)
    crossing = 0
    for c in hlo.inspect(fn, x).collectives:
        groups = c.replica_groups or ()
        if c.kind == "collective-permute":
            spans = any(slice_of.get(a) != slice_of.get(b) for a, b in c.source_target_pairs)
        else:
            spans = any(len({slice_of.get(d) for d in g}) > 1 for g in groups)
        if spans:
            crossing += c.bytes
    if crossing > local / chips + 64:
        refuse(EX5, f"{crossing:,} B per device cross the slow network, "
                    f"{crossing / local:.2f} of the array",
               hint="sum inside each slice first (over 'chip', on ICI), so that only "
                    "1/|chip| of the array has to cross slices")
    return ok(EX5, f"equals psum over {slices * chips} devices; {crossing:,} of {local:,} B per "
                   f"device cross slices (1/{chips}): the DCN carries 1/|chip| of the gradients")


# -- exercise 6: the two rules the chapter teaches, and the mistakes made with them


#: The notebook's cases, ``(chip, params, tokens_per_slice, slices)``: together they
#: separate the course's DCN rule from the book's (more than two slices), and both from
#: the usual slips (6 FLOPs overlapping, the 64-bit limit at two slices, another count of
#: bytes per parameter against HBM).
STRATEGY_CASES = (("v5e", 1.2e9, 2e5, 1), ("v5e", 7e9, 1e6, 4), ("v5p", 7e10, 2e4, 2),
                  ("v5p", 3e9, 9e4, 4), ("v5p", 5e9, 1.2e5, 2), ("v5e", 2.5e9, 5.5e4, 2),
                  ("v5p", 1e9, 4.2e4, 2), ("v5p", 1.1e10, 1.5e5, 4), ("v6e", 2.9e9, 1.3e5, 16),
                  ("v6e", 5e8, 5e5, 8))
WITHIN, ACROSS = ("dp", "fsdp"), ("none", "dp", "pipeline")


def _across_rule(scale: Callable[[int], float]) -> Callable[..., str]:
    """A DCN rule whose threshold is ``scale(slices) x C / W_dcn``."""
    def rule(chip: str, params: float, tokens: float, slices: int) -> str:
        if slices == 1:
            return "none"
        return "dp" if tokens >= scale(slices) * comms.dcn_intensity(chip) else "pipeline"
    return rule


#: Rules a learner may have written instead of the course's variant, each with its hint.
_ACROSS_MISTAKES = (
    (_across_rule(lambda s: 1.0),
     ("that is the scaling book's rule, C / W_dcn tokens per slice (bf16 gradients, the "
      "many-slice limit): the exercise asks for the course's variant (fp32 gradients, a ring "
      "over S slices, 2 (S-1)/S x 4 bytes per parameter), which agrees at two slices and "
      "asks for more beyond")),
    (_across_rule(lambda s: 2 * (s - 1) / s * 4 / 6),
     ("you let all 6 FLOPs per parameter per token hide the all-reduce; only the backward "
      "pass's 4 can (the gradients exist only once it has run)")),
    (_across_rule(lambda s: 2.0),
     ("you used the many-slice limit (64 bits per parameter) at every slice count: a ring over "
      "S slices sends 2 (S-1)/S x 32 bits per parameter, 32 bits at two slices")),
    (_across_rule(lambda s: (s - 1) / s),
     ("your threshold is half the course's: its variant all-reduces fp32 gradients (4 bytes "
      "per parameter, not bf16's 2) by a ring that sends each byte twice, 2 (S-1)/S times "
      "the array (reduce-scatter, then all-gather), not (S-1)/S")),
)
#: Bytes per parameter a learner may have counted against HBM, with what each one is.
_MEMORY_MISTAKES = {2: "the bf16 parameters alone", 4: "the fp32 parameters alone",
                    8: "parameters and gradients only", 12: "fp32 parameters and Adam's two "
                    "moments, without gradients", 16: "fp32 parameters, gradients and Adam's "
                    "two moments"}


def _strategy_hint(choose: Callable, cases: Sequence[tuple], got: dict[tuple, tuple]) -> str:
    """The hint naming the rule the learner's answers follow, where one fits them all."""
    from tpu_course import hardware

    wrong_within = [c for c in cases if got[c][0] != _ref.choose(*c)[0]]
    if wrong_within:
        if all(got[c][0] != _ref.choose(*c)[0] for c in cases):
            return "dp and fsdp are swapped: FSDP is for a replica that does not fit in HBM"
        for b, what in _MEMORY_MISTAKES.items():
            if all(got[c][0] == ("fsdp" if b * c[1] > hardware.get(c[0]).hbm_bytes else "dp")
                   for c in cases):
                return (f"you count {b} bytes per parameter ({what}); the chapter's count, the "
                        "scaling book's, is 10 bytes per parameter with Adam")
        return ("memory decides DP vs FSDP: 10 bytes per parameter (the scaling book's count "
                "with Adam) against the chip's HBM, hardware.get(chip).hbm_bytes")
    if any(got[c][1] != "none" for c in cases if c[3] == 1):
        return "with one slice nothing crosses slices: across_slices is 'none'"
    for rule, hint in _ACROSS_MISTAKES:
        if all(got[c][1] == rule(*c) for c in cases):
            return hint
    return ("across slices: DP when the tokens per slice reach the course's DCN threshold, "
            "2 (S-1)/S x 4 bytes / 4 FLOPs x C / W_dcn (fp32 gradients, a ring over S slices, "
            "the backward pass hiding it), otherwise pipeline")


def _strategy_hidden(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    """Other chips, model sizes, batches and slice counts, none within 3% of a threshold."""
    from tpu_course import hardware

    cases = []
    while len(cases) < 6:
        chip = str(rng.choice(["v5e", "v5p", "v6e"]))
        slices = int(rng.choice([1, 2, 3, 4, 6, 8, 16, 64]))
        params = float(f"{hardware.get(chip).hbm_bytes / 10 * rng.uniform(0.3, 3.0):.3g}")
        tokens = float(f"{comms.dcn_intensity(chip) * rng.uniform(0.4, 2.4):.3g}")
        near_memory = abs(10 * params / hardware.get(chip).hbm_bytes - 1) < 0.03
        near_dcn = slices > 1 and abs(tokens / _ref.dcn_threshold(chip, slices) - 1) < 0.03
        if not (near_memory or near_dcn):
            cases.append((chip, params, tokens, slices))
    return [("other chips, model sizes, batches and slice counts", {"cases": tuple(cases)})]


@LAB.exercise(EX6, minutes=10, kind="apply", hidden=_strategy_hidden)
def check_strategy(choose: Callable[[str, float, float, int], tuple[str, str]],
                   cases: Sequence[tuple[str, float, float, int]] = STRATEGY_CASES
                   ) -> CheckResult:
    """Exercise 6: ``choose(chip, params, tokens_per_slice, slices) -> (within, across)``:
    memory decides DP vs FSDP, the course's DCN rule DP vs pipeline across slices."""
    refuse_course_code(EX6, choose, _ref.choose, _ref.dcn_threshold, comms.recommend,
                       comms.dcn_min_tokens_per_slice)
    got = {}
    for case in cases:
        answer = choose(*case)
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            refuse(EX6, f"return a pair (within_slice, across_slices), got {answer!r:.80}",
                   hint='for example ("fsdp", "pipeline")')
        within, across = answer
        if within in ACROSS and across in WITHIN and within not in WITHIN:
            refuse(EX6, f"you returned {tuple(answer)}: the pair is (within_slice, "
                        "across_slices), in that order", hint='for example ("fsdp", "none")')
        if within not in WITHIN or across not in ACROSS:
            refuse(EX6, f"you returned {tuple(answer)!r:.80}: within_slice is one of "
                        f"{WITHIN}, across_slices one of {ACROSS}",
                   hint="return those strings exactly (lower case)")
        got[case] = (within, across)
    for case in cases:
        want = _ref.choose(*case)
        if got[case] != want:
            chip, params, tokens, slices = case
            part = "inside a slice" if got[case][0] != want[0] else "across slices"
            refuse(EX6, f"for {params:.3g} parameters on {chip} with {tokens:,.0f} tokens per "
                        f"slice and {slices} slice(s) you chose {got[case]}: the choice "
                        f"{part} is not the chapter's",
                   hint=_strategy_hint(choose, cases, got), answer=f"{case}: {want}")
    return ok(EX6, f"all {len(cases)} plans right: memory decides DP vs FSDP (10 bytes per "
                   "parameter against HBM), the course's DCN rule decides DP vs pipeline "
                   "across slices (above the book's C / W_dcn once there are more than two)")


# -- exercise 7: the rows each process feeds, in a real two-process run


def _rows_cases(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    rows = int(rng.choice([8, 24]))
    return [(f"a (data, model) mesh where both devices of a process hold the same block, "
             f"{rows} rows", {"mesh_kind": "replicated", "rows": rows})]


def _rows_source(process_rows: Callable) -> str:
    """The learner's function as a file the worker processes can run, or a failure."""
    import inspect
    import textwrap

    if getattr(process_rows, "__name__", "") == "<lambda>":
        refuse(EX7, "process_rows is a lambda: the worker processes need its source",
               hint="define it with def in a notebook cell")
    try:
        source = textwrap.dedent(inspect.getsource(process_rows))
    except (OSError, TypeError) as err:
        refuse(EX7, f"the source of process_rows cannot be read ({err}): each worker process "
                    "runs it from its source", hint="define it with def in a notebook cell")
    return ("import numpy as np\nimport jax\nimport jax.numpy as jnp\n\n" + source
            + f"\n\nprocess_rows = {process_rows.__name__}\n")


def _span(rows: Sequence[int]) -> str:
    if rows and list(rows) == list(range(rows[0], rows[0] + len(rows))):
        return f"rows {rows[0]}-{rows[-1]}"
    return "rows " + ", ".join(map(str, rows))


@LAB.exercise(EX7, minutes=15, kind="apply", hidden=_rows_cases)
def check_process_rows(process_rows: Callable, mesh_kind: str = "interleaved",
                       rows: int = 16) -> CheckResult:
    """Exercise 7: in a two-process run (2 CPU devices each, ``jax.distributed`` over gloo on
    127.0.0.1), each process's ``process_rows(global_batch, sharding)`` is exactly the rows
    its devices hold, once each, in the global batch's order; the global array that
    ``jax.make_array_from_process_local_data`` assembles from them is the global batch."""
    import os
    import tempfile

    from tpu_course import multihost

    refuse_course_code(EX7, process_rows, _ref.process_rows, multihost.check_rows,
                       multihost.train_data_parallel)
    if not callable(process_rows):
        refuse(EX7, f"process_rows should be a function, not {type(process_rows).__name__}",
               hint="def process_rows(global_batch, sharding): ...")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_rows_source(process_rows))
    try:
        results = multihost.launch_local(
            num_processes=2, local_devices=2, steps=1, timeout_s=240,
            extra_args=["--rows-from", f.name, "--rows-mesh", mesh_kind, "--rows", str(rows)])
    except multihost.LaunchError as err:
        lines = err.stderr_tail.strip().splitlines()
        last = lines[-1] if lines else str(err).splitlines()[0]
        if err.rank is None:
            refuse(EX7, "the two-process run did not finish in time", hint="process_rows "
                   "should only slice numpy arrays: no collectives, no waiting on the other "
                   "process")
        if "Invalid host data" in err.stderr_tail:
            refuse(EX7, f"process {err.rank}'s rows do not make the global batch: "
                        f"jax.make_array_from_process_local_data said {last[:200]}",
                   hint="feed each block this process's devices hold exactly once: a block "
                        "two of its devices hold (replicas) once, blocks only other "
                        "processes hold not at all",
                   answer="the rows of sharding.addressable_devices_indices_map(shape), each "
                          "block once, in the global batch's order")
        refuse(EX7, f"process_rows raised in process {err.rank}: {last[:200]}",
               hint="it runs alone in each worker process: numpy (np) and jax are imported "
                    "there; define any helper inside it")
    finally:
        os.unlink(f.name)
    for r in sorted(results, key=lambda r: r["process_index"]):
        i, fed, held = r["process_index"], r["fed"], r["held"]
        if fed is None:
            refuse(EX7, f"process {i} returned an array of shape {tuple(r['fed_shape'])}, "
                        "not rows of the batch", hint="return global_batch[...] rows, every "
                        "column kept")
        if fed == held:
            continue
        answer = f"process {i} feeds {_span(held)}"
        if len(fed) > len(set(fed)):
            refuse(EX7, f"process {i} fed some rows twice: a block two of its devices hold "
                        "(replicas) went in once per device",
                   hint="feed each block this process's devices hold exactly once",
                   answer=answer)
        if fed == list(range(rows)) and len(held) < rows:
            refuse(EX7, f"process {i} fed the whole global batch ({rows} rows); its devices "
                        f"hold {len(held)} of them",
                   hint="each host loads only the rows its own devices hold: that is the "
                        "point of make_array_from_process_local_data", answer=answer)
        if sorted(fed) == sorted(held):
            refuse(EX7, f"process {i} fed the right rows in another order",
                   hint="concatenate the blocks in the order they have in the global batch",
                   answer=answer)
        if fed == list(range(fed[0], fed[0] + len(fed))) if fed else False:
            refuse(EX7, f"process {i} fed one contiguous block ({_span(fed)}), but on this "
                        "mesh its devices are not next to each other",
                   hint="the chapter's worker could slice by process_index only because "
                        "jax.make_mesh put each process's devices together; ask the sharding "
                        "instead: sharding.addressable_devices_indices_map(global_batch.shape) "
                        "maps each of this process's devices to the rows it holds",
                   answer=answer)
        refuse(EX7, f"process {i} fed {_span(fed)}: not the rows its devices hold",
               hint="sharding.addressable_devices_indices_map(global_batch.shape) maps each of "
                    "this process's devices to the rows it holds", answer=answer)
    if any(r["assembled"] != list(range(rows)) for r in results):
        refuse(EX7, "the assembled global array is not the global batch",
               hint="feed each block this process holds once, in the global batch's order")
    fed = {r["process_index"]: _span(r["fed"]) for r in results}
    return ok(EX7, f"on the {mesh_kind} mesh process 0 fed {fed[0]} and process 1 {fed[1]}: "
                   "together, through make_array_from_process_local_data, exactly the global "
                   "batch (gathered back with process_allgather)")
