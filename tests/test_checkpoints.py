"""Tests for tpu_course.train.checkpoints, fit's checkpoints and the CLI's checkpoint flags.

Every case of issue 25 §1: the course deletes only what it wrote, a damaged step is a
course error naming the step, the file and the leaf (never garbage parameters), a bad
path or bad metadata is refused before anything is written or trained, and SIGTERM
saves the epoch in flight and exits cleanly (a real signal to a real process). Tiny MLP,
synthetic data.
"""

from __future__ import annotations

import inspect
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from tpu_course import errors, models, train

# Three epochs: the preemption test stops a run after its second. Every fit below trains
# this one config (donated, the default), so its programs are compiled once in this module
# and loaded from the module's compilation cache after that (tests/conftest.py).
TINY = train.TrainConfig(model="mlp", mlp_hidden=(32,), epochs=3, batch_size=64,
                         learning_rate=1e-3, warmup_steps=2, eval_batch_size=64, log_every=2,
                         pipeline="prefetch", progress=False)
REPO = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("compiled_once")


def synthetic(n_train: int = 384, n_test: int = 64, seed: int = 0) -> types.SimpleNamespace:
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


def states_after(steps: int) -> list:
    """A small MLP's TrainState after 0, 1, ..., ``steps`` Adam steps (distinct values per
    step), from one compiled step."""
    ds = synthetic(64, 8)
    batch = train.Batch(ds.train_images, ds.train_labels, np.ones(64, np.float32))
    tx = optax.adam(1e-3)
    graphdef, state = train.init_state(models.MLP(hidden=(32,), rngs=nnx.Rngs(0)), tx)
    step = jax.jit(train.make_train_step(graphdef, tx))
    states = [state]
    for _ in range(steps):
        states.append(step(states[-1], batch)[0])
    return states


@pytest.fixture(scope="module")
def states():
    return tuple(states_after(2))


@pytest.fixture(scope="module")
def uninterrupted():
    """``fit(TINY)`` from start to end, no checkpoints: what a resumed run must end at."""
    return train.fit(TINY, data=synthetic())


def assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def largest_data_file(step_dir: pathlib.Path) -> pathlib.Path:
    """The biggest array-data file of a step (it holds the largest kernels)."""
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)


def env_cpu() -> dict:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}


# --------------------------------------------------------------------------- only ours


def test_max_to_keep_deletes_only_the_steps_the_course_wrote(tmp_path, states):
    fresh, one, two = states
    for name in ("2023", "7"):  # the learner's own folders, named like steps
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("mine")
    train.save_checkpoint(tmp_path, one, step=1)
    (tmp_path / "1" / "plot.png").write_bytes(b"mine too")  # a learner's file in a course step
    train.save_checkpoint(tmp_path, two, step=2, max_to_keep=1)
    train.save_checkpoint(tmp_path, two, step=9000, max_to_keep=1)
    assert (tmp_path / "2023" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "7" / "notes.txt").read_text() == "mine"
    # Step 1's own files went; the learner's file stayed (so 1/ is no longer a course step).
    assert [p.name for p in (tmp_path / "1").iterdir()] == ["plot.png"]
    assert not (tmp_path / "2").exists()
    assert train.latest_step(tmp_path) == 9000
    assert_same(train.restore_checkpoint(tmp_path, fresh)[0], two)
    with pytest.raises(ValueError, match=r"9000 exists already .*does not overwrite"):
        train.save_checkpoint(tmp_path, one, step=9000)
    with pytest.raises(ValueError, match=r"7 exists already and is not a checkpoint the course wrote"):
        train.save_checkpoint(tmp_path, one, step=7)
    assert (tmp_path / "7" / "notes.txt").read_text() == "mine"


def test_a_folder_named_like_a_step_is_not_a_checkpoint(tmp_path, states):
    fresh, one, _ = states
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "junk.txt").write_text("x")
    assert train.latest_step(tmp_path) is None
    with pytest.raises(errors.CourseValueError,
                       match=r"no checkpoint in .*save one with save_checkpoint.*0/ \(holds junk.txt\)"):
        train.restore_checkpoint(tmp_path, fresh)
    train.save_checkpoint(tmp_path, one, {"n": 1}, step=1)
    state, meta = train.restore_checkpoint(tmp_path, fresh)  # the course's step; 0/ ignored
    assert meta == {"n": 1}
    assert_same(state, one)
    with pytest.raises(errors.CourseValueError, match=r"no checkpoint of step 0 .*steps there: \[1\]"
                                                      r".*0/ \(holds junk.txt\)"):
        train.restore_checkpoint(tmp_path, fresh, step=0)
    assert (tmp_path / "0" / "junk.txt").exists()


# --------------------------------------------------------------------------- damage


def test_flipped_bytes_are_refused_naming_the_step_and_the_file(tmp_path, states):
    """The issue's case: 64 bytes flipped in the array data restored as |p| sums of 3e38."""
    fresh, one, two = states
    train.save_checkpoint(tmp_path, one, step=1)
    train.save_checkpoint(tmp_path, two, step=2)
    data = largest_data_file(tmp_path / "2")
    raw = bytearray(data.read_bytes())
    middle = len(raw) // 2
    raw[middle:middle + 64] = bytes(b ^ 0xFF for b in raw[middle:middle + 64])
    data.write_bytes(bytes(raw))
    with pytest.raises(train.CheckpointDamagedError) as info:
        train.restore_checkpoint(tmp_path, fresh)
    message = str(info.value)
    assert "checkpoint step 2 in" in message and "is damaged" in message
    assert f"{data.relative_to(tmp_path)} differs from what was saved (SHA-256)" in message
    assert "Restore an earlier step (step=1" in message and f"delete {tmp_path / '2'}" in message
    assert_same(train.restore_checkpoint(tmp_path, fresh, step=1)[0], one)  # step 1 is intact


def test_arrays_that_read_back_wrong_are_refused_naming_the_leaf(tmp_path, states):
    """Data Orbax reads without complaint but that is not what was saved (here: step 1's
    arrays under step 2's manifest; Orbax's data is compressed, so flipped bytes decode to
    garbage or fail, depending on where they fall): the leaf checksums name the leaves."""
    fresh, one, two = states
    train.save_checkpoint(tmp_path, one, step=1)
    train.save_checkpoint(tmp_path, two, step=2)
    shutil.rmtree(tmp_path / "2" / "state")
    shutil.copytree(tmp_path / "1" / "state", tmp_path / "2" / "state")
    with pytest.raises(train.CheckpointDamagedError,
                       match=r"step 2 in .* is damaged: leaves \.step, \.params\['hidden'\]\[0\]"
                             r"\['bias'\]\.value, .* and \d+ more differ from what was saved"
                             r".*2/state/\S+ is missing.*Restore an earlier step \(step=1"):
        train.restore_checkpoint(tmp_path, fresh)


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, name, what", [
    (lambda step: truncate(largest_data_file(step)), "data", r"has \d+ bytes, \d+ were saved"),
    (lambda step: largest_data_file(step).unlink(), "data", "is missing"),
    (lambda step: truncate(step / "tpu_course.json"), "tpu_course.json", "cannot be read as JSON"),
], ids=["truncated data", "deleted data", "truncated json"])
def test_truncated_or_deleted_files_name_the_step_and_the_file(tmp_path, states, damage, name, what):
    fresh, one, _ = states
    train.save_checkpoint(tmp_path, one, step=3)
    target = largest_data_file(tmp_path / "3").relative_to(tmp_path) if name == "data" else \
        pathlib.Path("3", name)
    damage(tmp_path / "3")
    with pytest.raises(train.CheckpointDamagedError,
                       match=rf"step 3 in .* is damaged: {re.escape(str(target))} {what}.*no earlier step"
                             rf".*or delete .*3 and train that step again"):
        train.restore_checkpoint(tmp_path, fresh)


# --------------------------------------------------------------------------- refused first


def test_a_path_that_is_a_file_is_refused_and_nothing_is_written(tmp_path, states):
    _, one, _ = states
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    for call in (lambda: train.save_checkpoint(file, one), lambda: train.latest_step(file),
                 lambda: train.restore_checkpoint(file, one),
                 lambda: train.save_checkpoint(file / "sub", one)):
        with pytest.raises(errors.CourseValueError, match=r"notes.txt.*is a file"):
            call()
    with pytest.raises(errors.CourseValueError, match=r"checkpoint_dir=.*notes.txt'? is a file"):
        train.fit(TINY, data=synthetic(), checkpoint_dir=file)
    with pytest.raises(errors.CourseTypeError, match="expected a folder path"):
        train.save_checkpoint(3, one)
    assert file.read_text() == "mine" and sorted(tmp_path.iterdir()) == [file]


def test_metadata_json_cannot_hold_is_refused_before_saving(tmp_path, states):
    _, one, _ = states
    for bad, where in [({"w": np.zeros(3)}, r"metadata\['w'\] is a numpy.ndarray"),
                       ({"tags": {"a", "b"}}, r"metadata\['tags'\] is a set"),
                       ({"runs": [1, {"lr": np.float32(0.1)}]}, r"metadata\['runs'\]\[1\]\['lr'\] is a numpy.float32"),
                       ({3: "x"}, r"metadata has the key 3, an int")]:
        with pytest.raises(errors.CourseTypeError, match=where + ".*JSON cannot hold.*nothing was saved"):
            train.save_checkpoint(tmp_path / "c", one, bad, step=1)
    assert not (tmp_path / "c").exists()  # no folder, no *.orbax-checkpoint-tmp, nothing
    train.save_checkpoint(tmp_path / "c", one, {"w": np.zeros(3).tolist(), "f": np.float64(0.5)}, step=1)
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["1"]


def test_fit_resume_with_a_learners_folder_named_like_a_step(tmp_path, uninterrupted):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "mine.txt").write_text("x")
    (tmp_path / "2023").mkdir()
    # 1/ is where fit would save epoch 1: refused before training, with the fix; no KeyError.
    with pytest.raises(errors.CourseValueError, match=r"folders named like the steps fit saves.*1/"
                                                      r".*move them, or choose another"):
        train.fit(TINY, data=synthetic(), checkpoint_dir=tmp_path, resume=True)
    (tmp_path / "1" / "mine.txt").rename(tmp_path / "mine.txt")
    (tmp_path / "1").rmdir()
    h = train.fit(TINY, data=synthetic(), checkpoint_dir=tmp_path, resume=True)  # 2023/ ignored
    assert len(h.epochs) == 3 and train.latest_step(tmp_path) == 3
    assert (tmp_path / "2023").is_dir()
    assert h.train_loss == uninterrupted.train_loss  # nothing resumed: a run from scratch
    with pytest.raises(errors.CourseValueError, match="resume=True needs checkpoint_dir"):
        train.fit(TINY, data=synthetic(), resume=True)


# --------------------------------------------------------------------------- preemption


CHILD = '''
import sys
import numpy as np, types
from tpu_course import train
{synthetic}

class Gated(train.PIPELINES["prefetch"]):
    """The real pipeline; at the first step of epoch 2 it says so and waits for the parent."""
    def train_epoch(self, state, epoch, advance):
        def report(k):
            advance(k)
            if epoch == 1 and not getattr(self, "said", False):
                self.said = True
                print(f"step {{epoch * self.steps_per_epoch + 1}}", flush=True)
                sys.stdin.readline()  # SIGTERM arrives here, in the middle of epoch 2
        return super().train_epoch(state, epoch, report)

train.PIPELINES["prefetch"] = Gated
train.fit(train.TrainConfig(**{config}), data=synthetic(), checkpoint_dir=sys.argv[1])
print("finished every epoch", flush=True)
'''


def test_sigterm_saves_the_epoch_in_flight_and_resume_continues_it(tmp_path, uninterrupted):
    import dataclasses

    cfg = TINY
    script = CHILD.format(synthetic=inspect.getsource(synthetic),
                          config=repr(dataclasses.asdict(cfg)))
    # The child reads this module's compilation cache: TINY's programs (and the donation
    # probe's), compiled by the fixture above, are loaded there, not compiled again.
    cache = jax.config.jax_compilation_cache_dir
    env = {**env_cpu(), **({"JAX_COMPILATION_CACHE_DIR": cache,
                            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"} if cache else {})}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), str(tmp_path / "ck")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)
    try:
        line = proc.stdout.readline()  # blocks until the child is in epoch 2 (or dies)
        assert line.startswith("step 7"), (line, proc.stderr.read() if not line else "")
        proc.send_signal(signal.SIGTERM)
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err[-3000:]
    assert "finished every epoch" not in out and "Traceback" not in err
    assert "SIGTERM received: stopped after epoch 2 of 3, saved as step 2" in err
    assert train.latest_step(tmp_path / "ck") == 2
    # Resume continues from step 2 and ends exactly where an uninterrupted run ends.
    resumed = train.fit(cfg, data=synthetic(), checkpoint_dir=tmp_path / "ck", resume=True)
    whole = uninterrupted
    assert [e.epoch for e in resumed.epochs] == [1, 2, 3]
    assert resumed.test_accuracy == whole.test_accuracy and resumed.train_loss == whole.train_loss
    assert_same(resumed.state, whole.state)


def test_a_sigterm_during_a_run_that_ends_anyway_is_deferred_not_swallowed():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with train._SigtermFlag() as flag:
            signal.raise_signal(signal.SIGTERM)  # fit's flag takes it: the run goes on
            assert flag.received and seen == []
        assert seen == [signal.SIGTERM]  # delivered to the previous handler on the way out
        with pytest.raises(RuntimeError), train._SigtermFlag() as flag:  # fit failed: not re-sent
            signal.raise_signal(signal.SIGTERM)
            raise RuntimeError
        assert seen == [signal.SIGTERM]
        with train._SigtermFlag(active=False) as flag:  # fit without a checkpoint_dir
            signal.raise_signal(signal.SIGTERM)
        assert not flag.received and seen == [signal.SIGTERM] * 2
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------- nothing deleted, nothing passed over


def test_a_save_leaves_a_strangers_temporary_looking_folder_alone_and_says_so(tmp_path, states):
    fresh, _, _ = states
    theirs = tmp_path / "0.tpu-course-tmp"  # the fixed name older versions deleted
    theirs.mkdir()
    (theirs / "mine.txt").write_text("keep me")
    with pytest.warns(train.checkpoints.CheckpointWarning,
                      match=r"holds 0\.tpu-course-tmp: left alone .* never deleted"):
        train.save_checkpoint(tmp_path, fresh, {"a": 1}, step=0)
    assert (theirs / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "0.tpu-course-tmp"]  # no temp left
    assert train.checkpoints.saved_metadata(tmp_path) == {"a": 1}


def test_a_newer_step_without_its_manifest_is_named_not_passed_over(tmp_path, states):
    fresh, one, two = states
    train.save_checkpoint(tmp_path, one, step=1)
    train.save_checkpoint(tmp_path, two, step=2)
    (tmp_path / "2" / "tpu_course.json").unlink()  # a save cut short, or a manifest deleted
    assert train.latest_step(tmp_path) == 1
    with pytest.warns(train.checkpoints.CheckpointWarning,
                      match=r"restoring step 1 of .*; 2/ is newer but has no tpu_course.json"):
        restored, _ = train.restore_checkpoint(tmp_path, fresh)
    assert_same(restored, one)


def test_what_is_not_a_pytree_of_arrays_is_refused_by_name(tmp_path, states):
    fresh, _, _ = states
    with pytest.raises(errors.CourseTypeError, match=r"state: expected a pytree of arrays .* holds "
                       r"an int \(1\); pass it as an array \(np.asarray\(1\)\)"):
        train.save_checkpoint(tmp_path, {"w": 1}, step=1)
    with pytest.raises(errors.CourseValueError, match=r"step=None: state \(a dict\) has no .step"):
        train.save_checkpoint(tmp_path, {"w": np.zeros(2)})
    train.save_checkpoint(tmp_path, fresh, step=1)
    with pytest.raises(errors.CourseValueError, match=r"like=None: expected a pytree of arrays"):
        train.restore_checkpoint(tmp_path, None)
    with pytest.raises(errors.CourseValueError, match=r"directory='.*absent' does not exist"):
        train.restore_checkpoint(tmp_path / "absent", fresh)


# --------------------------------------------------------------------------- the CLI


def test_cli_refuses_bad_flags_in_one_line(capsys):
    from tpu_course.train import __main__ as cli

    assert cli.main(["--epochs", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "python -m tpu_course.train: error: --epochs=0: expected an integer >= 1.\n"
    assert cli.main(["--quick", "--resume"]) == 2
    assert capsys.readouterr().err.strip().endswith("--resume needs --checkpoint-dir DIR: the "
                                                   "folder the run to continue saved its "
                                                   "checkpoints in")


def test_cli_bad_flag_is_one_line_and_resume_says_where_it_starts(capsys, tmp_path, monkeypatch, states):
    from tpu_course.train import __main__ as cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--epochs", "abc"])
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        "python -m tpu_course.train: error: argument --epochs: invalid int value: 'abc' "
        "(--help lists the flags)\n")

    class Stop(Exception):
        pass

    def fake_fit(config, **kwargs):
        raise Stop  # what was said before training is the point

    monkeypatch.setattr(train, "fit", fake_fit)
    ck = tmp_path / "ck"
    with pytest.raises(Stop):
        cli.main(["--quick", "--checkpoint-dir", str(ck), "--resume"])
    assert capsys.readouterr().err == (f"python -m tpu_course.train: --resume: nothing saved in "
                                       f"{ck} yet: starting from scratch (epoch 1)\n")
    train.save_checkpoint(ck, states[0], step=1)
    with pytest.raises(Stop):
        cli.main(["--quick", "--checkpoint-dir", str(ck), "--resume"])
    epochs = train.TrainConfig.quick().epochs
    assert capsys.readouterr().err == (f"python -m tpu_course.train: --resume: continuing after "
                                       f"epoch 1 of {epochs}, saved in {ck}\n")


def test_a_checkpoint_dir_that_is_a_file_exits_promptly(tmp_path):
    """The public function and ``python -m tpu_course.train`` (run as ``__main__``, in one
    process to save a start-up) refuse it before any training, and the process ends at
    once: the old hang was Orbax's threads keeping a failed process alive ~5 minutes."""
    file = tmp_path / "ck"
    file.write_text("mine")
    script = textwrap.dedent(f"""
        import runpy, sys
        import numpy as np
        from tpu_course import errors, train
        try:
            train.save_checkpoint({str(file)!r}, {{"w": np.zeros(2)}}, step=1)
        except errors.CourseValueError as e:
            print(e, flush=True)
        sys.argv = ["python -m tpu_course.train", "--quick", "--checkpoint-dir", {str(file)!r}]
        runpy.run_module("tpu_course.train", run_name="__main__", alter_sys=True)
        """)
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env_cpu(), cwd=REPO)
    elapsed = time.monotonic() - t
    assert proc.stdout.startswith(f"directory='{file}' is a file, not a folder"), proc.stderr[-3000:]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == (f"python -m tpu_course.train: error: checkpoint_dir='{file}' is a "
                           f"file, not a folder: checkpoints are folders of steps. Pass a folder "
                           f"(it is created if missing), e.g. '{file}_checkpoints'.\n")
    assert proc.stdout.count("\n") == 1  # nothing was trained (no history printed)
    assert elapsed < 60, f"took {elapsed:.0f} s to exit"
    assert file.read_text() == "mine"
