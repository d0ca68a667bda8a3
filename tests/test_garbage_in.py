"""Garbage in, a course error out: the public entry points refuse nonsense by name.

Each case calls a public function with valid arguments except one, which hypothesis
replaces with garbage (negative, zero, NaN, infinite, the wrong type, an unknown name).
The call may succeed (when the garbage happens to be valid), or it must raise one of the
course's own errors (a ``tpu_course.errors.CourseError``, which is also a ``ValueError``
or ``TypeError``) with a message that names the argument: never a ``ZeroDivisionError``,
``KeyError``, ``AttributeError``, ``IndexError`` or a numpy casting error.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import tempfile
import types
import warnings
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_course import comms, costs, data, errors, hardware, plans, roofline, systolic

GARBAGE = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([-1e9, -1.5, -0.0, 0.0, 2.5, 64.0, math.nan, math.inf, -math.inf]),
    st.sampled_from(["", "0.01", "v99", "spot-ish", "ws ", "nan"]),
    st.sampled_from([None, True, False, (), [], (0, 0), (-1, 2), [1.5], {"a": 1}, object()]),
    st.sampled_from([np.int64(-2), np.float32("nan"), np.float64(-1.0), np.uint8(0)]),
)

V5E = hardware.get("v5e")
SHAPES = {"w1": (256, 1024), "w2": (1024, 256)}

#: (function, valid keyword arguments): each argument in turn gets the garbage.
CASES = {
    "systolic.fold_count": (systolic.fold_count, dict(M=8, K=8, N=8, rows=4, cols=4, dataflow="ws")),
    "systolic.cycle_count": (systolic.cycle_count, dict(M=8, K=8, N=8, rows=4, cols=4,
                                                        dataflow="ws", timing="tpu")),
    "systolic.utilization": (systolic.utilization, dict(M=8, K=8, N=8, rows=4, cols=4,
                                                        dataflow="os", timing="scalesim")),
    "systolic.simulate": (systolic.simulate, dict(a=np.ones((3, 4)), b=np.ones((4, 2)), rows=2,
                                                  cols=2, dataflow="ws", timing="tpu", trace=False)),
    "systolic.reference_matmul": (systolic.reference_matmul, dict(a=np.ones((3, 4)),
                                                                  b=np.ones((4, 2)), rows=2, cols=2)),
    "systolic.memory_accesses_per_mac": (systolic.memory_accesses_per_mac,
                                         dict(n=64, machine="gpu", tile=16, rows=8, cols=8)),
    "comms.all_gather_time": (comms.all_gather_time, dict(v_bytes=1e6, axes=8, chip="v5e",
                                                          wraparound=None, hop_latency_s=1e-6)),
    "comms.all_reduce_time": (comms.all_reduce_time, dict(v_bytes=1e6, axes=(4, 4), chip=V5E)),
    "comms.reduce_scatter_time": (comms.reduce_scatter_time, dict(v_bytes=1e6, axes=4, chip="h100")),
    "comms.all_to_all_time": (comms.all_to_all_time, dict(v_bytes=1e6, axes=16, chip="v5p",
                                                          wraparound=True)),
    "comms.ring_hops": (comms.ring_hops, dict(axes=(4, 4), wraparound=(True, False))),
    "comms.wraps": (comms.wraps, dict(chip="v5e", axis_size=16)),
    "comms.w_ici": (comms.w_ici, dict(chip="v6e")),
    "comms.latency_bound_bytes": (comms.latency_bound_bytes, dict(chip="v5e", axis_size=4)),
    "comms.dp_min_tokens_per_chip": (comms.dp_min_tokens_per_chip, dict(chip="v5e", axes=2)),
    "comms.tp_max_shards": (comms.tp_max_shards, dict(chip="v5p", d_ff=4096, axes=1)),
    "comms.fsdp_tp_min_tokens_per_chip": (comms.fsdp_tp_min_tokens_per_chip,
                                          dict(chip="v5p", d_ff=4096, mesh_axes=2)),
    "comms.dcn_bits_per_param": (comms.dcn_bits_per_param, dict(slices=4, grad_bits=16)),
    "comms.dcn_min_tokens_per_slice": (comms.dcn_min_tokens_per_slice,
                                       dict(chip="v5e", slices=2, grad_bits=32)),
    "comms.pipeline_bubble": (comms.pipeline_bubble, dict(stages=4, microbatches=8)),
    "comms.recommend": (comms.recommend, dict(chip="v5e", params=7e9, tokens_per_slice=1e6, slices=2)),
    "plans.collective_bytes": (plans.collective_bytes, dict(strategy="fsdp", params=SHAPES, devices=8,
                                                            bytes_per_elem=4, loss_bytes=4)),
    "plans.collective_bytes(tp)": (plans.collective_bytes, dict(strategy="tp", params=SHAPES, devices=8,
                                                                batch=64, d_out=256)),
    "plans.layer_bytes": (plans.layer_bytes, dict(strategy="tp", d_model=512, d_ff=2048, batch=8,
                                                  bytes_per_elem=2)),
    "costs.mfu": (costs.mfu, dict(model_flops_per_step=1e12, step_time_s=0.5, chips=4, chip="v5e")),
    "costs.training_cost": (costs.training_cost, dict(chip="v5e", chips=8, tokens=1e9, params=1e8,
                                                      mfu=0.4, pricing="spot")),
    "costs.training_cost(hours)": (costs.training_cost, dict(chip="v6e", chips=8, hours=2.0)),
    "roofline.arithmetic_intensity": (roofline.arithmetic_intensity, dict(flops=1e9, bytes_moved=1e6)),
    "roofline.matmul_flops": (roofline.matmul_flops, dict(m=8, k=8, n=8)),
    "roofline.matmul_bytes": (roofline.matmul_bytes, dict(m=8, k=8, n=8, bytes_per_element=2)),
    "roofline.matmul_intensity": (roofline.matmul_intensity, dict(m=8, k=8, n=8, bytes_per_element=2)),
    "roofline.elementwise_intensity": (roofline.elementwise_intensity,
                                       dict(flops_per_element=1, inputs=2, outputs=1, bytes_per_element=4)),
    "roofline.ridge_point": (roofline.ridge_point, dict(chip=V5E, dtype="bf16")),
    "roofline.attainable_flops_per_s": (roofline.attainable_flops_per_s,
                                        dict(intensity=10.0, chip="v5e", dtype="bf16")),
    "roofline.bound": (roofline.bound, dict(intensity=10.0, chip="v5e")),
    "roofline.estimate": (roofline.estimate, dict(flops=1e9, bytes_moved=1e6, chip="v6e", dtype="bf16")),
    "hardware.get": (hardware.get, dict(name="v5e")),
    "hardware.as_chip": (hardware.as_chip, dict(chip="v5e")),
    "hardware.lookup": (hardware.lookup, dict(device_kind="TPU v6 lite")),
    "hardware.table": (hardware.table, dict(chip_names=["v5e"])),
}

#: What must never come out, even wrapped: Python's and numpy's internal failures.
FORBIDDEN = (ZeroDivisionError, KeyError, AttributeError, IndexError, OverflowError)


def assert_course_error(err: BaseException) -> None:
    """A course error with a message; not an internal failure leaking through."""
    assert isinstance(err, errors.CourseError), f"{type(err).__module__}.{type(err).__name__}: {err}"
    assert isinstance(err, (ValueError, TypeError))
    assert not isinstance(err, FORBIDDEN)
    assert str(err).strip(), "a course error needs a message"


@pytest.mark.parametrize("case", sorted(CASES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), garbage=GARBAGE)
def test_pure_layer_refuses_garbage_by_name(case, data, garbage):
    fn, kwargs = CASES[case]
    arg = data.draw(st.sampled_from(sorted(kwargs)), label="argument")
    call = {**kwargs, arg: garbage}
    try:
        fn(**call)
    except Exception as err:  # noqa: BLE001 - the point is to see what comes out
        assert_course_error(err)


@pytest.mark.parametrize("case", sorted(CASES))
def test_valid_arguments_still_work(case):
    fn, kwargs = CASES[case]
    fn(**kwargs)  # the baseline each garbage case departs from


@settings(max_examples=40, deadline=None)
@given(field=st.sampled_from([
    "dataset", "model", "features", "hidden", "epochs", "batch_size", "learning_rate",
    "warmup_steps", "seed", "pipeline", "prefetch", "last_batch", "compute_dtype", "donate",
    "eval_batch_size", "log_every", "max_train_examples", "stop_at_accuracy", "progress"]),
       garbage=GARBAGE)
def test_train_config_refuses_garbage_by_field(field, garbage):
    train = pytest.importorskip("tpu_course.train")
    try:
        train.TrainConfig(**{field: garbage})
    except Exception as err:  # noqa: BLE001
        assert_course_error(err)
        assert f"TrainConfig.{field}" in str(err)


@settings(max_examples=25, deadline=None)
@given(garbage=GARBAGE)
def test_hlo_inspect_refuses_garbage_targets(garbage):
    hlo = pytest.importorskip("tpu_course.hlo")
    import jax.numpy as jnp

    if garbage is None:
        return  # None is the documented default (the local backend)
    with pytest.raises(Exception) as info:
        hlo.inspect(lambda x: x * 2, jnp.ones(4), target=garbage)
    assert_course_error(info.value)
    assert "target" in str(info.value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.one_of(st.binary(max_size=64),
                      st.binary(min_size=1, max_size=64).map(gzip.compress),
                      st.binary(min_size=12, max_size=64).map(lambda b: gzip.compress(b)[:-5]),
                      st.binary(min_size=1, max_size=64).map(lambda b: gzip.compress(b)[:10] + b)))
def test_data_refuses_any_bad_file_by_name(tmp_path, blob):
    spec = data.MNIST_SUBSET_FILES["train_labels"]
    path = tmp_path / spec.name
    path.write_bytes(blob)
    with pytest.raises(data.DataError) as info:
        data.verify(path, spec)
    assert_course_error(info.value)
    assert spec.name in str(info.value)


# --------------------------------------------------------------------------------------
# The cases issue 13 reported, each with the message it must give now
# --------------------------------------------------------------------------------------

TRAIN_CONFIG_CASES = [
    (dict(learning_rate=-0.01), ValueError, r"TrainConfig.learning_rate=-0.01: expected a finite number > 0 and <= 1"),
    (dict(learning_rate=0.0), ValueError, r"TrainConfig.learning_rate=0.0: expected a finite number > 0"),
    (dict(learning_rate=math.nan), ValueError, r"TrainConfig.learning_rate=nan: expected a finite number"),
    (dict(learning_rate="0.01"), TypeError, r"TrainConfig.learning_rate='0.01': .* got a string. Pass a number"),
    (dict(max_train_examples=-100), ValueError, r"TrainConfig.max_train_examples=-100: expected an integer >= 1"),
    (dict(max_train_examples=0), ValueError, r"TrainConfig.max_train_examples=0: expected an integer >= 1"),
    (dict(warmup_steps=-5), ValueError, r"TrainConfig.warmup_steps=-5: expected an integer >= 0"),
    (dict(stop_at_accuracy=1.5), ValueError, r"TrainConfig.stop_at_accuracy=1.5: expected a finite number >= 0 and <= 1"),
    (dict(epochs=2.5), TypeError, r"TrainConfig.epochs=2.5: expected an integer >= 1, got a float"),
    (dict(batch_size=64.0), TypeError, r"TrainConfig.batch_size=64.0: .* Write it without a decimal point \(64\)"),
    (dict(features=(0, 0)), ValueError, r"TrainConfig.features\[0\]=0: expected an integer >= 1"),
    (dict(model="resnet"), ValueError, r"TrainConfig.model='resnet': expected one of 'cnn', 'mlp'"),
]


@pytest.mark.parametrize("fields, kind, message", TRAIN_CONFIG_CASES)
def test_train_config_refuses_the_reported_nonsense(fields, kind, message):
    train = pytest.importorskip("tpu_course.train")
    with pytest.raises(kind, match=message) as info:
        train.TrainConfig(**fields)
    assert_course_error(info.value)


def test_cnn_refuses_zero_width_features():
    models = pytest.importorskip("tpu_course.models")
    from flax import nnx

    with pytest.raises(ValueError, match=r"CNN.features\[0\]=0: expected an integer >= 1"):
        models.CNN(features=(0, 0), rngs=nnx.Rngs(0))


COST_CASES = [
    (lambda: comms.all_reduce_time(-1e6, 8, "v5e"), ValueError, r"v_bytes=-1000000.0: expected a finite number >= 0"),
    (lambda: comms.all_gather_time(math.nan, 8, "v5e"), ValueError, r"v_bytes=nan: expected a finite number >= 0"),
    (lambda: comms.all_to_all_time(-1, 8, "v5p"), ValueError, r"v_bytes=-1"),
    (lambda: costs.mfu(1e12, 1.0, 0, "v5e"), ValueError, r"chips=0: expected an integer >= 1"),
    (lambda: costs.training_cost("v5e", 0, hours=1.0), ValueError, r"chips=0: expected an integer >= 1"),
    (lambda: costs.training_cost("v5e", -8, hours=1.0), ValueError, r"chips=-8"),
    (lambda: costs.training_cost("v5e", 8, hours=-1.0), ValueError, r"hours=-1.0: expected a finite number >= 0"),
    (lambda: costs.training_cost("v5e", 8, hours=1.0, pricing="spot-ish"), ValueError,
     r"pricing='spot-ish': expected one of 'on_demand', 'spot'"),
    (lambda: costs.training_cost("a100", 8, hours=1.0), ValueError, r"chip='a100': no price in the table; it has 'v5e'"),
    (lambda: plans.collective_bytes("fsdp", SHAPES, devices=0), ValueError, r"devices=0: expected an integer >= 1"),
    (lambda: plans.collective_bytes("dp", SHAPES, devices=0), ValueError, r"devices=0: expected an integer >= 1"),
    (lambda: plans.collective_bytes("pp", SHAPES, devices=8), ValueError, r"strategy='pp': expected one of 'dp', 'fsdp', 'tp'"),
]


@pytest.mark.parametrize("call, kind, message", COST_CASES)
def test_cost_models_refuse_the_reported_nonsense(call, kind, message):
    with pytest.raises(kind, match=message) as info:
        call()
    assert_course_error(info.value)


def test_hlo_inspect_target_42_is_a_type_error_listing_the_valid_ones():
    hlo = pytest.importorskip("tpu_course.hlo")
    import jax.numpy as jnp

    with pytest.raises(TypeError, match=r"target=42: expected None .* 'v5e:2x2'") as info:
        hlo.inspect(lambda x: x + 1, jnp.ones(3), target=42)
    assert_course_error(info.value)
    assert "v6e:1x1" in str(info.value)


# --------------------------------------------------------------------------------------
# Issue 25's small ones, each with the message it must give now
# --------------------------------------------------------------------------------------

_COUNT = "--xla_force_host_platform_device_count"


def _topology(name):
    from tpu_course.hlo import aot

    return aot.tpu_topology(name)


def _inspect_on(target):
    hlo = pytest.importorskip("tpu_course.hlo")
    import jax.numpy as jnp

    return hlo.inspect(lambda x: x * 2, jnp.ones(4), target=target)


def _runtime():
    from tpu_course import runtime

    return runtime


def _lab(number):
    from tpu_course import checks

    return checks.lab(number)


ISSUE_25_CASES = [
    # a 3-D v5e (or a 2-D v4) is no real slice: refused before libtpu builds it
    (lambda: _inspect_on("v5e:2x2x2"), ValueError,
     r"'v5e:2x2x2': v5e slices are 2-D .*, not 3-D.* For 8 chips use v5e:2x4\."),
    (lambda: _topology("v6e:1x1x1"), ValueError, r"v6e slices are 2-D .* use v6e:1x1\."),
    (lambda: _topology("v4:2x2"), ValueError, r"v4 slices are 3-D .* use v4:2x2x1\."),
    (lambda: _topology("v5p:2x4"), ValueError, r"v5p slices are 3-D .* use v5p:2x2x2\."),
    # the device-count flag, read without starting XLA (which would kill the process)
    (lambda: _runtime().check_device_count_flag(f"{_COUNT}=abc"), ValueError,
     rf"XLA_FLAGS holds {_COUNT}=abc: the CPU device count must be a whole number"),
    (lambda: _runtime().check_device_count_flag(f"{_COUNT}=-4"), ValueError,
     rf"XLA_FLAGS holds {_COUNT}=-4"),
    (lambda: _runtime().check_device_count_flag(f"{_COUNT}=0"), ValueError,
     rf"XLA_FLAGS holds {_COUNT}=0"),
    (lambda: _runtime().simulate_devices(0), ValueError,
     r"simulate_devices\(n\) needs a positive integer, got 0"),
    (lambda: _runtime().simulate_devices("8"), ValueError, r"positive integer, got '8'"),
    # a lab named as anything but its number
    (lambda: _lab("one"), ValueError, r"there is no lab 'one'.* Pass the lab's number"),
    (lambda: _lab(1.0), ValueError, r"there is no lab 1\.0.* Pass the lab's number"),
]


@pytest.mark.parametrize("call, kind, message", ISSUE_25_CASES)
def test_issue_25_small_ones_refuse_by_name(call, kind, message):
    with pytest.raises(kind, match=message) as info:
        call()
    assert_course_error(info.value)


# --------------------------------------------------------------------------------------
# Issue 38: chapter 8's surfaces (the language model, text data, profiling), the
# checkpoints and the environment, each argument in turn given the garbage
# --------------------------------------------------------------------------------------


class _Reached(Exception):
    """The call got past every check: its arguments were valid. The work itself (a
    compile, a training run) is skipped there, to keep the test cheap."""


def _reached(*args, **kwargs):
    raise _Reached


@pytest.fixture(scope="module")
def ch8(tmp_path_factory):
    """Valid arguments for every case: a model's shapes, files to read, a saved step."""
    import hashlib
    import json

    lm = pytest.importorskip("tpu_course.lm")
    from flax import nnx

    from tpu_course import profiling, runtime, textdata
    from tpu_course.train import checkpoints

    base = tmp_path_factory.mktemp("ch8")
    config = lm.LMConfig(d_model=8, heads=2, layers=1, d_ff=16, context=8,
                         compute_dtype="float32")
    model = nnx.eval_shape(lambda: lm.LM(config, rngs=nnx.Rngs(0)))  # shapes: no compile
    source = base / "source.txt"
    source.write_bytes(b"To be, or not to be, that is the question.\n" * 20)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    stdlib = base / "py"  # a stand-in standard library of 40 files
    stdlib.mkdir()
    for i in range(40):
        (stdlib / f"m{i:02d}.py").write_bytes(f"# file {i}\n".encode())
    trace = base / "trace" / "plugins" / "profile" / "run"
    trace.mkdir(parents=True)
    event = {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 5, "name": "fusion.1"}
    (trace / "vm.trace.json.gz").write_bytes(gzip.compress(json.dumps([event]).encode()))
    saved = base / "ck"
    state = {"w": np.zeros(3, np.float32)}
    checkpoints.save_checkpoint(saved, state, {"a": 1}, step=1)
    tokens = np.zeros((1, 4), np.int32)
    cases = {
        "lm.generate": (lm.generate, dict(model=model, prompt=[1, 2], steps=2, temperature=0.0,
                                          top_k=None, seed=0)),
        "lm.run": (lm.run, dict(config=config, steps=2, batch=2, seed=0, peak_lr=1e-3,
                                checkpoint_dir=None, checkpoint_every=2, eval_every=None,
                                log=None)),
        "lm.check_tokens": (lm.check_tokens, dict(tokens=tokens, config=config, start=0)),
        "lm.param_count": (lm.param_count, dict(config=config)),
        "lm.flops_per_token": (lm.flops_per_token, dict(config=config, context=8)),
        "lm.decode_cost": (lm.decode_cost, dict(config=config, batch=1, position=3,
                                                weight_bytes_per_param=2,
                                                cache_bytes_per_value=2)),
        "lm.decode_ridge_batch": (lm.decode_ridge_batch, dict(config=config, chip="v5e",
                                                              position=3)),
        "textdata.load": (textdata.load, dict(root=stdlib, heldout_fraction=0.3)),
        "textdata.batch_at": (textdata.batch_at, dict(data=np.arange(100, dtype=np.uint8), step=0,
                                                      batch=2, length=8, seed=0)),
        "textdata.batches": (textdata.batches, dict(data=np.arange(100, dtype=np.uint8), batch=2,
                                                    length=8, seed=0, start_step=0)),
        "textdata.bits_per_byte": (textdata.bits_per_byte, dict(loss_nats=1.0)),
        "textdata.unigram_bits_per_byte": (textdata.unigram_bits_per_byte,
                                           dict(train=np.arange(256, dtype=np.uint8),
                                                heldout=np.array([1, 2], np.uint8))),
        "textdata.bigram_bits_per_byte": (textdata.bigram_bits_per_byte,
                                          dict(train=np.arange(256, dtype=np.uint8),
                                               heldout=np.array([1, 2], np.uint8))),
        "textdata.is_heldout": (textdata.is_heldout, dict(relative_path="json/decoder.py",
                                                          fraction=0.1)),
        "textdata.download": (textdata.download, dict(name="hamlet", url=source.as_uri(),
                                                      sha256=digest, cache_dir=base / "cache",
                                                      heldout_fraction=0.1, timeout_s=5.0)),
        "profiling.read": (profiling.read, dict(directory=base / "trace", steps=1)),
        "profiling.Profile.top_ops": (profiling.read(base / "trace").top_ops,
                                      dict(n=3, category=None)),
        "checkpoints.save_checkpoint": (checkpoints.save_checkpoint,
                                        dict(directory="fresh", state=state, metadata={"a": 1},
                                             step=1, max_to_keep=None)),
        "checkpoints.restore_checkpoint": (checkpoints.restore_checkpoint,
                                           dict(directory=saved, like=state, step=None)),
        "checkpoints.latest_step": (checkpoints.latest_step, dict(directory=saved)),
        "checkpoints.saved_metadata": (checkpoints.saved_metadata,
                                       dict(directory=saved, step=1)),
        "runtime.check_device_count_flag": (runtime.check_device_count_flag,
                                            dict(value="--xla_dump_to=/tmp/x")),
        "runtime.cpu_subprocess_env": (runtime.cpu_subprocess_env,
                                       dict(devices=8, keep_xla_flags=True)),
    }
    stubs = {"lm.generate": (lm, "_generate"), "lm.run": (textdata, "load")}
    return types.SimpleNamespace(cases=cases, stubs=stubs, base=base, stdlib=stdlib,
                                 textdata=textdata, lm=lm, config=config)


CH8_CASES = ["lm.generate", "lm.run", "lm.check_tokens", "lm.param_count", "lm.flops_per_token",
             "lm.decode_cost", "lm.decode_ridge_batch", "textdata.load", "textdata.batch_at",
             "textdata.batches", "textdata.bits_per_byte", "textdata.unigram_bits_per_byte",
             "textdata.bigram_bits_per_byte", "textdata.is_heldout", "textdata.download",
             "profiling.read", "profiling.Profile.top_ops", "checkpoints.save_checkpoint",
             "checkpoints.restore_checkpoint", "checkpoints.latest_step",
             "checkpoints.saved_metadata", "runtime.check_device_count_flag",
             "runtime.cpu_subprocess_env"]


@pytest.mark.parametrize("case", CH8_CASES)
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), garbage=GARBAGE)
def test_chapter_8_surfaces_refuse_garbage_naming_the_argument(ch8, case, data, garbage):
    fn, kwargs = ch8.cases[case]
    arg = data.draw(st.sampled_from(sorted(kwargs)), label="argument")
    call = {**kwargs, arg: garbage}
    scratch = tempfile.mkdtemp(dir=ch8.base)  # a relative path lands here, fresh each time
    if call.get("directory") == "fresh":
        call["directory"] = os.path.join(scratch, "ck")
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.chdir(scratch))
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore", UserWarning)  # a checkpoint's news, not the point here
        if case in ch8.stubs:
            stack.enter_context(mock.patch.object(*ch8.stubs[case], _reached))
        stack.enter_context(mock.patch.object(ch8.textdata, "stdlib_root", lambda: ch8.stdlib))
        try:
            fn(**call)
        except _Reached:
            pass
        except Exception as err:  # noqa: BLE001 - the point is to see what comes out
            assert_course_error(err)
            assert arg in str(err), f"{case}({arg}={garbage!r}) gave {err!r}, which does not name {arg}"


@pytest.mark.parametrize("field", ["vocab", "d_model", "heads", "layers", "d_ff", "context",
                                   "compute_dtype", "remat"])
@settings(max_examples=10, deadline=None)
@given(garbage=GARBAGE)
def test_lm_config_refuses_garbage_by_field(field, garbage):
    lm = pytest.importorskip("tpu_course.lm")
    try:
        lm.LMConfig(**{field: garbage})
    except Exception as err:  # noqa: BLE001
        assert_course_error(err)
        assert field in str(err) and "LMConfig" in str(err)
