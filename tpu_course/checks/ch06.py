"""Lab 6 (shard the chapter-5 model): each exercise declared once.

Probes run the learner's code on simulated CPU devices (the lab asks for 8) and return plain
data (shardings, collectives parsed from the compiled text, sums, losses, each process's rows);
course instruments give the expected outputs. Each exercise's findings are one table."""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, Mapping

import numpy as np

from tpu_course import comms
from tpu_course.checks.engine import (Case, Exercise, Lab, Mistake, Wrong, _brief, array,
                                      number, values)

LAB = Lab(6, "Shard the chapter-5 model and explain every collective", cpu_devices=8)
BYTES_TOLERANCE = 0.10  # a predicted byte count against the compiled HLO's (scalars, padding)
BATCH, WIDTH = 64, 256  # the batch the checks compile for (8 rows a device), the MLP's width

def _findings(*entries: tuple[Callable, Callable | str, str]) -> dict:
    """``(when, say, hint)`` entries on ``(got, want, case)`` as ``compare`` (the first that
    holds says what is wrong; ``say`` may be a string) and ``rules`` (it names the mistake)."""
    def compare(got: Any, want: Any, case: Case) -> str | None:
        for when, say, _ in entries:
            if when(got, want, case):
                return say if isinstance(say, str) else say(got, want, case)
        return None
    return {"compare": compare, "rules": tuple(Mistake(h, when=w) for w, _, h in entries)}

def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    import jax
    from tpu_course import parallel
    if len(jax.devices("cpu")) < np.prod(shape):
        raise Wrong(f"this check needs {np.prod(shape)} CPU devices and JAX sees "
                    f"{len(jax.devices('cpu'))}", "run runtime.simulate_devices(8) in the "
                    "first cell, before JAX starts (restart the kernel first)")
    return parallel.cpu_mesh(shape, names)

def _compile(jitted: Any, *args: Any) -> tuple[Any, list]:
    from tpu_course import hlo
    compiled = jitted.lower(*args).compile()  # and its collectives, from the compiled text
    return compiled, hlo.parse_collectives(compiled.as_text())

def _abstract(tree: Any, shardings: Any) -> Any:
    import jax
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s),
                        tree, shardings)

@functools.lru_cache(maxsize=4)
def chapter5_problem(width: int = WIDTH) -> tuple[Any, Any, Any]:
    """``(step, state, batches)``: the chapter-5 MLP (784 -> width -> width -> 10), its Adam
    train step, two random batches; weights drawn with numpy, the state in host memory."""
    import jax
    import optax
    from flax import nnx
    from tpu_course import models, train
    tx, rng = optax.adam(1e-3), np.random.default_rng(0)
    shapes = nnx.eval_shape(lambda: models.MLP((width, width), rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(shapes, nnx.Param)
    params = jax.tree.map(lambda x: (rng.standard_normal(x.shape) / np.sqrt(x.shape[0]) if
                                     len(x.shape) == 2 else np.zeros(x.shape)).astype(x.dtype),
                          params)
    state = jax.tree.map(np.asarray, train.TrainState(np.zeros((), np.int32), params,
                                                      tx.init(params)))
    batches = [train.Batch(rng.integers(0, 255, (BATCH, 28, 28), dtype=np.uint8),
                           rng.integers(0, 10, (BATCH,)).astype(np.int32),
                           np.ones((BATCH,), np.float32)) for _ in range(2)]
    return train.make_train_step(graphdef, tx), state, batches

@functools.lru_cache(maxsize=2)
def fsdp_collectives(target: str = "cpu") -> dict[str, int]:
    """Exercises 1 and 3's instrument: the course's FSDP step of the chapter-5 model compiled
    on 8 CPU devices or for a TPU topology ("v5e:2x4"), {kind: bytes per device}, the kind of
    the largest collective first."""
    import jax
    from jax.sharding import AxisType
    from tpu_course import hlo, parallel
    step, state, batches = chapter5_problem()
    mesh = _mesh((8,), ("data",)) if target == "cpu" else jax.make_mesh(
        (8,), ("data",), axis_types=(AxisType.Auto,), devices=hlo.tpu_topology(target).devices)
    jitted, s_state, s_batch = parallel.make_sharded_train_step(step, "fsdp", state, mesh)
    report = hlo.inspect(jitted, _abstract(state, s_state),
                         _abstract(batches[0], type(batches[0])(*[s_batch] * 3)),
                         target=None if target == "cpu" else target)
    largest = sorted(report.collectives, key=lambda c: -c.bytes)
    return {k: sum(c.bytes for c in largest if c.kind == k)
            for k in dict.fromkeys(c.kind for c in largest if c.bytes)}

# -- Exercise 1: predict FSDP's collectives --------------------------------------------------

def _prediction(answer: Mapping[str, Any], case: Case) -> Any:
    got = values(answer, case)
    if not isinstance(got, Mapping) or not got:
        raise Wrong(f"the prediction should be a dict {{kind: bytes per device}}, not "
                    f"{_brief(got, 60)}", 'for example {"all-gather": 1000, "all-reduce": 2000}')
    return got

def _kinds_differ(got: dict, want: dict, case: Case) -> bool:
    for kind, value in got.items():
        if kind not in comms.KINDS:
            raise Wrong(f"{kind!r} is not a collective kind XLA emits",
                        f"use the HLO names: {', '.join(comms.KINDS)}")
        number(value, f"the bytes of {kind!r}")
    return set(got) != set(want)

def _say_kinds(g: dict, w: dict, c: Case, why: str = "") -> str:
    return f"the compiled step has {sorted(w)}; you predicted {sorted(g)}{why}"

def _off_by(ratio: float | None, hint: str) -> tuple[Callable, Callable, str]:
    """The finding "the first kind off by more than the tolerance is off by about ``ratio``"."""
    def off(g: dict, w: dict) -> Any:
        return next((k for k in sorted(w) if abs(g[k] / w[k] - 1) > BYTES_TOLERANCE), None)
    def when(g: dict, w: dict, c: Case) -> bool:
        k = off(g, w)
        return k is not None and (ratio is None or abs(g[k] / w[k] - ratio) < 0.1 * ratio)
    def say(g: dict, w: dict, c: Case) -> str:
        k = off(g, w)
        return (f"{k}: your {g[k]:,.0f} B per device is {g[k] / w[k]:.3g}x what 8 simulated "
                f"CPU devices compiled (tolerance {BYTES_TOLERANCE:.0%})")
    return when, say, hint

check_fsdp_prediction = LAB.add(Exercise(
    "Exercise 1 (predict FSDP's collectives)", minutes=10, kind="predict",
    provides=("predicted_fsdp",), probe=_prediction, expect=lambda case: fsdp_collectives(),
    cases=(Case("the chapter-5 FSDP step on 8 simulated CPU devices"),), **_findings(
        (lambda g, w, c: _kinds_differ(g, w, c) and "reduce-scatter" in set(g) - set(w),
         lambda g, w, c: _say_kinds(g, w, c, ": XLA's CPU backend does not emit FSDP's reduce-"
                                    "scatter, it all-reduces the whole gradient and each "
                                    "device keeps its slice"),
         "predict for the backend you compile for: the chapter's FSDP cell shows it"),
        (_kinds_differ, _say_kinds,
         "which collective gathers a shard before use, which one sums the gradients?"),
        (lambda g, w, c: all(abs(g[k] / w[k] - 8) < 0.8 for k in w),
         "every count is about 8x what 8 simulated CPU devices compiled",
         "bits or bytes? XLA counts bytes (fp32: 4 bytes per element)"),
        _off_by(8, "an all-gather's operand is the 1/8 shard each device holds, not the "
                   "gathered array"),
        _off_by(1 / 8, "a gradient reduction's operand is the whole gradient; the 1/8 shard "
                       "is its result"),
        _off_by(2, "fp32 parameters are 4 bytes each, not 8"),
        _off_by(0.5, "fp32 parameters are 4 bytes each, not 2"),
        _off_by(None, "add up the parameters' bytes leaf by leaf (weights and biases)"))))

# -- Exercise 2: FSDP of the chapter-5 model by annotations ----------------------------------

def _probe_fsdp(answer: Mapping[str, Any], case: Case) -> dict:
    """Each leaf's (name, shape, spec, split, on the mesh), bytes in and out per device, the
    collectives' kinds and two steps' losses, for ``shard_fsdp`` on ``devices`` devices."""
    import jax
    mesh = _mesh((case.args["devices"],), ("data",))
    step, state, batches = chapter5_problem(case.args["width"])
    got = answer["shard_fsdp"](step, state, mesh)
    if not isinstance(got, tuple) or len(got) != 3:
        raise Wrong("shard_fsdp should return three things, (jitted_step, state_sharding, "
                    f"batch_sharding); it returned {_brief(got, 60)}",
                    "return jitted, state_sharding, batch_sharding")
    jitted, s_state, s_batch = got
    if not hasattr(jitted, "lower"):
        raise Wrong("the first thing returned is not a jitted function",
                    "wrap the step in jax.jit(step, in_shardings=..., out_shardings=...)")
    leaves, shardings = jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(s_state)
    if len(shardings) != len(leaves) or not all(hasattr(s, "device_set") for s in shardings):
        raise Wrong("state_sharding is not one NamedSharding per leaf of the state", "build it "
                    "with jax.tree.map over the whole state (step, params, opt_state)")
    mine = {d.id for d in mesh.devices.flat}
    table = [(jax.tree_util.keystr(path).removesuffix(".value").lstrip("."), list(np.shape(x)),
              str(getattr(s, "spec", s)), not s.is_fully_replicated,
              {d.id for d in s.device_set} == mine) for (path, x), s in zip(leaves, shardings)]
    compiled, collectives = _compile(jitted, _abstract(state, s_state),
                                     _abstract(batches[0], type(batches[0])(*[s_batch] * 3)))
    memory, losses, placed = compiled.memory_analysis(), [], jax.device_put(state, s_state)
    for b in batches:
        placed, metrics = compiled(placed, jax.device_put(b, s_batch))
        placed = jax.device_put(placed, s_state)
        losses.append(float(metrics["loss"]))
    return {"leaves": table, "batch_split": not getattr(s_batch, "is_fully_replicated", True),
            "argument_bytes": int(memory.argument_size_in_bytes),
            "output_bytes": int(memory.output_size_in_bytes),
            "kinds": sorted({c.kind for c in collectives}), "losses": losses}

def _splits(shape: Any, n: int) -> bool:
    return n > 1 and any(d % n == 0 and d >= n for d in shape)  # FSDP splits it over n devices

@functools.lru_cache(maxsize=8)
def _fsdp_expect(n: int, width: int) -> dict:
    """A device's bytes when every array that splits is split; the single-device losses."""
    import jax
    step, state, batches = chapter5_problem(width)
    def per_device(x: Any) -> int:
        size = int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize
        return size // n if _splits(np.shape(x), n) else size
    single, out = jax.jit(step), {"state_bytes": sum(map(per_device, jax.tree.leaves(state))),
                                  "batch_bytes": sum(map(per_device, jax.tree.leaves(batches[0]))),
                                  "losses": []}
    for b in batches:
        state, metrics = single(state, b)
        out["losses"].append(float(metrics["loss"]))
    return out

def _whole(got: dict, case: Case, *parts: str) -> list[str]:
    """The leaves of ``parts`` ("params", "mu", "nu", "other") that split but are whole."""
    def part_of(name: str) -> str:
        return next((m for m in ("mu", "nu") if re.search(rf"\.{m}\b", name)),
                    "params" if name.startswith("params") else "other")
    return [name for name, shape, _, split, _ in got["leaves"]
            if not split and _splits(shape, case.args["devices"]) and part_of(name) in parts]

def _say_whole(part: str, what: str) -> Callable:
    return lambda g, w, c: (f"{_whole(g, c, part)[0]} is replicated: FSDP splits every "
                            + what.format(**c.args))

def _say_moments(g: dict, w: dict, c: Case) -> str:
    mu, nu = _whole(g, c, "mu"), _whole(g, c, "nu")
    which = ("Adam's moments are" if mu and nu else "Adam's first moment (mu) is" if mu else
             "Adam's second moment (nu) is")
    return (f"{which} replicated: {(mu + nu)[0]} ({len(mu + nu)} moment array(s) in all) is "
            "whole on every device, so each device still holds the full optimizer state")

check_shard_fsdp = LAB.add(Exercise(
    "Exercise 2 (FSDP of the chapter-5 model by annotations)", minutes=20,
    provides=("shard_fsdp",), time_limit_s=180,
    cases=(Case("the chapter-5 MLP on the 8-device mesh", {"devices": 8, "width": WIDTH}),),
    probe=_probe_fsdp, expect=lambda c: _fsdp_expect(c.args["devices"], c.args["width"]),
    hint="split the first dimension 'data' divides of every leaf, gather the weights inside "
         "the step", **_findings(
        (lambda g, w, c: not all(on for *_, on in g["leaves"]),
         lambda g, w, c: f"the sharding of {next(n for n, *_, on in g['leaves'] if not on)} is "
                         "on other devices than the mesh passed to shard_fsdp",
         "build every NamedSharding on shard_fsdp's mesh argument, not on a mesh of your own"),
        (lambda g, w, c: _whole(g, c, "params"),
         _say_whole("params", "parameter that can be split over the {devices} devices"),
         "shard the first dimension that the mesh's 'data' axis divides: P(None, 'data') for "
         "a (10, 256)-like shape, P('data') for (256,)"),
        (lambda g, w, c: _whole(g, c, "mu", "nu"), _say_moments,
         "FSDP shards the optimizer state like the parameters: build state_sharding with "
         "jax.tree.map over the whole state, not only over state.params"),
        (lambda g, w, c: _whole(g, c, "other"), _say_whole("other", "array that can be split"),
         "one rule for every leaf of the state: split its first dimension that 'data' divides"),
        (lambda g, w, c: not g["batch_split"],
         "the batch is replicated: FSDP splits the batch like data parallelism",
         "batch_sharding = NamedSharding(mesh, P('data'))"),
        (lambda g, w, c: g["argument_bytes"] > 1.02 * (w["state_bytes"] + w["batch_bytes"]) + 256,
         lambda g, w, c: f"the compiled step takes {g['argument_bytes']:,} argument bytes per "
                         f"device; a device holds {w['state_bytes'] + w['batch_bytes']:,} when "
                         "every array that splits is split",
         "jit's in_shardings must be the state_sharding you return and the batch's sharding"),
        (lambda g, w, c: g["output_bytes"] > 1.02 * w["state_bytes"] + 1024,
         lambda g, w, c: f"the compiled step returns {g['output_bytes']:,} bytes per device: "
                         "the new state comes back whole (or partly) on every device",
         "out_shardings=(state_sharding, replicated): only the metrics are replicated"),
        (lambda g, w, c: {"all-to-all", "collective-permute"} & set(g["kinds"]),
         "the compiled step moves activations between devices (all-to-all or collective-"
         "permute) instead of gathering the weights", "inside the step, constrain the "
         "parameters to be whole (jax.lax.with_sharding_constraint, replicated) before use"),
        (lambda g, w, c: "all-gather" not in g["kinds"],
         "no all-gather in the compiled step: the weights are never gathered",
         "FSDP keeps only a shard of each weight and gathers it before use"),
        (lambda g, w, c: not np.allclose([number(x, "a loss") for x in g["losses"]],
                                         w["losses"], rtol=2e-5),
         lambda g, w, c: f"the sharded step's losses {g['losses']} differ from the single-"
                         f"device step's {w['losses']}", "the sharded step must compute the "
         "same thing: pass the chapter-5 step's state and batch through unchanged"))))

# -- Exercise 3: FSDP on a v5e-8 ---------------------------------------------------------------

def _v5e_kind(got: Any, want: str, case: Case) -> str | None:
    if not isinstance(got, str) or got not in comms.KINDS:
        raise Wrong(f"predicted_v5e_kind should be one of the HLO kinds, not {_brief(got, 40)}",
                    f"one of: {', '.join(comms.KINDS)}")
    return None if got == want else (f"on the v5e-8 the largest gradient goes through another "
                                     f"kind than {got!r}")

check_v5e_kind = LAB.add(Exercise(
    "Exercise 3 (FSDP on a v5e-8: predict, then compile)", minutes=10, kind="predict",
    needs="tpu-compiler", provides=("predicted_v5e_kind",),
    cases=(Case("the chapter-5 FSDP step compiled for a v5e-8 (v5e:2x4)"),), probe=values,
    expect=lambda case: next(iter(fsdp_collectives("v5e:2x4"))), compare=_v5e_kind,
    rules=(Mistake("the CPU backend all-reduces and slices; look at what the chapter's v5e "
                   "cell printed for FSDP", when=lambda g, w, c: g == "all-reduce" != w),),
    hint="which collective sums gradients and leaves each device its shard?"))

# -- Exercises 4 and 5: a bidirectional ring all-reduce, a hierarchical one ------------------

def _blocks(devices: int, block: Any, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((devices * block[0], block[1])).astype(np.float32)

def _summed(x: np.ndarray, devices: int) -> np.ndarray:  # what psum gives each device
    return np.tile(x.reshape(devices, -1, x.shape[1]).sum(0), (devices, 1))

def _run_mapped(fn: Callable, mesh: Any, spec: Any, x: np.ndarray) -> tuple[np.ndarray, list]:
    import jax
    compiled, collectives = _compile(
        jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec)), x)
    return np.asarray(compiled(x)), collectives

def _sum_wrong(got: dict, want: dict, case: Case) -> bool:
    return not np.allclose(array(got["sum"], "the result", want["sum"].shape), want["sum"],
                           rtol=1e-5, atol=1e-5)

def _probe_ring(answer: Mapping[str, Any], case: Case) -> dict:
    from jax.sharding import PartitionSpec as P
    fn, n = answer["bidirectional_all_reduce"], case.args["n"]
    out, cs = _run_mapped(lambda a: fn(a, "data", n), _mesh((n,), ("data",)), P("data"),
                          _blocks(n, case.args["block"], 0))
    return {"sum": out, "kinds": sorted({c.kind for c in cs}),
            "directions": sorted({(b - a) % n for c in cs for a, b in c.source_target_pairs or ()}),
            "largest": max((c.bytes for c in cs), default=0)}

def _ring_expect(case: Case) -> dict:
    n, block = case.args["n"], case.args["block"]
    return {"sum": _summed(_blocks(n, block, 0), n), "directions": sorted({1, n - 1}),
            "half_chunk": block[0] * block[1] * 4 / n / 2}

check_bidirectional = LAB.add(Exercise(
    "Exercise 4 (a bidirectional ring all-reduce)", minutes=25, kind="apply",
    provides=("bidirectional_all_reduce",), probe=_probe_ring, expect=_ring_expect,
    cases=(Case("a ring of 8 devices, blocks of 1x35", {"n": 8, "block": (1, 35)}),), **_findings(
        (lambda g, w, c: set(g["kinds"]) - {"collective-permute"},
         lambda g, w, c: "the compiled function contains "
                         f"{sorted(set(g['kinds']) - {'collective-permute'})}: build the sum "
                         "from jax.lax.ppermute steps only",
         "no psum, pmean, all_gather or psum_scatter inside"),
        (_sum_wrong, "the result is not the sum over the devices' blocks",
         "run each half as its own ring; in the leftward ring the chunk index moves the other "
         "way: (me + s) where the rightward ring has (me - s)"),
        (lambda g, w, c: g["directions"] != w["directions"],
         "every transfer goes the same way round the ring",
         "send half of the data right, i -> i+1, and the other half left, i -> i-1: both "
         "directions of each link then carry traffic"),
        (lambda g, w, c: g["largest"] > w["half_chunk"] + 64,
         lambda g, w, c: f"one transfer moves {g['largest']} B, more than half a chunk "
                         f"({w['half_chunk']:.0f} B): the array was not split into 2n pieces",
         "cut the flat array into 2 halves of n chunks each"))))

def _probe_slices(answer: Mapping[str, Any], case: Case) -> dict:
    from jax.sharding import PartitionSpec as P
    mesh = _mesh(case.args["mesh"], ("slice", "chip"))
    out, cs = _run_mapped(answer["hierarchical_all_reduce"], mesh, P(("slice", "chip")),
                          _blocks(mesh.devices.size, case.args["block"], 1))
    slice_of = {d.id: i for i, row in enumerate(mesh.devices) for d in row}
    crossing = sum(c.bytes for c in cs if any(len({slice_of.get(d) for d in g}) > 1 for g in (
        c.source_target_pairs if c.kind == "collective-permute" else c.replica_groups) or ()))
    return {"sum": out, "crossing": crossing}

def _slices_expect(case: Case) -> dict:
    (slices, chips), block = case.args["mesh"], case.args["block"]
    x = _blocks(slices * chips, block, 1)
    return {"sum": _summed(x, slices * chips), "local": x.nbytes // (slices * chips),
            "crossing": x.nbytes // (slices * chips) // chips}

check_hierarchical = LAB.add(Exercise(
    "Exercise 5 (a hierarchical all-reduce across slices)", minutes=20, kind="apply",
    provides=("hierarchical_all_reduce",), probe=_probe_slices, expect=_slices_expect,
    cases=(Case("2 slices of 4 chips, blocks of 16x12", {"mesh": (2, 4), "block": (16, 12)}),),
    **_findings(
        (_sum_wrong,
         lambda g, w, c: f"the result is not the sum over all {np.prod(c.args['mesh'])} devices",
         "reduce-scatter over 'chip', all-reduce the piece over 'slice', all-gather over 'chip'"),
        (lambda g, w, c: g["crossing"] > w["crossing"] + 64,
         lambda g, w, c: f"{g['crossing']:,} B per device cross the slow network, "
                         f"{g['crossing'] / w['local']:.2f} of the array",
         "sum inside each slice first (over 'chip', on ICI): only 1/|chip| of the array has to "
         "cross slices"))))

# -- Exercise 6: choose a strategy ---------------------------------------------------------------

#: The notebook's plans ``(chip, params, tokens_per_slice, slices)``: they separate the
#: course's DCN rule from the book's and both from the usual slips.
STRATEGY_CASES = (("v5e", 1.2e9, 2e5, 1), ("v5e", 7e9, 1e6, 4), ("v5p", 7e10, 2e4, 2),
                  ("v5p", 3e9, 9e4, 4), ("v5p", 5e9, 1.2e5, 2), ("v5e", 2.5e9, 5.5e4, 2),
                  ("v5p", 1e9, 4.2e4, 2), ("v5p", 1.1e10, 1.5e5, 4), ("v6e", 2.9e9, 1.3e5, 16),
                  ("v6e", 5e8, 5e5, 8))
WITHIN, ACROSS = ("dp", "fsdp"), ("none", "dp", "pipeline")

def _compare_plans(got: Any, want: list, case: Case) -> str | None:
    if not isinstance(got, list) or len(got) != len(want):
        raise Wrong(f"expected one plan per input, got {_brief(got, 60)}", "return a pair")
    for (chip, params, tokens, slices), pair, right in zip(case.args["plans"], got, want):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise Wrong(f"return a pair (within_slice, across_slices), got {_brief(pair, 60)}",
                        'for example ("fsdp", "pipeline")')
        if pair[0] in ACROSS and pair[1] in WITHIN and pair[0] not in WITHIN:
            raise Wrong(f"you returned {tuple(pair)}: the pair is (within_slice, "
                        "across_slices), in that order", 'for example ("fsdp", "none")')
        if pair[0] not in WITHIN or pair[1] not in ACROSS:
            raise Wrong(f"you returned {_brief(tuple(pair), 60)}: within_slice is one of "
                        f"{WITHIN}, across_slices one of {ACROSS}",
                        "return those strings exactly (lower case)")
        if tuple(pair) != tuple(right):
            return (f"for {params:.3g} parameters on {chip} with {tokens:,.0f} tokens per slice "
                    f"and {slices} slice(s) you chose {tuple(pair)}: the choice "
                    f"{'inside a slice' if pair[0] != right[0] else 'across slices'} is not "
                    "the chapter's")
    return None

check_strategy = LAB.add(Exercise(
    "Exercise 6 (choose a strategy)", minutes=10, kind="apply", provides=("choose",),
    cases=(Case("ten plans on v5e, v5p and v6e", {"plans": STRATEGY_CASES}),),
    probe=lambda answer, case: [answer["choose"](*plan) for plan in case.args["plans"]],
    compare=_compare_plans,
    hint="memory decides DP vs FSDP (10 bytes per parameter against hardware.get(chip)."
         "hbm_bytes); across slices DP when the tokens per slice reach 2 (S-1)/S x 4 bytes / "
         "4 FLOPs x C / W_dcn, otherwise pipeline"))

# -- Exercise 7: each process's rows of the global batch ---------------------------------------

def _source(fn: Any) -> str:
    """``process_rows`` as the module each worker process runs."""
    import inspect
    import textwrap
    if not callable(fn):
        raise Wrong(f"process_rows should be a function, not {_brief(fn, 40)}",
                    "def process_rows(global_batch, sharding): ...")
    try:
        if fn.__name__ == "<lambda>":
            raise TypeError("a lambda")
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError, AttributeError) as err:
        raise Wrong(f"the source of process_rows cannot be read ({err}): each worker process "
                    "runs it from its source", "define it with def in a notebook cell") from None
    return ("import numpy as np\nimport jax\nimport jax.numpy as jnp\n\n" + source
            + f"\n\nprocess_rows = {fn.__name__}\n")

def _probe_rows(answer: Mapping[str, Any], case: Case) -> dict:
    """The rows each process fed (row ``i`` starts with ``i``) and the global array assembled
    from them, in a two-process ``jax.distributed`` run on 127.0.0.1."""
    import os
    import tempfile
    from tpu_course import multihost
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_source(answer["process_rows"]))
    try:
        results = multihost.launch_local(num_processes=2, local_devices=2, steps=1, timeout_s=240,
                                         extra_args=["--rows-from", f.name, "--rows-mesh",
                                                     case.args["mesh"], "--rows",
                                                     str(case.args["rows"])])
    except multihost.LaunchError as err:
        last = (err.stderr_tail.strip().splitlines() or [str(err)])[-1][:200]
        if err.rank is None:
            raise Wrong("the two-process run did not finish in time", "process_rows should "
                        "only slice numpy arrays: no collectives, no waiting") from None
        if "Invalid host data" in err.stderr_tail:
            raise Wrong(f"process {err.rank}'s rows do not make the global batch: jax.make_"
                        f"array_from_process_local_data said {last}", _ONCE) from None
        raise Wrong(f"process_rows raised in process {err.rank}: {last}", "it runs alone in "
                    "each worker process, with np and jax imported: define any helper "
                    "inside it") from None
    finally:
        os.unlink(f.name)
    results.sort(key=lambda r: r["process_index"])
    return {"fed": [r["fed"] if r["fed"] is not None else f"an array of shape {r['fed_shape']}"
                    for r in results], "assembled": [r["assembled"] for r in results]}

def _rows_expect(case: Case) -> dict:
    """The rows each process's devices hold on ``multihost.rows_mesh`` (2 processes of 2
    devices): "interleaved" orders the data axis (process 0, 1, 0, 1); "replicated" gives
    each process one row of a (data, model) grid, its two devices holding the same block."""
    rows, interleaved = case.args["rows"], case.args["mesh"] == "interleaved"
    blocks, size = ([[0, 2], [1, 3]], rows // 4) if interleaved else ([[0], [1]], rows // 2)
    return {"fed": [[r for b in bs for r in range(b * size, (b + 1) * size)] for bs in blocks],
            "assembled": [list(range(rows))] * 2}

def _contiguous(rows: Any) -> bool:
    return bool(rows) and list(rows) == list(range(rows[0], rows[0] + len(rows)))

def _rows_finding(test: Callable, what: str, hint: str) -> tuple[Callable, Callable, str]:
    """A finding ``test(fed, held, rows)`` on the first process that fed other rows than its
    devices hold."""
    def bad(g: dict, w: dict) -> tuple[int, Any, Any]:
        return next(((i, f, h) for i, (f, h) in enumerate(zip(g["fed"], w["fed"])) if f != h),
                    (-1, None, None))
    def say(g: dict, w: dict, c: Case) -> str:
        i, fed, _ = bad(g, w)
        span = fed if isinstance(fed, str) else (f"rows {fed[0]}-{fed[-1]}" if _contiguous(fed)
                                                 else "rows " + ", ".join(map(str, fed)))
        return f"process {i} fed {span}: {what}"
    return (lambda g, w, c: bad(g, w)[0] >= 0 and test(*bad(g, w)[1:], c.args["rows"])), say, hint

_ONCE = "feed each block this process's devices hold exactly once"
_INDICES_MAP = ("sharding.addressable_devices_indices_map(global_batch.shape) maps each of "
                "this process's devices to the rows it holds")

check_process_rows = LAB.add(Exercise(
    "Exercise 7 (each process's rows of the global batch)", minutes=15, kind="apply",
    provides=("process_rows",), probe=_probe_rows, expect=_rows_expect, time_limit_s=300,
    cases=(Case("an interleaved data axis, 16 rows", {"mesh": "interleaved", "rows": 16}),),
    **_findings(
        _rows_finding(lambda fed, held, rows: isinstance(fed, str), "not rows of the batch",
                      "return global_batch[...] rows, every column kept"),
        _rows_finding(lambda fed, held, rows: len(fed) > len(set(fed)), "some rows twice: a "
                      "block two of its devices hold (replicas) went in once per device", _ONCE),
        _rows_finding(lambda fed, held, rows: fed == list(range(rows)),
                      "the whole global batch, where its devices hold part of it",
                      "each host loads only the rows its own devices hold: that is the point "
                      "of make_array_from_process_local_data"),
        _rows_finding(lambda fed, held, rows: sorted(fed) == sorted(held),
                      "the right rows in another order",
                      "concatenate the blocks in the order they have in the global batch"),
        _rows_finding(lambda fed, held, rows: _contiguous(fed), "one contiguous block, but on "
                      "this mesh its devices are not next to each other", "the chapter's "
                      "worker could slice by process_index only because jax.make_mesh put each "
                      "process's devices together; ask the sharding instead: " + _INDICES_MAP),
        _rows_finding(lambda fed, held, rows: True, "not the rows its devices hold",
                      _INDICES_MAP),
        (lambda g, w, c: g["assembled"] != w["assembled"],
         "the assembled global array is not the global batch",
         "feed each block this process holds once, in the global batch's order"))))
