"""Evaluating a trained model: accuracy, loss and predictions on a test set, and the
confusion matrix (chapter 5). ``train.fit`` evaluates through its pipeline instead
(:mod:`tpu_course.train.pipelines`); this is for a model in hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx

from tpu_course import models
from tpu_course.train.pipelines import epoch_indices


@dataclasses.dataclass(frozen=True, repr=False)
class Evaluation:
    """Test-set results: accuracy and mean loss over all ``count`` examples, predictions."""

    accuracy: float
    loss: float
    count: int
    predictions: np.ndarray

    def __repr__(self) -> str:
        return f"Evaluation(accuracy={self.accuracy:.4f}, loss={self.loss:.4f}, count={self.count})"


def evaluate(model: nnx.Module, images: np.ndarray, labels: np.ndarray,
             batch_size: int = 1000) -> Evaluation:
    """Accuracy, loss and predicted classes of ``model`` on every one of ``images``.

    Batched with a padded last batch (one compiled shape), so all examples count.
    """
    graphdef, params = nnx.split(model, nnx.Param, ...)[:2]

    @jax.jit
    def logits_of(p: Any, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, p)(models.prepare_images(x))

    n = len(images)
    idx, w = epoch_indices(n, min(batch_size, n), shuffle=False, last_batch="pad")
    all_logits = np.concatenate([np.asarray(logits_of(params, images[i])) for i in idx])[:n]
    preds = all_logits.argmax(-1)
    labels = np.asarray(labels)
    z = all_logits - all_logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = float(-logp[np.arange(n), labels].mean())
    return Evaluation(float((preds == labels).mean()), loss, n, preds)


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray,
                     num_classes: int = models.NUM_CLASSES) -> np.ndarray:
    """``C[i, j]`` = number of examples of true class i predicted as class j.

    >>> confusion_matrix(np.array([0, 1, 1]), np.array([0, 1, 0]), 2).tolist()
    [[1, 0], [1, 1]]
    """
    cm = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(cm, (np.asarray(labels), np.asarray(predictions)), 1)
    return cm


