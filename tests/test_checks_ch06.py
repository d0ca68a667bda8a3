"""Lab 6 checkers accept the solution and reject plausible wrong answers.

The checkers compile on 8 simulated CPU devices, so each group runs in a subprocess with
that device count (one subprocess for all: compiling is the slow part)."""

from __future__ import annotations

from tpu_course import comms, hlo
from tpu_course.checks import NotWritten, ch06

SOLUTIONS = '''
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

def fsdp_spec(shape, axis, n):
    for d, size in enumerate(shape):
        if size % n == 0:
            return P(*([None] * d), axis)
    return P()

def shard_fsdp(step, state, mesh):
    n = mesh.shape["data"]
    s_state = jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), "data", n)), state)
    s_batch = NamedSharding(mesh, P("data"))
    rep = NamedSharding(mesh, P())
    def fsdp_step(state, batch):
        params = jax.lax.with_sharding_constraint(state.params, rep)
        return step(state._replace(params=params), batch)
    return jax.jit(fsdp_step, in_shardings=(s_state, s_batch), out_shardings=(s_state, rep)), s_state, s_batch

def bidirectional_all_reduce(x, axis, n):
    flat = x.reshape(-1)
    halves = jnp.pad(flat, (0, (-flat.size) % (2 * n))).reshape(2, n, -1)
    me = jax.lax.axis_index(axis)
    right = [(i, (i + 1) % n) for i in range(n)]
    left = [(i, (i - 1) % n) for i in range(n)]
    a, b = halves[0], halves[1]
    for s in range(n - 1):
        a = a.at[(me - 1 - s) % n].add(jax.lax.ppermute(a[(me - s) % n], axis, right))
        b = b.at[(me + 1 + s) % n].add(jax.lax.ppermute(b[(me + s) % n], axis, left))
    for s in range(n - 1):
        a = a.at[(me - s) % n].set(jax.lax.ppermute(a[(me + 1 - s) % n], axis, right))
        b = b.at[(me + s) % n].set(jax.lax.ppermute(b[(me - 1 + s) % n], axis, left))
    return jnp.stack([a, b]).reshape(-1)[: flat.size].reshape(x.shape)

def hierarchical_all_reduce(x):
    part = jax.lax.psum_scatter(x, "chip", scatter_dimension=0, tiled=True)
    return jax.lax.all_gather(jax.lax.psum(part, "slice"), "chip", axis=0, tiled=True)
'''

SCRIPT = SOLUTIONS + '''
import json
from tpu_course import parallel
from tpu_course.checks import ch06

def no_gather(step, state, mesh):  # in_shardings alone: the compiler reshards activations
    j, s, b = shard_fsdp(step, state, mesh)
    return jax.jit(step, in_shardings=(s, b), out_shardings=(s, NamedSharding(mesh, P()))), s, b

def replicated(step, state, mesh):  # DP, not FSDP
    s = jax.tree.map(lambda x: NamedSharding(mesh, P()), state)
    b = NamedSharding(mesh, P("data"))
    return jax.jit(step, in_shardings=(s, b), out_shardings=(s, NamedSharding(mesh, P()))), s, b

def raises(*a):
    raise ValueError("boom")

ag, ar = 134656, 1077288
r = {}
def put(key, res):
    r[key] = [res.status, res.message, res.hint]
put("fsdp", ch06.check_shard_fsdp(shard_fsdp))
put("fsdp_no_gather", ch06.check_shard_fsdp(no_gather))
put("fsdp_dp", ch06.check_shard_fsdp(replicated))
put("fsdp_pair", ch06.check_shard_fsdp(lambda *a: (1, 2)))
put("fsdp_raises", ch06.check_shard_fsdp(raises))
put("pred", ch06.check_fsdp_prediction({"all-gather": ag, "all-reduce": ar}, shard_fsdp))
put("pred_full_gather", ch06.check_fsdp_prediction({"all-gather": 8 * ag, "all-reduce": ar}, shard_fsdp))
put("pred_rs", ch06.check_fsdp_prediction({"all-gather": ag, "reduce-scatter": ar}, shard_fsdp))
put("pred_bits", ch06.check_fsdp_prediction({"all-gather": 8 * ag, "all-reduce": 8 * ar}, shard_fsdp))
put("pred_str", ch06.check_fsdp_prediction({"all-gather": "134656", "all-reduce": ar}, shard_fsdp))
put("pred_none", ch06.check_fsdp_prediction(None, shard_fsdp))
put("v5e", ch06.check_v5e_kind("reduce-scatter", shard_fsdp))
put("v5e_ar", ch06.check_v5e_kind("all-reduce", shard_fsdp))
put("v5e_garbage", ch06.check_v5e_kind(3, shard_fsdp))
put("bidi", ch06.check_bidirectional(bidirectional_all_reduce))
put("bidi_oneway", ch06.check_bidirectional(parallel.ring_all_reduce))
put("bidi_psum", ch06.check_bidirectional(lambda x, axis, n: jax.lax.psum(x, axis)))
put("bidi_identity", ch06.check_bidirectional(lambda x, axis, n: x))
put("hier", ch06.check_hierarchical(hierarchical_all_reduce))
put("hier_flat", ch06.check_hierarchical(lambda x: jax.lax.psum(x, ("slice", "chip"))))
put("hier_slice_only", ch06.check_hierarchical(lambda x: jax.lax.psum(x, "slice")))
print(json.dumps(r))
'''


def test_lab6_checkers(subprocess_runner):
    r = subprocess_runner(SCRIPT, devices=8, timeout_s=400)
    assert r["fsdp"][0] == "passed", r["fsdp"]
    assert r["fsdp_no_gather"][0] == "failed" and "with_sharding_constraint" in r["fsdp_no_gather"][2]
    assert r["fsdp_dp"][0] == "failed" and "replicated" in r["fsdp_dp"][1]
    assert r["fsdp_pair"][0] == "failed" and "three" in r["fsdp_pair"][1]
    assert r["fsdp_raises"][0] == "failed" and "ValueError" in r["fsdp_raises"][1]
    assert r["pred"][0] == "passed", r["pred"]
    assert r["pred_full_gather"][0] == "failed" and "shard" in r["pred_full_gather"][2]
    assert r["pred_rs"][0] == "failed" and "CPU backend" in r["pred_rs"][1]
    assert r["pred_bits"][0] == "failed" and "bits" in r["pred_bits"][2]
    assert r["pred_str"][0] == "failed" and "string" in r["pred_str"][1]
    assert r["pred_none"][0] == "failed" and "dict" in r["pred_none"][1]
    if hlo.tpu_compiler_available():
        assert r["v5e"][0] == "passed", r["v5e"]
        assert r["v5e_ar"][0] == "failed"
        assert r["v5e_garbage"][0] == "failed"
    else:
        assert r["v5e"][0] == "skipped" and "TPU compiler" in r["v5e"][1]
    assert r["bidi"][0] == "passed", r["bidi"]
    assert r["bidi_oneway"][0] == "failed" and "same way" in r["bidi_oneway"][1]
    assert r["bidi_psum"][0] == "failed" and "all-reduce" in r["bidi_psum"][1]
    assert r["bidi_identity"][0] == "failed" and "sum" in r["bidi_identity"][1]
    assert r["hier"][0] == "passed", r["hier"]
    assert r["hier_flat"][0] == "failed" and "cross" in r["hier_flat"][1]
    assert r["hier_slice_only"][0] == "failed" and "sum over all 8" in r["hier_slice_only"][1]


def test_strategy_checker():
    def right(chip, params, tokens, slices):
        rec = comms.recommend(chip, params, tokens, slices)
        return rec.within_slice, rec.across_slices
    assert ch06.check_strategy(right)
    r = ch06.check_strategy(lambda *a: ("dp", "dp"))
    assert not r and r.answer and "cost model" not in r.message
    r = ch06.check_strategy(lambda *a: "dp")
    assert not r and "pair" in r.message


def test_prediction_form_and_record(capsys):
    assert not ch06.check_fsdp_prediction({"all-gather": True}, lambda *a: None)
    assert not ch06.check_fsdp_prediction({"allgather": 1}, lambda *a: None)
    ch06.record_prediction({"all-gather": 1000, "all-reduce": 2000})
    assert "recorded" in capsys.readouterr().out
    ch06.record_prediction(NotWritten("Exercise 1"))
    assert "not written yet" in capsys.readouterr().out


def test_lab_registry():
    assert [e.kind for e in ch06.LAB.exercises].count("transfer") >= 1
    assert [e.kind for e in ch06.LAB.exercises].count("predict") >= 1
    assert [e.needs for e in ch06.LAB.exercises].count("tpu-compiler") == 1
    assert ch06.LAB.minutes == sum(e.minutes for e in ch06.LAB.exercises)
