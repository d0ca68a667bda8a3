"""What to train and how: :class:`TrainConfig`, the one argument of ``train.fit``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tpu_course import errors, models


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What to train and how. Defaults are for a real chip; :meth:`quick` for a 2-core CPU.

    Attributes:
        dataset: 'mnist' or 'fashion_mnist' (same code path for both).
        model: 'cnn' or 'mlp' (:mod:`tpu_course.models`).
        features: the CNN's two convolution widths (ignored by the MLP).
        hidden: the CNN's dense hidden width (ignored by the MLP).
        mlp_hidden: the MLP's hidden widths (ignored by the CNN).
        epochs: passes over the training set.
        batch_size: examples per step.
        optimizer: 'adam' (a linear warm-up to ``learning_rate``, then a cosine decay to
            0 over the run) or 'sgd' (plain SGD at a constant ``learning_rate``).
        learning_rate: the peak (Adam) or constant (SGD) learning rate.
        warmup_steps: Adam's linear warm-up steps from 0 to the peak learning rate.
        seed: seeds the model initialisation and every epoch's shuffle.
        shuffle: shuffle every epoch (False: the examples in order, every epoch the same;
            'prefetch' pipeline only).
        pipeline: 'device' (on-device epochs with lax.scan) or 'prefetch' (host batches,
            prefetched to the device, one step launch per batch).
        prefetch: batches in flight ahead of the step ('prefetch' pipeline; 0 = off).
        last_batch: 'drop' or 'pad' the last partial training batch (see module doc).
        compute_dtype: 'float32' or 'bfloat16' (bf16 compute, float32 parameters).
        donate: donate the state buffers to the jitted step.
        eval_batch_size: examples per evaluation batch (the test set is padded to it).
        log_every: record the mean training loss and accuracy every this many steps.
        max_train_examples: train on the first this many examples only (None: all).
        stop_at_accuracy: stop after the first epoch whose test accuracy reaches it (a
            fraction in [0, 1]; 0 stops after the first epoch).
        progress: show a tqdm progress bar.
    """

    dataset: str = "mnist"
    model: str = "cnn"
    features: tuple[int, int] = (16, 32)
    hidden: int = 128
    mlp_hidden: tuple[int, ...] = (256, 256)
    epochs: int = 5
    batch_size: int = 64
    optimizer: str = "adam"
    learning_rate: float = 5e-3
    warmup_steps: int = 10
    seed: int = 0
    shuffle: bool = True
    pipeline: str = "device"
    prefetch: int = 2
    last_batch: str = "drop"
    compute_dtype: str = "float32"
    donate: bool = True
    eval_batch_size: int = 2000
    log_every: int = 20
    max_train_examples: int | None = None
    stop_at_accuracy: float | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        """Check every field, so that nonsense is refused here and not trained on."""
        where = "TrainConfig"
        choices = {"dataset": ("mnist", "fashion_mnist"), "model": tuple(models.MODELS),
                   "pipeline": ("device", "prefetch"), "last_batch": ("drop", "pad"),
                   "compute_dtype": ("float32", "bfloat16"), "optimizer": ("adam", "sgd")}
        for field, allowed in choices.items():
            errors.check_choice(field, getattr(self, field), allowed, where=where)
        for field in ("hidden", "epochs", "batch_size", "eval_batch_size", "log_every"):
            errors.check_int(field, getattr(self, field), low=1, where=where)
        for field in ("warmup_steps", "seed", "prefetch"):
            errors.check_int(field, getattr(self, field), low=0, where=where)
        models.check_widths(where, "features", self.features, count=2)
        models.check_widths(where, "mlp_hidden", self.mlp_hidden)
        # Adam's step is about lr per update: above 1 it only ever diverges on this model.
        errors.check_number("learning_rate", self.learning_rate, low=0, high=1, low_open=True,
                            where=where)
        if self.max_train_examples is not None:
            errors.check_int("max_train_examples", self.max_train_examples, low=1, where=where)
        if self.stop_at_accuracy is not None:
            # 0 is allowed: it stops after the first epoch (a way to interrupt a run).
            errors.check_number("stop_at_accuracy", self.stop_at_accuracy, low=0, high=1,
                                where=where)
        if self.pipeline == "device" and not self.shuffle:
            raise errors.CourseValueError(f"{where}: shuffle=False needs pipeline='prefetch' (the "
                                          "'device' pipeline draws its permutation on the device)")
        for field in ("donate", "progress", "shuffle"):
            if not isinstance(getattr(self, field), bool):
                raise errors.CourseTypeError(f"{where}.{field}={getattr(self, field)!r}: "
                                             "expected True or False.")

    @classmethod
    def quick(cls, **overrides: Any) -> "TrainConfig":
        """The preset for a 2-core CPU (CI): the same model and data, 3 epochs, fp32.

        It uses the host-fed ``'prefetch'`` pipeline: XLA's CPU backend runs a
        ``lax.scan`` of convolutions several times slower than the same step launched
        once per batch (measured here: about 120 vs 900 images/s on 2 busy cores), while
        on a TPU or GPU the on-device epoch is the fast path.
        """
        base = dict(epochs=3, eval_batch_size=1000, pipeline="prefetch")
        base.update(overrides)
        return cls(**base)

    def replace(self, **changes: Any) -> "TrainConfig":
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def model_kwargs(self) -> dict:
        """The widths ``models.create(self.model, ...)`` takes for this model."""
        if self.model == "cnn":
            return {"features": tuple(self.features), "hidden": self.hidden}
        return {"hidden": tuple(self.mlp_hidden)}

    #: Fields that change how a run is shown or stopped, not what it computes: a run may
    #: resume from a checkpoint written under other values of these.
    NOT_IN_RESULT = ("progress", "stop_at_accuracy", "donate", "prefetch")

    def differences(self, stored: dict) -> list[str]:
        """``'field=<stored> there, <self> here'`` for every field that changes the result
        and differs from ``stored`` (a config saved as JSON, e.g. in a checkpoint)."""
        mine = json.loads(json.dumps(dataclasses.asdict(self)))  # tuples -> lists, as stored
        return [f"{k}={stored.get(k, '(absent)')!r} there, {v!r} here" for k, v in mine.items()
                if k not in self.NOT_IN_RESULT and stored.get(k) != v]


