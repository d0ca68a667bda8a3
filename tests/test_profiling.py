"""tpu_course.profiling: reading jax.profiler traces without TensorBoard."""

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from tpu_course import errors, profiling


def write_trace(directory, events, threads):
    """A trace.json.gz in the layout jax.profiler.trace writes."""
    run = directory / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}}]
    meta += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}}
             for tid, name in threads.items()]
    body = [{"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name}
            for tid, name, ts, dur in events]
    with gzip.open(run / "vm.trace.json.gz", "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": meta + body}, f)


def test_self_time_and_categories_of_a_known_trace(tmp_path):
    threads = {7: "python", 8: "tf_XLAExecute/1"}
    write_trace(tmp_path, [
        (7, "PjitFunction(step)", 0, 100),  # host, with a child of 30 us
        (7, "ParseArguments", 10, 30),
        (8, "fusion.12", 0, 50),  # compute, with a 20 us all-reduce inside
        (8, "AllReduce", 20, 20),
        (8, "all_gather.3", 60, 10),
        (8, "reduce-scatter-start.1", 70, 5),
        (8, "Wait: pending_threads=1/4", 80, 40),
        (8, "end: fusion.12", 50, 0),
    ], threads)
    profile = profiling.read(tmp_path, steps=2)
    by_name = {e.name: e for e in profile.events}
    assert by_name["PjitFunction(step)"].self_us == 70
    assert by_name["fusion.12"].self_us == 30
    times = profile.time_by_category()
    assert times == pytest.approx({"host": 100e-6 / 2, "compute": 30e-6 / 2,
                                   "collectives": 35e-6 / 2, "other": 40e-6 / 2})
    top = profile.top_ops(2)
    assert [row[0] for row in top] == ["PjitFunction(step)", "Wait: pending_threads=1/4"]
    assert "collectives" in str(profile) and "fusion" in profile.ops_table()


@pytest.mark.parametrize("name,thread,process,category", [
    ("all-reduce.7", "XLA Ops", "/device:TPU:0", "collectives"),
    ("AllGather", "XLA Ops", "/device:TPU:0", "collectives"),
    ("collective-permute-done", "XLA Ops", "/device:TPU:0", "collectives"),
    ("copy-start.2", "XLA Ops", "/device:TPU:0", "compute"),
    ("convolution_add_fusion", "tf_XLAEigen/3", "/host:CPU", "compute"),
    ("ParseArguments", "python", "/host:CPU", "host"),
    # jax 0.7.2's CPU client runs a program's ops on its client threads at times
    ("dot_general.1", "tf_XLAPjRtCpuClient/-7317782526851094055", "/host:CPU", "compute"),
    ("reduce-window", "tf_XLAPjRtCpuClient/12", "/host:CPU", "compute"),
    ("PjitFunction(<lambda>)", "python", "/host:CPU", "host"),
    ("CommonPjRtLoadedExecutable::Execute (jit_step)", "tf_XLAPjRtCpuClient", "/host:CPU",
     "other"),
    ("ThunkExecutor::Execute (wait for completion)", "tf_XLAExecute/2", "/host:CPU", "other"),
    ("GrpcSystemConfigTrace", "tf_profiler_thread", "/host:CPU", "other"),
    ("$selectors.py:451 select", "python", "/host:CPU", "other"),  # waiting for input
])
def test_classify_by_patterns(name, thread, process, category):
    assert profiling.classify(name, thread, process) == category


def test_reads_a_real_trace_of_this_jax(tmp_path):
    f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((128, 128))
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        for _ in range(2):
            f(x).block_until_ready()
    profile = profiling.read(tmp_path, steps=2)
    assert profile.events and profile.path.endswith(".trace.json.gz")
    assert all(0 <= e.self_us <= e.duration_us for e in profile.events)
    times = profile.time_by_category()
    assert times["compute"] > 0 and times["host"] > 0
    import matplotlib

    matplotlib.use("Agg")
    ax = profile.plot()
    assert ax.get_xlabel().startswith("milliseconds")
    # the same trace's XSpace reads too, and a cut-off copy of it is refused (older
    # jaxlibs abort the process on a malformed XSpace, so it never reaches them)
    xplane = next(tmp_path.glob("**/*.xplane.pb"))
    assert {e.name for e in profiling.read(xplane, steps=2).events} & {e.name for e in profile.events}
    cut = tmp_path / "cut.xplane.pb"
    cut.write_bytes(xplane.read_bytes()[: xplane.stat().st_size // 2])
    with pytest.raises(profiling.TraceError, match="cannot be read as an XSpace"):
        profiling.read(cut)


def test_no_trace_is_a_course_error(tmp_path):
    with pytest.raises(errors.CourseValueError, match="jax.profiler.trace"):
        profiling.read(tmp_path)
    with pytest.raises(errors.CourseValueError, match="category"):
        profiling.Profile((), "x").top_ops(category="gpu")


def _trace_file(directory, blob, name="vm.trace.json.gz"):
    run = directory / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True)
    (run / name).write_bytes(blob)
    return run / name


def _gz(value):
    return gzip.compress(json.dumps(value).encode(), mtime=0)  # the same bytes on every worker


X = {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 5, "name": "fusion.1"}
BAD_TRACES = [
    (_gz({"traceEvents": []}), "holds no timed events: nothing ran inside the"),
    (_gz({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}), "holds no timed events"),
    (_gz({"traceEvents": [{**X, "dur": -5}]}), "has an event 'fusion.1' with a negative duration"),
    (_gz({"traceEvents": [{**X, "ts": "soon"}]}), "'ts' is 'soon', not a number"),
    (_gz({"traceEvents": [{**X, "dur": None}]}), "'dur' is None, not a number"),
    (_gz({"traceEvents": [1, 2]}), "holds a trace event that is int 1, not an object"),
    (_gz(42), "holds no list of trace events"),
    (_gz({"events": []}), "holds no list of trace events"),
    (b"not gzip at all", "cannot be read as gzip"),
    (gzip.compress(b"{not json", mtime=0), "is not JSON inside its gzip"),
    (gzip.compress(b"\xff\xfe", mtime=0), "is not JSON inside its gzip"),
    (_gz({"traceEvents": [X]})[:-6], "cannot be read as gzip"),  # cut short
]


@pytest.mark.parametrize("blob, said", BAD_TRACES)
def test_a_trace_that_is_empty_or_malformed_says_what_is_wrong(tmp_path, blob, said):
    path = _trace_file(tmp_path, blob)
    with pytest.raises(profiling.TraceError) as info:
        profiling.read(tmp_path)
    assert str(info.value).startswith(str(path)) and said in str(info.value), str(info.value)
    assert "jax.profiler.trace" in str(info.value)  # what to do


def test_an_empty_or_garbage_xplane_is_refused(tmp_path):
    _trace_file(tmp_path / "a", b"", "vm.xplane.pb")
    with pytest.raises(profiling.TraceError, match=r"vm.xplane.pb is empty \(0 bytes\): the trace "
                       r"was not written completely"):
        profiling.read(tmp_path / "a")
    path = _trace_file(tmp_path / "b", b"\x08\x96\x01 garbage \xff" * 3, "vm.xplane.pb")
    with pytest.raises(profiling.TraceError, match=r"cannot be read as an XSpace|holds no timed events"):
        profiling.read(path)  # a trace file itself is read too


def test_bad_arguments_name_themselves(tmp_path):
    for directory, said in ((None, r"directory=None: expected the folder given to "
                                   r"jax.profiler.trace"),
                            ("", r"directory='' is empty"),
                            (tmp_path / "absent", r"directory='.*absent' does not exist")):
        with pytest.raises(errors.CourseError, match=said):
            profiling.read(directory)
    with pytest.raises(errors.CourseValueError, match=r"Profile.steps=0: expected an integer >= 1"):
        profiling.Profile((), "x", steps=0)


def test_by_kind_takes_the_union_over_threads_per_step(tmp_path):
    threads = {7: "python", 8: "tf_XLAEigen/1", 9: "tf_XLAEigen/2"}
    write_trace(tmp_path, [
        (7, "$profiler.py:471 trace", 0, 1000),  # the profiler starting: left out
        (7, "TransferToDevice", 5, 10),  # a host transfer
        (8, "ThunkExecutor::Execute", 0, 300),  # the runtime's wrapper: left out
        (8, "dot.1", 100, 40), (9, "dot.1", 120, 40),  # two devices: union 60, not 80
        (8, "fusion.7", 150, 10),  # named an optimizer op by `kinds`
        (8, "fusion.8", 165, 5),  # attention's softmax, by `kinds`
        (9, "all-reduce.2", 170, 30), (9, "Rendezvous", 175, 20),  # nested: union 30
        (8, "Wait: pending_threads=1/4", 200, 90),  # a wait: left out
        (8, "copy.3", 200, 20),
    ], threads)
    profile = profiling.read(tmp_path, steps=2)
    summary = profile.by_kind({"fusion.7": "optimizer", "fusion.8": "attention"},
                              collective_bytes=2e6)
    assert [row[0] for row in summary.rows] == list(profiling.KINDS)
    ms = {kind: t * 1e3 for kind, t, _ in summary.rows}  # microseconds per step
    assert ms == pytest.approx({"matmul": 30, "attention": 2.5, "collectives": 15,
                                "optimizer": 5, "host transfer": 5, "other": 10})
    assert summary.window_ms == pytest.approx((220 - 5) / 2 / 1e3)
    text = str(summary)
    assert "union over all threads" in text and "start-up" in text
    assert "2,000 kB per device predicted" in text and "counted in other" not in text
    plain = profile.by_kind()  # without kinds: names only, attention folded into other
    assert plain.ms("optimizer") == 0 and "counted in other" in str(plain)
    with pytest.raises(errors.CourseTypeError, match="op_kinds"):
        profile.by_kind(["dot.1"])
    with pytest.raises(errors.CourseValueError, match="collective_bytes"):
        profile.by_kind(collective_bytes=-1)


def test_by_kind_of_a_real_train_step_names_its_matmuls_and_optimizer(tmp_path):
    from flax import nnx

    from tpu_course import lm

    config = lm.LMConfig(d_model=32, heads=2, layers=1, d_ff=64, context=16,
                         compute_dtype="float32")
    graphdef, params = nnx.split(lm.LM(config, rngs=nnx.Rngs(0)))
    tx = lm.make_optimizer(10)
    step = jax.jit(lm.make_train_step(graphdef, tx))
    opt_state = tx.init(params)
    x = jnp.zeros((4, 16), jnp.int32)
    kinds = profiling.op_kinds(step.lower(params, opt_state, x, x).compile().as_text())
    assert {"matmul", "optimizer"} <= set(kinds.values())
    step(params, opt_state, x, x)[2].block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        for _ in range(2):
            params, opt_state, loss = step(params, opt_state, x, x)
        loss.block_until_ready()
    summary = profiling.read(tmp_path, steps=2).by_kind(kinds)
    assert summary.ms("matmul") > 0 and summary.window_ms > 0
    assert all(t <= summary.window_ms * (1 + 1e-9) for _, t, _ in summary.rows)
