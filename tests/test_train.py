"""Tests for tpu_course.train: pipelines, the step, evaluation, fit, checkpoints.

Everything runs on a small MLP and synthetic data, so the whole file takes seconds. A
``fit`` costs its compilations: the tests that only read a tiny run's History share one
run per pipeline (:func:`tiny_fit`), the tests of one step share one compiled step
(:func:`adam`), and a program built again is loaded from the module's compilation cache.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_course import models, train


def synthetic(n_train: int = 384, n_test: int = 203, seed: int = 0) -> types.SimpleNamespace:
    """Ten noisy class templates: learnable in a few steps, no files needed."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, (10, 28, 28))

    def draw(n):
        y = rng.integers(0, 10, n).astype(np.int32)
        x = np.clip(templates[y] + rng.normal(0, 60, (n, 28, 28)), 0, 255).astype(np.uint8)
        return x, y

    (xtr, ytr), (xte, yte) = draw(n_train), draw(n_test)
    return types.SimpleNamespace(train_images=xtr, train_labels=ytr, test_images=xte,
                                 test_labels=yte, train_set="synthetic", name="synthetic")


# donate=False: fit skips the donation probe (seconds, once per process); it does not
# change what a run computes. fit's donated runs, resumed bit for bit, are
# tests/test_checkpoints.py's; the probe's agreement with a train step is test_runtime's.
TINY = train.TrainConfig(model="mlp", mlp_hidden=(32,), epochs=2, batch_size=64,
                         learning_rate=3e-3, warmup_steps=2, eval_batch_size=64, log_every=2,
                         progress=False, donate=False)

# The fits below repeat one config (shared, interrupted, resumed): each program is compiled
# once and loaded after that (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("compiled_once")


def small_mlp():
    return models.MLP(hidden=(32,), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tiny_fit():
    """``tiny_fit(pipeline)``: the History of ``fit(TINY)`` with that pipeline, run once
    per module (the tests that read it do not change it)."""
    runs: dict[str, train.History] = {}

    def get(pipeline: str) -> train.History:
        if pipeline not in runs:
            runs[pipeline] = train.fit(TINY.replace(pipeline=pipeline), data=synthetic())
        return runs[pipeline]
    return get


@pytest.fixture(scope="module")
def adam():
    """One small MLP's fresh state, Adam and train step, the step jitted once (not donated)
    for the tests that check what any step does; their batches are 64 examples."""
    tx = optax.adam(3e-3)
    graphdef, state = train.init_state(small_mlp(), tx)
    fn = train.make_train_step(graphdef, tx)
    return types.SimpleNamespace(tx=tx, graphdef=graphdef, state=state, fn=fn, step=jax.jit(fn))


def full_batch(ds) -> train.Batch:
    n = len(ds.train_labels)
    return train.Batch(ds.train_images, ds.train_labels, np.ones(n, np.float32))


# --------------------------------------------------------------------------- pipelines


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(1, 64), epoch=st.integers(0, 3))
def test_pad_yields_every_example_exactly_once(n, batch, epoch):
    idx, w = train.epoch_indices(n, batch, seed=1, epoch=epoch, last_batch="pad")
    assert idx.shape == w.shape == (-(-n // batch), batch)
    real = idx[w == 1]
    assert sorted(real.tolist()) == list(range(n))
    assert w.sum() == n


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(1, 64))
def test_drop_yields_full_batches_of_distinct_examples(n, batch):
    if batch > n:
        with pytest.raises(ValueError, match="last_batch='pad'"):
            train.epoch_indices(n, batch, last_batch="drop")
        return
    idx, w = train.epoch_indices(n, batch, last_batch="drop")
    assert idx.shape == (n // batch, batch) and np.all(w == 1)
    assert len(set(idx.ravel().tolist())) == idx.size


def test_shuffle_depends_on_seed_and_epoch_only():
    a = train.epoch_indices(100, 10, seed=3, epoch=1)[0]
    np.testing.assert_array_equal(a, train.epoch_indices(100, 10, seed=3, epoch=1)[0])
    assert not np.array_equal(a, train.epoch_indices(100, 10, seed=3, epoch=2)[0])


def test_device_epoch_indices_cover_every_example_once_when_padded():
    # the sizes of test_device_epoch_equals_the_same_steps_run_one_by_one (compiled once)
    idx, w = train.device_epoch_indices(jax.random.key(0), 300, 64, "pad")
    idx, w = np.asarray(idx), np.asarray(w)
    assert idx.shape == w.shape == (5, 64) and w.sum() == 300
    assert sorted(idx[w == 1].tolist()) == list(range(300))


def test_batches_match_their_indices():
    ds = synthetic(50, 10)
    got = list(train.batches(ds.train_images, ds.train_labels, 16, seed=0, epoch=0,
                             last_batch="pad"))
    idx, w = train.epoch_indices(50, 16, seed=0, epoch=0, last_batch="pad")
    assert len(got) == 4
    for b, i, ww in zip(got, idx, w):
        np.testing.assert_array_equal(b.images, ds.train_images[i])
        np.testing.assert_array_equal(b.labels, ds.train_labels[i])
        np.testing.assert_array_equal(b.weights, ww)


def test_prefetch_keeps_order_and_runs_ahead():
    pulled = []

    def source():
        for i in range(6):
            pulled.append(i)
            yield np.full(3, i)

    seen_ahead = []
    out = []
    for item in train.prefetch_to_device(source(), depth=2):
        assert isinstance(item, jax.Array)  # already on the device
        out.append(int(item[0]))
        seen_ahead.append(len(pulled) - len(out))
    assert out == list(range(6))
    assert seen_ahead[:4] == [2, 2, 2, 2]  # two transfers in flight while a step runs
    assert [int(x[0]) for x in train.prefetch_to_device(iter([np.zeros(1)]), depth=0)] == [0]
    with pytest.raises(ValueError):
        list(train.prefetch_to_device(iter([]), depth=-1))


# --------------------------------------------------------------------------- the step


def test_train_step_equals_a_hand_written_optax_step(adam):
    batch = full_batch(synthetic(64, 8))
    tx, graphdef = adam.tx, adam.graphdef
    new, metrics = adam.step(adam.state, batch)

    # Reference: the model called directly, optax.adam by hand.
    model = small_mlp()
    params = nnx.state(model, nnx.Param)

    def loss(p):
        logits = nnx.merge(graphdef, p)(jnp.asarray(batch.images, jnp.float32)[..., None] / 255)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels).mean()

    @jax.jit  # one program (op-by-op, each operation would be compiled on its own)
    def reference(params):
        value, grads = jax.value_and_grad(loss)(params)
        updates, _ = tx.update(grads, tx.init(params), params)
        return value, optax.apply_updates(params, updates)

    value, want = reference(params)
    np.testing.assert_allclose(metrics["loss"], value, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(new.step) == 1


def test_loss_drops_on_a_fixed_batch(adam):
    batch, state = full_batch(synthetic(64, 8)), adam.state
    losses = []
    for _ in range(20):
        state, m = adam.step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.5 * losses[0]


def test_padding_does_not_change_the_loss(adam):
    ds = synthetic(40, 8)
    loss = jax.jit(lambda params, batch: train.loss_fn(params, adam.graphdef, batch)[0])
    x, y = ds.train_images, ds.train_labels
    full = loss(adam.state.params, train.Batch(x[:30], y[:30], np.ones(30)))
    w = np.r_[np.ones(30), np.zeros(10)].astype(np.float32)
    padded = loss(adam.state.params, train.Batch(x, y, w))
    np.testing.assert_allclose(padded, full, rtol=1e-6)


def test_bf16_compute_keeps_float32_parameters(adam):
    batch, state = full_batch(synthetic(64, 8)), adam.state
    f32 = adam.step(state, batch)[1]["loss"]  # the float32 step's loss, before its update
    new, m = jax.jit(train.make_train_step(adam.graphdef, adam.tx,
                                           compute_dtype=jnp.bfloat16))(state, batch)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new.params))
    np.testing.assert_allclose(m["loss"], f32, rtol=2e-2)  # bf16 keeps ~3 decimal digits


def test_device_epoch_equals_the_same_steps_run_one_by_one(adam):
    ds = synthetic(300, 8)  # 5 steps of 64, the last one padded (44 real examples)
    key = jax.random.key(7)
    epoch = jax.jit(train.make_device_epoch(adam.fn, 300, 64, "pad"))
    got, metrics = epoch(adam.state, jnp.asarray(ds.train_images), jnp.asarray(ds.train_labels),
                         key)
    idx, w = map(np.asarray, train.device_epoch_indices(key, 300, 64, "pad"))
    assert w[-1].sum() == 44
    want = adam.state
    for i, ww in zip(idx, w):
        want, _ = adam.step(want, train.Batch(ds.train_images[i], ds.train_labels[i], ww))
    assert metrics["loss"].shape == (5,)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_device_evaluate_counts_the_whole_test_set():
    ds = synthetic(8, 203)
    model = small_mlp()
    graphdef, params = nnx.split(model, nnx.Param, ...)[:2]
    ev = jax.jit(train.make_device_evaluate(train.make_eval_step(graphdef), 203, 64))
    sums = ev(params, jnp.asarray(ds.test_images), jnp.asarray(ds.test_labels))
    ref = train.evaluate_model(model, ds.test_images, ds.test_labels, batch_size=64)
    assert float(sums["count"]) == 203 == ref.count == len(ref.predictions)
    want = np.mean(ref.predictions == ds.test_labels)
    assert float(sums["correct"]) / 203 == pytest.approx(want) == pytest.approx(ref.accuracy)
    assert float(sums["loss_sum"]) / 203 == pytest.approx(ref.loss, rel=1e-4)


def test_confusion_matrix_rows_are_true_classes():
    cm = train.confusion_matrix(np.array([0, 0, 2]), np.array([0, 2, 2]), 3)
    assert cm.tolist() == [[1, 0, 1], [0, 0, 0], [0, 0, 1]] and cm.sum() == 3


# --------------------------------------------------------------------------- fit


@pytest.mark.parametrize("pipeline", ["device", "prefetch"])
def test_fit_tiny_config_learns(pipeline, tiny_fit):
    h = tiny_fit(pipeline)
    assert len(h.epochs) == 2 and h.train_set == "synthetic: synthetic"
    assert h.steps[-1][1] < h.steps[0][1]  # loss every log_every steps goes down
    assert h.test_accuracy[-1] > 0.5 and h.train_loss[1] < h.train_loss[0]
    assert h.images_trained == 2 * (384 // 64) * 64
    assert [e.step for e in h.epochs] == [6, 12]  # where History.plot puts each test accuracy
    if pipeline == "prefetch":
        import matplotlib

        matplotlib.use("Agg")
        ax = h.plot()
        assert ax[1].lines[0].get_xdata().tolist() == [6, 12]
        assert ax[0].lines[0].get_xdata().tolist() == [s[0] for s in h.steps]
    assert h.compile_time_s > 0 and h.train_time_s > 0 and h.images_per_s > 0
    assert isinstance(h.model, models.MLP)
    ev = train.evaluate_model(h.model, synthetic().test_images, synthetic().test_labels)
    assert ev.accuracy == pytest.approx(h.test_accuracy[-1])


def test_time_to_accuracy_reads_the_first_epoch_at_target(tiny_fit):
    h = tiny_fit("device")
    target = h.test_accuracy[1]
    tta = train.time_to_accuracy(h, target)
    first = next(e for e in h.epochs if e.test_accuracy >= target)
    assert tta.reached and tta.epoch == first.epoch and tta.train_time_s == first.train_time_s
    assert tta.with_compile_s == pytest.approx(first.train_time_s + h.compile_time_s)
    assert not train.time_to_accuracy(h, 1.01).reached


def test_checkpoint_round_trip_resumes_exactly(tmp_path, adam):
    batch, tx, step = full_batch(synthetic(64, 8)), adam.tx, adam.step
    state, _ = step(adam.state, batch)
    train.save_checkpoint(tmp_path / "c", state, {"note": "after one step"})
    uninterrupted, m1 = step(state, batch)
    fresh = train.init_state(small_mlp(), tx)[1]
    restored, meta = train.restore_checkpoint(tmp_path / "c", fresh)
    assert meta == {"note": "after one step"} and int(restored.step) == 1
    resumed, m2 = step(restored, batch)
    assert float(m1["loss"]) == float(m2["loss"])
    for a, b in zip(jax.tree.leaves(uninterrupted), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(a, b)
    # the state of a 16-wide MLP: the 32-wide one's arrays cut to 16 (its structure, shapes
    # and dtypes; no initialiser to compile for new shapes)
    other = jax.tree.map(lambda a: np.asarray(a)[tuple(slice(16) if n == 32 else slice(None)
                                                        for n in np.shape(a))], fresh)
    with pytest.raises(ValueError, match=r"\['bias'\].* is \[32\] float32 there, expected \[16\] float32"):
        train.restore_checkpoint(tmp_path / "c", other)
    with pytest.raises(ValueError, match="no checkpoint of step 7"):
        train.restore_checkpoint(tmp_path / "c", fresh, step=7)
    with pytest.raises(ValueError, match="no checkpoint directory"):
        train.restore_checkpoint(tmp_path / "absent", fresh)
    assert not (tmp_path / "absent").exists()


@pytest.mark.parametrize("pipeline", ["device", "prefetch"])
def test_fit_resumes_from_checkpoint_bit_for_bit(tmp_path, pipeline, tiny_fit):
    cfg = TINY.replace(pipeline=pipeline)
    whole = tiny_fit(pipeline)
    # Interrupt the same 2-epoch run after epoch 1 (stop_at_accuracy=0 stops at once; the
    # learning-rate schedule is still the 2-epoch one), then resume from its checkpoint.
    half = train.fit(cfg.replace(stop_at_accuracy=0.0), data=synthetic(),
                     checkpoint_dir=tmp_path / "r")
    assert len(half.epochs) == 1
    resumed = train.fit(cfg, data=synthetic(), checkpoint_dir=tmp_path / "r", resume=True)
    assert resumed.test_accuracy == whole.test_accuracy
    assert resumed.train_loss == whole.train_loss
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state)):
        np.testing.assert_array_equal(a, b)
    # A different run may not continue this one, nor a fresh run overwrite it.
    with pytest.raises(ValueError, match=r"different run: learning_rate=0.003 there, 0.002 here"):
        train.fit(cfg.replace(learning_rate=2e-3), data=synthetic(), checkpoint_dir=tmp_path / "r",
                  resume=True)
    with pytest.raises(ValueError, match="already holds checkpoints.*resume=True"):
        train.fit(cfg, data=synthetic(), checkpoint_dir=tmp_path / "r")


def test_config_rejects_unknown_choices():
    with pytest.raises(ValueError, match="pipeline"):
        train.TrainConfig(pipeline="tfdata")
    with pytest.raises(ValueError, match="batch_size"):
        train.TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="optimizer"):
        train.TrainConfig(optimizer="lbfgs")
    with pytest.raises(ValueError, match="shuffle=False needs pipeline='prefetch'"):
        train.TrainConfig(pipeline="device", shuffle=False)
    assert train.TrainConfig.quick().epochs <= train.TrainConfig().epochs


def test_sgd_in_order_is_plain_sgd_on_the_first_batches():
    """optimizer='sgd', shuffle=False: fit's loop takes the first batches in order and
    applies plain SGD (what parallel.train_chapter5 relies on)."""
    ds = synthetic(128, 8)
    cfg = TINY.replace(optimizer="sgd", learning_rate=0.05, shuffle=False, epochs=1,
                       pipeline="prefetch", log_every=1, mlp_hidden=(32,))
    h = train.fit(cfg, data=ds)
    tx = optax.sgd(0.05)
    graphdef, state = train.init_state(small_mlp(), tx)
    step = jax.jit(train.make_train_step(graphdef, tx))
    want = []
    for i in range(2):
        sl = slice(64 * i, 64 * (i + 1))
        state, m = step(state, train.Batch(ds.train_images[sl], ds.train_labels[sl], np.ones(64, np.float32)))
        want.append(float(m["loss"]))
    np.testing.assert_allclose([s[1] for s in h.steps], want, rtol=1e-6)


def test_command_line_turns_flags_into_the_config(monkeypatch, capsys, tiny_fit):
    from tpu_course.train import __main__ as cli

    seen, history = {}, tiny_fit("prefetch")

    def fake_fit(config, **kwargs):  # the flags' config, recorded; a tiny run, printed
        seen.update(config=config, **kwargs)
        return history

    monkeypatch.setattr(train, "fit", fake_fit)
    assert cli.main(["--quick", "--epochs", "1", "--bf16", "--pipeline", "device",
                     "--checkpoint-dir", "ck", "--resume"]) == 0
    assert seen["config"] == train.TrainConfig.quick(epochs=1, compute_dtype="bfloat16", pipeline="device")
    assert seen["checkpoint_dir"] == "ck" and seen["resume"] is True
    assert "test accuracy" in capsys.readouterr().out


def test_time_steps_threads_a_donated_state_and_counts_images():
    ds = synthetic(128, 8)
    tx = optax.adam(1e-3)
    graphdef, state = train.init_state(small_mlp(), tx)
    step = jax.jit(train.make_train_step(graphdef, tx), donate_argnums=0)
    host = train.batches(ds.train_images, ds.train_labels, 16)
    state, t = train.time_steps(step, state, train.prefetch_to_device(host), warmup=2)
    assert t.steps == 6 and int(state.step) == 8
    assert t.images_per_s == pytest.approx(16 / t.seconds_per_step)


def test_donation_on_the_cpu_backend_is_honoured_without_a_warning():
    """Chapter 3's claim, on whichever JAX line runs the suite (0.7.2 and 0.12 both):
    the donated CPU array is deleted, its buffer reused, and nothing warns; a donation
    that cannot be used (no output of that shape) warns and deletes nothing."""
    import warnings

    bump = jax.jit(lambda x: x.at[1].add(1.0), donate_argnums=0)
    old = jnp.zeros(1024)
    pointer = old.unsafe_buffer_pointer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = bump(old)
        new.block_until_ready()
    assert old.is_deleted() and not caught
    if jax.default_backend() == "cpu":
        assert new.unsafe_buffer_pointer() == pointer
    with pytest.raises(RuntimeError, match="deleted"):
        old + 1
    x = jnp.zeros(4)
    with pytest.warns(UserWarning, match="donated buffers were not usable"):
        jax.jit(jnp.sum, donate_argnums=0)(x)
    assert not x.is_deleted()


def test_shipped_accelerator_reference_is_the_committed_bench_result():
    """The copy a notebook reads (package data) is exactly bench/results' file."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    for shipped in train.REFERENCE_DIR.glob("*.json"):
        committed = root / "bench" / "results" / shipped.name
        assert json.loads(shipped.read_text()) == json.loads(committed.read_text()), shipped.name
    assert train.accelerator_reference("mnist-h200")["device"] == "h200"
    with pytest.raises(ValueError, match="ships"):
        train.accelerator_reference("mnist-tpu-v9")
