"""Checkers for lab 8: the chapter-8 language model's size and FLOPs (predicted, then
counted and compiled), the shardings of attention for tensor parallelism on 8 simulated
CPU devices, a remat policy that fits a memory budget (predicted, then compiled), the
KV-cache decode step of attention, and the batch size where decoding turns compute-bound.

Every checker measures what it grades on the running stack: the parameter count from the
model itself, FLOPs from XLA's cost analysis, collectives from the compiled HLO
(``hlo.inspect``), memory from ``compiled.memory_analysis()``, decoding against a full
recomputation of causal attention. The sharding and remat checks compile small
programs the checker owns (a tied-embedding attention model; a scanned stack of
pre-norm blocks), so each compile takes seconds on a CPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from tpu_course.checks._answers import ch08 as _ref
from tpu_course.checks._core import (
    CheckResult,
    Lab,
    as_number,
    close_enough,
    ok,
    refuse,
    refuse_course_code,
)

LAB = Lab(8, "Train, shard, fit and serve the chapter-8 language model", cpu_devices=8)

EX1 = "Exercise 1 (predict the parameters and FLOPs per token)"
EX2 = "Exercise 2 (shardings of attention for tensor parallelism)"
EX3 = "Exercise 3 (a remat policy that fits the budget)"
EX4 = "Exercise 4 (the KV-cache decode step)"
EX5 = "Exercise 5 (the batch where decoding turns compute-bound)"


# ---------------------------------------------------------------- exercise 1: size, FLOPs

def exercise1_config() -> Any:
    """The configuration exercise 1 asks about: not one the chapter shows (other width,
    depth and context than ``LMConfig.cpu()``)."""
    from tpu_course import lm

    return lm.LMConfig(d_model=96, heads=3, layers=3, d_ff=384, context=192)


def real_param_count(config: Any) -> int:
    """The parameters of ``lm.LM(config)``, counted leaf by leaf (no arrays allocated)."""
    import jax
    import numpy as np
    from flax import nnx

    from tpu_course import lm

    abstract = nnx.eval_shape(lambda: lm.LM(config, rngs=nnx.Rngs(0)))
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))))


@functools.lru_cache(maxsize=4)
def xla_flops_per_token(config: Any) -> float:
    """XLA's count (cost analysis) of one training step's FLOPs (forward and backward,
    ``value_and_grad`` of the cross-entropy), per token, on one sequence of the config's
    context."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from tpu_course import hlo, lm

    graphdef, params = nnx.split(nnx.eval_shape(lambda: lm.LM(config, rngs=nnx.Rngs(0))))

    def loss(params: Any, tokens: Any) -> Any:
        logits = nnx.merge(graphdef, params)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    tokens = jax.ShapeDtypeStruct((1, config.context + 1), jnp.int32)
    report = hlo.inspect(jax.value_and_grad(loss), params, tokens)
    return float(report.flops) / config.context


def _size_slips(config: Any) -> list[tuple[float, str]]:
    """(parameter count, what it is) for the usual slips."""
    v, d, t, layers = config.vocab, config.d_model, config.context, config.layers
    n = real_param_count(config)
    return [(n - v * d, "you left out one of the two vocab x d_model tables: the token "
                        "embedding and the output head are separate parameters (not tied)"),
            (n - t * d, "you left out the position table (context x d_model)"),
            (n - 2 * d * layers - d, "you left out the norms' scales (two per block and the "
                                     "final one, d_model each)"),
            (n - 2 * v * d, "you left out both vocab x d_model tables (the token embedding "
                            "and the output head)"),
            (n - v * d - t * d, "you left out both embedding tables (tokens and positions)")]


def _flops_slips(config: Any) -> list[tuple[float, str]]:
    """(FLOPs per token, what it is) for the usual slips, from the chapter's formula."""
    from tpu_course import lm

    d, t, layers = config.d_model, config.context, config.layers
    right = lm.flops_per_token(config, t)
    n = lm.param_count(config) - (config.vocab + t) * d  # the tables are lookups
    attention = 12 * layers * d * t
    return [(right - attention, "you left out the attention term: the scores and the weighted "
                                "sum grow with the context, 12 x layers x d_model x context "
                                "per token (PaLM, appendix B)"),
            (right / 2, "you counted a multiply-add as 1 FLOP: XLA (and the 6N rule) counts 2"),
            (2 * n + 4 * layers * d * t, "that is the forward pass alone (2N + attention): "
                                         "training adds the backward pass, twice the forward"),
            (2 * n, "that is the forward pass alone (2N), without attention"),
            (right - 6 * config.vocab * d, "you left out the output head: it multiplies "
                                           "every token, 6 x d_model x vocab"),
            (6 * lm.param_count(config), "that is 6N with every parameter and no attention "
                                         "term")]


@LAB.exercise(EX1, minutes=15, kind="predict")
def check_size_prediction(predicted_params: Any, predicted_flops_per_token: Any
                          ) -> CheckResult:
    """Exercise 1: the parameter count of ``exercise1_config()`` (against the model's own
    leaves) and its training FLOPs per token at its context (against XLA's cost analysis
    of the compiled step; within 10 %, after the usual slips are named)."""
    config = exercise1_config()
    got_n = as_number(EX1, predicted_params, "predicted_params")
    got_f = as_number(EX1, predicted_flops_per_token, "predicted_flops_per_token")
    want_n = real_param_count(config)
    if not close_enough(got_n, want_n, 1e-4):
        hint = next((h for v, h in _size_slips(config) if close_enough(got_n, v, 1e-4)),
                    "add it up per block (4 attention matrices d x d, the MLP's d x d_ff "
                    "twice, two norm scales) times the layers, plus both embedding tables, "
                    "the final norm and the output head")
        refuse(EX1, f"the model has another number of parameters than your {got_n:,.0f} "
                    f"({got_n / want_n:.3f}x)", hint=hint, answer=f"{want_n:,} parameters")
    xla = xla_flops_per_token(config)
    from tpu_course import lm

    right = lm.flops_per_token(config, config.context)
    for value, hint in _flops_slips(config):
        if close_enough(got_f, value, 0.01) and not close_enough(got_f, right, 0.01):
            refuse(EX1, f"your {got_f:,.0f} FLOPs per token is {got_f / xla:.2f}x what XLA "
                        "counts in the compiled step", hint=hint,
                   answer=f"{xla:,.0f} FLOPs per token (XLA's count)")
    if not close_enough(got_f, xla, 0.10):
        refuse(EX1, f"your {got_f:,.0f} FLOPs per token is {got_f / xla:.2f}x what XLA counts "
                    "in the compiled step (tolerance 10 %)",
               hint="6 FLOPs per multiplying parameter per token (forward 2, backward 4), "
                    "plus attention's 12 x layers x d_model x context",
               answer=f"{xla:,.0f} FLOPs per token (XLA's count)")
    return ok(EX1, f"{want_n:,} parameters, exactly; {got_f:,.0f} FLOPs per token against "
                   f"XLA's {xla:,.0f} ({got_f / xla - 1:+.1%}: XLA also counts the norms, the "
                   "softmax and the GELU)")


# ------------------------------------------------------- exercise 2: attention's shardings

#: The attention model exercise 2 shards: ``(vocab, d_model, heads, head_dim)``.
ATTENTION_SHAPE = (256, 64, 4, 16)
#: Each attention weight's heads axis (the one "model" splits).
HEADS_AXIS = {"wq": 1, "wk": 1, "wv": 1, "wo": 0}
FEATURE_AXIS = {"wq": 0, "wk": 0, "wv": 0, "wo": 2, "embed": 1}


def attention_params(shape: tuple[int, int, int, int] = ATTENTION_SHAPE, seed: int = 0
                     ) -> dict[str, Any]:
    """The parameters of the one-block attention model with a tied embedding, shaped as
    ``lm.Attention``'s: wq, wk, wv (d, heads, head_dim), wo (heads, head_dim, d)."""
    import numpy as np

    v, d, h, k = shape
    rng = np.random.default_rng(seed)
    p = {"embed": rng.normal(0, 0.02, (v, d))}
    for name in ("wq", "wk", "wv"):
        p[name] = rng.normal(0, d ** -0.5, (d, h, k))
    p["wo"] = rng.normal(0, (h * k) ** -0.5, (h, k, d))
    return {n: x.astype(np.float32) for n, x in p.items()}


def _attention_loss(p: dict[str, Any], tokens: Any) -> Any:
    import jax
    import jax.numpy as jnp
    import optax

    x = p["embed"][tokens[:, :-1]]
    q = jnp.einsum("btd,dhk->bthk", x, p["wq"])
    k = jnp.einsum("btd,dhk->bthk", x, p["wk"])
    v = jnp.einsum("btd,dhk->bthk", x, p["wv"])
    scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1])
    t = x.shape[1]
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e30)
    out = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, -1), v)
    y = x + jnp.einsum("bqhk,hkd->bqd", out, p["wo"])
    logits = y @ p["embed"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def attention_problem(shape: tuple[int, int, int, int] = ATTENTION_SHAPE
                      ) -> tuple[Callable, Any, Any, Any]:
    """``(step, state, tokens, tx)``: AdamW on the attention model, ``state = (params,
    opt_state)``, a batch of 16 sequences of 32 bytes."""
    import jax
    import numpy as np
    import optax

    tx = optax.adamw(1e-2)
    params = attention_params(shape)
    state = (params, tx.init(params))
    tokens = np.random.default_rng(1).integers(0, shape[0], (16, 33)).astype(np.int32)

    def step(state: Any, tokens: Any, use: Any = None) -> Any:
        params, opt = state

        def loss(p: Any) -> Any:
            if use is not None:  # FSDP: gather each weight over "data" where it is used
                p = jax.lax.with_sharding_constraint(p, use)
            return _attention_loss(p, tokens)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), value

    return step, state, tokens, tx


@functools.lru_cache(maxsize=4)
def _single_device_losses(shape: tuple[int, int, int, int]) -> tuple[float, ...]:
    import jax

    step, state, tokens, _ = attention_problem(shape)
    run, losses = jax.jit(step), []
    for _ in range(2):
        state, loss = run(state, tokens)
        losses.append(float(loss))
    return tuple(losses)


def _spec_axes(sharding: Any, ndim: int) -> list[tuple[str, ...]]:
    """The mesh axes each dimension of an array is split over, from a NamedSharding."""
    spec = tuple(sharding.spec) + (None,) * ndim
    out = []
    for entry in spec[:ndim]:
        if entry is None:
            out.append(())
        elif isinstance(entry, str):
            out.append((entry,))
        else:
            out.append(tuple(entry))
    return out


def _without_data(mesh: Any, sharding: Any, ndim: int) -> Any:
    """The sharding with "data" removed: where FSDP uses the weight (gathered)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    axes = [tuple(a for a in entry if a != "data") for entry in _spec_axes(sharding, ndim)]
    return NamedSharding(mesh, P(*[(a[0] if len(a) == 1 else a) if a else None for a in axes]))


def _leaf_key(path: Any) -> tuple[str, str | None]:
    """``(weight name, "mu"/"nu"/None)`` of a leaf of ``(params, opt_state)``."""
    names = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
    weight = next((n for n in reversed(names) if n in FEATURE_AXIS), "")
    moment = next((m for m in ("mu", "nu") if m in names), None)
    return weight, moment


def _mesh(title: str, shape: tuple[int, int]) -> Any:
    import jax
    from jax.sharding import AxisType

    have = len(jax.devices("cpu"))
    if have < shape[0] * shape[1]:
        refuse(title, f"this check needs {shape[0] * shape[1]} CPU devices and JAX sees {have}",
               hint="run runtime.simulate_devices(8) in the first cell, before JAX starts "
                    "(restart the kernel first)")
    devices = jax.devices("cpu")[: shape[0] * shape[1]]
    return jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2,
                         devices=devices)


def _shardings_of(attention_shardings: Callable, state: Any, mesh: Any) -> Any:
    import jax

    got = attention_shardings(state, mesh)
    leaves, shardings = jax.tree.leaves(state), jax.tree.leaves(
        got, is_leaf=lambda s: hasattr(s, "spec"))
    if jax.tree.structure(state) != jax.tree.structure(
            got, is_leaf=lambda s: hasattr(s, "spec")) or len(leaves) != len(shardings):
        what = ("only the parameters' shardings: the state is (params, opt_state)"
                if isinstance(got, dict) and set(got) == set(state[0]) else
                "something without the state's structure")
        refuse(EX2, f"attention_shardings returned {what}",
               hint="return one NamedSharding per leaf of the whole state (params, "
                    "opt_state): jax.tree.map or jax.tree_util.tree_map_with_path over it, "
                    "or optax.tree_map_params for the optimizer's part")
    devices = {d.id for d in mesh.devices.flat}
    for s in shardings:
        if not hasattr(s, "spec") or not hasattr(s, "device_set"):
            refuse(EX2, f"a leaf's sharding is a {type(s).__name__}, not a NamedSharding",
                   hint="NamedSharding(mesh, PartitionSpec(...)) for every leaf")
        if {d.id for d in s.device_set} != devices:
            refuse(EX2, "a sharding is on other devices than the mesh passed in",
                   hint="build every NamedSharding on the mesh argument")
    return got


def _check_layouts(state: Any, got: Any, mesh: Any) -> dict[str, Any]:
    """The per-leaf rules; returns the parameters' shardings by name."""
    import jax

    params: dict[str, Any] = {}
    moments: list[tuple[str, str, Any]] = []
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    for (path, leaf), s in zip(flat, jax.tree.leaves(got, is_leaf=lambda x: hasattr(x, "spec"))):
        weight, moment = _leaf_key(path)
        if not weight or getattr(leaf, "ndim", 0) == 0:
            continue
        if getattr(path[0], "idx", None) == 0:
            params[weight] = s
        elif moment:
            moments.append((weight, moment, s))
    for weight, moment, s in moments:
        ndim = state[0][weight].ndim
        if _spec_axes(s, ndim) != _spec_axes(params[weight], ndim):
            whole = s.is_fully_replicated
            refuse(EX2, f"Adam's {'first' if moment == 'mu' else 'second'} moment of {weight} "
                        + ("is replicated" if whole else "is laid out unlike its parameter")
                        + ": the parameters alone are sharded, so each device still holds "
                          "the whole optimizer state, twice the parameters' bytes",
                   hint="shard the optimizer state like the parameters: mu and nu have the "
                        "parameters' shapes (optax.tree_map_params, or a tree map over the "
                        "whole state by leaf name), not jax.jit(tx.init)'s replicated output")
    embed = _spec_axes(params["embed"], 2)
    if embed[FEATURE_AXIS["embed"]]:
        refuse(EX2, f"the embedding's feature axis (d_model) is split over "
                    f"{embed[1]}: every lookup then needs whole rows from other devices, and "
                    "XLA reports an 'involuntary full rematerialization' of the table",
               hint="shard the embedding's rows (the vocabulary), not its features: "
                    "P('data', None)")
    return params


def _attention_verdict(attention_shardings: Callable, shape: tuple[int, int, int, int],
                       mesh_shape: tuple[int, int]) -> Any:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from tpu_course import hlo

    refuse_course_code(EX2, attention_shardings, _ref.attention_shardings)
    mesh = _mesh(EX2, mesh_shape)
    step, state, tokens, _ = attention_problem(shape)
    got = _shardings_of(attention_shardings, state, mesh)
    params = _check_layouts(state, got, mesh)
    use = {n: _without_data(mesh, s, state[0][n].ndim) for n, s in params.items()}
    batch = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    jitted = jax.jit(functools.partial(step, use=use), in_shardings=(got, batch),
                     out_shardings=(got, replicated))
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s),
                            state, got)
    report = hlo.inspect(jitted, abstract,
                         jax.ShapeDtypeStruct(tokens.shape, tokens.dtype, sharding=batch))
    kinds = report.by_kind()
    if "all-to-all" in kinds:
        odd = [n for n in ("wq", "wk", "wv", "wo")
               if _spec_axes(params[n], 3)[3 - 1 if n != "wo" else 1]]
        which = (f"{', '.join(odd)} split{'s' if len(odd) == 1 else ''} the head_dim axis"
                 if odd else "the weights disagree on which axis 'model' splits")
        refuse(EX2, f"the compiled step has {kinds['all-to-all'][0]} all-to-all(s): {which}, "
                    "so XLA transposes activations between the projections and attention",
               hint="split the same axis, the heads, of wq, wk, wv and wo over 'model': each "
                    "device then computes whole heads, with no exchange inside attention")
    for n in ("wq", "wk", "wv", "wo"):
        if "model" not in _spec_axes(params[n], 3)[HEADS_AXIS[n]]:
            refuse(EX2, f"the heads of {n} are not split over 'model' (its sharding is "
                        f"{params[n].spec}): every model-parallel device computes every head",
                   hint="tensor parallelism of attention puts the heads axis on 'model': "
                        "axis 1 of wq, wk, wv (d, heads, head_dim), axis 0 of wo "
                        "(heads, head_dim, d)")
    for n in ("embed", "wq", "wk", "wv", "wo"):
        if not any("data" in a for a in _spec_axes(params[n], state[0][n].ndim)):
            refuse(EX2, f"{n} is whole on every 'data' shard: that is not FSDP",
                   hint="FSDP splits each weight over 'data' too: the d_model axis of the "
                        "attention weights, the rows of the embedding")
    step_losses = []
    sharded = jax.device_put(state, got)
    for _ in range(2):
        sharded, loss = jitted(sharded, jax.device_put(tokens, batch))
        step_losses.append(float(loss))
    want = _single_device_losses(shape)
    if not np.allclose(step_losses, want, rtol=2e-5):
        refuse(EX2, f"the sharded step's losses {step_losses} differ from one device's {want}",
               hint="shardings change where numbers live, not what is computed: return "
                    "shardings only, one per leaf")
    return report


def _attention_cases(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    heads = int(rng.choice([8, 16]))
    return [(f"a (2, 4) mesh and {heads} heads of 8",
             {"shape": (128, 64, heads, 8), "mesh_shape": (2, 4)})]


@LAB.exercise(EX2, minutes=25, hidden=_attention_cases)
def check_attention_shardings(attention_shardings: Callable,
                              shape: tuple[int, int, int, int] = ATTENTION_SHAPE,
                              mesh_shape: tuple[int, int] = (4, 2)) -> CheckResult:
    """Exercise 2: ``attention_shardings(state, mesh)`` gives every leaf of ``(params,
    opt_state)`` a NamedSharding: heads on "model", FSDP on "data", embedding rows not
    features, Adam's moments like their parameters. Graded by the compiled collectives (no
    all-to-all) and two training steps equal to one device's."""
    report = _attention_verdict(attention_shardings, tuple(shape), tuple(mesh_shape))
    kinds = ", ".join(f"{k} x{n}" for k, (n, _) in sorted(report.by_kind().items()))
    return ok(EX2, f"heads on 'model', FSDP on 'data', moments like their parameters; "
                   f"collectives: {kinds}; {report.argument_bytes:,} argument bytes per "
                   "device; losses equal to one device's")


# ----------------------------------------------------------- exercise 3: a remat policy

#: The memory budget of exercise 3: temporary bytes of the compiled training step.
REMAT_BUDGET_BYTES = 10_000_000
#: The policies exercise 3 chooses from (names in ``jax.checkpoint_policies``), and None.
POLICIES = ("none", "everything_saveable", "dots_saveable",
            "dots_with_no_batch_dims_saveable", "nothing_saveable")
#: The stack exercise 3 compiles: (layers, batch, length, d_model, d_ff, heads).
REMAT_SHAPE = (4, 8, 64, 64, 256, 4)


def _remat_block(p: dict[str, Any], x: Any, heads: int) -> Any:
    import jax
    import jax.numpy as jnp

    b, t, d = x.shape

    def norm(y: Any) -> Any:
        return y * jax.lax.rsqrt(jnp.mean(y * y, -1, keepdims=True) + 1e-6)

    h = norm(x)
    q, k, v = ((h @ p[n]).reshape(b, t, heads, -1) for n in ("wq", "wk", "wv"))
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(d // heads)
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e30)
    x = x + jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, -1), v).reshape(b, t, d) @ p["wo"]
    return x + jax.nn.gelu(norm(x) @ p["w1"]) @ p["w2"]


def _policy(title: str, choice: Any) -> tuple[str, Any]:
    """``(name, policy)`` of a learner's choice: a name of ``POLICIES`` or one of
    ``jax.checkpoint_policies``' functions."""
    import jax

    cp = jax.checkpoint_policies
    if choice is None:
        return "none", None
    if callable(choice):
        for name in POLICIES[1:]:
            if getattr(cp, name) is choice:
                return name, choice
        if choice is getattr(cp, "checkpoint_dots", None):
            return "dots_saveable", choice
        refuse(title, f"{getattr(choice, '__name__', choice)!r} is not one of the policies "
                      "this exercise compares", hint=f"one of {', '.join(POLICIES)}")
    if not isinstance(choice, str):
        refuse(title, f"name a policy (a string), not a {type(choice).__name__}",
               hint=f"one of {', '.join(repr(p) for p in POLICIES)}")
    name = choice.strip().removeprefix("jax.checkpoint_policies.")
    if name == "checkpoint_dots":
        name = "dots_saveable"
    if name not in POLICIES:
        refuse(title, f"{choice!r} is not one of the policies this exercise compares",
               hint=f"one of {', '.join(repr(p) for p in POLICIES)} (names in "
                    "jax.checkpoint_policies; 'none' for no remat)")
    return name, None if name == "none" else getattr(cp, name)


@functools.lru_cache(maxsize=8)
def remat_measurement(name: str, shape: tuple[int, ...] = REMAT_SHAPE) -> tuple[int, float]:
    """``(temporary bytes, FLOPs)`` of the stack's training step under policy ``name``, from
    ``compiled.memory_analysis()`` and the cost analysis (the layers are a ``lax.scan``,
    so the memory plan keeps what the policy saves for the backward pass)."""
    import jax
    import jax.numpy as jnp

    from tpu_course import hlo

    layers, b, t, d, f, heads = shape
    policy = _policy(EX3, name)[1]
    sizes = {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, f), "w2": (f, d)}
    stacked = {n: jax.ShapeDtypeStruct((layers, *s), jnp.float32) for n, s in sizes.items()}
    x = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    block = functools.partial(_remat_block, heads=heads)
    body = block if name == "none" else jax.checkpoint(block, policy=policy)

    def loss(params: Any, x: Any) -> Any:
        y, _ = jax.lax.scan(lambda h, p: (body(p, h), None), x, params)
        return jnp.mean(y * y)

    report = hlo.inspect(jax.grad(loss), stacked, x)
    return int(report.temp_bytes or 0), float(report.flops or 0.0)


@LAB.exercise(EX3, minutes=15, kind="predict")
def check_remat_policy(chosen_policy: Any, budget: int = REMAT_BUDGET_BYTES) -> CheckResult:
    """Exercise 3: the policy must fit ``budget`` temporary bytes and, of those that fit,
    recompute the least (the fewest FLOPs): graded on the compiled step of each."""
    name, _ = _policy(EX3, chosen_policy)
    measured = {p: remat_measurement(p) for p in POLICIES}
    fits = {p: m for p, m in measured.items() if m[0] <= budget}
    temp, flops = measured[name]
    table = f"{temp / 1e6:.1f} MB of temporaries"
    if name not in fits:
        why = {"none": "without remat the backward pass keeps every activation",
               "everything_saveable": "everything_saveable saves every intermediate: the same "
                                      "as no remat",
               "dots_saveable": "dots_saveable also saves attention's batched matmuls (the "
                                "scores, batch x heads x length x length)"}.get(name, "")
        refuse(EX3, f"{name} needs {table}, over the budget of {budget / 1e6:.1f} MB"
                    + (f": {why}" if why else ""),
               hint="a policy that saves less: which matmul outputs are the big ones?",
               answer=min(fits, key=lambda p: fits[p][1]) if fits else "none fits")
    best = min(fits, key=lambda p: fits[p][1])
    if flops > fits[best][1] * 1.005:
        refuse(EX3, f"{name} fits ({table}), but recomputes more than it must: "
                    f"{flops / fits[best][1] - 1:.0%} more FLOPs than a policy that also fits",
               hint="nothing_saveable recomputes every matmul; keep the weight matmuls' "
                    "outputs (no batch dimension) and recompute the rest",
               answer=best)
    return ok(EX3, f"{name}: {table} (budget {budget / 1e6:.1f} MB) and the fewest FLOPs of the "
                   f"policies that fit ({flops / measured['none'][1] - 1:+.0%} against no remat)")


# ------------------------------------------------------- exercise 4: the KV-cache decode

#: The decode step exercise 4 checks: (batch, cache length, heads, head_dim, d_model).
DECODE_SHAPE = (2, 16, 4, 8, 32)
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


def _decode_problem(shape: tuple[int, ...], dtype: str, seed: int) -> dict[str, Any]:
    import numpy as np

    b, t, h, k, d = shape
    rng = np.random.default_rng(seed)
    w = {n: rng.normal(0, d ** -0.5, (d, h, k)) for n in ("wq", "wk", "wv")}
    w["wo"] = rng.normal(0, (h * k) ** -0.5, (h, k, d))
    xs = rng.normal(0, 1, (b, t, d))
    stale = rng.normal(0, 3, (2, b, t, h, k))  # a longer, earlier sequence's entries
    return {"w": w, "xs": xs, "stale": stale}


def _full_attention(w: dict, xs: Any, mask: str = "causal", scale: bool = True) -> Any:
    """Causal attention of every position of ``xs`` (float64 numpy): the recomputation
    the cache must equal. ``mask``/``scale`` give the usual mistakes' outputs."""
    import numpy as np

    q, k, v = (np.einsum("btd,dhk->bthk", xs, w[n]) for n in ("wq", "wk", "wv"))
    s = np.einsum("bqhk,bshk->bhqs", q, k) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    t = xs.shape[1]
    allowed = {"causal": np.tril(np.ones((t, t), bool)), "strict": np.tril(np.ones((t, t), bool), -1)}
    s = np.where(allowed[mask], s, -np.inf) if mask in allowed else s
    with np.errstate(invalid="ignore"):  # the "strict" mistake leaves row 0 empty: NaN
        s = s - s.max(-1, keepdims=True)
        p = np.exp(s)
        p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhqs,bshk,hkd->bqd", p, v, w["wo"])


def _decode_cases(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    heads = int(rng.choice([2, 8]))
    length = int(rng.choice([12, 24]))
    return [(f"{heads} heads, a cache of {length}, decoding from position 0",
             {"shape": (3, length, heads, 4, 16), "start": 0}),
            (f"bfloat16 and the last position of a cache of {length}",
             {"shape": (1, length, 2, 8, 16), "start": length - 3, "dtype": "bfloat16"})]


@LAB.exercise(EX4, minutes=25, hidden=_decode_cases)
def check_decode_step(decode_step: Callable, shape: tuple[int, ...] = DECODE_SHAPE,
                      start: int = 9, dtype: str = "float32", seed: int = 0) -> CheckResult:
    """Exercise 4: ``decode_step(weights, x, cache, pos) -> (out, cache)`` for one new
    token per sequence (``x`` (batch, d_model); ``cache = (keys, values)``, each (batch,
    length, heads, head_dim); ``pos`` a traced int32), jitted and run from ``start`` to
    the end of the cache, feeding back the cache it returns: every output equals a full
    recomputation of causal attention (float32 1e-4, bf16 3e-2), every new key and value
    lands at its position, and one step does one token's work."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tpu_course import hlo, lm

    refuse_course_code(EX4, decode_step, _ref.decode_step, lm.Attention, lm.LM, lm.generate,
                       lm.init_cache)
    b, t, h, k, d = shape
    prob = _decode_problem(tuple(shape), dtype, seed)
    w64, xs = prob["w"], prob["xs"]
    want = _full_attention(w64, xs)
    keys = np.einsum("btd,dhk->bthk", xs, w64["wk"])
    values = np.einsum("btd,dhk->bthk", xs, w64["wv"])
    stale_k, stale_v = prob["stale"]
    cache_k = np.where(np.arange(t)[None, :, None, None] < start, keys, stale_k)
    cache_v = np.where(np.arange(t)[None, :, None, None] < start, values, stale_v)
    dt = jnp.dtype(dtype)
    w = {n: jnp.asarray(a, dt) for n, a in w64.items()}
    cache = (jnp.asarray(cache_k, dt), jnp.asarray(cache_v, dt))
    step = jax.jit(decode_step)
    tol = TOLERANCE[dtype]
    scale = float(np.abs(want).max())
    for pos in range(start, t):
        x = jnp.asarray(xs[:, pos], dt)
        try:
            got = step(w, x, cache, jnp.int32(pos))
        except jax.errors.ConcretizationTypeError:
            refuse(EX4, "your step uses pos as a Python number, but pos changes every step "
                        "and is traced under jit",
                   hint="write at pos with jax.lax.dynamic_update_slice (or .at[:, pos].set) "
                        "and mask with jnp.arange(length) <= pos")
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            refuse(EX4, "decode_step should return (out, cache)", hint="return out, (keys, values)")
        out, new_cache = got
        if not isinstance(new_cache, (tuple, list)) or len(new_cache) != 2:
            refuse(EX4, "the cache you return should be (keys, values)",
                   hint="return out, (keys, values)")
        out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
        nk, nv = (np.asarray(jnp.asarray(c, jnp.float32), np.float64) for c in new_cache)
        if out.shape != (b, d) or nk.shape != (b, t, h, k):
            refuse(EX4, f"out has shape {out.shape} and keys {nk.shape}; expected {(b, d)} and "
                        f"{(b, t, h, k)}", hint="one output vector per sequence; the cache "
                                                "keeps its shape")
        kpos = keys[:, pos]
        at = [j for j in range(t) if np.allclose(nk[:, j], kpos, atol=tol * 4, rtol=tol)]
        if pos not in at:
            where = (f"at position {at[0]} instead of {pos}" if at else "nowhere")
            refuse(EX4, f"at step pos={pos} the new token's key landed {where} in the cache "
                        "you return",
                   hint="write k and v at index pos of the length axis (axis 1), and return "
                        "the updated cache: the next step reads it")
        if not np.allclose(nv[:, pos], values[:, pos], atol=tol * 4, rtol=tol):
            refuse(EX4, f"at step pos={pos} the new token's value is not at position {pos}",
                   hint="write v at pos like k")
        if not np.allclose(out, want[:, pos], atol=tol * max(scale, 1.0), rtol=tol):
            slips = {("nomask", True): "you attended to every position of the cache, including "
                                       "the ones after pos (stale entries): mask positions > pos",
                     ("strict", True): "the new token must attend to itself too: the mask keeps "
                                       "positions <= pos, not < pos",
                     ("causal", False): "scale the scores by 1 / sqrt(head_dim)"}
            hint = ("compare your step with the chapter's attention: the query of the new token "
                    "against the cached keys 0..pos, softmax, times the cached values")
            for (mask, scaled), text in slips.items():
                if mask == "nomask":
                    bad = _nomask_output(w64, xs, np.where(np.arange(t)[None, :, None, None] <= pos,
                                                           keys, stale_k),
                                         np.where(np.arange(t)[None, :, None, None] <= pos,
                                                  values, stale_v), pos)
                else:
                    bad = _full_attention(w64, xs, mask, scaled)[:, pos]
                if np.allclose(out, bad, atol=tol * max(scale, 1.0), rtol=tol):
                    hint = text
                    break
            refuse(EX4, f"at pos={pos} the output differs from a full recomputation of causal "
                        f"attention (largest difference {np.abs(out - want[:, pos]).max():.3g})",
                   hint=hint)
        cache = new_cache
    flops = hlo.inspect(decode_step, w, jnp.asarray(xs[:, 0], dt), cache, jnp.int32(0)).flops
    one_token = 2 * b * (4 * d * h * k + 2 * t * h * k)  # projections, scores, weighted sum
    if flops and flops > 2 * one_token + b * h * t * t * k:  # half a length x length square
        refuse(EX4, f"one step costs {flops:,.0f} FLOPs, {flops / one_token:.0f}x one token's "
                    "work: it recomputes attention for every cached position",
               hint="the cache exists so that a step computes only the new token's query, key "
                    "and value and one row of scores: no length x length matrix")
    return ok(EX4, f"{t - start} steps from position {start}: every output equals full "
                   f"recomputation ({dtype}, within {tol:g}), each key and value written at its "
                   f"position, {flops:,.0f} FLOPs a step")


def _nomask_output(w: dict, xs: Any, keys: Any, values: Any, pos: int) -> Any:
    import numpy as np

    q = np.einsum("bd,dhk->bhk", xs[:, pos], w["wq"])
    s = np.einsum("bhk,bthk->bht", q, keys) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bht,bthk,hkd->bd", p, values, w["wo"])


# ---------------------------------------------- exercise 5: when decoding is compute-bound

#: Exercise 5's case: a model the chapter did not train, on a chip, at a cache position.
DECODE_CASE = {"d_model": 2048, "heads": 16, "layers": 24, "d_ff": 8192, "context": 2048}
DECODE_CHIP, DECODE_POSITION = "v5e", 15


def decode_config() -> Any:
    from tpu_course import lm

    return lm.LMConfig(**DECODE_CASE)


def _ridge_slips(config: Any, chip: str, position: int) -> list[tuple[float, str]]:
    from tpu_course import hardware, lm

    ridge = hardware.get(chip).critical_intensity()
    no_cache = ("you left out the KV cache: every sequence also reads its own cached keys and "
                "values (2 x layers x d_model numbers per position), bytes that grow with the "
                "batch; without them (and without attention's FLOPs) the batch would be the "
                "ridge point itself")
    return [(lm.decode_ridge_batch(config, chip, position, cache_bytes_per_value=0), no_cache),
            (ridge, no_cache),
            (lm.decode_ridge_batch(config, chip, position, weight_bytes_per_param=4),
             "you counted the weights as fp32 (4 bytes): serving reads bf16 weights, 2 bytes"),
            (lm.decode_ridge_batch(config, chip, position, weight_bytes_per_param=4,
                                   cache_bytes_per_value=4),
             "you counted weights and cache as fp32 (4 bytes): bf16 is 2"),
            (ridge / 2, "half the ridge point: a multiply-add is 2 FLOPs per weight, not 1")]


@LAB.exercise(EX5, minutes=10, kind="predict")
def check_ridge_batch(predicted_batch: Any) -> CheckResult:
    """Exercise 5: the batch at which a decode step of ``decode_config()`` at position
    ``DECODE_POSITION`` turns compute-bound on ``DECODE_CHIP``, against the course's
    roofline (``lm.decode_ridge_batch``), within 3 %."""
    from tpu_course import lm

    got = as_number(EX5, predicted_batch, "predicted_batch")
    config = decode_config()
    want = lm.decode_ridge_batch(config, DECODE_CHIP, DECODE_POSITION)
    if close_enough(got, want, 0.03) or abs(got - want) <= 1:
        cost = lm.decode_cost(config, max(1, round(want)), DECODE_POSITION)
        return ok(EX5, f"{got:,.0f} against the roofline's {want:,.1f}: there the step reads "
                       f"{cost.bytes / 1e9:.2f} GB (weights {cost.weight_bytes / 1e9:.2f} GB, KV "
                       f"cache {cost.cache_bytes / 1e9:.2f} GB) for {cost.flops / 1e12:.2f} TFLOPs")
    for value, hint in _ridge_slips(config, DECODE_CHIP, DECODE_POSITION):
        if math.isfinite(value) and close_enough(got, value, 0.03):
            refuse(EX5, f"your batch {got:,.0f} is {got / want:.2f}x the roofline's",
                   hint=hint, answer=f"{want:,.1f}")
    refuse(EX5, f"your batch {got:,.0f} is {got / want:.2f}x the roofline's",
           hint="solve b (2N + 4 L d t) = I (2 bytes x params + b x 2 L d t x 2 bytes) for b, "
                "with I the chip's bf16 peak / HBM bandwidth and t = position + 1",
           answer=f"{want:,.1f}")

