"""tpu_course.parallel on 8 simulated CPU devices (in a subprocess) and compile-only v5e.

The reference for the collectives is tpu_course.comms (the cost model) set against what
XLA compiled (tpu_course.hlo); the reference for the numbers is the single-device step.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tpu_course import hlo, parallel, plans


def test_ring_schedule_sums_and_moves_2_n_minus_1_over_n():
    for n in (2, 3, 5, 8):
        frames = parallel.ring_schedule(n)
        assert len(frames) == 2 * (n - 1) + 1
        assert (frames[-1] == sum(10**i for i in range(n))).all()
        # after the reduce-scatter phase, device i holds the full sum of chunk (i+1) mod n
        mid = frames[n - 1]
        assert all(mid[i, (i + 1) % n] == sum(10**k for k in range(n)) for i in range(n))


def test_param_specs_tp_alternates_and_fsdp_divides():
    from jax.sharding import PartitionSpec as P
    params = {"a": {"kernel": np.zeros((8, 16)), "bias": np.zeros(16)},
              "b": {"kernel": np.zeros((16, 8)), "bias": np.zeros(8)},
              "c": {"kernel": np.zeros((8, 10)), "bias": np.zeros(10)}}
    tp = parallel.param_specs("tp", params, "m", 8)
    assert tp["a"]["kernel"] == P(None, "m") and tp["a"]["bias"] == P("m")
    assert tp["b"]["kernel"] == P("m", None) and tp["b"]["bias"] == P()
    assert tp["c"]["kernel"] == P()  # odd one out stays replicated
    fsdp = parallel.param_specs("fsdp", params, "d", 8)
    assert fsdp["a"]["kernel"] == P("d") and fsdp["c"]["bias"] == P()
    assert fsdp["c"]["kernel"] == P("d")
    with pytest.raises(ValueError, match="strategy"):
        parallel.param_specs("zero3", params)


# An 8-device mesh (simulated CPUs, or a compile-only TPU topology) and the MLP block's sizes.
MESH_8 = """
TARGET = {target!r}
if TARGET:
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=hlo.tpu_topology(TARGET).devices)
else:
    mesh = parallel.cpu_mesh((8,), ("data",))
B, D, F = 64, 256, 1024
out = {{}}
"""

HLO_VS_COMMS = """
import json, jax
from tpu_course import parallel, hlo, comms, plans
""" + MESH_8 + """for strategy in ("dp", "fsdp", "tp"):
    args = parallel.mlp_block_abstract(strategy, mesh, B, D, F)
    rep = hlo.inspect(step(parallel.mlp_block_step, strategy, mesh), *args, target=TARGET)
    got = rep.by_kind()
    want = plans.collective_bytes(strategy, {{"w1": (D, F), "w2": (F, D)}}, devices=8,
                                  batch=B, d_out=D).by_kind()
    out[strategy] = [sorted(got.items()), sorted(want.items())]
print(json.dumps(out))
"""


def _check(out):
    for strategy, (got, want) in out.items():
        assert got == want, f"{strategy}: compiled {got} vs predicted {want}"
    assert [k for k, _ in out["fsdp"][0]] == ["all-gather", "all-reduce", "reduce-scatter"]


def test_hlo_collectives_equal_cost_model_simulated_cpu(eight_devices):
    _check(eight_devices["hlo_vs_comms_cpu"])


def test_hlo_collectives_equal_cost_model_compile_only_v5e(eight_devices):
    if not hlo.tpu_compiler_available():
        pytest.skip(hlo.tpu_compiler_problem())
    _check(eight_devices["hlo_vs_comms_v5e"])


ANNOTATED = """
import json, jax, numpy as np
from tpu_course import parallel, hlo, comms, plans
""" + MESH_8 + """# on the v5e only FSDP's collectives are asserted: compile it alone
for strategy in ("fsdp",) if TARGET else ("dp", "fsdp", "tp"):
    args = parallel.mlp_block_abstract(strategy, mesh, B, D, F)
    rep = hlo.inspect(step(parallel.sharded_block_step, strategy, mesh), *args, target=TARGET)
    out[strategy] = sorted(rep.by_kind().items())
if not TARGET:  # the annotated steps compute what the single-device step computes
    params = parallel.mlp_block_params(D, F)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, D)).astype(np.float32); y = np.tanh(x)
    _, want = step(parallel.mlp_block_reference_step)(params, x, y)
    for strategy in ("dp", "fsdp", "tp"):
        pspec, xspec = parallel.mlp_block_specs(strategy)
        _, got = step(parallel.sharded_block_step, strategy, mesh)(  # the one inspected
            parallel.place(params, mesh, pspec), parallel.place(x, mesh, xspec),
            parallel.place(y, mesh, xspec))
        out[strategy + "_rel"] = abs(float(got) - float(want)) / abs(float(want))
print(json.dumps(out))
"""


def _got(pairs):
    return [(kind, tuple(v)) for kind, v in pairs]


def _plan(strategy):
    return sorted(plans.collective_bytes(strategy, {"w1": (256, 1024), "w2": (1024, 256)},
                                         devices=8, batch=64, d_out=256).by_kind().items())


def test_annotated_block_collectives_simulated_cpu(eight_devices):
    """By annotations alone, XLA's CPU backend emits what the cost model predicts for DP and
    TP; for FSDP the same bytes, with the gradients all-reduced (not reduce-scattered)."""
    out = eight_devices["annotated_cpu"]
    assert _got(out["dp"]) == _plan("dp")
    assert _got(out["tp"]) == _plan("tp")
    fsdp = dict(_got(out["fsdp"]))
    plan = dict(_plan("fsdp"))
    assert fsdp["all-gather"] == plan["all-gather"]
    assert fsdp["all-reduce"] == (3, plan["reduce-scatter"][1] + plan["all-reduce"][1])
    assert "reduce-scatter" not in fsdp
    for s in ("dp", "fsdp", "tp"):
        assert out[s + "_rel"] < 2e-5


def test_annotated_block_fsdp_reduce_scatters_on_v5e(eight_devices):
    if not hlo.tpu_compiler_available():
        pytest.skip(hlo.tpu_compiler_problem())
    out = eight_devices["annotated_v5e"]
    assert _got(out["fsdp"]) == _plan("fsdp")


SHARDED_PARITY = """
import json, jax, numpy as np
from tpu_course import comms, hlo, parallel, plans
mesh = parallel.cpu_mesh((8,), ("data",))
# the sizes (B, D, F) = (64, 256, 1024) of the parts above: their compiled steps are reused
params = parallel.mlp_block_params(256, 1024, seed=0)
rng = np.random.default_rng(1)
xs = rng.standard_normal((4, 64, 256)).astype(np.float32)
ys = np.tanh(xs[..., ::-1]).copy()
ref = step(parallel.mlp_block_reference_step)
p = {k: jax.numpy.asarray(v) for k, v in params.items()}
ref_losses = []
for x, y in zip(xs, ys):
    p, l = ref(p, x, y); ref_losses.append(float(l))
out = {"ref": ref_losses}
for s in ("dp", "fsdp", "tp"):
    pspec, xspec = parallel.mlp_block_specs(s)
    q = parallel.place(params, mesh, pspec)
    sharded = step(parallel.mlp_block_step, s, mesh)
    losses = []
    for x, y in zip(xs, ys):
        xb = parallel.place(x, mesh, xspec); yb = parallel.place(y, mesh, xspec)
        q, l = sharded(q, xb, yb); losses.append(float(l))
    out[s] = losses
    out[s + "_w1"] = float(np.abs(np.asarray(q["w1"]) - np.asarray(p["w1"])).max())
# the psum ring
from jax.sharding import PartitionSpec as P
v = jax.numpy.asarray(rng.standard_normal((8, 37)).astype(np.float32))
ring = jax.shard_map(lambda a: parallel.ring_all_reduce(a, "data", 8), mesh=mesh, in_specs=P("data"), out_specs=P("data"))
ps = jax.shard_map(lambda a: jax.lax.psum(a, "data"), mesh=mesh, in_specs=P("data"), out_specs=P("data"))
out["ring_err"] = float(np.abs(np.asarray(jax.jit(ring)(v)) - np.asarray(jax.jit(ps)(v))).max())
# GPipe
w = jax.numpy.asarray(rng.standard_normal((4, 8, 8)).astype(np.float32) / 3)
mbs = jax.numpy.asarray(rng.standard_normal((6, 2, 8)).astype(np.float32))
pmesh = parallel.cpu_mesh((4,), ("stage",))
f = lambda wi, a: jax.numpy.tanh(a @ wi)
outs, line = parallel.gpipe_forward(f, w, mbs, pmesh)
seq = mbs
for i in range(4):
    seq = f(w[i], seq)
out["pipe_err"] = float(np.abs(np.asarray(outs) - np.asarray(seq)).max())
out["timeline"] = np.asarray(line).tolist()
print(json.dumps(out))
"""


def test_sharded_training_matches_single_device_ring_and_pipeline(eight_devices):
    out = eight_devices["sharded_parity"]
    for s in ("dp", "fsdp", "tp"):
        np.testing.assert_allclose(out[s], out["ref"], rtol=1e-5, err_msg=s)
        assert out[s + "_w1"] < 1e-5, s
    assert out["ring_err"] < 1e-5
    assert out["pipe_err"] < 1e-5
    line = np.array(out["timeline"])
    assert line.shape == (4, 6 + 4 - 1)
    assert (line == -1).mean() == pytest.approx(3 / 9)  # (p-1)/(m+p-1)
    assert line[0].tolist()[:6] == list(range(6)) and line[3].tolist()[3:] == list(range(6))


CHAPTER5 = """
import json, numpy as np
from tpu_course import comms, hlo, parallel, plans
mesh = parallel.cpu_mesh((8,), ("data",))
rng = np.random.default_rng(0)
imgs = rng.integers(0, 255, (192, 28, 28), dtype=np.uint8)
labels = rng.integers(0, 10, (192,)).astype(np.int32)
out = {"single": parallel.train_chapter5(None, None, imgs, labels, steps=3)}
for s in ("dp", "fsdp", "tp"):
    out[s] = parallel.train_chapter5(s, mesh, imgs, labels, steps=3)
print(json.dumps(out))
"""


def test_chapter5_model_sharded_three_ways_matches_single_device(eight_devices):
    out = eight_devices["chapter5"]
    for s in ("dp", "fsdp", "tp"):
        np.testing.assert_allclose(out[s], out["single"], rtol=2e-5, err_msg=s)


#: What the parts share in their one interpreter: ``step(factory, *args)`` makes each jitted
#: step once, so a step compiled by ``hlo.inspect`` in one part is run, not compiled again,
#: by a later part with the same sizes.
SHARED = """
import json, traceback
from tpu_course import parallel
RESULTS, STEPS = {}, {}

def step(factory, *args):
    key = (factory.__name__, *args)
    if key not in STEPS:
        STEPS[key] = factory(*args)
    return STEPS[key]
"""


def _part(name: str, script: str) -> str:
    """``script`` (which prints its ``out`` as JSON) as a function whose result is kept
    under ``name``; a part that raises is kept as its traceback, for its own test."""
    body = script.replace("print(json.dumps(out))", "return out")
    return (f"def {name}():\n" + textwrap.indent(body, "    ") +
            f"\ntry:\n    RESULTS[{name!r}] = {name}()\nexcept Exception:\n"
            f"    RESULTS[{name!r}] = {{'error': traceback.format_exc()}}\n")


@pytest.fixture(scope="module")
def eight_devices(subprocess_runner):
    """Every 8-device program above, run in one fresh interpreter with 8 simulated CPU
    devices (one JAX start-up instead of one per test): each test reads its part's output."""
    parts = {"hlo_vs_comms_cpu": HLO_VS_COMMS.format(target=None),
             "annotated_cpu": ANNOTATED.format(target=None),
             "sharded_parity": SHARDED_PARITY, "chapter5": CHAPTER5}
    if hlo.tpu_compiler_available():
        parts.update(hlo_vs_comms_v5e=HLO_VS_COMMS.format(target="v5e:2x4"),
                     annotated_v5e=ANNOTATED.format(target="v5e:2x4"))
    code = SHARED + "".join(
        _part(name, script) for name, script in parts.items()) + "print(json.dumps(RESULTS))\n"
    results = subprocess_runner(code, devices=8, timeout_s=540)

    class Parts(dict):
        def __getitem__(self, name):
            out = super().__getitem__(name)
            if isinstance(out, dict) and set(out) == {"error"}:
                raise AssertionError(f"{name} failed in the subprocess:\n{out['error']}")
            return out
    return Parts(results)


def test_make_mesh_too_big_says_what_to_do():
    import jax
    with pytest.raises(ValueError, match="simulate_devices"):
        parallel.make_mesh((jax.device_count() + 1,), ("data",))
    with pytest.raises(ValueError, match="differ in length"):
        parallel.make_mesh((1,), ("a", "b"))


def test_layout_of_a_single_device_array_and_specs_like_for_adam():
    import jax
    import optax
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = parallel.make_mesh((1,), ("data",), jax.devices()[:1])
    a = jax.device_put(np.zeros((4, 4)), NamedSharding(mesh, P("data")))
    assert parallel.layout(a).tolist() == [[jax.devices()[0].id]]
    params = {"a": {"kernel": np.zeros((8, 16))}, "b": {"kernel": np.zeros((16, 8))}}
    specs = parallel.param_specs("tp", params, "m", 8)
    opt = optax.adam(1e-3).init(params)
    like = parallel._specs_like(opt, params, specs)
    mu = like[0].mu
    assert mu["a"]["kernel"] == P(None, "m") and mu["b"]["kernel"] == P("m", None)
    assert like[0].count == P()
