"""Lab 8 (the chapter-8 language model): each exercise declared once. The expected outputs
come from the course's instruments (the model's leaves and the chapter's FLOPs count, one
device's training steps, each remat policy compiled, a float64 recomputation of attention,
the decode roofline); references, hidden cases and known mistakes live in the repository's
``grading/ch08.py``. Exercise 2 runs on the notebook's 8 simulated CPU devices."""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable, Mapping

import numpy as np

from tpu_course.checks.engine import Case, Exercise, Lab, Mistake, Wrong, number

#: Compile options of the checks' programs: LLVM's -O0 (the same HLO plan, compiled faster).
_O0 = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
LAB = Lab(8, "Train, shard, fit and serve the chapter-8 language model", cpu_devices=8)


def _failed(err: BaseException, what: str, hint: str) -> Wrong:
    """A learner's exception as a one-line failure (never a traceback)."""
    text = " ".join(str(err).split())[:240] or "no message"
    return Wrong(f"{what} raised {type(err).__name__}: {text}", hint)


# -- Exercise 1: predict the parameters and FLOPs per token -----------------------------------


def exercise1_config() -> Any:
    """The configuration exercise 1 asks about: not one the chapter shows."""
    from tpu_course import lm

    return lm.LMConfig(d_model=96, heads=3, layers=3, d_ff=384, context=192)


@functools.lru_cache(maxsize=4)
def real_param_count(config: Any) -> int:
    """The parameters of ``lm.LM(config)``, counted leaf by leaf (no arrays allocated)."""
    import jax
    from flax import nnx

    from tpu_course import lm

    abstract = nnx.eval_shape(lambda: lm.LM(config, rngs=nnx.Rngs(0)))
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))))


@functools.lru_cache(maxsize=4)
def xla_flops_per_token(config: Any) -> float:
    """XLA's count (cost analysis) of one training step's FLOPs (forward and backward of
    the cross-entropy), per token, on one sequence of the config's context."""
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
    return float(hlo.inspect(jax.value_and_grad(loss), params, tokens).flops) / config.context


def chapter_count(config: Any) -> tuple[int, float]:
    """``(parameters, FLOPs per token)``: the model's leaves counted, and the chapter's count
    of a training step (``lm.flops_per_token``: 6 per multiplying parameter, attention's
    12 L d T; XLA's count is a few per cent higher, with norms, softmax and GELU)."""
    from tpu_course import lm

    return real_param_count(config), lm.flops_per_token(config)


def _size_compare(got: Any, want: Any, case: Case) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Wrong(f"expected two numbers, not {str(got)[:60]}", "give both predictions")
    n, f = (number(v, what) for v, what in zip(got, ("predicted_params", "the FLOPs")))
    want_n, want_f = want
    if not math.isclose(n, want_n, rel_tol=1e-4):
        return f"the model has {'fewer' if want_n < n else 'more'} parameters than your {n:,.0f}"
    if not math.isclose(f, want_f, rel_tol=0.02):
        return (f"your {f:,.0f} FLOPs per token is {f / want_f:.2f}x the chapter's count for "
                "this model (tolerance 2 %)")
    return None


check_size_prediction = LAB.add(Exercise(
    "Exercise 1 (predict the parameters and FLOPs per token)", minutes=15, kind="predict",
    provides=("predicted_params", "predicted_flops_per_token"),
    probe=lambda answer, case: (number(answer["predicted_params"], "predicted_params"),
                                number(answer["predicted_flops_per_token"],
                                       "predicted_flops_per_token")),
    expect=lambda case: chapter_count(exercise1_config()),
    compare=_size_compare,
    hint="parameters: per block 4 attention matrices d x d, the MLP's d x d_ff twice, two norm "
         "scales; times the layers, plus both embedding tables, the final norm and the output "
         "head. FLOPs: 6 per multiplying parameter per token (the tables are lookups) plus "
         "attention's 12 x layers x d_model x context"))


# -- Exercise 2: shardings of attention for tensor parallelism --------------------------------

#: The attention model exercise 2 shards: ``(vocab, d_model, heads, head_dim)``.
ATTENTION_SHAPE = (256, 64, 4, 16)
#: Each attention weight's heads axis (the one "model" splits) and head_dim axis.
HEADS_AXIS = {"wq": 1, "wk": 1, "wv": 1, "wo": 0}
HEAD_DIM_AXIS = {"wq": 2, "wk": 2, "wv": 2, "wo": 1}
WEIGHTS = ("embed", "wq", "wk", "wv", "wo")


def attention_params(shape: tuple[int, int, int, int] = ATTENTION_SHAPE) -> dict[str, Any]:
    """The one-block attention model with a tied embedding (vocab, d), shaped as
    ``lm.Attention``'s: wq, wk, wv (d, heads, head_dim), wo (heads, head_dim, d)."""
    v, d, h, k = shape
    rng = np.random.default_rng(0)
    p = {"embed": rng.normal(0, 0.02, (v, d)), "wq": rng.normal(0, d ** -0.5, (d, h, k)),
         "wk": rng.normal(0, d ** -0.5, (d, h, k)), "wv": rng.normal(0, d ** -0.5, (d, h, k)),
         "wo": rng.normal(0, (h * k) ** -0.5, (h, k, d))}
    return {n: x.astype(np.float32) for n, x in p.items()}


def _attention_loss(p: dict[str, Any], tokens: Any) -> Any:
    import jax
    import jax.numpy as jnp
    import optax

    x = p["embed"][tokens[:, :-1]]
    q, k, v = (jnp.einsum("btd,dhk->bthk", x, p[n]) for n in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1])
    t = x.shape[1]
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e30)
    out = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, -1), v)
    logits = (x + jnp.einsum("bqhk,hkd->bqd", out, p["wo"])) @ p["embed"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def attention_problem(shape: tuple[int, int, int, int] = ATTENTION_SHAPE
                      ) -> tuple[Callable, Any, Any, Any]:
    """``(step, state, tokens, tx)``: AdamW on the attention model, ``state = (params,
    opt_state)``, a batch of 16 sequences of 32 tokens."""
    import jax
    import optax

    tx = optax.adamw(1e-2)
    params = attention_params(shape)
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

    return step, (params, tx.init(params)), tokens, tx


@functools.lru_cache(maxsize=4)
def single_device_losses(shape: tuple[int, int, int, int] = ATTENTION_SHAPE) -> tuple:
    """The losses of two training steps on one CPU device: what sharding must not change."""
    import jax

    step, state, tokens, _ = attention_problem(tuple(shape))
    run, losses = jax.jit(step, compiler_options=_O0), []
    with jax.default_device(jax.devices("cpu")[0]):
        for _ in range(2):
            state, loss = run(state, tokens)
            losses.append(float(loss))
    return tuple(losses)


def _axes(sharding: Any, ndim: int) -> tuple[tuple[str, ...], ...]:
    """The mesh axes each dimension is split over, from a NamedSharding's spec."""
    spec = (*tuple(sharding.spec), *(None,) * ndim)[:ndim]
    return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec)


def _probe_shardings(answer: Mapping[str, Any], case: Case) -> dict:
    """The learner's shardings of the state as data (mesh axes per dimension of each
    weight and of Adam's moments), the compiled step's collectives and two steps' losses."""
    import jax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from tpu_course.hlo.text import parse_collectives

    rows, cols = case.args["mesh_shape"]
    if len(jax.devices("cpu")) < rows * cols:
        raise Wrong(f"this check needs {rows * cols} CPU devices and JAX sees "
                    f"{len(jax.devices('cpu'))}", "run runtime.simulate_devices(8) in the first "
                    "cell, before JAX starts (restart the kernel first)")
    mesh = jax.make_mesh((rows, cols), ("data", "model"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices("cpu")[:rows * cols])
    step, state, tokens, _ = attention_problem(tuple(case.args["shape"]))
    try:
        got = answer["attention_shardings"](state, mesh)
    except Exception as err:  # noqa: BLE001 - a learner's error, reported as data
        raise _failed(err, "attention_shardings(state, mesh)", "return one NamedSharding per "
                      "leaf of the state (params, opt_state); run it on the cell's mesh") from None
    is_sharding = lambda s: isinstance(s, NamedSharding)
    if jax.tree.structure(state) != jax.tree.structure(got, is_leaf=is_sharding):
        what = ("only the parameters' shardings: the state is (params, opt_state)"
                if isinstance(got, dict) and set(got) == set(state[0]) else
                "something without the state's structure")
        raise Wrong(f"attention_shardings returned {what}", "return one NamedSharding per leaf "
                    "of the whole state (params, opt_state): jax.tree_util.tree_map_with_path "
                    "over it, or optax.tree_map_params for the optimizer's part")
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    shardings = jax.tree.leaves(got, is_leaf=is_sharding)
    out: dict[str, Any] = {"params": {}, "moments": {}}
    for (path, leaf), s in zip(flat, shardings):
        if not is_sharding(s) or set(s.device_set) != set(mesh.devices.flat):
            raise Wrong(f"a leaf's sharding is a {type(s).__name__} "
                        f"{'on other devices than the mesh' if is_sharding(s) else ''}",
                        "NamedSharding(mesh, PartitionSpec(...)) on the mesh argument, every leaf")
        names = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
        weight = next((n for n in reversed(names) if n in WEIGHTS), None)
        moment = next((m for m in ("mu", "nu") if m in names), None)
        if weight and np.ndim(leaf):
            axes = _axes(s, np.ndim(leaf))
            if getattr(path[0], "idx", None) == 0:
                out["params"][weight] = axes
            elif moment:
                out["moments"][f"{weight} {moment}"] = axes
    use = {n: NamedSharding(mesh, P(*[tuple(a for a in e if a != "data") or None
                                      for e in _axes(s, state[0][n].ndim)]))
           for n, s in got[0].items()}
    batch, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    try:
        jitted = jax.jit(functools.partial(step, use=use), in_shardings=(got, batch),
                         out_shardings=(got, whole), compiler_options=_O0)
        sharded, tokens, losses = jax.device_put(state, got), jax.device_put(tokens, batch), []
        for _ in range(2):
            sharded, loss = jitted(sharded, tokens)
            losses.append(float(loss))
        text = jitted.lower(sharded, tokens).compile().as_text()  # the program that ran
    except Exception as err:  # noqa: BLE001 - the learner's shardings did not compile or run
        found = re.search(r"axis (\d+) is partitioned (\d+) times, but the dimension size is "
                          r"(\d+) \(full shape: (\([^)]*\))", str(err))
        if type(err).__name__ != "IndivisibleError" or not found:
            raise _failed(err, "the step with your shardings", "every leaf a NamedSharding "
                          "whose PartitionSpec has at most as many entries as the leaf has "
                          "axes (P() for scalars)") from None
        axis, parts, size, full = found.groups()
        raise Wrong(f"a sharding splits axis {axis} of a {full} array, of size {size}, into "
                    f"{parts} parts, which do not divide it", "split each axis over mesh axes "
                    "whose sizes divide it: the heads over 'model' alone, d_model and the "
                    "vocabulary over 'data'") from None
    out["collectives"] = sorted({c.kind for c in parse_collectives(text)})
    out["losses"] = tuple(losses)
    return out


def _attention_problem(got: Any, want: Any, case: Case) -> tuple[int, str] | None:
    """(index of the rule, what is wrong) of the first problem of the shardings, or None."""
    params, moments = got["params"], got["moments"]
    for key, axes in moments.items():
        weight, moment = key.split()
        if axes != params[weight]:
            return 0, (f"Adam's {'first' if moment == 'mu' else 'second'} moment of {weight} is "
                       + ("replicated" if not any(axes) else "laid out unlike its parameter")
                       + ": each device still holds the whole optimizer state")
    if params["embed"][1]:
        return 1, (f"the embedding's feature axis (d_model) is split over {params['embed'][1]}: "
                   "every lookup needs whole rows from other devices")
    if "all-to-all" in got["collectives"]:
        odd = [n for n in ("wq", "wk", "wv", "wo") if params[n][HEAD_DIM_AXIS[n]]]
        which = (f"{', '.join(odd)} split{'s' if len(odd) == 1 else ''} the head_dim axis" if odd
                 else "the weights disagree on which axis 'model' splits")
        return 2, (f"the compiled step has all-to-alls: {which}, so XLA transposes activations "
                   "between the projections and attention")
    for n in ("wq", "wk", "wv", "wo"):
        if "model" not in params[n][HEADS_AXIS[n]]:
            return 3, (f"the heads of {n} are not split over 'model' (its axes: {params[n]}): "
                       "every model-parallel device computes every head")
    for n in WEIGHTS:
        if not any("data" in a for a in params[n]):
            return 4, f"{n} is whole on every 'data' shard: that is not FSDP"
    if not np.allclose(got["losses"], want, rtol=2e-5):
        return 5, f"the sharded step's losses {got['losses']} differ from one device's {want}"
    return None


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


def _attention_compare(got: Any, want: Any, case: Case) -> str | None:
    if not isinstance(got, dict) or {"params", "moments", "collectives", "losses"} - set(got):
        raise Wrong(f"the check could not read your shardings ({str(got)[:80]})",
                    "return one NamedSharding per leaf of (params, opt_state)")
    try:
        problem = _attention_problem(got, want, case)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise Wrong("the check could not read your shardings", "return one NamedSharding per "
                    "leaf of (params, opt_state)") from None
    return problem and problem[1]


def _attention_rule(i: int) -> Mistake:
    return Mistake(_ATTENTION_HINTS[i], when=lambda got, want, case: (
        _attention_problem(got, want, case) or (None,))[0] == i)


def _attention_case(shape: tuple[int, int, int, int], mesh_shape: tuple[int, int]) -> Case:
    return Case(f"a {mesh_shape[0]}x{mesh_shape[1]} mesh and {shape[2]} heads of {shape[3]}",
                {"shape": shape, "mesh_shape": mesh_shape})


check_attention_shardings = LAB.add(Exercise(
    "Exercise 2 (shardings of attention for tensor parallelism)", minutes=25,
    provides=("attention_shardings",), cases=(_attention_case(ATTENTION_SHAPE, (4, 2)),),
    probe=_probe_shardings, compare=_attention_compare,
    expect=lambda case: single_device_losses(tuple(case.args["shape"])),
    rules=tuple(_attention_rule(i) for i in range(len(_ATTENTION_HINTS))), time_limit_s=240,
    hint="heads on 'model', FSDP on 'data', the embedding's rows on 'data', Adam's moments "
         "like their parameters, scalars replicated"))


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
          "dots_saveable": "dots_saveable saves every matmul's output, batched ones included",
          "dots_with_no_batch_dims_saveable": "it saves the matmuls without batch dimensions",
          "nothing_saveable": "it saves nothing and recomputes every matmul"}


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


@functools.lru_cache(maxsize=8)
def remat_measurement(name: str, shape: tuple[int, ...] = REMAT_SHAPE) -> tuple[int, float]:
    """``(temporary bytes, FLOPs)`` of the stack's training step under policy ``name``, from
    ``compiled.memory_analysis()`` and the cost analysis (the layers are a ``lax.scan``)."""
    import jax
    import jax.numpy as jnp

    layers, b, t, d, f, heads = shape
    sizes = {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, f), "w2": (f, d)}
    stacked = {n: jax.ShapeDtypeStruct((layers, *s), jnp.float32) for n, s in sizes.items()}
    block = functools.partial(_remat_block, heads=heads)
    if name != "none":
        block = jax.checkpoint(block, policy=getattr(jax.checkpoint_policies, name))

    def loss(params: Any, x: Any) -> Any:
        y, _ = jax.lax.scan(lambda h, p: (block(p, h), None), x, params)
        return jnp.mean(y * y)

    x = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    with jax.default_device(jax.devices("cpu")[0]):  # -O0: the same plan, compiled faster
        compiled = jax.jit(jax.grad(loss), compiler_options=_O0).lower(stacked, x).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return int(compiled.memory_analysis().temp_size_in_bytes), float(cost["flops"])


def best_policy(budget: int = REMAT_BUDGET_BYTES) -> str:
    """Of the policies whose step fits ``budget`` temporary bytes, the one with the fewest
    FLOPs (measured)."""
    fits = [p for p in POLICIES if remat_measurement(p)[0] <= budget]
    return min(fits, key=lambda p: remat_measurement(p)[1]) if fits else "none fits"


def _policy_name(answer: Mapping[str, Any], case: Case) -> str:
    import jax

    choice = answer["chosen_policy"]
    if choice is None:
        return "none"
    if callable(choice):
        found = [n for n in POLICIES[1:] if getattr(jax.checkpoint_policies, n) is choice]
        if choice is getattr(jax.checkpoint_policies, "checkpoint_dots", None):
            found = ["dots_saveable"]
        if not found:
            raise Wrong(f"{getattr(choice, '__name__', choice)!r} is not one of the policies "
                        "this exercise compares", f"one of {', '.join(POLICIES)}")
        return found[0]
    if not isinstance(choice, str):
        raise Wrong(f"name a policy (a string), not a {type(choice).__name__}",
                    f"one of {', '.join(repr(p) for p in POLICIES)}")
    name = choice.strip().removeprefix("jax.checkpoint_policies.")
    name = "dots_saveable" if name == "checkpoint_dots" else name
    if name not in POLICIES:
        raise Wrong(f"{choice!r:.60} is not one of the policies this exercise compares",
                    f"one of {', '.join(repr(p) for p in POLICIES)} (names in "
                    "jax.checkpoint_policies; 'none' for no remat)")
    return name


def _over_budget(name: str) -> bool:
    return name in POLICIES and remat_measurement(name)[0] > REMAT_BUDGET_BYTES


def _remat_compare(got: Any, want: Any, case: Case) -> str | None:
    if got == want:
        return None
    if got not in POLICIES:
        raise Wrong(f"{str(got)[:60]!r} is not one of the policies", f"one of {POLICIES}")
    temp, flops = remat_measurement(got)
    if _over_budget(got):
        return (f"{got} needs {temp / 1e6:.1f} MB of temporaries, over the budget of "
                f"{REMAT_BUDGET_BYTES / 1e6:.0f} MB ({_SAVES[got]})")
    return (f"{got} fits ({temp / 1e6:.1f} MB), but another policy that fits recomputes less: "
            f"{flops / remat_measurement(want)[1] - 1:.0%} more FLOPs")


check_remat_policy = LAB.add(Exercise(
    "Exercise 3 (a remat policy that fits the budget)", minutes=15, kind="predict",
    provides=("chosen_policy",), probe=_policy_name, compare=_remat_compare,
    expect=lambda case: best_policy(),
    rules=(Mistake("a policy that saves less: which matmul outputs are the big ones?",
                   when=lambda got, want, case: _over_budget(got)),
           Mistake("nothing_saveable recomputes every matmul; keep the weight matmuls' "
                   "outputs (no batch dimension) and recompute the rest",
                   when=lambda got, want, case: got in POLICIES and not _over_budget(got))),
    hint="which policies' steps fit the budget, and which of those recomputes the least?"))


# -- Exercise 4: the KV-cache decode step ------------------------------------------------------

#: The decode step exercise 4 checks: (batch, cache length, heads, head_dim, d_model).
DECODE_SHAPE = (2, 16, 4, 8, 32)
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


def decode_problem(shape: tuple[int, ...], start: int, seed: int) -> dict[str, Any]:
    """Weights, inputs and the cache a decode from ``start`` begins with (float64): keys and
    values of positions before ``start``, a longer earlier sequence's entries after it."""
    b, t, h, k, d = shape
    rng = np.random.default_rng(seed)
    w = {n: rng.normal(0, d ** -0.5, (d, h, k)) for n in ("wq", "wk", "wv")}
    w["wo"] = rng.normal(0, (h * k) ** -0.5, (h, k, d))
    xs = rng.normal(0, 1, (b, t, d))
    keys, values = (np.einsum("btd,dhk->bthk", xs, w[n]) for n in ("wk", "wv"))
    stale = rng.normal(0, 3, (2, b, t, h, k))
    early = np.arange(t)[None, :, None, None] < start
    return {"w": w, "xs": xs, "keys": keys, "values": values,
            "cache": (np.where(early, keys, stale[0]), np.where(early, values, stale[1]))}


def decode_truth(shape: tuple[int, ...], start: int, dtype: str, seed: int) -> dict[str, Any]:
    """What the step must give: causal attention of every position from ``start`` on,
    recomputed in float64 from scratch, and the cache holding every position's key and
    value."""
    p = decode_problem(shape, start, seed)
    w, xs = p["w"], p["xs"]
    q = np.einsum("btd,dhk->bthk", xs, w["wq"])
    s = np.einsum("bqhk,bshk->bhqs", q, p["keys"]) / math.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((shape[1],) * 2, bool)), s, -np.inf)
    probs = np.exp(s - s.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("bhqs,bshk,hkd->bqd", probs, p["values"], w["wo"])
    return {"out": out[:, start:].transpose(1, 0, 2), "keys": p["keys"], "values": p["values"],
            "dtypes": (dtype,) * 3}


def _decode_flops_bound(case: Case) -> float:
    """Twice one token's work plus half a length x length square: above it, a step
    recomputes attention for every cached position."""
    b, t, h, k, d = case.args["shape"]
    return 2 * (2 * b * (4 * d * h * k + 2 * t * h * k)) + b * h * t * t * k


def _probe_decode(answer: Mapping[str, Any], case: Case) -> dict:
    """The learner's step, traced under jit once (pos must stay traced; its FLOPs from the
    lowered program), then run from ``start`` to the end of the cache, feeding back the cache
    it returns: each output, the final cache, the dtypes, one step's FLOPs."""
    import jax
    import jax.numpy as jnp

    fn, (shape, start, dtype) = answer["decode_step"], (case.args[n] for n in (
        "shape", "start", "dtype"))
    p = decode_problem(tuple(shape), start, case.args["seed"])
    w = {n: jnp.asarray(a, dtype) for n, a in p["w"].items()}
    cache = tuple(jnp.asarray(c, dtype) for c in p["cache"])
    outs, dtypes, flops = [], None, None
    for pos in range(start, shape[1]):
        x = jnp.asarray(p["xs"][:, pos], dtype)
        try:
            with jax.default_matmul_precision("float32"):
                if flops is None:
                    cost = jax.jit(fn).lower(w, x, cache, jnp.int32(pos)).cost_analysis()
                    flops = float((cost[0] if isinstance(cost, list) else cost or {}).get(
                        "flops", 0.0))
                got = fn(w, x, cache, jnp.int32(pos))
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
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(
                got[1], (tuple, list)) and len(got[1]) == 2):
            raise Wrong("decode_step should return (out, (keys, values))",
                        "return out, (keys, values)")
        out, cache = got[0], tuple(got[1])
        if np.shape(out) != (shape[0], shape[4]) or any(np.shape(c) != shape[:4] for c in cache):
            raise Wrong(f"out has shape {np.shape(out)} and the cache {np.shape(cache[0])}; "
                        f"expected {(shape[0], shape[4])} and {tuple(shape[:4])}",
                        "one output vector per sequence; the cache keeps its shape")
        dtypes = dtypes or tuple(str(jnp.asarray(a).dtype) for a in (out, *cache))
        outs.append(np.asarray(out, np.float32))
    return {"out": np.stack(outs), "keys": np.asarray(cache[0], np.float32),
            "values": np.asarray(cache[1], np.float32), "dtypes": dtypes, "flops": flops}


def _decode_compare(got: Any, want: Any, case: Case) -> str | None:
    try:
        same = all(np.shape(got[n]) == np.shape(want[n]) for n in ("out", "keys", "values"))
        float(got["flops"]), tuple(got["dtypes"])
    except (KeyError, TypeError, ValueError):
        same = False
    if not same:
        raise Wrong(f"the check could not read your step's outputs ({str(got)[:60]})",
                    "return out, (keys, values)")
    start, tol = case.args["start"], TOLERANCE[case.args["dtype"]]
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
    if got["flops"] > _decode_flops_bound(case):
        return (f"one step costs {got['flops']:,.0f} FLOPs: it recomputes attention for every "
                "cached position")
    return None


def _decode_case(shape: tuple[int, ...], start: int, dtype: str, seed: int, label: str) -> Case:
    b, t, h, k, d = shape
    return Case(f"{label}: batch {b}, {h} heads of {k}, d_model {d}, {dtype}, from position "
                f"{start} to the end of a cache of {t}",
                {"shape": shape, "start": start, "dtype": dtype, "seed": seed})


check_decode_step = LAB.add(Exercise(
    "Exercise 4 (the KV-cache decode step)", minutes=25, provides=("decode_step",),
    cases=(_decode_case(DECODE_SHAPE, 9, "float32", 0, "the chapter's shape"),
           _decode_case((1, 12, 2, 8, 16), 8, "bfloat16", 1, "a bf16 cache")),
    probe=_probe_decode, compare=_decode_compare,
    expect=lambda case: decode_truth(**case.args),
    rules=(Mistake("the cache exists so that a step computes only the new token's query, key "
                   "and value and one row of scores: no length x length matrix",
                   when=lambda got, want, case: got["flops"] > _decode_flops_bound(case)),),
    time_limit_s=120,
    hint="compare your step with the chapter's attention: the new token's query against the "
         "cached keys 0..pos (its own key written at pos first), softmax, times the values"))


# -- Exercise 5: the batch where decoding turns compute-bound ----------------------------------

#: Exercise 5's case: a model the chapter did not train, on a chip, at a cache position.
DECODE_CASE = {"d_model": 2048, "heads": 16, "layers": 24, "d_ff": 8192, "context": 2048}
DECODE_CHIP, DECODE_POSITION = "v5e", 15


def decode_config() -> Any:
    from tpu_course import lm

    return lm.LMConfig(**DECODE_CASE)


def ridge_batch() -> float:
    """The course's roofline: where a decode step of ``decode_config()`` at
    ``DECODE_POSITION`` on ``DECODE_CHIP`` turns compute-bound."""
    from tpu_course import lm

    return lm.decode_ridge_batch(decode_config(), DECODE_CHIP, DECODE_POSITION)


def _ridge_compare(got: Any, want: Any, case: Case) -> str | None:
    got = number(got, "predicted_batch")
    if abs(got - want) <= 1 or math.isclose(got, want, rel_tol=0.03):
        return None
    return f"your batch {got:,.0f} is {got / want:.2f}x the roofline's"


check_ridge_batch = LAB.add(Exercise(
    "Exercise 5 (the batch where decoding turns compute-bound)", minutes=10, kind="predict",
    provides=("predicted_batch",),
    probe=lambda answer, case: number(answer["predicted_batch"], "predicted_batch"),
    expect=lambda case: ridge_batch(), compare=_ridge_compare,
    hint="solve b (2N + 4 L d t) = I (2 bytes x params + b x 2 L d t x 2 bytes) for b, with I "
         "the chip's bf16 peak / HBM bandwidth, N the multiplying parameters, t = position + 1"))
