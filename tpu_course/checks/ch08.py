"""Lab 8 (the chapter-8 language model). Expected outputs come from the course's instruments
(the model's leaves, the chapter's count, one device's steps, each remat policy compiled, a
float64 attention, the decode roofline); keys live in ``grading/ch08.py``."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from tpu_course import hlo, lm
from tpu_course.checks.engine import Case, Exercise, Lab, Mistake, Wrong, number

#: LLVM's -O0 for the checks' programs: the same HLO plan, compiled faster.
_O0 = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
LAB = Lab(8, "Train, shard, fit and serve the chapter-8 language model", cpu_devices=8)

def _failed(err, what, hint):  # a learner's exception as a one-line failure, no traceback
    text = " ".join(str(err).split())[:240] or "no message"
    return Wrong(f"{what} raised {type(err).__name__}: {text}", hint)

def _flops(program):  # of a lowered or compiled program, from XLA's cost analysis
    return hlo.text.normalise_cost(program.cost_analysis()).get("flops", 0.0)

def _causal(q, k, v, xp=jnp, softmax=jax.nn.softmax):  # (batch, length, heads, head_dim)
    t = q.shape[1]
    s = xp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1])
    s = xp.where(xp.tril(xp.ones((t, t), bool)), s, -1e30)
    return xp.einsum("bhqs,bshk->bqhk", softmax(s, -1), v)

def _readable(compare, hint):  # refuses, with hint, an output it cannot read (tampered with)
    def guarded(got, want, case):
        try:
            return compare(got, want, case)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise Wrong(f"the check could not read your output ({str(got)[:60]})", hint) from None
    return guarded

# -- Exercise 1: predict the parameters and FLOPs per token -----------------------------------

def exercise1_config() -> lm.LMConfig:
    """The configuration exercise 1 asks about: not one the chapter shows."""
    return lm.LMConfig(d_model=96, heads=3, layers=3, d_ff=384, context=192)

@functools.lru_cache(maxsize=4)
def real_param_count(config: lm.LMConfig) -> int:
    """The parameters of ``lm.LM(config)``, counted leaf by leaf (no arrays allocated)."""
    params = nnx.state(nnx.eval_shape(lambda: lm.LM(config, rngs=nnx.Rngs(0))), nnx.Param)
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))

@functools.lru_cache(maxsize=4)
def xla_flops_per_token(config: lm.LMConfig) -> float:
    """XLA's count of a training step's FLOPs (forward and backward) per token of a sequence."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: lm.LM(config, rngs=nnx.Rngs(0))))
    tokens = jax.ShapeDtypeStruct((1, config.context), jnp.int32)
    step = jax.value_and_grad(lm.make_loss(graphdef))
    return float(hlo.inspect(step, state, tokens, tokens).flops) / config.context

def _size_compare(got, want, case):  # the chapter's count (XLA's is a few % higher)
    (n, want_n), (f, want_f) = ((number(g, w), x) for g, w, x in zip(
        got, ("predicted_params", "the FLOPs"), want, strict=True))
    if not math.isclose(n, want_n, rel_tol=1e-4):
        return f"the model has {'fewer' if want_n < n else 'more'} parameters than your {n:,.0f}"
    if not math.isclose(f, want_f, rel_tol=0.02):
        return f"your {f:,.0f} FLOPs per token is {f / want_f:.2f}x the chapter's count (2 %)"
    return None

check_size_prediction = LAB.add(Exercise(
    "Exercise 1 (predict the parameters and FLOPs per token)", minutes=15, kind="predict",
    provides=("predicted_params", "predicted_flops_per_token"),
    probe=lambda a, case: tuple(number(a[n], n) for n in ("predicted_params",
                                                          "predicted_flops_per_token")),
    expect=lambda case: (real_param_count(c := exercise1_config()), lm.flops_per_token(c)),
    compare=_readable(_size_compare, "give both predictions, two numbers"),
    hint="parameters: per block 4 attention matrices d x d, the MLP's d x d_ff twice, two norm "
         "scales; times the layers, plus both embedding tables, the final norm and the output "
         "head. FLOPs: 6 per multiplying parameter per token (the tables are lookups) plus "
         "attention's 12 x layers x d_model x context"))

# -- Exercise 2: shardings of attention for tensor parallelism --------------------------------

#: The attention model exercise 2 shards: ``(vocab, d_model, heads, head_dim)``.
ATTENTION_SHAPE = (256, 64, 4, 16)
#: Each attention weight's (heads axis, head_dim axis): "model" splits the heads.
_HEAD_AXES = {"wq": (1, 2), "wk": (1, 2), "wv": (1, 2), "wo": (0, 1)}

def attention_problem(shape: tuple[int, ...] = ATTENTION_SHAPE) -> tuple[Any, Any, Any, Any]:
    """``(step, state, tokens, tx)``: AdamW on one attention block (``lm.Attention``'s weights)
    with a tied embedding, ``state = (params, opt_state)``, 16 sequences of 32 tokens."""
    v, d, h, k = shape
    rng, tx = np.random.default_rng(0), optax.adamw(1e-2)
    sizes = {"embed": ((v, d), 0.02), **{n: ((d, h, k), d ** -0.5) for n in ("wq", "wk", "wv")},
             "wo": ((h, k, d), (h * k) ** -0.5)}
    params = {n: rng.normal(0, std, s).astype(np.float32) for n, (s, std) in sizes.items()}

    def loss(p, tokens, use):
        if use is not None:  # FSDP: gather each weight over "data" where it is used
            p = jax.lax.with_sharding_constraint(p, use)
        x = p["embed"][tokens[:, :-1]]
        q, k, v = (jnp.einsum("btd,dhk->bthk", x, p[n]) for n in ("wq", "wk", "wv"))
        logits = (x + jnp.einsum("bqhk,hkd->bqd", _causal(q, k, v), p["wo"])) @ p["embed"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def step(state, tokens, use=None):
        value, grads = jax.value_and_grad(loss)(state[0], tokens, use)
        updates, opt = tx.update(grads, state[1], state[0])
        return (optax.apply_updates(state[0], updates), opt), value

    tokens = np.random.default_rng(1).integers(0, v, (16, 33)).astype(np.int32)
    return step, (params, tx.init(params)), tokens, tx

def _two_steps(run, state, tokens):  # the losses of two training steps, and the state after
    state, first = run(state, tokens)
    state, second = run(state, tokens)
    return (float(first), float(second)), state

@functools.lru_cache(maxsize=4)
def single_device_losses(shape: tuple[int, ...] = ATTENTION_SHAPE) -> tuple[float, float]:
    """The losses of two training steps on one CPU device: what sharding must not change."""
    step, state, tokens, _ = attention_problem(tuple(shape))
    with jax.default_device(jax.devices("cpu")[0]):
        return _two_steps(jax.jit(step, compiler_options=_O0), state, tokens)[0]

def _axes(sharding, ndim):  # the mesh axes each dimension is split over
    spec = (*tuple(sharding.spec), *(None,) * ndim)[:ndim]
    return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec)

def _probe_shardings(answer, case):
    """The learner's shardings as data: the mesh axes of each dimension of each weight ("wq")
    and Adam moment ("wq mu"), the compiled step's collectives, two steps' losses."""
    (rows, cols), devices = case.args["mesh_shape"], jax.devices("cpu")
    if len(devices) < rows * cols:
        raise Wrong(f"this check needs {rows * cols} CPU devices and JAX sees {len(devices)}",
                    "restart the kernel and run runtime.simulate_devices(8) before JAX starts")
    mesh = jax.make_mesh((rows, cols), ("data", "model"), axis_types=(AxisType.Auto,) * 2,
                         devices=devices[:rows * cols])
    step, state, tokens, _ = attention_problem(tuple(case.args["shape"]))
    per_leaf = "return one NamedSharding per leaf of the whole state (params, opt_state)"
    try:
        got = answer["attention_shardings"](state, mesh)
    except Exception as err:  # noqa: BLE001 - a learner's error, reported as data
        raise _failed(err, "attention_shardings(state, mesh)", per_leaf) from None
    is_sharding = lambda s: isinstance(s, NamedSharding)
    if jax.tree.structure(state) != jax.tree.structure(got, is_leaf=is_sharding):
        raise Wrong("attention_shardings returned " + (
            "only the parameters' shardings: the state is (params, opt_state)" if isinstance(
                got, dict) and set(got) == set(state[0]) else "something else than the state's "
            "structure"), f"{per_leaf}: tree_map_with_path, or optax.tree_map_params")
    axes = {}
    for (path, leaf), s in zip(jax.tree_util.tree_flatten_with_path(state)[0],
                               jax.tree.leaves(got, is_leaf=is_sharding)):
        if not is_sharding(s):
            raise Wrong(f"a leaf's sharding is a {type(s).__name__}", "NamedSharding(mesh, "
                        "PartitionSpec(...)) on the mesh argument, for every leaf")
        names = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
        weight = next((n for n in reversed(names) if n in state[0]), None)
        moment = next((m for m in ("mu", "nu") if m in names), "")  # "": a parameter
        if weight and np.ndim(leaf) and (moment or path[0].idx == 0):
            split = axes[f"{weight} {moment}".strip()] = _axes(s, np.ndim(leaf))
            for i, (size, over) in enumerate(zip(np.shape(leaf), split)):
                if size % (parts := math.prod(mesh.shape.get(a, 1) for a in over)):
                    raise Wrong(f"a sharding splits axis {i} of a {np.shape(leaf)} array, of "
                                f"size {size}, into {parts} parts, which do not divide it",
                                "split the heads over 'model' alone, d_model and the "
                                "vocabulary over 'data': mesh axes whose sizes divide them")
    use = {n: NamedSharding(mesh, P(*[tuple(a for a in e if a != "data") or None
                                      for e in axes[n]])) for n in state[0]}
    batch = NamedSharding(mesh, P("data"))
    try:
        compiled = jax.jit(functools.partial(step, use=use), in_shardings=(got, batch),
                           out_shardings=(got, NamedSharding(mesh, P())),
                           compiler_options=_O0).lower(state, tokens).compile()
        losses = _two_steps(compiled, jax.device_put(state, got), jax.device_put(tokens, batch))[0]
    except Exception as err:  # noqa: BLE001 - the learner's shardings did not compile or run
        raise _failed(err, "the step with your shardings", "every leaf a NamedSharding whose "
                      "PartitionSpec has at most as many entries as the leaf has axes (P() for "
                      "scalars)") from None
    return {"axes": axes, "losses": losses,
            "collectives": sorted({c.kind for c in hlo.text.parse_collectives(compiled.as_text())})}

_ATTENTION_HINTS = (
    "shard the optimizer state like the parameters: mu and nu have the parameters' shapes "
    "(optax.tree_map_params, or a tree map over the whole state by leaf name)",
    "shard the embedding's rows (the vocabulary), not its features: P('data', None)",
    "split the same axis, the heads, of wq, wk, wv and wo over 'model': each device then "
    "computes whole heads, with no exchange inside attention",
    "tensor parallelism of attention puts the heads axis on 'model': axis 1 of wq, wk, wv "
    "(d, heads, head_dim), axis 0 of wo (heads, head_dim, d)",
    "FSDP splits each weight over 'data' too: the d_model axis of the attention weights, "
    "the rows of the embedding",
    "shardings change where numbers live, not what is computed: return shardings only")

def _attention_problem(got, want):
    """(index of its hint, what is wrong) of the shardings' first problem, or None."""
    axes = got["axes"]
    for key, split in axes.items():
        weight, *moment = key.split()
        if moment and split != axes[weight]:
            return 0, (f"Adam's {'first' if moment == ['mu'] else 'second'} moment of {weight} "
                       f"is {'laid out unlike its parameter' if any(split) else 'replicated'}: "
                       "each device still holds the whole optimizer state")
    if axes["embed"][1]:
        return 1, (f"the embedding's feature axis (d_model) is split over {axes['embed'][1]}: "
                   "every lookup needs whole rows from other devices")
    if "all-to-all" in got["collectives"]:
        odd = [n for n, (_, head_dim) in _HEAD_AXES.items() if axes[n][head_dim]]
        which = (f"{', '.join(odd)} split{'s' * (len(odd) == 1)} the head_dim axis" if odd
                 else "the weights disagree on which axis 'model' splits")
        return 2, (f"the compiled step has all-to-alls: {which}, so XLA transposes activations "
                   "between the projections and attention")
    for n, (heads, _) in _HEAD_AXES.items():
        if "model" not in axes[n][heads]:
            return 3, (f"the heads of {n} are not split over 'model' (its axes: {axes[n]}): "
                       "every model-parallel device computes every head")
    for n in ("embed", *_HEAD_AXES):
        if not any("data" in a for a in axes[n]):
            return 4, f"{n} is whole on every 'data' shard: that is not FSDP"
    if not np.allclose(got["losses"], want, rtol=2e-5):
        return 5, f"the sharded step's losses {got['losses']} differ from one device's {want}"
    return None

def _attention_case(shape, mesh_shape):
    return Case(f"a {mesh_shape[0]}x{mesh_shape[1]} mesh and {shape[2]} heads of {shape[3]}",
                {"shape": shape, "mesh_shape": mesh_shape})

check_attention_shardings = LAB.add(Exercise(
    "Exercise 2 (shardings of attention for tensor parallelism)", minutes=25,
    provides=("attention_shardings",), cases=(_attention_case(ATTENTION_SHAPE, (4, 2)),),
    probe=_probe_shardings, expect=lambda case: single_device_losses(tuple(case.args["shape"])),
    compare=_readable(lambda got, want, case: (_attention_problem(got, want) or (0, None))[1],
                      "return one NamedSharding per leaf of (params, opt_state)"),
    rules=tuple(Mistake(h, when=lambda got, want, case, i=i: (
        _attention_problem(got, want) or (None,))[0] == i) for i, h in enumerate(_ATTENTION_HINTS)),
    time_limit_s=240, hint="heads on 'model', FSDP on 'data', the embedding's rows on 'data', "
                           "Adam's moments like their parameters, scalars replicated"))

# -- Exercise 3: a remat policy that fits the budget ------------------------------------------

#: The memory budget of exercise 3: temporary bytes of the compiled training step.
REMAT_BUDGET_BYTES = 10_000_000
#: The policies exercise 3 chooses from (names in ``jax.checkpoint_policies``; "none").
POLICIES = ("none", "everything_saveable", "dots_saveable",
            "dots_with_no_batch_dims_saveable", "nothing_saveable")
#: The stack exercise 3 compiles: (layers, batch, length, d_model, d_ff, heads).
REMAT_SHAPE = (4, 8, 64, 64, 256, 4)
_SAVES = {"none": "no remat keeps every activation for the backward pass",
          "everything_saveable": "everything_saveable saves every intermediate, as no remat",
          "dots_saveable": "dots_saveable saves every matmul's output, batched ones included"}
_ONE_OF = f"one of {', '.join(map(repr, POLICIES))} (names in jax.checkpoint_policies)"

def _remat_block(p, x, heads):
    b, t, d = x.shape
    norm = lambda y: y * jax.lax.rsqrt(jnp.mean(y * y, -1, keepdims=True) + 1e-6)
    h = norm(x)
    q, k, v = ((h @ p[n]).reshape(b, t, heads, -1) for n in ("wq", "wk", "wv"))
    x = x + _causal(q, k, v).reshape(b, t, d) @ p["wo"]
    return x + jax.nn.gelu(norm(x) @ p["w1"]) @ p["w2"]

@functools.lru_cache(maxsize=8)
def remat_measurement(name: str, shape: tuple[int, ...] = REMAT_SHAPE) -> tuple[int, float]:
    """``(temporary bytes, FLOPs)`` of the stack's compiled training step (its layers a
    ``lax.scan``) under policy ``name``."""
    layers, b, t, d, f, heads = shape
    sizes = {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, f), "w2": (f, d)}
    stacked = {n: jax.ShapeDtypeStruct((layers, *s), jnp.float32) for n, s in sizes.items()}
    block = functools.partial(_remat_block, heads=heads)
    if name != "none":
        block = jax.checkpoint(block, policy=getattr(jax.checkpoint_policies, name))

    def loss(params, x):
        y, _ = jax.lax.scan(lambda h, p: (block(p, h), None), x, params)
        return jnp.mean(y * y)

    x = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    with jax.default_device(jax.devices("cpu")[0]):
        compiled = jax.jit(jax.grad(loss), compiler_options=_O0).lower(stacked, x).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes), _flops(compiled)

def _over_budget(name):
    return name in POLICIES and remat_measurement(name)[0] > REMAT_BUDGET_BYTES

def _policy_name(answer, case):  # a name, or one of jax.checkpoint_policies; None: no remat
    choice = "none" if answer["chosen_policy"] is None else answer["chosen_policy"]
    if callable(choice):  # checkpoint_dots is dots_saveable
        choice = next((n for n in (*POLICIES[1:], "checkpoint_dots") if getattr(
            jax.checkpoint_policies, n, None) is choice), repr(choice))
    if not isinstance(choice, str):
        raise Wrong(f"name a policy (a string), not a {type(choice).__name__}", _ONE_OF)
    name = choice.strip().removeprefix("jax.checkpoint_policies.")
    name = "dots_saveable" if name == "checkpoint_dots" else name
    if name not in POLICIES:
        raise Wrong(f"{choice!r:.60} is not one of the policies this exercise compares",
                    f"{_ONE_OF}; 'none' for no remat")
    return name

def _remat_compare(got, want, case):
    if got == want:
        return None
    temp, flops = remat_measurement(POLICIES[POLICIES.index(got)])  # ValueError: not a policy
    if _over_budget(got):
        return (f"{got} needs {temp / 1e6:.1f} MB of temporaries, over the budget of "
                f"{REMAT_BUDGET_BYTES / 1e6:.0f} MB ({_SAVES.get(got, 'it saves too much')})")
    return (f"{got} fits ({temp / 1e6:.1f} MB), but another policy that fits recomputes less: "
            f"{flops / remat_measurement(want)[1] - 1:.0%} more FLOPs")

check_remat_policy = LAB.add(Exercise(
    "Exercise 3 (a remat policy that fits the budget)", minutes=15, kind="predict",
    provides=("chosen_policy",), probe=_policy_name, compare=_readable(_remat_compare, _ONE_OF),
    # measured: of the policies whose step fits the budget, the one with the fewest FLOPs
    expect=lambda case: min((p for p in POLICIES if not _over_budget(p)),
                            key=lambda p: remat_measurement(p)[1], default="none fits"),
    rules=(Mistake("a policy that saves less: which matmul outputs are the big ones?",
                   when=lambda got, want, case: _over_budget(got)),
           Mistake("nothing_saveable recomputes every matmul; keep the weight matmuls' "
                   "outputs (no batch dimension) and recompute the rest",
                   when=lambda got, want, case: got in POLICIES and not _over_budget(got))),
    hint="which policies' steps fit the budget, and which of those recomputes the least?"))

# -- Exercise 4: the KV-cache decode step ------------------------------------------------------

def decode_problem(shape: tuple[int, ...], start: int, seed: int) -> dict[str, Any]:
    """Weights, inputs and the cache a decode from ``start`` begins with (float64): keys and
    values of positions before ``start``, a longer earlier sequence's entries after it."""
    b, t, h, k, d = shape
    rng = np.random.default_rng(seed)
    w = {n: rng.normal(0, d ** -0.5, (d, h, k)) for n in ("wq", "wk", "wv")}
    w["wo"] = rng.normal(0, (h * k) ** -0.5, (h, k, d))
    xs = rng.normal(0, 1, (b, t, d))
    keys, values = (np.einsum("btd,dhk->bthk", xs, w[n]) for n in ("wk", "wv"))
    stale, early = rng.normal(0, 3, (2, b, t, h, k)), np.arange(t)[None, :, None, None] < start
    return {"w": w, "xs": xs, "keys": keys, "values": values,
            "cache": (np.where(early, keys, stale[0]), np.where(early, values, stale[1]))}

def decode_truth(shape: tuple[int, ...], start: int, dtype: str, seed: int) -> dict[str, Any]:
    """What the step must give: causal attention of each position from ``start`` on, in
    float64 from scratch, and the cache holding every position's key and value."""
    p, softmax = decode_problem(shape, start, seed), lambda s, axis: (e := np.exp(
        s - s.max(axis, keepdims=True))) / e.sum(axis, keepdims=True)
    q = np.einsum("btd,dhk->bthk", p["xs"], p["w"]["wq"])
    att = _causal(q, p["keys"], p["values"], np, softmax)[:, start:]
    return {"out": np.einsum("bqhk,hkd->qbd", att, p["w"]["wo"]), "keys": p["keys"],
            "values": p["values"], "dtypes": (dtype,) * 3}

def _decode_flops_bound(case):  # above it, a step recomputes attention for every position:
    b, t, h, k, d = case.args["shape"]  # twice one token's work plus half a t x t square
    return 2 * (2 * b * (4 * d * h * k + 2 * t * h * k)) + b * h * t * t * k

def _probe_decode(answer, case):
    """The learner's step lowered under jit once (pos traced; one step's FLOPs), then run from
    ``start`` to the cache's end, fed back its cache: the outputs, final cache and dtypes."""
    (b, t, h, k, d), start, dtype = (case.args[n] for n in ("shape", "start", "dtype"))
    fn, p = answer["decode_step"], decode_problem((b, t, h, k, d), start, case.args["seed"])
    w = {n: jnp.asarray(a, dtype) for n, a in p["w"].items()}
    cache, outs, dtypes, flops = tuple(jnp.asarray(c, dtype) for c in p["cache"]), [], None, None
    for pos in range(start, t):
        args = (w, jnp.asarray(p["xs"][:, pos], dtype), cache, jnp.int32(pos))
        try:
            with jax.default_matmul_precision("float32"):
                flops = _flops(jax.jit(fn).lower(*args)) if flops is None else flops
                got = fn(*args)
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
                jax.errors.TracerBoolConversionError):
            raise Wrong("your step uses pos as a Python number, but pos changes every step and "
                        "is traced under jit", "write at pos with jax.lax.dynamic_update_slice "
                        "(or .at[:, pos].set) and mask with jnp.arange(length) <= pos") from None
        except Exception as err:  # noqa: BLE001 - a learner's error, reported as data
            raise _failed(err, f"decode_step at pos={pos}", "weights is a dict of wq, wk, wv "
                          "(d, heads, head_dim) and wo (heads, head_dim, d); x is (batch, d); "
                          "cache is a tuple (keys, values) of (batch, length, heads, head_dim); "
                          "pos an int32 traced by jit") from None
        pair = lambda v: isinstance(v, (tuple, list)) and len(v) == 2
        out, cache = (got[0], tuple(got[1])) if pair(got) and pair(got[1]) else (None, ())
        if np.shape(out) != (b, d) or [np.shape(c) for c in cache] != [(b, t, h, k)] * 2:
            raise Wrong(f"decode_step should return (out, (keys, values)) of shapes {(b, d)} "
                        f"and {(b, t, h, k)}, not {str(jax.tree.map(np.shape, got))[:80]}",
                        "one output vector per sequence; the cache keeps its shape")
        dtypes = dtypes or tuple(str(jnp.asarray(a).dtype) for a in (out, *cache))
        outs.append(np.asarray(out, np.float32))
    return {"out": np.stack(outs), "keys": np.asarray(cache[0], np.float32),
            "values": np.asarray(cache[1], np.float32), "dtypes": dtypes, "flops": flops}

def _decode_compare(got, want, case):
    if any(np.shape(got[n]) != np.shape(want[n]) for n in ("out", "keys", "values")):
        raise ValueError("shapes")  # refused as unreadable
    start, tol = case.args["start"], {"float32": 1e-4, "bfloat16": 3e-2}[case.args["dtype"]]
    scale = max(float(np.abs(want["out"]).max()), 1.0)
    for i, (o, w) in enumerate(zip(got["out"], want["out"])):
        if not np.allclose(o, w, atol=tol * scale, rtol=tol):
            return (f"at pos={start + i} the output differs from a full recomputation of causal "
                    f"attention (largest difference {np.abs(o - w).max():.3g})")
    for name in ("keys", "values"):
        bad = ~np.isclose(got[name], want[name], atol=4 * tol, rtol=tol).all(axis=(0, 2, 3))
        if bad.any():
            return (f"after the last step, the {name} of the cache you return differ from every "
                    f"position's at position {int(np.argmax(bad))}")
    if tuple(got["dtypes"]) != tuple(want["dtypes"]):
        return (f"{case.args['dtype']} came in, but out, keys and values come back as "
                f"{', '.join(got['dtypes'])}")
    if float(got["flops"]) > _decode_flops_bound(case):
        return f"one step costs {got['flops']:,.0f} FLOPs: it recomputes attention for every token"
    return None

def _decode_case(shape, start, dtype, seed, label):  # shape: (batch, length, heads, head_dim, d)
    b, t, h, k, d = shape
    return Case(f"{label}: batch {b}, {h} heads of {k}, d_model {d}, {dtype}, from position "
                f"{start} to the end of a cache of {t}",
                {"shape": shape, "start": start, "dtype": dtype, "seed": seed})

check_decode_step = LAB.add(Exercise(
    "Exercise 4 (the KV-cache decode step)", minutes=25, provides=("decode_step",),
    cases=(_decode_case((2, 16, 4, 8, 32), 9, "float32", 0, "the chapter's shape"),
           _decode_case((1, 12, 2, 8, 16), 8, "bfloat16", 1, "a bf16 cache")),
    probe=_probe_decode, compare=_readable(_decode_compare, "return out, (keys, values)"),
    expect=lambda case: decode_truth(**case.args), time_limit_s=120,
    rules=(Mistake("the cache exists so that a step computes only the new token's query, key "
                   "and value and one row of scores: no length x length matrix",
                   when=lambda got, want, case: got["flops"] > _decode_flops_bound(case)),),
    hint="compare your step with the chapter's attention: the new token's query against the "
         "cached keys 0..pos (its own key written at pos first), softmax, times the values"))

# -- Exercise 5: the batch where decoding turns compute-bound ----------------------------------

#: Exercise 5's chip and cache position, for a model the chapter did not train.
DECODE_CHIP, DECODE_POSITION = "v5e", 15

def decode_config() -> lm.LMConfig:
    """Exercise 5's model."""
    return lm.LMConfig(d_model=2048, heads=16, layers=24, d_ff=8192, context=2048)

def _ridge_compare(got, want, case):
    got = number(got, "predicted_batch")
    if abs(got - want) <= 1 or math.isclose(got, want, rel_tol=0.03):
        return None
    return f"your batch {got:,.0f} is {got / want:.2f}x the roofline's"

check_ridge_batch = LAB.add(Exercise(
    "Exercise 5 (the batch where decoding turns compute-bound)", minutes=10, kind="predict",
    provides=("predicted_batch",), compare=_ridge_compare,
    probe=lambda answer, case: number(answer["predicted_batch"], "predicted_batch"),
    expect=lambda case: lm.decode_ridge_batch(decode_config(), DECODE_CHIP, DECODE_POSITION),
    hint="solve b (2N + 4 L d t) = I (2 bytes x params + b x 2 L d t x 2 bytes) for b, with I "
         "the chip's bf16 peak / HBM bandwidth, N the multiplying parameters, t = position + 1"))
