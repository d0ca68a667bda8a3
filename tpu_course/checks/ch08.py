"""Lab 8 (the chapter-8 language model). Expected outputs come from the course's instruments
(the model's leaves, the chapter's count, one device's steps, each remat policy compiled, an
uninterrupted run, the decode roofline); keys live in ``grading/ch08.py``."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

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

# -- Exercise 2: causal attention ----------------------------------------------------------------

def attention_inputs(shape: tuple[int, ...], dtype: str, seed: int) -> tuple[Any, Any, Any]:
    """Exercise 2's ``(q, k, v)``: (batch, length, heads, head_dim) normal values in ``dtype``."""
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(0, 1, shape), dtype) for _ in range(3))

def _probe_attention(answer, case):
    """The learner's attention on the case's inputs: its output as it came (dtype kept)."""
    q, k, v = attention_inputs(tuple(case.args["shape"]), case.args["dtype"], case.args["seed"])
    try:
        out = answer["causal_attention"](q, k, v)
    except Exception as err:  # noqa: BLE001 - a learner's error, reported as data
        raise _failed(err, "causal_attention(q, k, v)", "q, k and v are (batch, length, heads, "
                      "head_dim); return the same shape") from None
    if np.shape(out) != tuple(case.args["shape"]):
        raise Wrong(f"causal_attention returned shape {np.shape(out)}, expected "
                    f"{tuple(case.args['shape'])}", "one output vector per query position "
                    "and head: (batch, length, heads, head_dim), the shape of q")
    return out

def _attention_compare(got, want, case):
    if not isinstance(got, np.ndarray) or got.shape != want.shape:
        raise ValueError("not an array of the expected shape")  # refused as unreadable
    if got.dtype != want.dtype:
        return f"{want.dtype} came in, and your output is {got.dtype}"
    tol = 1e-4 if want.dtype == np.float32 else 3e-2
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = max(float(np.nanmax(np.abs(w), initial=0.0)), 1.0)
    bad = ~np.isclose(g, w, rtol=tol, atol=tol * scale, equal_nan=True)  # NaN: a known mistake's
    if not bad.any():
        return None
    b, t, h, _ = (int(i) for i in np.argwhere(bad)[0])
    what = "is NaN" if np.isnan(g[b, t, h]).any() else "differs from causal attention's"
    return (f"the output of query position {t} (sequence {b}, head {h}) {what}; "
            f"{int(bad.any(axis=(0, 2, 3)).sum())} of {w.shape[1]} positions are wrong")

def _causal_case(shape, dtype, seed, label):  # shape: (batch, length, heads, head_dim)
    b, t, h, k = shape
    return Case(f"{label}: batch {b}, length {t}, {h} heads of {k}, {dtype}",
                {"shape": shape, "dtype": dtype, "seed": seed})

check_causal_attention = LAB.add(Exercise(
    "Exercise 2 (causal attention)", minutes=15, provides=("causal_attention",),
    cases=(_causal_case((2, 7, 2, 8), "float32", 0, "float32"),
           _causal_case((1, 5, 3, 16), "bfloat16", 1, "bfloat16 in, bfloat16 out")),
    probe=_probe_attention,
    compare=_readable(_attention_compare, "return an array of the shape of q, in q's dtype"),
    hint="scores q . k / sqrt(head_dim) for every query and key of the same head, keys after "
         "the query masked out, a softmax over the keys, then the weighted sum of the values"))

# -- Exercise 3: the sharded train step (FSDP x tensor parallelism) ----------------------------

#: The attention model exercise 3 shards: ``(vocab, d_model, heads, head_dim)``.
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
    """The learner's sharded step as data: the mesh it was built on, the mesh axes of each
    dimension of each weight ("wq") and Adam moment ("wq mu") as the compiled step takes and
    returns them, the batch's, the compiled step's collectives and two steps' losses."""
    mesh_shape, devices = tuple(case.args["mesh_shape"]), jax.devices("cpu")
    if len(devices) < math.prod(mesh_shape):
        raise Wrong(f"this check needs {math.prod(mesh_shape)} CPU devices and JAX sees "
                    f"{len(devices)}", "restart the kernel and run runtime.simulate_devices(8) "
                    "before JAX starts")
    step, state, tokens, _ = attention_problem(tuple(case.args["shape"]))
    how = ("return jax.jit(step, in_shardings=(state_shardings, batch_sharding), "
           "out_shardings=(state_shardings, replicated)) on a mesh you build from mesh_shape")
    try:
        jitted = answer["sharded_step"](step, state, mesh_shape)
        lower = getattr(jitted, "lower", None)
        if not callable(lower):
            raise Wrong(f"sharded_step returned a {type(jitted).__name__}, not a jax.jit "
                        "function", how)
        compiled = lower(state, tokens).compile(compiler_options=_O0)
        state_in, batch_in = compiled.input_shardings[0][:2]
        state_out = compiled.output_shardings[0]
    except Wrong:
        raise
    except Exception as err:  # noqa: BLE001 - a learner's error, reported as data
        hint = ("every leaf of the state a NamedSharding whose PartitionSpec has at most as "
                "many entries as the leaf has axes (P() for scalars), splitting only axes the "
                f"mesh axes divide; {how}")
        raise _failed(err, "sharded_step(step, state, mesh_shape), lowered and compiled",
                      hint) from None
    is_sharding = lambda s: hasattr(s, "spec") and hasattr(s, "mesh")
    mesh = getattr(batch_in, "mesh", None)
    built = (dict(mesh.shape) if mesh is not None and hasattr(mesh, "shape") else {})
    axes, returned = {}, {}
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    for (path, leaf), s_in, s_out in zip(flat, jax.tree.leaves(state_in, is_leaf=is_sharding),
                                         jax.tree.leaves(state_out, is_leaf=is_sharding)):
        names = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
        weight = next((n for n in reversed(names) if n in state[0]), None)
        moment = next((m for m in ("mu", "nu") if m in names), "")  # "": a parameter
        if weight and np.ndim(leaf) and (moment or path[0].idx == 0):
            key = f"{weight} {moment}".strip()
            axes[key] = _axes(s_in, np.ndim(leaf))
            returned[key] = _axes(s_out, np.ndim(leaf))
    try:
        # each step's state placed as the step takes it: a state returned in another layout
        # is the returned-layout rule's to name, not a crash here
        losses = _two_steps(lambda st, tok: compiled(jax.device_put(st, state_in), tok),
                            state, jax.device_put(tokens, batch_in))[0]
    except Exception as err:  # noqa: BLE001 - the compiled step did not run
        raise _failed(err, "two steps of your compiled step", how) from None
    return {"mesh": {str(k): int(v) for k, v in built.items()}, "axes": axes,
            "returned": returned, "batch": _axes(batch_in, 1)[0], "losses": losses,
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
    "shardings change where numbers live, not what is computed: return shardings only",
    "build the mesh from mesh_shape: jax.make_mesh(mesh_shape, ('data', 'model'))",
    "cut the batch over 'data': in_shardings for the tokens NamedSharding(mesh, P('data')); "
    "each data shard then computes its own sequences",
    "out_shardings: give the state back laid out as it came in (the next step's input), the "
    "loss replicated")

def _attention_problem(got, want, case=None):
    """(index of its hint, what is wrong) of the shardings' first problem, or None."""
    axes = got["axes"]
    if case is not None and got["mesh"] != dict(zip(("data", "model"), asked := tuple(
            case.args["mesh_shape"]))):
        return 6, (f"the step runs on a mesh {got['mesh']}, not the {asked[0]} x {asked[1]} "
                   "('data', 'model') mesh asked for")
    if "data" not in (got.get("batch") or ()):
        return 7, ("the batch is replicated: every device computes every sequence, and the "
                   "'data' axis does no data parallelism")
    for key, split in got.get("returned", {}).items():
        if split != axes.get(key):
            return 8, (f"the step takes {key} split over {axes.get(key)} but returns it split "
                       f"over {split}: the next step's input changes layout")
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

check_sharded_step = LAB.add(Exercise(
    "Exercise 3 (the sharded train step: FSDP x tensor parallelism)", minutes=25,
    provides=("sharded_step",), cases=(_attention_case(ATTENTION_SHAPE, (4, 2)),),
    probe=_probe_shardings, expect=lambda case: single_device_losses(tuple(case.args["shape"])),
    compare=_readable(lambda got, want, case: (_attention_problem(got, want, case) or
                                               (0, None))[1],
                      "return jax.jit(step, in_shardings=..., out_shardings=...)"),
    rules=tuple(Mistake(h, when=lambda got, want, case, i=i: (
        _attention_problem(got, want, case) or (None,))[0] == i)
        for i, h in enumerate(_ATTENTION_HINTS)),
    time_limit_s=240, hint="a (data, model) mesh from mesh_shape; heads on 'model', FSDP on "
                           "'data', the embedding's rows on 'data', Adam's moments like their "
                           "parameters, scalars replicated, the batch on 'data'; the state "
                           "returned as it came in"))

# -- Exercise 4: a remat policy that fits the budget ------------------------------------------

#: The memory budget of exercise 4: temporary bytes of the compiled training step.
REMAT_BUDGET_BYTES = 10_000_000
#: The policies exercise 4 chooses from (names in ``jax.checkpoint_policies``; "none").
POLICIES = ("none", "everything_saveable", "dots_saveable",
            "dots_with_no_batch_dims_saveable", "nothing_saveable")
#: The stack exercise 4 compiles: (layers, batch, length, d_model, d_ff, heads).
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
    "Exercise 4 (a remat policy that fits the budget)", minutes=15, kind="predict",
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

# -- Exercise 5: resume training from a checkpoint ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ResumeProblem:
    """What exercise 5's ``train`` trains: ``init()`` gives a fresh ``(params, opt_state)``
    (a byte-bigram model and AdamW's state), ``step(params, opt_state, inputs, targets)``
    is one compiled training step ``-> (params, opt_state, loss)``, and batch ``k`` is
    ``textdata.batch_at(corpus, k, batch, length, seed)``."""

    corpus: np.ndarray
    batch: int
    length: int
    seed: int
    init: Callable[[], tuple[Any, Any]]
    step: Callable[..., tuple[Any, Any, Any]]

    def __repr__(self) -> str:
        return (f"ResumeProblem(corpus of {self.corpus.size} bytes, batch={self.batch}, "
                f"length={self.length}, seed={self.seed}, init(), step(...))")

@functools.lru_cache(maxsize=4)
def _bigram(width: int) -> tuple[Any, Any]:  # (tx, compiled step) of a byte-bigram model
    tx = optax.adamw(1e-2)

    def loss(params, inputs, targets):
        logits = params["embed"][inputs] @ params["head"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def step(params, opt_state, inputs, targets):
        value, grads = jax.value_and_grad(loss)(params, inputs, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return tx, jax.jit(step, compiler_options=_O0)

def resume_problem(seed: int = 0, width: int = 8) -> ResumeProblem:
    """A problem small enough to train a few steps in a fraction of a second."""
    tx, step = _bigram(width)

    def init():
        rng = np.random.default_rng(seed)
        params = {"embed": rng.normal(0, 1, (lm.VOCAB, width)).astype(np.float32),
                  "head": np.zeros((width, lm.VOCAB), np.float32)}
        return params, tx.init(params)

    corpus = np.random.default_rng(seed + 1).integers(0, 256, 4096).astype(np.uint8)
    return ResumeProblem(corpus, 4, 8, seed, init, step)

def resume_truth(steps: int, stop: int, seed: int) -> dict[str, Any]:
    """An uninterrupted run of ``steps`` steps (no checkpoint): what both runs must give."""
    from tpu_course import textdata

    problem = resume_problem(seed)
    params, opt_state = problem.init()
    for k in range(steps):
        batch = textdata.batch_at(problem.corpus, k, problem.batch, problem.length, seed)
        params, opt_state, _ = problem.step(params, opt_state, *batch)
    params = {n: np.asarray(a) for n, a in params.items()}
    return {"uninterrupted": params, "resumed": params, "steps_run": (steps, stop, steps - stop)}

def _probe_resume(answer, case):
    """The learner's ``train`` run to ``steps`` in one folder; in another, to ``stop``, then
    again to ``steps`` (a restart): both runs' parameters and the steps each call ran."""
    import tempfile

    steps, stop, seed = (case.args[n] for n in ("steps", "stop", "seed"))
    problem, calls = resume_problem(seed), [0]

    def counted(*args):
        calls[0] += 1
        return problem.step(*args)

    counting = dataclasses.replace(problem, step=counted)
    runs, ran = [], []
    with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as split:
        for directory, until in ((whole, steps), (split, stop), (split, steps)):
            calls[0] = 0
            try:
                params = answer["train"](directory, until, counting)
            except Exception as err:  # noqa: BLE001 - a learner's error, reported as data
                raise _failed(err, f"train(directory, {until}, problem)", "train(directory, "
                              "steps, problem): restore the latest step if there is one, train "
                              "on to steps with problem.step, save, return the params") from None
            if not isinstance(params, dict) or set(params) != {"embed", "head"}:
                raise Wrong(f"train returned {str(params)[:60]}, not the parameters",
                            "return the params dict (embed, head) after the last step")
            runs.append({n: np.asarray(a, np.float32) for n, a in params.items()})
            ran.append(calls[0])
    return {"uninterrupted": runs[0], "resumed": runs[2], "steps_run": tuple(ran)}

def _resume_compare(got, want, case):
    steps, stop = case.args["steps"], case.args["stop"]
    if tuple(got["steps_run"]) != tuple(want["steps_run"]):
        (whole, first, second), left = got["steps_run"], steps - stop
        if whole != steps or first != stop:
            return f"train(directory, {steps}) in an empty folder ran {whole} steps, not {steps}"
        return (f"stopped at step {stop}, train(directory, {steps}) ran {second} steps "
                f"again, not the {left} left")
    for run in ("uninterrupted", "resumed"):
        for name in ("embed", "head"):
            g, w = got[run][name], want[run][name]
            if g.shape != w.shape or not np.allclose(g, w, rtol=1e-6, atol=1e-7):
                return ({"uninterrupted": f"train(directory, {steps}) in an empty folder does "
                                          f"not give {steps} steps' parameters ({name})",
                         "resumed": f"stopped at step {stop} and resumed to {steps}, the "
                                    f"parameters ({name}) differ from an uninterrupted run's"
                         }[run])
    return None

def _resume_case(steps, stop, seed, label):
    return Case(f"{label}: {steps} steps, stopped after {stop}", {"steps": steps, "stop": stop,
                                                                "seed": seed})

check_resume = LAB.add(Exercise(
    "Exercise 5 (resume training from a checkpoint)", minutes=20, provides=("train",),
    cases=(_resume_case(5, 2, 0, "the lab's run"),), probe=_probe_resume,
    expect=lambda case: resume_truth(**case.args), time_limit_s=120,
    compare=_readable(_resume_compare, "return the params dict (embed, head)"),
    hint="the step to continue from is the latest saved one; restore params and optimizer "
         "state from it, and train steps latest..steps-1 on their own batches, batch_at(step)"))

# -- Exercise 6: the decode loop with a KV cache --------------------------------------------------

#: The model exercise 6 decodes with: one block, float32 matmuls, a random output head.
DECODE_LOOP_CONFIG = lm.LMConfig(d_model=32, heads=2, layers=1, d_ff=64, context=24,
                                 compute_dtype="float32")

@functools.lru_cache(maxsize=2)
def decode_model(seed: int = 0) -> lm.LM:
    """``lm.LM(DECODE_LOOP_CONFIG)`` with a random output head (a fresh model's is zero:
    every byte equally likely), so that greedy and sampled bytes differ from step to step."""
    model = lm.LM(DECODE_LOOP_CONFIG, rngs=nnx.Rngs(seed))
    head = np.random.default_rng(seed).normal(0, 0.5, model.head[...].shape)
    model.head[...] = jnp.asarray(head, jnp.float32)
    return model

def _probe_generate(answer, case):
    """The learner's ``generate`` on the case's prompt and key: the new bytes."""
    b, p, steps = case.args["batch"], case.args["prompt_len"], case.args["steps"]
    prompt = jnp.asarray(np.random.default_rng(case.args["seed"]).integers(0, 256, (b, p)),
                         jnp.int32)
    key = jax.random.key(case.args["seed"])
    try:
        out = answer["generate"](decode_model(), prompt, steps, key,
                                 case.args["temperature"], case.args["top_k"])
    except Exception as err:  # noqa: BLE001 - a learner's error, reported as data
        raise _failed(err, "generate(model, prompt, steps, key, temperature, top_k)",
                      "prefill with model.decode(prompt, lm.init_cache(model.config, batch)), "
                      "then one model.decode(token[:, None], cache) per new byte") from None
    if np.shape(out) != (b, steps):
        hint = ("return the new bytes only, not the prompt before them" if np.shape(out) == (
            b, p + steps) else "one row per sequence, one column per new byte")
        raise Wrong(f"generate returned shape {np.shape(out)}, expected {(b, steps)}", hint)
    return np.asarray(out).astype(np.int64)

def _generate_compare(got, want, case):
    if not isinstance(got, np.ndarray) or got.shape != want.shape:
        raise ValueError("shape")  # refused as unreadable
    bad = np.argwhere(got != want)
    if not len(bad):
        return None
    row, i = (int(n) for n in bad[np.argmin(bad[:, 1])])
    return (f"new byte {i} of sequence {row} is {int(got[row, i])}; {int((got != want).sum())} of "
            f"{got.size} bytes differ from the protocol's")

def _generate_case(batch, prompt_len, steps, temperature, top_k, seed, label):
    how = "greedy" if temperature == 0 else f"temperature {temperature}, top_k={top_k}"
    return Case(f"{label}: {how}, batch {batch}, a prompt of {prompt_len}, {steps} new bytes",
                {"batch": batch, "prompt_len": prompt_len, "steps": steps,
                 "temperature": temperature, "top_k": top_k, "seed": seed})

check_generate = LAB.add(Exercise(
    "Exercise 6 (the decode loop with a KV cache)", minutes=25, provides=("generate",),
    cases=(_generate_case(2, 4, 6, 0.0, None, 0, "greedy"),
           _generate_case(3, 3, 8, 2.0, 4, 1, "sampled")),
    probe=_probe_generate, compare=_readable(_generate_compare, "return (batch, steps) bytes"),
    time_limit_s=120,
    hint="prefill the prompt once; new byte i is argmax at temperature 0, else "
         "jax.random.categorical(jax.random.fold_in(key, i), logits / temperature) with all "
         "but the top_k largest logits set to -inf; then decode that byte with the cache"))

# -- Exercise 7: the batch where decoding turns compute-bound ----------------------------------

#: Exercise 7's chip and cache position, for a model the chapter did not train.
DECODE_CHIP, DECODE_POSITION = "v5e", 15

def decode_config() -> lm.LMConfig:
    """Exercise 7's model."""
    return lm.LMConfig(d_model=2048, heads=16, layers=24, d_ff=8192, context=2048)

def _ridge_compare(got, want, case):
    got = number(got, "predicted_batch")
    if abs(got - want) <= 1 or math.isclose(got, want, rel_tol=0.03):
        return None
    return f"your batch {got:,.0f} is {got / want:.2f}x the roofline's"

check_ridge_batch = LAB.add(Exercise(
    "Exercise 7 (the batch where decoding turns compute-bound)", minutes=10, kind="predict",
    provides=("predicted_batch",), compare=_ridge_compare,
    probe=lambda answer, case: number(answer["predicted_batch"], "predicted_batch"),
    expect=lambda case: lm.decode_ridge_batch(decode_config(), DECODE_CHIP, DECODE_POSITION),
    hint="solve b (2N + 4 L d t) = I (2 bytes x params + b x 2 L d t x 2 bytes) for b, with I "
         "the chip's bf16 peak / HBM bandwidth, N the multiplying parameters, t = position + 1"))
