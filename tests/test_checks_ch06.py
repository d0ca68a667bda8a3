"""Lab 6 checkers: honest solutions written differently from the course's pass (also on
the grader's hidden inputs), and every typical mistake and shortcut fails with its own hint.

The FSDP and collective checkers compile on simulated CPU devices, so they run in one
subprocess with 8 devices (compiling is the slow part); exercise 6 runs here.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from tpu_course import comms, hardware, hlo
from tpu_course.checks import _core, ch06
from tpu_course.checks._answers import ch06 as ref


def choose(chip, params, tokens_per_slice, slices):
    # the chapter's two rules written as times per parameter, not as thresholds
    c = hardware.get(chip)
    inside = "dp" if 10 * params <= c.hbm_bytes else "fsdp"
    if slices < 2:
        return inside, "none"
    comms_s = 4 * 2 * (slices - 1) / slices / c.dcn_bytes_per_s  # fp32 ring, per parameter
    math_s = 4 * tokens_per_slice / c.peak_bf16_flops_per_s  # backward pass, per parameter
    return inside, ("dp" if math_s >= comms_s else "pipeline")


honest_choose = choose
CHOOSE = "from tpu_course import hardware\n" + inspect.getsource(choose)

# Honest answers, each written differently from the course's (tpu_course/checks/_answers).
HONEST = '''
import functools
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

def shard_fsdp(step, state, mesh):
    # the LAST dimension the axis divides, specs by path, the constraint through a closure
    size = mesh.shape["data"]
    def spec_of(path, leaf):
        dims = [d for d, s in enumerate(np.shape(leaf)) if s % size == 0]
        if not dims:
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, P(*[("data" if d == dims[-1] else None)
                                       for d in range(np.ndim(leaf))]))
    shardings = jax.tree_util.tree_map_with_path(spec_of, state)
    whole = NamedSharding(mesh, P())
    gather = functools.partial(jax.lax.with_sharding_constraint, shardings=whole)
    @functools.partial(jax.jit, in_shardings=(shardings, NamedSharding(mesh, P("data"))),
                       out_shardings=(shardings, whole))
    def run(st, batch):
        return step(st._replace(params=gather(st.params)), batch)
    return run, shardings, NamedSharding(mesh, P("data"))

def _ring(chunks, axis, n, shift):
    # one ring over n chunks in direction shift (+1 right, -1 left): reduce-scatter, all-gather
    me = jax.lax.axis_index(axis)
    pairs = [(i, (i + shift) % n) for i in range(n)]
    for s in range(n - 1):
        send = (me - shift * s) % n
        chunks = chunks.at[(send - shift) % n].add(jax.lax.ppermute(chunks[send], axis, pairs))
    for s in range(n - 1):
        send = (me + shift * (1 - s)) % n
        chunks = chunks.at[(send - shift) % n].set(jax.lax.ppermute(chunks[send], axis, pairs))
    return chunks

def bidirectional_all_reduce(x, axis, n):
    flat = x.ravel()
    pad = (-flat.size) % (2 * n)
    both = jnp.concatenate([flat, jnp.zeros(pad, flat.dtype)]).reshape(2, n, -1)
    out = jnp.concatenate([_ring(both[0], axis, n, +1).ravel(),
                           _ring(both[1], axis, n, -1).ravel()])
    return out[: flat.size].reshape(x.shape)

def hierarchical_all_reduce(x):
    flat = x.reshape(-1)  # scatter the flat array, not its rows
    mine = jax.lax.psum_scatter(flat, "chip", tiled=True)
    mine = jax.lax.psum(mine, "slice")
    return jax.lax.all_gather(mine, "chip", tiled=True).reshape(x.shape)
''' + CHOOSE

SCRIPT = HONEST + '''
import json
from tpu_course import checks, parallel
from tpu_course.checks import ch06
from tpu_course.checks._answers import ch06 as ref

def variant(change):  # the honest FSDP, with one thing changed
    def wrong(step, state, mesh):
        j, s, b = shard_fsdp(step, state, mesh)
        return change(step, state, mesh, j, s, b)
    return wrong

whole = lambda mesh: NamedSharding(mesh, P())

def moments_whole(step, state, mesh, j, s, b, which=("mu", "nu")):
    adam = s.opt_state[0]._replace(**{m: jax.tree.map(lambda _: whole(mesh), getattr(s.opt_state[0], m))
                                     for m in which})
    s = s._replace(opt_state=(adam, *s.opt_state[1:]))
    def fsdp_step(st, batch):
        return step(st._replace(params=jax.lax.with_sharding_constraint(st.params, whole(mesh))), batch)
    return jax.jit(fsdp_step, in_shardings=(s, b), out_shardings=(s, whole(mesh))), s, b

def params_only(step, state, mesh):  # shardings built over state.params only, moments whole
    return variant(moments_whole)(step, state, mesh)

def nu_whole(step, state, mesh):
    return variant(lambda *a: moments_whole(*a, which=("nu",)))(step, state, mesh)

def state_back_whole(step, state, mesh, j, s, b):
    def fsdp_step(st, batch):
        return step(st._replace(params=jax.lax.with_sharding_constraint(st.params, whole(mesh))), batch)
    rep = jax.tree.map(lambda _: whole(mesh), s)
    return jax.jit(fsdp_step, in_shardings=(s, b), out_shardings=(rep, whole(mesh))), s, b

def no_gather(step, state, mesh):  # in_shardings alone: the compiler reshards activations
    j, s, b = eight_always(step, state, mesh)  # (first dimensions split)
    return jax.jit(step, in_shardings=(s, b), out_shardings=(s, whole(mesh))), s, b

def replicated(step, state, mesh):  # DP, not FSDP
    s = jax.tree.map(lambda x: whole(mesh), state)
    b = NamedSharding(mesh, P("data"))
    return jax.jit(step, in_shardings=(s, b), out_shardings=(s, whole(mesh))), s, b

def eight_always(step, state, mesh):  # the notebook's 8 devices typed in
    rep = NamedSharding(mesh, P())
    def spec(x):
        for d, size in enumerate(np.shape(x)):
            if size % 8 == 0:
                return P(*([None] * d), "data")
        return P()
    s = jax.tree.map(lambda x: NamedSharding(mesh, spec(x)), state)
    b = NamedSharding(mesh, P("data"))
    def fsdp_step(st, batch):
        return step(st._replace(params=jax.lax.with_sharding_constraint(st.params, rep)), batch)
    return jax.jit(fsdp_step, in_shardings=(s, b), out_shardings=(s, rep)), s, b

def package_fsdp(step, state, mesh):
    return parallel.make_sharded_train_step(step, "fsdp", state, mesh)

def raises(*a):
    raise ValueError("boom")

def one_way(x, axis, n):  # the chapter's ring, written by hand: every chunk goes right
    flat = x.ravel()
    chunks = jnp.pad(flat, (0, (-flat.size) % n)).reshape(n, -1)
    return _ring(chunks, axis, n, +1).ravel()[: flat.size].reshape(x.shape)

def ring_of_8(x, axis, n):
    return bidirectional_all_reduce(x, axis, 8)

ag, ar = 134656, 1077288
r = {}
def put(key, res):
    r[key] = [res.status, res.message, res.hint, res.answer]

# HONEST and MISTAKES (set before this script): the honest answers, each typical mistake
if HONEST:
    put("fsdp", ch06.check_shard_fsdp(shard_fsdp))
    _refuse = ch06.refuse_course_code  # the package's FSDP step through lab 6's own logic
    ch06.refuse_course_code = lambda *a, **k: None
    put("package_fsdp_logic", ch06.check_shard_fsdp(package_fsdp))
    ch06.refuse_course_code = _refuse
    put("pred", ch06.check_fsdp_prediction({"all-gather": ag, "all-reduce": ar}, shard_fsdp))
    ch06.LAB.predict("Exercise 1", {"all-gather": ag, "all-reduce": ar})
    ch06.LAB.predicted("Exercise 1")  # the measurement shows: locked
    put("pred_edited_after",
        ch06.check_fsdp_prediction({"all-gather": 1, "all-reduce": 1}, shard_fsdp))
    put("v5e", ch06.check_v5e_kind("reduce-scatter", shard_fsdp))
    put("bidi", ch06.check_bidirectional(bidirectional_all_reduce))
    put("hier", ch06.check_hierarchical(hierarchical_all_reduce))
if MISTAKES:
    put("fsdp_params_only", ch06.check_shard_fsdp(params_only))
    put("fsdp_nu", ch06.check_shard_fsdp(nu_whole))
    put("fsdp_back_whole", ch06.check_shard_fsdp(variant(state_back_whole)))
    put("fsdp_no_gather", ch06.check_shard_fsdp(no_gather))
    put("fsdp_dp", ch06.check_shard_fsdp(replicated))
    put("fsdp_pair", ch06.check_shard_fsdp(lambda *a: (1, 2)))
    put("fsdp_raises", ch06.check_shard_fsdp(raises))
    put("fsdp_reference", ch06.check_shard_fsdp(ref.shard_fsdp))
    put("fsdp_package", ch06.check_shard_fsdp(package_fsdp))
    put("fsdp_eight", ch06.check_shard_fsdp(eight_always))
    put("fsdp_eight_hidden", ch06.check_shard_fsdp(eight_always, width=196, devices=4))
    put("pred_moments_whole",
        ch06.check_fsdp_prediction({"all-gather": ag, "all-reduce": ar}, params_only))
    put("v5e_ar", ch06.check_v5e_kind("all-reduce", shard_fsdp))
    put("v5e_garbage", ch06.check_v5e_kind(3, shard_fsdp))
    put("bidi_oneway", ch06.check_bidirectional(one_way))
    put("bidi_package", ch06.check_bidirectional(parallel.ring_all_reduce))
    put("bidi_reference", ch06.check_bidirectional(
        lambda x, axis, n: ref.bidirectional_all_reduce(x, axis, n)))
    put("bidi_psum", ch06.check_bidirectional(lambda x, axis, n: jax.lax.psum(x, axis)))
    put("bidi_identity", ch06.check_bidirectional(lambda x, axis, n: x))
    put("bidi_ring_of_8_hidden", ch06.check_bidirectional(ring_of_8, n=4, block=(2, 9)))
    put("hier_flat", ch06.check_hierarchical(lambda x: jax.lax.psum(x, ("slice", "chip"))))
    put("hier_two_psums", ch06.check_hierarchical(
        lambda x: jax.lax.psum(jax.lax.psum(x, "chip"), "slice")))
    put("hier_slice_only", ch06.check_hierarchical(lambda x: jax.lax.psum(x, "slice")))
    put("hier_reference", ch06.check_hierarchical(ref.hierarchical_all_reduce))

names = {"predicted_fsdp": {"all-gather": ag, "all-reduce": ar}, "shard_fsdp": shard_fsdp,
         "predicted_v5e_kind": "reduce-scatter",
         "bidirectional_all_reduce": bidirectional_all_reduce,
         "hierarchical_all_reduce": hierarchical_all_reduce, "choose": choose}
seed = checks.grading_seed("someone", 6)
if HONEST:
    r["graded"] = [[g.status, g.message] for g in ch06.LAB.grade(names, seed=seed)]
if MISTAKES:
    wrong = dict(names, shard_fsdp=eight_always, bidirectional_all_reduce=ring_of_8)
    r["graded_wrong"] = [[g.status, g.message] for g in ch06.LAB.grade(wrong, seed=seed)]
print(json.dumps(r))
'''


def run_lab6_checks(subprocess_runner, mistakes):
    """Lab 6's compiling checkers on the honest answers, or (``mistakes``) on each typical
    mistake, in one process with 8 CPU devices."""
    flags = f"HONEST, MISTAKES = {not mistakes}, {mistakes}\n"
    return subprocess_runner(flags + SCRIPT, devices=8, timeout_s=600)


def test_lab6_compiling_checkers_pass_honest_answers(subprocess_runner):
    r = run_lab6_checks(subprocess_runner, mistakes=False)
    # exercise 2: the honest FSDP passes
    assert r["fsdp"][0] == "passed", r["fsdp"]
    assert "Adam's moments sharded" in r["fsdp"][1]
    # parallel.make_sharded_train_step("fsdp") is FSDP by lab 6's check: gathers, no all-to-all
    assert r["package_fsdp_logic"][0] == "passed", r["package_fsdp_logic"]
    # exercise 1: graded on a right FSDP step
    assert r["pred"][0] == "passed", r["pred"]
    assert r["pred_edited_after"][0] == "passed"  # the locked prediction is graded
    assert "recorded before the measurement" in r["pred_edited_after"][1]
    if hlo.tpu_compiler_available():
        assert r["v5e"][0] == "passed", r["v5e"]
        kinds = r["v5e"][1].split("All kinds:")[1]
        # a permute appears when a shard is not whole 8-row tiles (the notebook's 784-row
        # weight split on rows: 43,008 B); the message then says what it is
        assert ("collective-permute" not in kinds) or "realigns shards" in r["v5e"][1]
    else:
        assert r["v5e"][0] == "skipped" and "TPU compiler" in r["v5e"][1]
    assert r["bidi"][0] == "passed", r["bidi"]  # exercise 4
    assert r["hier"][0] == "passed", r["hier"]  # exercise 5
    # the grader: the honest answers pass the hidden inputs too
    graded = dict(zip([e.title for e in ch06.LAB.exercises], r["graded"]))
    for title, (status, message) in graded.items():
        if title == ch06.EX3 and not hlo.tpu_compiler_available():
            assert status == "skipped"
        elif title == ch06.EX7:  # its own test below (a two-process run per check)
            assert status == "not written"
        else:
            assert status == "passed", (title, message)


@pytest.mark.mistake
def test_lab6_compiling_checkers_name_each_mistake(subprocess_runner):
    r = run_lab6_checks(subprocess_runner, mistakes=True)
    # exercise 2: each mistake gets its own message
    status, message, hint, _ = r["fsdp_params_only"]
    assert status == "failed" and "Adam's moments are replicated" in message, message
    assert "optimizer state" in hint and "state.params" in hint
    assert r["fsdp_nu"][0] == "failed" and "second moment (nu)" in r["fsdp_nu"][1]
    assert r["fsdp_back_whole"][0] == "failed" and "comes back whole" in r["fsdp_back_whole"][1]
    assert "out_shardings" in r["fsdp_back_whole"][2] and r["fsdp_back_whole"][3]
    assert r["fsdp_no_gather"][0] == "failed" and "with_sharding_constraint" in r["fsdp_no_gather"][2]
    assert r["fsdp_dp"][0] == "failed" and "params" in r["fsdp_dp"][1]
    assert "replicated" in r["fsdp_dp"][1] and "parameter" in r["fsdp_dp"][1]
    assert r["fsdp_pair"][0] == "failed" and "three" in r["fsdp_pair"][1]
    assert r["fsdp_raises"][0] == "failed" and "ValueError" in r["fsdp_raises"][1]
    for key in ("fsdp_reference", "fsdp_package"):
        assert r[key][0] == "failed" and "course's own function" in r[key][1], r[key]
    assert r["fsdp_eight"][0] == "passed"  # the notebook's mesh cannot tell...
    assert r["fsdp_eight_hidden"][0] == "failed"  # ...another mesh and width can
    assert "replicated" in r["fsdp_eight_hidden"][1]
    # exercise 1: never graded with a misleading hint while exercise 2 fails
    status, message, hint, _ = r["pred_moments_whole"]
    assert status == "failed" and "exercise 2 does not pass yet" in message, message
    assert "Adam's moments are replicated" in message and "exercise 2's check pass" in hint
    if hlo.tpu_compiler_available():
        assert r["v5e_ar"][0] == "failed"
        assert r["v5e_garbage"][0] == "failed"
    # exercise 4
    assert r["bidi_oneway"][0] == "failed" and "same way" in r["bidi_oneway"][1]
    for key in ("bidi_package", "bidi_reference"):
        assert r[key][0] == "failed" and "course's own function" in r[key][1], r[key]
    assert r["bidi_psum"][0] == "failed" and "all-reduce" in r["bidi_psum"][1]
    assert r["bidi_identity"][0] == "failed" and "sum" in r["bidi_identity"][1]
    assert r["bidi_ring_of_8_hidden"][0] == "failed"
    # exercise 5
    assert r["hier_flat"][0] == "failed" and "cross" in r["hier_flat"][1]
    assert r["hier_two_psums"][0] == "failed" and "cross" in r["hier_two_psums"][1]
    assert r["hier_slice_only"][0] == "failed" and "sum over all 8" in r["hier_slice_only"][1]
    assert r["hier_reference"][0] == "failed" and "course's own" in r["hier_reference"][1]
    # the grader: typed-in sizes fail the hidden inputs
    wrong = dict(zip([e.title for e in ch06.LAB.exercises], r["graded_wrong"]))
    for title in (ch06.EX2, ch06.EX4):
        status, message = wrong[title]
        assert status == "failed" and "does not show (" in message, (title, message)


# -- exercise 6: no devices needed ----------------------------------------------------------


def rule(bytes_per_param=10, scale=None):
    """A wrong rule: another count of bytes per parameter, or another DCN threshold."""
    def choose(chip, params, tokens, slices):
        c = hardware.get(chip)
        inside = "fsdp" if bytes_per_param * params > c.hbm_bytes else "dp"
        if slices == 1:
            return inside, "none"
        factor = scale(slices) if scale else 2 * (slices - 1) / slices
        threshold = factor * c.peak_bf16_flops_per_s / c.dcn_bytes_per_s
        return inside, ("dp" if tokens >= threshold else "pipeline")
    return choose


def uses_recommend(chip, params, tokens, slices):
    rec = comms.recommend(chip, params, tokens, slices)
    return rec.within_slice, rec.across_slices


def uses_threshold(chip, params, tokens, slices):
    inside = "fsdp" if 10 * params > hardware.get(chip).hbm_bytes else "dp"
    if slices == 1:
        return inside, "none"
    enough = tokens >= comms.dcn_min_tokens_per_slice(chip, slices)
    return inside, "dp" if enough else "pipeline"


STRATEGY_MISTAKES = [
    ("book", rule(scale=lambda s: 1.0), "scaling book's rule"),
    ("six_flops", rule(scale=lambda s: 2 * (s - 1) / s * 4 / 6), "all 6 FLOPs"),
    ("64_bits", rule(scale=lambda s: 2.0), "many-slice limit"),
    ("half", rule(scale=lambda s: (s - 1) / s), "not (S-1)/S"),
    ("16_bytes", rule(bytes_per_param=16), "you count 16 bytes per parameter"),
    ("4_bytes", rule(bytes_per_param=4), "fp32 parameters alone"),
    ("swapped", lambda *a: tuple({"dp": "fsdp", "fsdp": "dp"}.get(x, x) if i == 0 else x
                                 for i, x in enumerate(honest_choose(*a))), "swapped"),
    ("one_slice", lambda c, p, t, s: (honest_choose(c, p, t, s)[0], "dp" if s == 1 else
                                      honest_choose(c, p, t, s)[1]), "'none'"),
]


@pytest.mark.parametrize("name, choose, words", STRATEGY_MISTAKES, ids=[m[0] for m in STRATEGY_MISTAKES])
@pytest.mark.mistake
def test_strategy_mistakes_are_named(name, choose, words):
    r = ch06.check_strategy(choose)
    assert r.status == "failed" and r.answer, r
    assert words in r.hint, (name, r.hint)


def test_strategy_honest_passes_also_hidden_and_course_code_is_refused():
    assert ch06.check_strategy(honest_choose), ch06.check_strategy(honest_choose)
    graded = ch06.LAB.exercises[5].grade_hidden({"choose": honest_choose},
                                                _core.grading_seed("someone", 6))
    assert graded.passed and "unseen" in graded.message, graded
    for cheat in (uses_recommend, uses_threshold, ref.choose, lambda *a: ref.choose(*a)):
        r = ch06.check_strategy(cheat)
        assert r.status == "failed" and "course's own function" in r.message, r


def test_strategy_cases_separate_the_two_rules_and_every_slip():
    truth = [ref.choose(*c) for c in ch06.STRATEGY_CASES]
    assert truth == [(r.within_slice, r.across_slices) for r in
                     (comms.recommend(*c) for c in ch06.STRATEGY_CASES)]
    for _, wrong, _ in STRATEGY_MISTAKES:
        assert [wrong(*c) for c in ch06.STRATEGY_CASES] != truth
    hidden = ch06._strategy_hidden(np.random.default_rng(0))[0][1]["cases"]
    assert [ref.choose(*c) for c in hidden] == [(r.within_slice, r.across_slices) for r in
                                                (comms.recommend(*c) for c in hidden)]


@pytest.mark.mistake
def test_strategy_garbage():
    r = ch06.check_strategy(lambda *a: "dp")
    assert not r and "pair" in r.message
    r = ch06.check_strategy(lambda c, p, t, s: honest_choose(c, p, t, s)[::-1])
    assert not r and "in that order" in r.message
    r = ch06.check_strategy(lambda *a: ("DP", "None"))
    assert not r and "lower case" in r.hint
    r = ch06.check_strategy(lambda *a: 1 / 0)
    assert not r and "ZeroDivisionError" in r.message


class FakeReport:  # what the CPU compiled for the chapter-5 FSDP step (see the test above)
    def by_kind(self):
        return {"all-gather": (5, 134656), "all-reduce": (10, 1077304)}


AG, AR = 134656, 1077288
PREDICTION_MISTAKES = [
    ("right", {"all-gather": AG, "all-reduce": AR}, "passed", "", ""),
    ("full_gather", {"all-gather": 8 * AG, "all-reduce": AR}, "failed", "", "shard each device"),
    ("gradient_shard", {"all-gather": AG, "all-reduce": AR / 8}, "failed", "", "whole gradient"),
    ("reduce_scatter", {"all-gather": AG, "reduce-scatter": AR}, "failed", "CPU backend", ""),
    ("bits", {"all-gather": 8 * AG, "all-reduce": 8 * AR}, "failed", "8x", "bits or bytes"),
    ("fp64", {"all-gather": 2 * AG, "all-reduce": 2 * AR}, "failed", "", "not 8"),
    ("missing_kind", {"all-gather": AG}, "failed", "you predicted", "sums the gradients"),
    ("string", {"all-gather": "134656", "all-reduce": AR}, "failed", "string", ""),
    ("none", None, "failed", "dict", ""),
    ("kind_name", {"allgather": AG}, "failed", "not a collective kind", "HLO names"),
]


@pytest.mark.parametrize("name, predicted, status, words, hint", PREDICTION_MISTAKES,
                         ids=[m[0] for m in PREDICTION_MISTAKES])
@pytest.mark.mistake
def test_prediction_mistakes_are_named(monkeypatch, name, predicted, status, words, hint):
    monkeypatch.setattr(ch06, "_needs_exercise2", lambda *a, **k: FakeReport())
    r = ch06.check_fsdp_prediction(predicted, lambda *a: None)
    assert r.status == status and words in r.message and hint in r.hint, (name, r)
    assert r.passed or r.answer or words in ("string", "dict", "not a collective kind")


def test_prediction_form():
    assert not ch06.check_fsdp_prediction({"all-gather": True}, lambda *a: None)
    assert not ch06.check_fsdp_prediction({"allgather": 1}, lambda *a: None)
    assert "string" in ch06.check_fsdp_prediction({"all-gather": "1"}, lambda *a: None).message
    assert not hasattr(ch06, "record_prediction")  # LAB.predict replaces it


def test_lab_registry():
    kinds = [e.kind for e in ch06.LAB.exercises]
    assert kinds.count("apply") >= 1 and kinds.count("predict") == 2
    assert [e.needs for e in ch06.LAB.exercises].count("tpu-compiler") == 1
    assert ch06.LAB.minutes == sum(e.minutes for e in ch06.LAB.exercises)
    for e in ch06.LAB.exercises:  # every written function is also checked on unseen inputs
        assert (e.hidden is not None) == (e.kind != "predict"), e.title
    assert not any(name.endswith("_reference") for name in vars(ch06))
    assert not hasattr(ch06, "_cpu_mesh") and not hasattr(ch06, "fsdp_param_bytes")


# -- exercise 7: each process's rows, graded in real two-process runs ------------------------

ROWS = """
import numpy as np


def rows_by_mesh(global_batch, sharding):
    # honest, written differently: walk the mesh's data axis, keep this process's blocks
    import jax
    mesh = sharding.mesh
    n = mesh.shape["data"]
    size = len(global_batch) // n
    devices = np.moveaxis(mesh.devices, mesh.axis_names.index("data"), 0).reshape(n, -1)
    mine = [k for k in range(n) if any(d.process_index == jax.process_index() for d in devices[k])]
    return np.concatenate([global_batch[k * size:(k + 1) * size] for k in mine])


def contiguous(global_batch, sharding):  # the chapter's slice: right only when devices are together
    import jax
    per = len(global_batch) // jax.process_count()
    return global_batch[jax.process_index() * per:(jax.process_index() + 1) * per]


def whole(global_batch, sharding):
    return global_batch


def every_device(global_batch, sharding):  # one block per device: replicas fed twice
    index = sharding.addressable_devices_indices_map(global_batch.shape)
    return np.concatenate([global_batch[i[0]] for i in index.values()])
"""


@pytest.fixture(scope="module")
def rows_module(tmp_path_factory):
    import importlib.util
    path = tmp_path_factory.mktemp("rows") / "learner_rows.py"
    path.write_text(ROWS)
    spec = importlib.util.spec_from_file_location("learner_rows", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_process_rows_honest_passes_on_both_meshes(rows_module):
    r = ch06.check_process_rows(rows_module.rows_by_mesh)
    assert r.passed and "0, 1, 2, 3, 8, 9, 10, 11" in r.message, r
    (what, kwargs), = ch06._rows_cases(np.random.default_rng(0))
    assert "same block" in what
    r = ch06.check_process_rows(rows_module.rows_by_mesh, **kwargs)
    assert r.passed, r


ROWS_MISTAKES = [
    ("contiguous", {}, "one contiguous block", "addressable_devices_indices_map"),
    ("whole", {}, "whole global batch", "only the rows its own devices hold"),
    ("every_device", {"mesh_kind": "replicated", "rows": 8}, "rows twice", "exactly once"),
]


@pytest.mark.parametrize("name, kwargs, words, hint", ROWS_MISTAKES, ids=[m[0] for m in ROWS_MISTAKES])
@pytest.mark.mistake
def test_process_rows_mistakes_are_named(rows_module, name, kwargs, words, hint):
    r = ch06.check_process_rows(getattr(rows_module, name), **kwargs)
    assert r.status == "failed" and words in r.message and hint in r.hint, (name, r)


@pytest.mark.mistake
def test_process_rows_refuses_course_code_and_lambdas():
    from tpu_course import multihost
    for cheat in (ref.process_rows, multihost.check_rows):
        r = ch06.check_process_rows(cheat)
        assert r.status == "failed" and "course's own function" in r.message, r
    r = ch06.check_process_rows(lambda b, s: b)
    assert r.status == "failed" and "lambda" in r.message, r


def test_permute_note_explains_the_v5e_padding_permute():
    """Lab 6 Ex 3's 43,008-byte collective-permute (seen in the v5e-8 compile): 784 rows
    over 8 devices are 98-row shards, padded to 104-row tiles for the reduce-scatter; the
    note derives 42 rows (7 x 6) from the shapes, and says nothing for another permute."""
    from types import SimpleNamespace as NS

    import jax

    def report(*collectives):
        return NS(collectives=[NS(kind=k, shape=s, bytes=b) for k, s, b in collectives])

    state = [jax.ShapeDtypeStruct((784, 256), np.float32), jax.ShapeDtypeStruct((256,), np.float32)]
    seen = report(("reduce-scatter", (832, 256), 851_968),
                  ("collective-permute", (42, 256), 43_008))
    note = ch06._permute_note(seen, state, 8)
    assert "43,008-byte collective-permute" in note and "8 pieces of 104 rows" in note
    assert "shards of 98 rows" in note and "7 x 6 = 42" in note
    assert ch06._permute_note(report(("collective-permute", (5, 256), 5120)), state, 8) == ""
    assert ch06._permute_note(report(("all-gather", (98, 256), 100_352)), state, 8) == ""
    whole_tiles = [jax.ShapeDtypeStruct((1024, 256), np.float32)]
    assert ch06._permute_note(seen, whole_tiles, 8) == ""
