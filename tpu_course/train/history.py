"""What a training run measured: per-epoch records, the :class:`History` ``train.fit``
returns, time to accuracy, step timing, and the committed accelerator results.

Time is split honestly. ``compile_time_s`` is the ahead-of-time compilation
(``jit(...).lower(...).compile()``) of every function the run uses, timed apart;
``train_time_s`` is the time in training steps only, measured from an epoch's first
launch to ``block_until_ready`` of its last result (no compilation, no evaluation);
``images_per_s = images trained / train_time_s``. :func:`time_to_accuracy` reads the
first epoch at which the test accuracy reached a target, and reports training time to
it, with and without compilation.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from flax import nnx

from tpu_course import errors
from tpu_course.train.config import TrainConfig
from tpu_course.train.step import Batch, TrainState, to_model

@dataclasses.dataclass(frozen=True)
class EpochRecord:
    """One epoch: mean training loss/accuracy, test loss/accuracy, cumulative times (s).

    ``step`` is the number of training steps done when the epoch ended (the x position
    of its test accuracy in :meth:`History.plot`).
    """

    epoch: int
    step: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    train_time_s: float  # cumulative training-step time to the end of this epoch
    wall_time_s: float  # since fit() began: data, compilation, training and evaluation


@dataclasses.dataclass(frozen=True, repr=False)
class History:
    """What ``fit`` measured. Times in seconds; ``train_time_s`` excludes compilation.

    ``steps`` holds ``(step, mean loss, mean accuracy)`` of every ``log_every`` training
    steps. ``state`` and ``graphdef`` are the trained result (``model`` rebuilds the
    ``nnx.Module``).
    """

    config: TrainConfig
    train_set: str
    device: str
    epochs: tuple[EpochRecord, ...]
    steps: tuple[tuple[int, float, float], ...]
    compile_time_s: float
    train_time_s: float
    eval_time_s: float
    images_trained: int
    wall_time_s: float
    state: Any = dataclasses.field(default=None, compare=False)
    graphdef: Any = dataclasses.field(default=None, compare=False)

    @property
    def test_accuracy(self) -> list[float]:
        """Test accuracy after each epoch."""
        return [e.test_accuracy for e in self.epochs]

    @property
    def train_loss(self) -> list[float]:
        """Mean training loss of each epoch."""
        return [e.train_loss for e in self.epochs]

    @property
    def images_per_s(self) -> float:
        """Training throughput: images trained / training time (compilation excluded)."""
        return self.images_trained / self.train_time_s if self.train_time_s > 0 else float("nan")

    @property
    def model(self) -> nnx.Module:
        """The trained model."""
        return to_model(self.graphdef, self.state)

    def summary(self) -> str:
        """A few lines: data, device, final accuracy, times, throughput."""
        last = self.epochs[-1] if self.epochs else None
        acc = f"{last.test_accuracy:.2%}" if last else "n/a"
        return (f"{self.config.model.upper()} on {self.train_set}, {len(self.epochs)} epoch(s), "
                f"{self.config.pipeline} pipeline, {self.config.compute_dtype}, on {self.device}\n"
                f"test accuracy {acc}; compile {self.compile_time_s:.2f} s, training "
                f"{self.train_time_s:.2f} s, evaluation {self.eval_time_s:.2f} s, wall "
                f"{self.wall_time_s:.2f} s; {self.images_per_s:,.0f} images/s")

    def __repr__(self) -> str:
        return f"History({self.summary()})"

    def table(self) -> str:
        """Per-epoch table (deterministic columns first, times last)."""
        rows = ["epoch  train loss  train acc  test loss  test acc  train s  wall s"]
        for e in self.epochs:
            rows.append(f"{e.epoch:5d}  {e.train_loss:10.4f}  {e.train_accuracy:9.4f}  "
                        f"{e.test_loss:9.4f}  {e.test_accuracy:8.4f}  {e.train_time_s:7.2f}  "
                        f"{e.wall_time_s:6.2f}")
        return "\n".join(rows)

    def plot(self, ax: Any = None) -> Any:
        """Training loss every ``log_every`` steps and test accuracy per epoch (matplotlib)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(1, 2, figsize=(10, 3.2))
        s = np.array(self.steps) if self.steps else np.zeros((0, 3))
        ax[0].plot(s[:, 0], s[:, 1], label="training loss")
        ax[0].set(xlabel="step", ylabel="loss", yscale="log", title="training loss")
        ax[1].plot([e.step for e in self.epochs], self.test_accuracy, "o-",
                   label="test accuracy")
        ax[1].plot(s[:, 0], s[:, 2], alpha=0.5, label="training accuracy (batch mean)")
        ax[1].set(xlabel="step", ylabel="accuracy", title="accuracy", ylim=(0.8, 1.0))
        ax[1].legend(loc="lower right")
        return ax


@dataclasses.dataclass(frozen=True)
class TimeToAccuracy:
    """When a run first reached ``target`` test accuracy (checked after every epoch).

    ``train_time_s`` is training-step time only; ``with_compile_s`` adds compilation;
    ``wall_time_s`` is from the start of ``fit`` (data, compile, train, eval). All None
    when the target was never reached.
    """

    target: float
    reached: bool
    epoch: int | None
    accuracy: float | None
    train_time_s: float | None
    with_compile_s: float | None
    wall_time_s: float | None
    device: str

    def __str__(self) -> str:
        if not self.reached:
            return f"{self.target:.1%} not reached on {self.device}"
        return (f"{self.target:.1%} reached after epoch {self.epoch} ({self.accuracy:.2%}): "
                f"{self.train_time_s:.3f} s of training, {self.with_compile_s:.3f} s with "
                f"compilation, {self.wall_time_s:.3f} s wall, on {self.device}")


def time_to_accuracy(history: History, target: float = 0.976) -> TimeToAccuracy:
    """The first epoch whose test accuracy is >= ``target``, and the time it took."""
    for e in history.epochs:
        if e.test_accuracy >= target:
            return TimeToAccuracy(target, True, e.epoch, e.test_accuracy, e.train_time_s,
                                  e.train_time_s + history.compile_time_s, e.wall_time_s,
                                  history.device)
    return TimeToAccuracy(target, False, None, None, None, None, None, history.device)


# --------------------------------------------------------------------------- timing

@dataclasses.dataclass(frozen=True)
class StepTiming:
    """Timed training steps: how many, seconds per step, images per second."""

    steps: int
    seconds_per_step: float
    images_per_s: float

    def __str__(self) -> str:
        return (f"{self.steps} steps: {self.seconds_per_step * 1e3:.2f} ms/step, "
                f"{self.images_per_s:,.0f} images/s")


def time_steps(run_step: Callable, state: TrainState, batch_iter: Iterable[Batch], *,
               warmup: int = 2) -> tuple[TrainState, StepTiming]:
    """Run ``run_step`` over ``batch_iter`` threading the state; time all but ``warmup`` steps.

    The clock starts after ``warmup`` steps have finished (so compilation is excluded)
    and stops when the last state is ready (``jax.block_until_ready``). The state is
    threaded through, so this also times a step that donates its input state, which a
    harness calling ``fn(*args)`` again and again cannot.
    """
    it = iter(batch_iter)
    for _ in range(warmup):
        state, _ = run_step(state, next(it))
    jax.block_until_ready(state)
    t = time.perf_counter()
    steps = images = 0
    for batch in it:
        state, _ = run_step(state, batch)
        steps += 1
        images += len(batch.labels)
    jax.block_until_ready(state)
    elapsed = time.perf_counter() - t
    if steps == 0:
        raise errors.CourseValueError(f"batch_iter gave no batches after the {warmup} warm-up steps")
    return state, StepTiming(steps, elapsed / steps, images / elapsed)



# --------------------------------------------------------------------------- reference runs

#: Committed ``make bench`` results shipped inside the package, so that a notebook shows
#: them on any runtime (Colab included), not only in a clone of the repository.
REFERENCE_DIR = pathlib.Path(__file__).resolve().parent.parent / "reference"


def accelerator_reference(name: str = "mnist-h200") -> dict:
    """A committed benchmark result: ``bench/results/<name>.json`` as ``make bench`` wrote it.

    Measured, not sourced: each holds the device, the date and the jax version of the run
    that produced it, and its rows (see ``bench/bench_mnist.py``). Chapter 5 shows the
    H200's rows beside its own CPU measurements. A test keeps the copy in
    ``tpu_course/reference/`` equal to the one in ``bench/results/``.

    >>> ref = accelerator_reference()
    >>> ref["device"], sorted({r["train_set"].split(":")[0] for r in ref["rows"]})
    ('h200', ['fashion_mnist', 'mnist'])
    """
    path = REFERENCE_DIR / f"{name}.json"
    if not path.exists():
        known = sorted(p.stem for p in REFERENCE_DIR.glob("*.json"))
        raise ValueError(f"no committed result {name!r}; the package ships {known}")
    return json.loads(path.read_text())
