"""Training the chapter-5 models: ``fit(config) -> History``, the one training loop.

``fit`` runs any :class:`TrainConfig`: it builds the model and the optimizer, the pure
train step (:mod:`tpu_course.train.step`), and the input pipeline the config names (one
interface, :mod:`tpu_course.train.pipelines`), compiles every function ahead of time
(timed apart), then trains epoch by epoch and evaluates on the whole test set after each
one, recording a :class:`History` (:mod:`tpu_course.train.history`). With
``checkpoint_dir`` it saves the state after every epoch through Orbax
(:mod:`tpu_course.train.checkpoints`) and ``resume=True`` continues a run from its last
saved epoch, bit for bit, refusing a checkpoint written under a different config. With
``placement`` the same loop runs sharded over a mesh (chapter 6:
``tpu_course.parallel.train_chapter5``).

The package is the concept's one public face, as optax's is: its parts live in
submodules, and the names the course uses are exposed here (``train.TrainConfig``,
``train.Batch``, ``train.batches``, ``train.evaluate`` ...):

* :mod:`~tpu_course.train.step`: ``Batch``, ``TrainState``, the pure train and eval steps;
* :mod:`~tpu_course.train.pipelines`: how batches reach the step (host and device);
* :mod:`~tpu_course.train.evaluation`: chapter 5's evaluation loop, and a model in hand;
* :mod:`~tpu_course.train.config`: ``TrainConfig``, what to train and how;
* :mod:`~tpu_course.train.history`: what a run measured, time to accuracy;
* :mod:`~tpu_course.train.checkpoints`: save and restore through Orbax;
* ``__main__``: the command line, ``python -m tpu_course.train --quick``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tpu_course import errors, models, runtime
from tpu_course.train import pipelines
from tpu_course.train import checkpoints
from tpu_course.train.checkpoints import (CheckpointDamagedError, latest_step, restore_checkpoint,
                                          save_checkpoint)
from tpu_course.train.config import TrainConfig
from tpu_course.train.evaluation import Evaluation, confusion_matrix, evaluate, evaluate_model
from tpu_course.train.history import (REFERENCE_DIR, EpochRecord, History, StepTiming,
                                      TimeToAccuracy, accelerator_reference, time_steps,
                                      time_to_accuracy)
from tpu_course.train.pipelines import (PIPELINES, DevicePipeline, HostPipeline, Pipeline,
                                        Placement, batches, device_epoch_indices,
                                        epoch_indices, make_device_epoch,
                                        make_device_evaluate, prefetch_to_device)
from tpu_course.train.step import (Batch, TrainState, init_state, loss_fn, make_eval_step,
                                   make_train_step, to_model)

__all__ = [
    "REFERENCE_DIR", "Batch", "CheckpointDamagedError", "DevicePipeline", "EpochRecord",
    "Evaluation", "History", "HostPipeline", "PIPELINES", "Pipeline", "Placement", "Preempted",
    "StepTiming", "TimeToAccuracy",
    "TrainConfig", "TrainState", "accelerator_reference", "batches", "confusion_matrix",
    "device_epoch_indices", "epoch_indices", "evaluate", "evaluate_model", "fit", "init_state",
    "latest_step",
    "loss_fn", "make_device_epoch", "make_device_evaluate", "make_eval_step", "make_optimizer",
    "make_train_step", "prefetch_to_device", "restore_checkpoint", "save_checkpoint",
    "time_steps", "time_to_accuracy", "to_model",
]


def make_optimizer(config: TrainConfig, steps_per_epoch: int) -> optax.GradientTransformation:
    """``config.optimizer``: Adam with a linear warm-up to ``learning_rate`` and a cosine
    decay to 0 over the run, or SGD at a constant ``learning_rate``."""
    if config.optimizer == "sgd":
        return optax.sgd(config.learning_rate)
    total = max(config.epochs * steps_per_epoch, config.warmup_steps + 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, min(config.warmup_steps, total - 1), total)
    return optax.adam(schedule)


def _load(config: TrainConfig) -> Any:
    from tpu_course import data

    return data.load_mnist() if config.dataset == "mnist" else data.load_fashion_mnist()


def _device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform.upper()} {d.device_kind}"


def _resume(config: TrainConfig, checkpoint_dir: Any, state: TrainState) -> tuple[TrainState, dict]:
    """The state and metadata of the newest checkpoint, if it was written under ``config``."""
    restored, meta = restore_checkpoint(checkpoint_dir, state)
    differences = config.differences(meta["config"])
    if differences:
        raise errors.CourseValueError(
            f"the checkpoint in {checkpoint_dir} was written by a different run: "
            f"{'; '.join(differences)}. Resume with the config that wrote it, or start a "
            f"fresh run in another checkpoint_dir. These fields may differ: "
            f"{', '.join(TrainConfig.NOT_IN_RESULT)}.")
    return restored, meta


def _check_checkpoint_dir(config: TrainConfig, checkpoint_dir: Any, resume: bool) -> None:
    """Refuse, before anything is trained, a checkpoint_dir fit cannot save into."""
    path = checkpoints.check_directory(checkpoint_dir)
    newest = latest_step(path)
    if newest is not None and not resume:
        raise errors.CourseValueError(
            f"{checkpoint_dir} already holds checkpoints (newest: step {newest}): pass "
            "resume=True to continue that run, or choose an empty checkpoint_dir")
    _, foreign = checkpoints.step_folders(path)
    clash = [s for s in foreign if 1 <= s <= config.epochs]
    if clash:
        raise errors.CourseValueError(
            f"{checkpoint_dir} holds folders named like the steps fit saves (1 to "
            f"{config.epochs}, one per epoch) that the course did not write: "
            f"{', '.join(f'{s}/' for s in clash)}. The course never overwrites them: move them, "
            "or choose another checkpoint_dir.")


class Preempted(SystemExit):
    """``fit`` stopped on SIGTERM (a spot VM's preemption notice) after saving a checkpoint.

    A ``SystemExit`` with code 143 (128 + SIGTERM, what a shell reports for a process
    ended by that signal), so a script stops there without a traceback and a scheduler
    sees an unfinished run; ``fit(config, checkpoint_dir=..., resume=True)`` continues it.
    """

    def __init__(self, message: str, checkpoint_dir: str, step: int):
        super().__init__(143)
        self.message, self.checkpoint_dir, self.step = message, checkpoint_dir, step

    def __str__(self) -> str:
        return self.message


class _SigtermFlag:
    """While ``active``, SIGTERM sets ``self.received`` instead of ending the process; a second
    SIGTERM acts as it did before (so a stuck run can still be stopped), and a SIGTERM that
    arrived during a run that then ended normally is delivered on exit (deferred, never
    swallowed). Only in the main thread, where Python runs signal handlers."""

    def __init__(self, active: bool = True) -> None:
        self.active, self.received = active, False
        self._installed, self._previous = False, signal.SIG_DFL

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = True
        signal.signal(signal.SIGTERM, self._previous)

    def __enter__(self) -> "_SigtermFlag":
        if self.active and threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, self._handle)
            self._previous = signal.SIG_DFL if previous is None else previous
            self._installed = True
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            if self.received and exc_type is None:  # the run ended anyway: deliver it now
                signal.raise_signal(signal.SIGTERM)


def fit(config: TrainConfig = TrainConfig(), *, data: Any = None,
        checkpoint_dir: str | os.PathLike | None = None, resume: bool = False,
        placement: Callable[[TrainState], Placement] | None = None) -> History:
    """Train ``config.model`` on ``config.dataset``; evaluate on the full test set each epoch.

    Args:
        config: what to train and how (:class:`TrainConfig`).
        data: a dataset with ``train_images``, ``train_labels``, ``test_images``,
            ``test_labels`` and ``train_set`` (default: ``tpu_course.data``'s loader).
        checkpoint_dir: save the state after every epoch there (Orbax; the newest kept;
            folders there that the course did not write are never touched). A path that
            is a file, or lies under one, is refused before anything is trained. With a
            ``checkpoint_dir``, SIGTERM (a spot VM's preemption notice) lets the epoch in
            flight finish, saves it and raises :class:`Preempted` (exit code 143).
        resume: continue from the newest checkpoint in ``checkpoint_dir`` when there is
            one (the next epochs see exactly the batches an uninterrupted run would); a
            checkpoint written under a different config is refused. Without ``resume`` a
            ``checkpoint_dir`` that already holds checkpoints is refused; ``resume``
            without a ``checkpoint_dir`` is refused.
        placement: for a sharded run, ``placement(state) -> Placement`` says where the
            state, the batches and the metrics live ('prefetch' pipeline only; see
            ``tpu_course.parallel.strategy_placement``).

    Returns:
        a :class:`History`.
    """
    t_start = time.perf_counter()
    if checkpoint_dir is not None:
        _check_checkpoint_dir(config, checkpoint_dir, resume)
    elif resume:
        raise errors.CourseValueError("resume=True needs checkpoint_dir: the folder the run to "
                                      "continue saved its checkpoints in")
    ds = data if data is not None else _load(config)
    train_x, train_y = np.asarray(ds.train_images), np.asarray(ds.train_labels, np.int32)
    if config.max_train_examples is not None:
        train_x, train_y = train_x[: config.max_train_examples], train_y[: config.max_train_examples]
    n = len(train_x)

    steps_per_epoch = pipelines.steps_per_epoch(n, config.batch_size, config.last_batch)
    model = models.create(config.model, seed=config.seed, **config.model_kwargs())
    tx = make_optimizer(config, steps_per_epoch)
    graphdef, state = init_state(model, tx)
    dtype = jnp.bfloat16 if config.compute_dtype == "bfloat16" else None
    place = placement(state) if placement is not None else None
    pipeline: Pipeline = PIPELINES[config.pipeline](
        (train_x, train_y), (ds.test_images, ds.test_labels), batch_size=config.batch_size,
        eval_batch_size=config.eval_batch_size, seed=config.seed, shuffle=config.shuffle,
        last_batch=config.last_batch, depth=config.prefetch, placement=place)

    done: list[EpochRecord] = []
    logged: list[tuple[int, float, float]] = []
    if resume and checkpoint_dir is not None and latest_step(checkpoint_dir) is not None:
        state, meta = _resume(config, checkpoint_dir, state)
        done = [EpochRecord(**r) for r in meta["epochs"]]
        logged = [tuple(s) for s in meta["steps"]]
    # Committed to its device(s) as a restored state is: a resumed run then reuses the
    # programs a fresh run compiled (an uncommitted state is another cache key).
    state = jax.device_put(state, place.state if place is not None else jax.devices()[0])
    donate = (0,) if config.donate and runtime.donation_is_safe() else ()
    compile_time = pipeline.compile(make_train_step(graphdef, tx, compute_dtype=dtype),
                                    make_eval_step(graphdef, compute_dtype=dtype), state, donate)

    train_time = done[-1].train_time_s if done else 0.0
    prior_wall = done[-1].wall_time_s if done else 0.0
    eval_time, images = 0.0, 0
    from tqdm.auto import tqdm

    bar = tqdm(total=config.epochs * steps_per_epoch, initial=len(done) * steps_per_epoch,
               disable=not config.progress, desc=f"{config.model} on {config.dataset}", unit="step")
    with _SigtermFlag(active=checkpoint_dir is not None) as sigterm:
        for epoch in range(len(done), config.epochs):
            t0 = time.perf_counter()
            state, metrics = pipeline.train_epoch(state, epoch, bar.update)
            train_time += time.perf_counter() - t0
            images += pipeline.images_per_epoch

            t1 = time.perf_counter()
            sums = pipeline.evaluate(state.params)
            eval_time += time.perf_counter() - t1
            losses = np.asarray(metrics["loss"], np.float64)
            accs = np.asarray(metrics["accuracy"], np.float64)
            every = config.log_every
            for j in range(0, steps_per_epoch - every + 1, every):
                logged.append((epoch * steps_per_epoch + j + every, float(losses[j:j + every].mean()),
                               float(accs[j:j + every].mean())))
            record = EpochRecord(
                epoch=epoch + 1, step=(epoch + 1) * steps_per_epoch, train_loss=float(losses.mean()),
                train_accuracy=float(accs.mean()), test_loss=float(sums["loss_sum"] / sums["count"]),
                test_accuracy=float(sums["correct"] / sums["count"]), train_time_s=train_time,
                wall_time_s=prior_wall + time.perf_counter() - t_start)
            done.append(record)
            bar.set_postfix(loss=f"{record.train_loss:.4f}", test_acc=f"{record.test_accuracy:.4f}")
            if checkpoint_dir is not None:
                save_checkpoint(checkpoint_dir, state, {"epochs": [dataclasses.asdict(r) for r in done],
                                                        "steps": logged,
                                                        "config": dataclasses.asdict(config)},
                                step=epoch + 1, max_to_keep=1)
            if sigterm.received and epoch + 1 < config.epochs:
                bar.close()
                message = (f"SIGTERM received: stopped after epoch {epoch + 1} of {config.epochs}, "
                           f"saved as step {epoch + 1} in {checkpoint_dir}. Continue with "
                           "fit(config, checkpoint_dir=..., resume=True) (python -m "
                           "tpu_course.train ... --resume).")
                print(message, file=sys.stderr, flush=True)
                raise Preempted(message, str(checkpoint_dir), epoch + 1)
            if config.stop_at_accuracy is not None and record.test_accuracy >= config.stop_at_accuracy:
                break
    bar.close()
    train_set = f"{getattr(ds, 'name', config.dataset)}: {getattr(ds, 'train_set', f'{n} images')}"
    if n < len(ds.train_images):
        train_set += f", first {n:,} used"
    return History(config=config, train_set=train_set, device=_device_name(),
                   epochs=tuple(done), steps=tuple(logged), compile_time_s=compile_time,
                   train_time_s=train_time, eval_time_s=eval_time, images_trained=images,
                   wall_time_s=time.perf_counter() - t_start, state=state, graphdef=graphdef)
