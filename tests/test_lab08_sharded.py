"""Lab 8's exercise 3, the sharded train step: its rules fed as data here, its probe on 8
simulated CPU devices in one subprocess (the test process has one device)."""

from __future__ import annotations

import pytest

from tpu_course.checks import ch08, engine

# -- Exercise 3: its rules on data, its probe on 8 devices ------------------------------------

GOOD = {"embed": (("data",), ()), "wq": (("data",), ("model",), ()),
        "wk": (("data",), ("model",), ()), "wv": (("data",), ("model",), ()),
        "wo": (("model",), (), ("data",))}


def _data(losses, params=(), moments=(), collectives=("all-gather", "all-reduce")):
    axes = {**GOOD, **dict(params)}
    axes |= {f"{n} {m}": a for n, a in list(axes.items()) for m in ("mu", "nu")} | dict(moments)
    return {"mesh": {"data": 4, "model": 2}, "axes": axes, "returned": dict(axes),
            "batch": ["data"], "collectives": list(collectives), "losses": losses}


@pytest.mark.parametrize(("changes", "words"), [
    ({}, ()),
    ({"moments": {"wq mu": ((), (), ())}}, ("first moment of wq is replicated", "tree_map_params")),
    ({"params": {"embed": ((), ("data",))}}, ("feature axis", "rows")),
    ({"params": {"wk": (("data",), (), ("model",))}, "collectives": ["all-to-all"]},
     ("wk splits the head_dim", "same axis")),
    ({"params": {n: (("data",), (), ()) for n in ("wq", "wk", "wv")}},
     ("heads of wq are not split", "axis 1 of wq")),
    ({"params": {"wq": ((), ("model",), ())}}, ("not FSDP", "'data' too")),
    ({"losses": (9.0, 9.0)}, ("differ from one device's", "shardings only")),
])
def test_attention_rules_name_the_problem(changes, words):
    ex = ch08.LAB.find(3)
    case = ex.cases[0]
    want = (5.5, 5.4)
    got = _data(changes.pop("losses", want), **changes)
    mistakes = [[(m, engine.NO_OUTPUT) for m in ex.rules]]
    result = engine.judge(ex, [case], [got], [want], mistakes)
    assert result.passed == (not words), result
    assert all(w in f"{result.message} / {result.hint}" for w in words), result


SCRIPT = r'''
import json, jax, numpy as np, optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from tests import assess
from tpu_course.checks import ch08

LAYOUT = {"embed": P(("data",), None), "wq": P("data", "model"), "wk": P("data", "model"),
          "wv": P("data", "model"), "wo": P("model", None, "data")}

def honest(step, state, mesh_shape, layout=LAYOUT, batch=P("data"), moments=True, out=True):
    # params by name, the optimizer's part with optax.tree_map_params, the mesh by hand
    devices = jax.devices()[: mesh_shape[0] * mesh_shape[1]]
    mesh = jax.sharding.Mesh(np.array(devices).reshape(mesh_shape), ("data", "model"),
                             axis_types=(AxisType.Auto,) * 2)
    shard = {k: NamedSharding(mesh, layout[k]) for k in state[0]}
    whole = NamedSharding(mesh, P())
    opt = optax.tree_map_params(optax.adamw(1e-2), lambda _, s: s, state[1], shard,
                                transform_non_params=lambda _: whole,
                                is_leaf=lambda x: isinstance(x, NamedSharding))
    if not moments:
        opt = jax.tree.map(lambda _: whole, state[1])
    kw = {"out_shardings": ((shard, opt) if out else whole, whole)}
    return jax.jit(step, in_shardings=((shard, opt), NamedSharding(mesh, batch)), **kw)

def variant(**changes):
    return lambda step, state, mesh_shape: honest(step, state, mesh_shape, **changes)

out = {"honest": assess.graded(8, "Exercise 3", honest)}
for name, answer in {
        "kv_head_dim": variant(layout={**LAYOUT, "wk": P("data", None, "model"),
                                       "wv": P("data", None, "model")}),
        "indivisible": variant(layout={**LAYOUT, "wq": P(None, ("data", "model"))}),
        "batch_whole": variant(batch=P()), "moments_whole": variant(moments=False),
        "state_back_whole": variant(out=False),
        "mesh_fixed": lambda step, state, mesh_shape: honest(step, state, (8, 1)),
        "not_jitted": lambda step, state, mesh_shape: step,
        "raises": lambda step, state, mesh_shape: state.nope}.items():
    out[name] = ch08.check_sharded_step(answer)
print(json.dumps({k: [r.status, r.message, r.hint] for k, r in out.items()}))
'''


def test_the_sharded_step_on_eight_devices(subprocess_runner):
    r = subprocess_runner(SCRIPT, devices=8, timeout_s=300)
    assert r["honest"][0] == "passed" and "not shown" in r["honest"][1], r["honest"]
    for name, words in {"kv_head_dim": ("all-to-all", "wk, wv split the head_dim"),
                        "indivisible": ("lowered and compiled raised", "mesh axes divide"),
                        "batch_whole": ("batch is replicated", "P('data')"),
                        "moments_whole": ("moment of embed is replicated", "tree_map_params"),
                        "state_back_whole": ("returns it split over", "laid out as it came in"),
                        "mesh_fixed": ("{'data': 8, 'model': 1}", "jax.make_mesh(mesh_shape"),
                        "not_jitted": ("not a jax.jit function", "in_shardings"),
                        "raises": ("raised AttributeError", "jax.jit(step")}.items():
        status, message, hint = r[name]
        assert status == "failed" and all(w in f"{message} / {hint}" for w in words), (name, r[name])
