"""Evaluating a model on a whole test set (chapter 5): one loop, two ways in.

:func:`evaluate` is chapter 5's loop (the chapter writes it; this is the same code): the
jitted eval step of :func:`~tpu_course.train.step.make_eval_step` over padded batches,
summing correct predictions, loss and count so that every example counts exactly once.
:func:`evaluate_model` runs that same loop for a model in hand and adds the predicted
classes (for :func:`confusion_matrix`). ``train.fit`` evaluates through its pipeline
instead (:mod:`tpu_course.train.pipelines`), with the same eval step.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from tpu_course import errors, models
from tpu_course.train.pipelines import batches
from tpu_course.train.step import make_eval_step


def evaluate(eval_step, params, images, labels, batch_size=1000):
    """Accuracy and mean loss over every one of ``images``."""
    totals = {"correct": 0.0, "loss_sum": 0.0, "count": 0.0}
    for b in batches(images, labels, batch_size, shuffle=False, last_batch="pad"):
        sums = eval_step(params, b)
        totals = {k: totals[k] + sums[k] for k in totals}
    return {"accuracy": float(totals["correct"] / totals["count"]),
            "loss": float(totals["loss_sum"] / totals["count"]),
            "count": int(totals["count"])}


@dataclasses.dataclass(frozen=True, repr=False)
class Evaluation:
    """Test-set results: accuracy and mean loss over all ``count`` examples, predictions."""

    accuracy: float
    loss: float
    count: int
    predictions: np.ndarray

    def __repr__(self) -> str:
        return f"Evaluation(accuracy={self.accuracy:.4f}, loss={self.loss:.4f}, count={self.count})"


def evaluate_model(model: nnx.Module, images: np.ndarray, labels: np.ndarray,
                   batch_size: int = 1000) -> Evaluation:
    """:func:`evaluate` for a model in hand, plus its predicted class for every image.

    >>> from tpu_course import models
    >>> x, y = np.zeros((5, 28, 28), np.uint8), np.arange(5)
    >>> ev = evaluate_model(models.MLP(rngs=nnx.Rngs(0)), x, y, batch_size=2)
    >>> ev.count, ev.predictions.shape
    (5, (5,))
    """
    if not isinstance(model, nnx.Module):
        raise errors.CourseTypeError(
            f"model={type(model).__name__}: expected a Flax NNX model. For an eval step and "
            "its parameters use train.evaluate(eval_step, params, images, labels).")
    graphdef, params = nnx.split(model, nnx.Param, ...)[:2]
    batch_size = errors.check_int("batch_size", batch_size, low=1)
    eval_step = make_eval_step(graphdef)

    @jax.jit
    def sums_and_classes(p, batch):  # one compiled step: XLA shares the forward pass
        logits = nnx.merge(graphdef, p)(models.prepare_images(batch.images))
        return eval_step(p, batch), logits.argmax(-1)

    classes = []

    def step(p, batch):  # evaluate's loop, keeping each batch's predicted classes
        sums, predicted = sums_and_classes(p, batch)
        classes.append(np.asarray(predicted))
        return sums

    sums = evaluate(step, params, images, labels, batch_size)
    predictions = np.concatenate(classes)[:len(images)]  # the padded tail dropped
    return Evaluation(sums["accuracy"], sums["loss"], sums["count"], predictions)


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray,
                     num_classes: int = models.NUM_CLASSES) -> np.ndarray:
    """``C[i, j]`` = number of examples of true class i predicted as class j.

    >>> confusion_matrix(np.array([0, 1, 1]), np.array([0, 1, 0]), 2).tolist()
    [[1, 0], [1, 1]]
    """
    cm = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(cm, (np.asarray(labels), np.asarray(predictions)), 1)
    return cm
