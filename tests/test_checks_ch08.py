"""Lab 8 checkers: honest solutions written differently from the course's pass (also on
the grader's hidden inputs), and every typical mistake and shortcut fails with its own hint.

Exercise 2 compiles on 8 simulated CPU devices, so it runs in one subprocess; the others
run here (exercise 4 on one device; exercises 1 and 3 compile small programs once).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_course import checks, hardware, lm
from tpu_course.checks import ch08
from tpu_course.checks._answers import ch08 as ref

# -- exercise 1: the size and the FLOPs -------------------------------------------------

CFG = ch08.exercise1_config()


def _honest_size():
    # per-matrix, not per-block: every weight's shape multiplied out
    d, f, h = CFG.d_model, CFG.d_ff, CFG.heads
    shapes = [(CFG.vocab, d), (CFG.context, d), (d,), (d, CFG.vocab)]
    shapes += CFG.layers * [(d, h, d // h)] * 3 + CFG.layers * [(h, d // h, d), (d, f), (f, d),
                                                               (d,), (d,)]
    n = sum(math.prod(s) for s in shapes)
    lookups = (CFG.vocab + CFG.context) * d  # the two embedding tables
    return n, 6 * (n - lookups) + 12 * CFG.layers * d * CFG.context


N, F = _honest_size()
V, D, L, T = CFG.vocab, CFG.d_model, CFG.layers, CFG.context
SIZE_MISTAKES = [
    ("no_embedding", N - V * D, F, "two vocab x d_model tables"),
    ("no_vocab_tables", N - 2 * V * D, F, "both vocab x d_model tables"),
    ("no_positions", N - T * D, F, "position table"),
    ("no_norms", N - 2 * D * L - D, F, "norms' scales"),
    ("no_attention", N, F - 12 * L * D * T, "attention term"),
    ("macs", N, F / 2, "multiply-add as 1 FLOP"),
    ("forward_only", N, 2 * (N - (V + T) * D) + 4 * L * D * T, "forward pass alone"),
    ("no_head", N, F - 6 * V * D, "output head"),
    ("way_off", N, 3 * F, "6 FLOPs per multiplying parameter"),
]


@pytest.mark.parametrize("name, params, flops, hint", SIZE_MISTAKES,
                         ids=[m[0] for m in SIZE_MISTAKES])
@pytest.mark.mistake
def test_size_mistakes_are_named(name, params, flops, hint):
    r = ch08.check_size_prediction(params, flops)
    assert r.status == "failed" and hint in r.hint and r.answer, (name, r)


def test_size_honest_passes_and_garbage_is_refused():
    r = ch08.check_size_prediction(N, F)
    assert r.passed and "exactly" in r.message, r
    assert N == lm.param_count(CFG) and CFG != lm.LMConfig.cpu()
    r = ch08.check_size_prediction(np.int64(N), float(F) * 1.05)  # within XLA's 10 %
    assert r.passed, r
    for bad in (str(N), None, [N]):
        r = ch08.check_size_prediction(bad, F)
        assert r.status == "failed", r
    assert ch08.check_size_prediction(checks.NotWritten("Exercise 1"), F).status == "not written"


# -- exercise 3: a remat policy -----------------------------------------------------------

REMAT_CASES = [
    ("dots_with_no_batch_dims_saveable", "passed", "", ""),
    (jax.checkpoint_policies.dots_with_no_batch_dims_saveable, "passed", "", ""),
    ("none", "failed", "every activation", "saves less"),
    ("everything_saveable", "failed", "same as no remat", "saves less"),
    ("dots_saveable", "failed", "scores", "saves less"),
    (jax.checkpoint_policies.checkpoint_dots, "failed", "scores", "saves less"),
    ("nothing_saveable", "failed", "recomputes more than it must", "weight matmuls"),
    ("dots", "failed", "not one of the policies", "dots_saveable"),
    (3, "failed", "name a policy", ""),
]


def test_remat_policies_are_measured_and_mistakes_named():
    temps = {p: ch08.remat_measurement(p)[0] for p in ch08.POLICIES}
    # the budget separates them on this stack, with a margin either side
    assert temps["dots_with_no_batch_dims_saveable"] < 0.97 * ch08.REMAT_BUDGET_BYTES, temps
    assert temps["dots_saveable"] > 1.03 * ch08.REMAT_BUDGET_BYTES, temps
    assert temps["nothing_saveable"] < temps["dots_with_no_batch_dims_saveable"] < temps["none"]
    for choice, status, words, hint in REMAT_CASES:
        r = ch08.check_remat_policy(choice)
        assert r.status == status and words in r.message and hint in r.hint, (choice, r)
    ch08.LAB.predict("Exercise 3", "dots_with_no_batch_dims_saveable")
    assert ch08.LAB.predicted("Exercise 3")
    r = ch08.check_remat_policy("nothing_saveable")  # edited after the measurement showed
    assert r.passed and "recorded before the measurement" in r.message, r


# -- exercise 4: the KV-cache decode step ---------------------------------------------------


def honest_decode(weights, x, cache, pos):
    # written differently: one-hot write, a float mask added to the scores, heads flattened
    keys, values = cache
    b, t, h, k = keys.shape
    q = (x @ weights["wq"].reshape(x.shape[-1], -1)).reshape(b, h, k)
    kn = (x @ weights["wk"].reshape(x.shape[-1], -1)).reshape(b, 1, h, k)
    vn = (x @ weights["wv"].reshape(x.shape[-1], -1)).reshape(b, 1, h, k)
    here = (jnp.arange(t) == pos)[None, :, None, None]
    keys = jnp.where(here, kn.astype(keys.dtype), keys)
    values = jnp.where(here, vn.astype(values.dtype), values)
    s = jnp.einsum("bhk,bthk->bht", q.astype(jnp.float32), keys.astype(jnp.float32)) / k ** 0.5
    s = s + jnp.where(jnp.arange(t) > pos, -1e30, 0.0)
    p = jax.nn.softmax(s, -1)
    o = jnp.einsum("bht,bthk->bhk", p, values.astype(jnp.float32)).reshape(b, h * k)
    return (o @ weights["wo"].reshape(h * k, -1).astype(jnp.float32)).astype(x.dtype), (keys, values)


def _variant(write_shift=0, mask="le", scale=True, return_old=False, recompute=False):
    def step(weights, x, cache, pos):
        keys, values = cache
        q, k, v = (jnp.einsum("bd,dhk->bhk", x, weights[n]) for n in ("wq", "wk", "wv"))
        at = jnp.clip(pos + write_shift, 0, keys.shape[1] - 1)
        new_k = jax.lax.dynamic_update_slice_in_dim(keys, k[:, None].astype(keys.dtype), at, 1)
        new_v = jax.lax.dynamic_update_slice_in_dim(values, v[:, None].astype(values.dtype), at, 1)
        s = jnp.einsum("bhk,bthk->bht", q, new_k) / (math.sqrt(q.shape[-1]) if scale else 1.0)
        t = jnp.arange(keys.shape[1])
        if mask == "le":
            s = jnp.where(t <= pos, s, -jnp.inf)
        elif mask == "lt":
            s = jnp.where(t < pos, s, -1e30)
        out = jnp.einsum("bht,bthk,hkd->bd", jax.nn.softmax(s, -1), new_v, weights["wo"])
        if recompute:  # the whole length x length attention each step, one row kept
            every = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", new_k, new_k), -1)
            out = out + jnp.einsum("bhqs,bshk->bqhk", every, new_v).sum() * 0
        return out, ((keys, values) if return_old else (new_k, new_v))
    return step


def python_pos(weights, x, cache, pos):
    keys, values = cache
    keys = keys[:, : int(pos)]
    return x, (keys, values)


DECODE_MISTAKES = [
    ("no_mask", _variant(mask="none"), "differs from a full recomputation", "mask positions > pos"),
    ("strict_mask", _variant(mask="lt"), "differs from a full recomputation", "attend to itself"),
    ("no_scale", _variant(scale=False), "differs from a full recomputation", "sqrt(head_dim)"),
    ("wrong_position", _variant(write_shift=1), "landed at position", "index pos"),
    ("cache_not_returned", _variant(return_old=True), "landed nowhere", "return the updated cache"),
    ("python_pos", python_pos, "traced under jit", "dynamic_update_slice"),
    ("recompute", _variant(recompute=True), "one token's work", "no length x length"),
    ("tuple", lambda w, x, c, p: x, "(out, cache)", "return out"),
]


@pytest.mark.parametrize("name, step, words, hint", DECODE_MISTAKES,
                         ids=[m[0] for m in DECODE_MISTAKES])
@pytest.mark.mistake
def test_decode_mistakes_are_named(name, step, words, hint):
    r = ch08.check_decode_step(step)
    assert r.status == "failed" and words in r.message and hint in r.hint, (name, r)


def test_decode_honest_passes_also_hidden_and_course_code_is_refused():
    r = ch08.check_decode_step(honest_decode)
    assert r.passed and "full recomputation" in r.message, r
    ex = ch08.LAB.find("Exercise 4")
    graded = ex.grade_hidden({"decode_step": honest_decode}, checks.grading_seed("someone", 8))
    assert graded.passed and "unseen" in graded.message, graded
    r = ch08.check_decode_step(honest_decode, dtype="bfloat16")
    assert r.passed, r
    for cheat in (ref.decode_step, lambda w, x, c, p: ref.decode_step(w, x, c, p)):
        r = ch08.check_decode_step(cheat)
        assert r.status == "failed" and "course's own function" in r.message, r

    def uses_lm(weights, x, cache, pos):
        layer = lm.Attention(lm.LMConfig(d_model=32, heads=4), rngs=None)
        return layer(x[:, None], cache, pos)

    r = ch08.check_decode_step(uses_lm)
    assert r.status == "failed" and "course's own function" in r.message, r


# -- exercise 5: the decode roofline ------------------------------------------------------


def _honest_ridge():
    # from the chip's numbers, solving flops(b) / bytes(b) = ridge by bisection
    c = ch08.decode_config()
    chip = hardware.get(ch08.DECODE_CHIP)
    t, d, n_layers = ch08.DECODE_POSITION + 1, c.d_model, c.layers
    n = lm.param_count(c)

    def intensity(b):
        flops = b * (2 * (n - c.context * d) + 4 * n_layers * d * t)
        return flops / (2 * n + b * 4 * n_layers * d * t)

    lo, hi = 1.0, 1e6
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if intensity(mid) < chip.critical_intensity() else (lo, mid)
    return hi


RIDGE = _honest_ridge()
RIDGE_MISTAKES = [
    ("no_cache", "decode_ridge_batch", {"cache_bytes_per_value": 0}, "KV cache"),
    ("fp32_weights", "decode_ridge_batch", {"weight_bytes_per_param": 4}, "fp32 (4 bytes)"),
    ("ridge_itself", "ridge", {}, "KV cache"),
    ("half_ridge", "half", {}, "2 FLOPs per weight"),
]


@pytest.mark.parametrize("name, how, kwargs, hint", RIDGE_MISTAKES,
                         ids=[m[0] for m in RIDGE_MISTAKES])
@pytest.mark.mistake
def test_ridge_mistakes_are_named(name, how, kwargs, hint):
    ridge = hardware.get(ch08.DECODE_CHIP).critical_intensity()
    value = {"ridge": ridge, "half": ridge / 2}.get(how) or lm.decode_ridge_batch(
        ch08.decode_config(), ch08.DECODE_CHIP, ch08.DECODE_POSITION, **kwargs)
    r = ch08.check_ridge_batch(value)
    assert r.status == "failed" and hint in r.hint and r.answer, (name, r)


def test_ridge_honest_passes():
    assert ch08.check_ridge_batch(RIDGE).passed
    assert ch08.check_ridge_batch(math.ceil(RIDGE)).passed
    assert not ch08.check_ridge_batch(RIDGE * 1.2)
    assert "string" in ch08.check_ridge_batch(str(round(RIDGE))).message


def test_lab_registry():
    assert [e.kind for e in ch08.LAB.exercises] == ["predict", "write", "predict", "write",
                                                    "predict"]
    assert ch08.LAB.cpu_devices == 8 and checks.lab(8) is ch08.LAB
    for e in ch08.LAB.exercises:
        assert (e.hidden is not None) == (e.kind != "predict"), e.title
    assert not any(name.endswith("_reference") for name in vars(ch08))


# -- exercise 2: on 8 simulated devices ------------------------------------------------------

SCRIPT = r'''
import json
import jax, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec as P
from tpu_course import checks
from tpu_course.checks import ch08
from tpu_course.checks._answers import ch08 as ref

LAYOUT = {"embed": P(("data",), None), "wq": P("data", "model"), "wk": P("data", "model"),
          "wv": P("data", "model"), "wo": P("model", None, "data")}

def honest(state, mesh, layout=LAYOUT):
    # written differently: params by name, the optimizer's part with optax.tree_map_params
    params, opt = state
    shard = {k: NamedSharding(mesh, layout[k]) for k in params}
    tx = optax.adamw(1e-2)
    opt_s = optax.tree_map_params(tx, lambda _, s: s, opt, shard,
                                  transform_non_params=lambda _: NamedSharding(mesh, P()),
                                  is_leaf=lambda x: isinstance(x, NamedSharding))
    return shard, opt_s

def with_layout(**changes):
    return lambda state, mesh: honest(state, mesh, {**LAYOUT, **changes})

def params_only(state, mesh):
    shard, _ = honest(state, mesh)
    return shard, jax.tree.map(lambda _: NamedSharding(mesh, P()), state[1])

def params_dict(state, mesh):
    return honest(state, mesh)[0]

def typed_mesh(state, mesh):  # shards a (4, 2) mesh's heads by 2 explicitly: ok anywhere
    return honest(state, mesh)

ANSWERS = {
    "honest": honest,
    "heads_replicated": with_layout(wq=P("data"), wk=P("data"), wv=P("data"),
                                    wo=P(None, None, "data")),
    "embed_features": with_layout(embed=P(None, "data")),
    "kv_head_dim": with_layout(wk=P("data", None, "model"), wv=P("data", None, "model")),
    "wo_head_dim": with_layout(wo=P(None, "model", "data")),
    "params_only": params_only,
    "params_dict": params_dict,
    "no_fsdp": with_layout(wq=P(None, "model"), wk=P(None, "model"), wv=P(None, "model"),
                           wo=P("model")),
    "reference": ref.attention_shardings,
}
r = {}
for name in NAMES:
    res = ch08.check_attention_shardings(ANSWERS[name])
    r[name] = [res.status, res.message, res.hint]
if "honest" in NAMES:
    ex = ch08.LAB.find("Exercise 2")
    res = ex.grade_hidden({"attention_shardings": honest}, checks.grading_seed("someone", 8))
    r["hidden"] = [res.status, res.message, res.hint]
print(json.dumps(r))
'''

ATTENTION_MISTAKES = [
    ("heads_replicated", "heads of wq are not split", "heads axis on 'model'"),
    ("embed_features", "feature axis", "rows"),
    ("kv_head_dim", "all-to-all", "wk, wv split the head_dim"),
    ("wo_head_dim", "all-to-all", "wo splits the head_dim"),
    ("params_only", "Adam's first moment", "tree_map_params"),
    ("params_dict", "only the parameters' shardings", "opt_state"),
    ("no_fsdp", "not FSDP", "'data' too"),
    ("reference", "course's own function", "write this yourself"),
]


def run_attention_checks(subprocess_runner, names):
    """Exercise 2's checker on the named answers, in a process with 8 CPU devices."""
    return subprocess_runner(f"NAMES = {list(names)!r}\n" + SCRIPT, devices=8, timeout_s=300)


def test_attention_shardings_honest_passes_also_hidden(subprocess_runner):
    r = run_attention_checks(subprocess_runner, ["honest"])
    assert r["honest"][0] == "passed", r["honest"]
    assert "all-to-all" not in r["honest"][1] and "losses equal" in r["honest"][1]
    assert r["hidden"][0] == "passed" and "unseen" in r["hidden"][1], r["hidden"]


@pytest.mark.mistake
def test_attention_shardings_mistakes_are_named(subprocess_runner):
    r = run_attention_checks(subprocess_runner, [name for name, *_ in ATTENTION_MISTAKES])
    for name, words, hint in ATTENTION_MISTAKES:
        status, message, got_hint = r[name]
        where = message + " / " + got_hint
        assert status == "failed" and words in where and hint in where, (name, r[name])
