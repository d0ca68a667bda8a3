"""Checkers for lab 5: a model, its cost, a train step and a fast pipeline for Fashion-MNIST.

The registry :data:`LAB` lists the exercises in order:

1. **A model under 100,000 parameters** (write): the learner's ``FashionModel`` class
   builds from ``rngs=nnx.Rngs(0)``, holds at most :data:`PARAM_BUDGET` parameters
   (chapter 5's CNN holds twice that: the learner decides where to cut) and ``nnx.Param``
   state only, maps images ``(N, 28, 28, 1)`` to finite logits ``(N, 10)`` for any N (the
   grader tries other N), and compiles under ``nnx.jit``. Whether the budget still
   reaches the target is graded by exercise 5's training. The course's models are refused.
2. **Predict its size and its cost** (predict): before counting, the learner records
   (``LAB.predict``) the parameter count of their model and the FLOPs of one training
   step on a batch of 64; graded against ``models.count_params`` (exactly) and XLA's cost
   analysis of the compiled step (within 25 %: XLA also counts bias adds, ReLUs and the
   optimizer).
3. **A train step that clips gradients** (apply): ``train_step(model, optimizer,
   batch, max_norm)`` under ``nnx.jit`` returning ``{'loss', 'accuracy', 'grad_norm'}``,
   weighted by ``batch.weights`` (padding counts for nothing), scaling the gradient by
   ``min(1, max_norm / global_norm)`` before one update through the optimizer. Compared
   with the course's step (private, :mod:`tpu_course.checks._answers.ch05`) with the clip
   out of the way, then with SGD (where the applied gradient is readable from the update)
   with the clip active and not; per-array, by-value, always-rescaling and post-clip-norm
   mistakes are named. Other batches, learning rates, seeds, optimizers and thresholds
   when grading.
4. **A faster input pipeline** (apply): ``fast_batches`` yields exactly the batches of
   the planted :func:`slow_batches` (same shuffle, same random flips) at least
   :data:`PIPELINE_SPEEDUP` times faster, both timed here in the same run; the grader
   also tries other batch sizes, seeds and data sizes.
5. **Reach 85 % in 3 epochs** (write): the checker owns the data and the loop. The
   learner hands over ``FashionModel``, ``train_step`` (called with ``max_norm`` =
   :data:`MAX_GRAD_NORM`), ``fast_batches`` and
   ``fashion_config`` (batch size, peak learning rate, warm-up steps); the checker
   builds the model, trains it with Adam for exactly :data:`EPOCHS` epochs on the first
   :data:`TRAIN_IMAGES` training images fed by the learner's pipeline (each batch
   compared with the expected one, and a few steps, drawn at random, compared with one
   honest update), then evaluates on the 10,000 test images it alone loads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tpu_course.checks._answers import ch05 as _answers
from tpu_course.checks._core import (
    CheckResult,
    Lab,
    Verdict,
    as_number,
    ok,
    refuse,
    refuse_course_code,
)
from tpu_course.train import Batch

LAB = Lab(5, "A model, a step and a fast pipeline for Fashion-MNIST")

EX1 = "Exercise 1 (a model under 100,000 parameters)"
EX2 = "Exercise 2 (predict its size and its cost)"
EX3 = "Exercise 3 (a train step that clips gradients)"
EX4 = "Exercise 4 (a faster input pipeline)"
EX5 = "Exercise 5 (reach 85 % in 3 epochs)"

#: The lab's accuracy target on the full Fashion-MNIST test set, the epochs the checker
#: trains and the training images it trains on (the first ones of the training set).
TARGET_ACCURACY = 0.85
#: Exercise 1's budget: at most this many parameters (chapter 5's CNN has 206,922).
PARAM_BUDGET = 100_000
#: The global gradient norm exercise 5 clips to (through the learner's step).
MAX_GRAD_NORM = 1.0
EPOCHS = 3
TRAIN_IMAGES = 10_000
#: What ``fashion_config`` holds: name -> (what it is, default).
CONFIG_KEYS = {"batch_size": ("the batch size", 64),
               "learning_rate": ("Adam's peak learning rate", None),
               "warmup_steps": ("steps of linear warm-up before the cosine decay", 0)}
BATCH_SIZES = (16, 1024)
#: On a CPU the checker trains only models up to this forward cost per image (the
#: chapter's CNN costs 2.4 MFLOP): 3 epochs of a bigger one take minutes on 2 cores.
CPU_MAX_FORWARD_FLOPS = 25e6
#: How much faster ``fast_batches`` must be than :func:`slow_batches` (loose: a busy
#: 2-core machine; a vectorised pipeline is 30-100x faster).
PIPELINE_SPEEDUP = 5.0
#: Tolerance of the FLOPs prediction (the parameter count must be exact).
FLOPS_TOLERANCE = 0.25
PREDICT_BATCH = 64

_CACHE: dict[str, Any] = {}  # loaded data only (never a learner's answer)
_JITTED: dict[str, Any] = {}  # the course's own step, compiled
#: Exercise 5's last training run: the scorecard re-runs every check, and training twice
#: would double the lab's slowest cell. Reused only for the very same objects (``is``)
#: and an equal config.
_TRAINED: dict[str, Any] = {}


def slow_batches(images, labels, batch_size, seed=0, epoch=0):
    """Shuffled batches with random left-right flips (data augmentation): correct, but
    slow.

    Same order as ``train.batches`` (``default_rng([seed, epoch]).permutation``), full
    batches only; then, from the same generator, one draw per example in batch order:
    below 0.5 the image is mirrored left-right (a shirt mirrored is still a shirt).
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(images))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        xs, ys = [], []
        for i in order[start:start + batch_size]:  # one example at a time
            image = [list(row) for row in images[i]]  # as Python lists of pixels
            if rng.random() < 0.5:
                image = [row[::-1] for row in image]  # mirror left-right
            xs.append(image)
            ys.append(labels[i])
        yield Batch(np.array(xs, np.uint8), np.array(ys, np.int32),
                    np.ones(batch_size, np.float32))


def _batch(images: Any, labels: Any, weights: Any) -> Any:
    return Batch(images, labels, weights)


def _fixed_batch(n: int = 64, padded: int = 0, seed: int = 0) -> Any:
    """A learnable batch of n digit-like images; the last ``padded`` have weight 0 and
    labels that disagree with their images (so counting them changes loss and accuracy)."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, (10, 28, 28))
    y = rng.integers(0, 10, n).astype(np.int32)
    x = np.clip(templates[y] + rng.normal(0, 60, (n, 28, 28)), 0, 255).astype(np.uint8)
    w = np.ones(n, np.float32)
    if padded:
        w[-padded:] = 0.0
        y[-padded:] = (y[-padded:] + 5) % 10
    return _batch(x, y, w)


def _course_models() -> tuple:
    from tpu_course import models

    return (models.CNN, models.MLP, models.create)


def _refuse_course_model(title: str, FashionModel: Any) -> None:
    """The course's own models (or a subclass that only renames one) are not an answer."""
    course = _course_models()
    if isinstance(FashionModel, type):
        for base in course[:2]:
            if issubclass(FashionModel, base):
                what = "is" if FashionModel is base else "is a subclass of"
                refuse(title, f"FashionModel {what} the course's models.{base.__name__}",
                       hint="write this yourself: that is the course's own model. Start "
                            "from chapter 5's CNN if you like, written out in your class")
    refuse_course_code(title, FashionModel, *course)


def _instantiate(title: str, FashionModel: Any) -> Any:
    """``FashionModel(rngs=nnx.Rngs(0))``, or end the check (:class:`Verdict`) saying why not."""
    from flax import nnx

    if not callable(FashionModel):
        refuse(title, f"FashionModel should be a class (an nnx.Module subclass), but it is "
                      f"a {type(FashionModel).__name__}",
               hint="write `class FashionModel(nnx.Module):` with __init__ and __call__")
    try:
        model = FashionModel(rngs=nnx.Rngs(0))
    except TypeError as err:
        refuse(title, f"FashionModel(rngs=nnx.Rngs(0)) raised TypeError: {err}",
               hint="give __init__ the signature `def __init__(self, *, rngs: nnx.Rngs)` "
                    "(other arguments need defaults)")
    if not isinstance(model, nnx.Module):
        refuse(title, f"FashionModel(rngs=...) gave a {type(model).__name__}, not an "
                      "nnx.Module", hint="subclass nnx.Module")
    return model


def _param_leaves(model: Any) -> list:
    import jax
    from flax import nnx

    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


# -- Exercise 1 ------------------------------------------------------------------------


def _refuse_over_budget(title: str, model: Any, n_params: int) -> None:
    """End the check: the model is over :data:`PARAM_BUDGET`; name the layer that holds most."""
    import jax
    from flax import nnx

    layers: dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]:
        keys = [str(getattr(k, "key", getattr(k, "idx", ""))) for k in path]
        keys = [k for k in keys if k and k != "value"]  # e.g. ["dense", "kernel"]
        name = ".".join(keys[:-1]) or ".".join(keys)  # the layer: "dense"
        layers[name] = layers.get(name, 0) + int(np.size(leaf))
    big, size = max(layers.items(), key=lambda kv: kv[1])
    hint = (f"{size / n_params:.0%} of them are in `{big}`: shrink where the parameters are, "
            "not where the arithmetic is")
    if size / n_params > 0.5:
        hint += (". A Linear after flattening has (height x width x channels) x width "
                 "weights: pool once more before it, use fewer channels in the last "
                 "convolution, or make it narrower (and check exercise 5 still reaches the "
                 "target)")
    refuse(title, f"the model has {n_params:,} parameters, over the budget of "
                  f"{PARAM_BUDGET:,} by {n_params - PARAM_BUDGET:,}", hint=hint)




@LAB.exercise(EX1, minutes=20, kind="write",
              hidden=lambda rng: [(f"a batch of {int(n)} images", {"batch_sizes": (int(n),)})
                                  for n in rng.choice([2, 3, 5, 7, 13, 32, 100], 2,
                                                      replace=False)])
def check_model(FashionModel: Any, batch_sizes: tuple = (4, 1)) -> CheckResult:
    """The model builds, holds at most :data:`PARAM_BUDGET` parameters, only parameters, and
    maps (N, 28, 28, 1) to finite (N, 10) logits (not probabilities) for each N of
    ``batch_sizes``."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    _refuse_course_model(EX1, FashionModel)
    model = _instantiate(EX1, FashionModel)
    params = nnx.state(model, nnx.Param)
    n_params = sum(int(np.size(x)) for x in jax.tree.leaves(params))
    if n_params == 0:
        refuse(EX1, "the model has no parameters",
               hint="create layers (nnx.Conv, nnx.Linear) in __init__ and keep them as "
                    "attributes (self.conv1 = ...)")
    if n_params > PARAM_BUDGET:
        _refuse_over_budget(EX1, model, n_params)
    rest = nnx.state(model, nnx.Not(nnx.Param))
    if jax.tree.leaves(rest):
        refuse(EX1, "the model holds state that is not nnx.Param (batch statistics, "
                    "dropout RNG counters): the lab's step updates parameters only",
               hint="leave out BatchNorm and Dropout here; a plain CNN reaches the target")
    rng = np.random.default_rng(0)
    for n in batch_sizes:
        x = jnp.asarray(rng.random((n, 28, 28, 1)), jnp.float32)
        try:
            out = model(x)
        except NotImplementedError:
            raise
        except Exception as err:  # noqa: BLE001 - a learner's model may raise anything
            refuse(EX1, f"calling the model on images of shape {(n, 28, 28, 1)} raised "
                        f"{type(err).__name__}: {str(err)[:200]}",
                   hint="check each layer's input size (after two 2x2 poolings 28 -> 7) "
                        "and flatten with x.reshape(x.shape[0], -1), not a fixed batch")
        shape = getattr(out, "shape", None)
        if shape != (n, 10):
            refuse(EX1, f"for images of shape {(n, 28, 28, 1)} the model returned "
                        f"{type(out).__name__} of shape {shape}, not (N, 10) logits",
                   hint="flatten with x.reshape(x.shape[0], -1) (not a fixed batch size) "
                        "and end with a 10-wide nnx.Linear, without a softmax")
        out = np.asarray(out, np.float64)
        if not np.all(np.isfinite(out)):
            refuse(EX1, "the logits contain NaN or infinity for ordinary images",
                   hint="look for a division or a log in __call__")
        if np.all(out >= 0) and np.allclose(out.sum(-1), 1.0, atol=1e-4):
            refuse(EX1, "the model returns probabilities (each row sums to 1): a softmax "
                        "ends it, so the loss would apply a second one",
                   hint="end with the 10-wide nnx.Linear and return its raw logits; "
                        "optax's cross-entropy takes logits and does the softmax itself")
    out = nnx.jit(lambda m, x: m(x))(model, x)
    if getattr(out, "shape", None) != (len(x), 10):
        refuse(EX1, "under nnx.jit the model returned a different shape",
               hint="avoid Python-side decisions on array values in __call__")
    return ok(EX1, f"{type(model).__name__}: {n_params:,} parameters (budget "
                   f"{PARAM_BUDGET:,}), (N, 28, 28, 1) -> (N, 10) logits; exercise 5 tells "
                   "whether it is enough")


# -- Exercise 2 ------------------------------------------------------------------------


def measured_cost(FashionModel: Any) -> dict:
    """The model's parameter count and XLA's FLOPs for one jitted training step (batch 64).

    The step is the package's pure step (``train.make_train_step``, Adam) compiled for
    this runtime; ``flops`` comes from ``compiled.cost_analysis()``.
    """
    import jax
    import optax

    from tpu_course import hlo, models, train

    try:
        model = _instantiate(EX2, FashionModel)
    except Verdict as stop:
        raise TypeError(stop.result.message) from None
    tx = optax.adam(1e-3)
    graphdef, state = train.init_state(model, tx)
    batch = _fixed_batch(PREDICT_BATCH)
    compiled = jax.jit(train.make_train_step(graphdef, tx)).lower(state, batch).compile()
    cost = hlo.normalise_cost(compiled.cost_analysis())
    biases = sum(int(np.size(x)) for x in jax.tree.leaves(state.params) if np.ndim(x) == 1)
    return {"params": models.count_params(model), "biases": biases,
            "step_flops": cost.get("flops")}


@LAB.exercise(EX2, minutes=10, kind="predict",
              predicts=("predicted_params", "predicted_step_flops"))
def check_prediction(FashionModel: Any, predicted_params: Any,
                     predicted_step_flops: Any) -> CheckResult:
    """Parameters exactly; step FLOPs within 25 % of XLA's cost analysis."""
    p = as_number(EX2, predicted_params, "predicted_params")
    f = as_number(EX2, predicted_step_flops, "predicted_step_flops")
    try:
        got = measured_cost(FashionModel)
    except TypeError as err:
        refuse(EX2, f"your model could not be built: {err}",
               hint="pass Exercise 1 first: the prediction is about your FashionModel")
    want_p, want_f = got["params"], got["step_flops"]
    answer = f"{want_p:,} parameters; XLA counts {want_f:,.0f} FLOPs per step of {PREDICT_BATCH}"
    if round(p) != want_p:
        hint = ("count every layer's weights AND biases: a Conv kernel has kh*kw*C_in*C_out "
                "weights and C_out biases, a Linear In*Out weights and Out biases; the first "
                "Linear after flattening has (height*width*channels) inputs")
        if round(p) == want_p - got["biases"]:
            hint = "close: you left out the biases (one per output of each layer)"
        elif round(p) in (2 * want_p, 4 * want_p):
            hint = (f"that looks like bytes ({round(p) // want_p} per parameter): the "
                    "prediction counts parameters, the numbers themselves")
        elif round(p) in (want_p * PREDICT_BATCH,):
            hint = "the parameters do not grow with the batch: count them once"
        refuse(EX2, f"your parameter count {p:,.0f} is {p / want_p:.2f}x the model's",
               hint=hint, answer=answer)
    if not want_f:
        return ok(EX2, f"parameters exact ({want_p:,}); this backend reports no FLOP count, "
                       "so the FLOPs prediction could not be graded")
    ratio = f / want_f
    if abs(ratio - 1) > FLOPS_TOLERANCE:
        hint = ("a training step is a forward pass (2 FLOPs per multiply-add) plus a backward "
                "pass of about twice that, for each of the 64 images")
        guesses = ((1 / PREDICT_BATCH, "per image: the step trains a batch of 64"),
                   (1 / 3, "the forward pass only: the backward pass costs about twice more"),
                   (1 / 2, "multiply-adds: XLA counts 2 FLOPs for each (a multiply and an add)"),
                   (1 / 6, ("multiply-adds of the forward pass only: x2 for FLOPs, x3 for "
                           "forward + backward")),
                   (1 / (3 * PREDICT_BATCH), ("one image's forward pass: x3 for the backward "
                                             "pass, x64 images")),
                   (2.0, ("2 FLOPs counted twice (or the backward pass counted as 5x the "
                         "forward): a multiply-add is 2 FLOPs, forward + backward about 3x")))
        if ratio > 0:
            r, why = min(guesses, key=lambda g: abs(math.log(ratio / g[0])))
            if abs(math.log(ratio / r)) < math.log(1.3):
                hint = f"your number looks like the {why}"
        refuse(EX2, f"parameters right; your step FLOPs are {ratio:.2f}x what XLA "
                    f"counts (allowed: within {FLOPS_TOLERANCE:.0%})", hint=hint, answer=answer)
    return ok(EX2, f"parameters exact ({want_p:,}); step FLOPs within {abs(ratio - 1):.0%} "
                   f"of XLA's {want_f / 1e6:,.0f} MFLOP (XLA also counts bias adds, "
                   "activations and Adam's update)")


# -- Exercise 3 ------------------------------------------------------------------------


def _reference_step() -> Any:
    """The course's step under ``nnx.jit``, compiled once per shape (op by op it would
    compile every operation for every new batch shape)."""
    if "step" not in _JITTED:
        from flax import nnx

        _JITTED["step"] = nnx.jit(_answers.train_step)
    return _JITTED["step"]


def _course_steps() -> tuple:
    from tpu_course import train

    return (_answers.train_step, train.make_train_step, train.loss_fn)


def _metrics(out: Any) -> dict:
    if not isinstance(out, Mapping):
        refuse(EX3, f"train_step returned a {type(out).__name__}; it should return a dict "
                    "{'loss': ..., 'accuracy': ..., 'grad_norm': ...}",
               hint="end the step with return {'loss': loss, 'accuracy': accuracy, "
                    "'grad_norm': norm}")
    missing = [k for k in ("loss", "accuracy", "grad_norm") if k not in out]
    if missing:
        refuse(EX3, f"the returned dict lacks {missing}",
               hint="return {'loss': loss, 'accuracy': accuracy, 'grad_norm': norm}, the "
                    "norm measured before clipping")
    values = {}
    for k in ("loss", "accuracy", "grad_norm"):
        v = out[k]
        if np.size(v) == 1 and not isinstance(v, (str, bool)):
            try:
                if math.isnan(float(np.asarray(v).ravel()[0])):
                    refuse(EX3, f"the {k} is NaN",
                           hint="use optax.softmax_cross_entropy_with_integer_labels on the "
                                "logits (no softmax and log by hand), and divide by the sum "
                                "of the weights")
            except (TypeError, ValueError):
                pass
        values[k] = as_number(EX3, v, f"metrics[{k!r}]")
    return values


def _loss_of(model: Any, batch: Any, *, weights: Any = None, scale: float = 1.0) -> float:
    """The weighted mean cross-entropy of ``model`` on ``batch`` (for naming mistakes);
    ``scale=255`` feeds the raw pixels."""
    import jax.numpy as jnp
    import optax

    from tpu_course import models

    w = jnp.asarray(batch.weights if weights is None else weights, jnp.float32)
    logits = model(models.prepare_images(batch.images) * scale)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
    return float(jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1.0))


def _raw_grads(model: Any, batch: Any) -> list:
    """The unclipped gradient of the weighted loss, one numpy array per parameter leaf."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from tpu_course import models

    w = jnp.asarray(batch.weights, jnp.float32)

    def loss(m):
        ce = optax.softmax_cross_entropy_with_integer_labels(
            m(models.prepare_images(batch.images)), batch.labels)
        return jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1.0)

    return [np.asarray(g, np.float64) for g in jax.tree.leaves(nnx.grad(loss)(model))]


def _close(a: float, b: float, rel: float = 1e-4) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(b))


def _same_leaves(got: list, want: list, rel: float = 2e-2) -> bool:
    """Leaf by leaf within ``rel`` of each leaf's largest entry (float32 differences)."""
    return all(np.max(np.abs(g - w)) <= rel * np.max(np.abs(w)) + 1e-9
               for g, w in zip(got, want))


def _clip_mistake(applied: list, grads: list, max_norm: float) -> str | None:
    """Name the way ``applied`` (the gradient an SGD step applied) was clipped wrong."""
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
    scaled = lambda k: [g * k for g in grads]
    candidates = (
        (grads, "the update used the unclipped gradient: nothing was clipped (clipping by "
                "value, each element to [-max_norm, max_norm], leaves a gradient whose "
                "elements are all small whole, however large its norm)"),
        ([g * min(1.0, max_norm / max(float(np.linalg.norm(g)), 1e-30)) for g in grads],
         "each parameter array was clipped on its own norm, not on the global norm of the "
         "whole gradient"),
        ([np.clip(g, -max_norm, max_norm) for g in grads],
         "each element was clipped to [-max_norm, max_norm] (clipping by value), which "
         "leaves a gradient of large norm almost whole"),
        (scaled(max_norm / norm), "the gradient was rescaled to max_norm although its norm "
                                  "was already below it (scaled up)"),
        (scaled(min(1.0, max_norm / norm ** 2)), "the scale divides by the squared norm"),
        (scaled(min(1.0, math.sqrt(max_norm / norm))), "the scale is a square root"),
    )
    for want, why in candidates:
        if _same_leaves(applied, want, 2e-3):
            return why
    return None


def _clipping_probe(train_step: Any, batch: Any, seed: int, max_norm_of: Any,
                    named_only: bool = False) -> None:
    """Two SGD steps from the same model, one with the clip active and one not: the applied
    gradient, ``(before - after) / lr``, must be the globally clipped one; the returned
    ``grad_norm`` the norm before clipping. ``named_only``: end the check only for a
    clipping mistake it can name (the caller has a better message for anything else)."""
    import optax
    from flax import nnx

    from tpu_course import models

    lr = 0.1
    for active in (True, False):
        model = models.MLP(hidden=(32,), rngs=nnx.Rngs(seed))
        opt = nnx.Optimizer(model, optax.sgd(lr), wrt=nnx.Param)
        before = [x.astype(np.float64) for x in _param_leaves(model)]
        grads = _raw_grads(model, batch)
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
        max_norm = max_norm_of(norm, active)
        got = _metrics(train_step(model, opt, batch, max_norm))
        applied = [(b - a.astype(np.float64)) / lr for b, a in zip(before, _param_leaves(model))]
        want = [g * min(1.0, max_norm / norm) for g in grads]
        state = (f"(SGD, gradient norm {norm:.3g}, max_norm {max_norm:.3g}: the clip is "
                 f"{'active' if active else 'not active'})")
        if not _same_leaves(applied, want):
            why = _clip_mistake(applied, grads, max_norm)
            if why is None and named_only:
                return
            refuse(EX3, f"{why or 'the applied gradient is not the clipped one'} {state}",
                   hint="global norm = sqrt of the sum, over every parameter array, of the "
                        "sum of its squared gradients (optax.tree.norm); multiply every "
                        "gradient by min(1, max_norm / norm) before optimizer.update",
                   answer=f"applied gradient norm {min(norm, max_norm):.4g} for {state}")
        if not _close(got["grad_norm"], norm, 2e-3):
            why = "is not the norm of the whole gradient before clipping"
            hint = ("return the global norm you measured before scaling: it is what a "
                    "training log shows to tell how often the clip acts")
            if _close(got["grad_norm"], min(norm, max_norm), 2e-3) and active:
                why = "is the norm after clipping (max_norm whenever the clip acts)"
            elif _close(got["grad_norm"], norm ** 2, 2e-3):
                why = "is the squared norm"
                hint = "take the square root of the sum of squares"
            refuse(EX3, f"the returned grad_norm {why} {state}", hint=hint,
                   answer=f"grad_norm {norm:.4g}")


def _hidden_steps(rng: Any) -> list:
    cases = []
    for optimizer in ("adam", "sgd"):
        n = int(rng.choice([24, 40, 80, 96]))
        padded = int(rng.integers(1, n // 3))
        lr = float(rng.choice([3e-3, 5e-3, 1e-2, 2e-2] if optimizer == "adam" else
                              [0.03, 0.05, 0.1]))  # SGD above 0.1 can diverge on these batches
        seed = int(rng.integers(1, 10_000))
        clip = float(rng.choice([0.2, 0.35, 0.6, 0.8]))
        cases.append(((f"a batch of {n} with {padded} padding examples, {optimizer} at "
                      f"learning rate {lr:g}, data seed {seed}, max_norm {clip:g} x the "
                      "gradient's norm"),
                      {"batch_size": n, "padded": padded, "learning_rate": lr,
                       "optimizer": optimizer, "seed": seed, "clip": clip}))
    return cases


@LAB.exercise(EX3, minutes=20, kind="apply", hidden=_hidden_steps)
def check_train_step(train_step: Any, batch_size: int = 64, padded: int = 16,
                     learning_rate: float = 1e-2, optimizer: str = "adam",
                     seed: int = 0, clip: float = 0.5) -> CheckResult:
    """One jitted step: weighted metrics, one optimizer update, the loss falls; compared
    with the course's step on a batch of ``batch_size`` (the last ``padded`` weighted 0)
    with the clip out of the way; then the clip itself, with SGD, at ``clip`` times the
    gradient's norm and at ``1 / clip`` times it."""
    import optax
    from flax import nnx

    from tpu_course import models

    if not callable(train_step):
        refuse(EX3, f"train_step should be a function, not a {type(train_step).__name__}")
    refuse_course_code(EX3, train_step, *_course_steps())
    if not hasattr(train_step, "lower"):
        refuse(EX3, "train_step is not compiled: every call would run op by op in Python",
               hint="decorate it with @nnx.jit (the model and optimizer go in as arguments)")
    make_tx = {"adam": optax.adam, "sgd": optax.sgd}[optimizer]
    off = 1e9  # a max_norm no gradient here reaches: the plain step

    def fresh():
        m = models.MLP(hidden=(32,), rngs=nnx.Rngs(seed))
        return m, nnx.Optimizer(m, make_tx(learning_rate), wrt=nnx.Param)

    batch = _fixed_batch(batch_size, padded=padded, seed=seed)
    real = float(np.sum(batch.weights))
    model, opt = fresh()
    before = _param_leaves(model)
    got = _metrics(train_step(model, opt, batch, off))
    ref_model, ref_opt = fresh()
    want = {k: float(v) for k, v in _reference_step()(ref_model, ref_opt, batch, off).items()}
    if not math.isfinite(got["loss"]):
        refuse(EX3, "the loss is not finite")
    if not _close(got["loss"], want["loss"]):
        start, _ = fresh()
        if _close(got["loss"], _loss_of(start, batch, weights=np.ones(batch_size))):
            refuse(EX3, "the loss counts the padding examples (weight 0) too",
                   hint="multiply each example's cross-entropy by batch.weights and divide "
                        "by the sum of the weights")
        if _close(got["loss"], want["loss"] * real, 1e-3):
            refuse(EX3, "the loss is a sum over the batch, not a mean",
                   hint="divide the weighted sum by the sum of the weights")
        if _close(got["loss"], want["loss"] * real / batch_size, 1e-3):
            refuse(EX3, "the loss divides by the batch size, padding included, not by the "
                        "sum of the weights",
                   hint="divide the weighted sum by jnp.sum(batch.weights): padding examples "
                        "must not count in the mean either")
        if _close(got["loss"], _loss_of(start, batch, scale=255.0), 1e-3):
            refuse(EX3, "the images went into the model as 0..255 pixels, not floats in "
                        "[0, 1]",
                   hint="feed the model models.prepare_images(batch.images), as the exercise "
                        "says")
        if _close(got["loss"], _loss_of(ref_model, batch), 1e-3):
            refuse(EX3, "the returned loss is the updated model's, computed after the "
                        "optimizer step",
                   hint="return the loss that nnx.value_and_grad computed, from the forward "
                        "pass the gradient came from")
        refuse(EX3, "the loss is not the weighted mean cross-entropy of the batch",
               hint="loss = sum(w * CE(logits, labels)) / sum(w), with CE from "
                    "optax.softmax_cross_entropy_with_integer_labels and the images "
                    "through models.prepare_images (uint8 -> floats in [0, 1])")
    after = _param_leaves(model)
    if all(np.array_equal(a, b) for a, b in zip(before, after)):
        refuse(EX3, "the parameters did not change: the step does not update the model",
               hint="call optimizer.update(model, grads) inside the step")
    want_after = _param_leaves(ref_model)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(after, want_after))
    step = max(float(np.max(np.abs(a - b))) for a, b in zip(want_after, before))
    if diff > 1e-5 + 1e-3 * step:
        twice = all(np.allclose(a - b, 2 * (c - b), rtol=1e-3, atol=1e-6)
                    for a, b, c in zip(after, before, want_after))
        if twice:
            refuse(EX3, "after one step the parameters moved twice as far as one optimizer "
                        "update: the step updates twice",
                   hint="call optimizer.update(model, grads) exactly once per step")
        _clipping_probe(train_step, batch, seed,  # a clipping mistake, named if it is one
                        lambda norm, active: norm * clip if active else norm / clip,
                        named_only=True)
        refuse(EX3, f"with a max_norm far above the gradient's norm (nothing to clip), the "
                    f"parameters after one step differ from one optimizer update by up to "
                    f"{diff:.1e} ({optimizer}, learning rate {learning_rate:g})",
               hint="compute grads with nnx.value_and_grad of the loss with respect to the "
                    "model, scale them only when their norm exceeds max_norm, and call "
                    "optimizer.update(model, grads) exactly once (the optimizer you are "
                    "given: no update by hand, no optimizer or learning rate of your own)")
    if abs(got["accuracy"] - want["accuracy"]) > 1e-5:
        refuse(EX3, "the accuracy is not the weighted fraction of correct predictions",
               hint="accuracy = sum(w * (argmax(logits) == labels)) / sum(w): padding "
                    "examples must not count")
    _clipping_probe(train_step, batch, seed,
                    lambda norm, active: norm * clip if active else norm / clip)
    losses = [got["loss"]]
    for _ in range(10):
        losses.append(_metrics(train_step(model, opt, batch, off))["loss"])
    if not losses[-1] < (0.7 if optimizer == "adam" else 0.97) * losses[0]:
        refuse(EX3, f"on one fixed batch the loss went {losses[0]:.3f} -> {losses[-1]:.3f} "
                    "in 11 steps; it should fall well below its start")
    return ok(EX3, f"jitted, weighted, one {optimizer} update per call, the gradient clipped "
                   f"to its global norm (checked with the clip active and not); loss on a "
                   f"fixed batch {losses[0]:.3f} -> {losses[-1]:.3f} in 11 steps")


# -- Exercise 4 ------------------------------------------------------------------------


def _course_pipelines() -> tuple:
    from tpu_course import train

    return (_answers.fast_batches, slow_batches, train.batches, train.epoch_indices)


def _materialise(batches: Any, limit: int) -> list:
    out = []
    for b in batches:
        out.append(tuple(np.asarray(x) for x in b))
        if len(out) == limit:
            break
    return out


def _time_pipeline(fn: Any, images: Any, labels: Any, count: int, repeats: int = 3) -> float:
    """Best of ``repeats`` wall times to produce ``count`` batches (arrays materialised)."""
    best = math.inf
    for r in range(repeats):
        t = time.perf_counter()
        got = _materialise(fn(images, labels, 64, seed=0, epoch=r), count)
        best = min(best, time.perf_counter() - t)
        if len(got) < count:
            raise ValueError(f"gave {len(got)} batches where {count} were expected")
    return best


def _flip_mistake(got: np.ndarray, images: np.ndarray, idx: np.ndarray,
                  draws: np.ndarray) -> str | None:
    """Name the flip mistake that gives ``got`` from the right examples, if one does."""
    x = images[idx]
    mirrored = x[:, :, ::-1]
    flip = (draws < 0.5)[:, None, None]
    candidates = (
        (x, "no image is mirrored: the random flips are missing"),
        (mirrored, "every image is mirrored, not a random half"),
        (np.where(~flip, mirrored, x), ("the flips are the opposite ones: mirror the images "
                                       "whose draw is below 0.5")),
        (np.where(flip, x[:, ::-1, :], x), ("the flipped images are upside down: mirror "
                                            "left-right (the last axis, [:, :, ::-1])")),
    )
    for want, why in candidates:
        if got.shape == want.shape and np.array_equal(got, want):
            return why
    return None


def _hidden_pipelines(rng: Any) -> list:
    cases = []
    for batch_size in rng.choice([16, 32, 50, 100, 128], 2, replace=False):
        n = int(rng.integers(300, 900))
        runs = tuple((int(rng.integers(1, 1000)), int(rng.integers(0, 10))) for _ in range(2))
        cases.append((f"{n} images in batches of {int(batch_size)}, seeds and epochs {runs}",
                      {"n_images": n, "batch_size": int(batch_size), "runs": runs,
                       "timed": False}))
    return cases


@LAB.exercise(EX4, minutes=15, kind="apply", hidden=_hidden_pipelines)
def check_fast_batches(fast_batches: Any, n_images: int = 700, batch_size: int = 64,
                       runs: tuple = ((0, 0), (0, 1), (3, 2)), timed: bool = True
                       ) -> CheckResult:
    """The same batches as :func:`slow_batches` for each (seed, epoch) of ``runs``; when
    ``timed``, at least :data:`PIPELINE_SPEEDUP`x faster."""
    if not callable(fast_batches):
        refuse(EX4, f"fast_batches should be a function, not a {type(fast_batches).__name__}")
    refuse_course_code(EX4, fast_batches, *_course_pipelines())
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (n_images, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, n_images).astype(np.int32)
    for seed, epoch in runs:
        want = _materialise(slow_batches(images, labels, batch_size, seed=seed, epoch=epoch),
                            10_000)
        got = _materialise(fast_batches(images, labels, batch_size, seed=seed, epoch=epoch),
                           len(want) + 1)
        if len(got) != len(want):
            refuse(EX4, f"{n_images} examples in batches of {batch_size} gave {len(got)} "
                        f"batches; the slow pipeline gives {len(want)} (full batches only)",
                   hint="stop at the last full batch, as slow_batches does")
        idx, draws = _answers.flip_plan(n_images, batch_size, seed, epoch)
        for k, (g, w) in enumerate(zip(got, want)):
            if len(g) != 3:
                refuse(EX4, f"batch {k} has {len(g)} fields, not 3",
                       hint="yield Batch(images, labels, weights)")
            for name, a, b in zip(("images", "labels", "weights"), g, w):
                if a.shape != b.shape or a.dtype != b.dtype:
                    refuse(EX4, f"batch {k}'s {name} are {a.dtype}{list(a.shape)}, "
                                f"expected {b.dtype}{list(b.shape)}",
                           hint="images stay uint8 (the chip converts them), labels int32, "
                                "weights float32")
            if not np.array_equal(g[1], w[1]):
                refuse(EX4, f"batch {k} (seed={seed}, epoch={epoch}) holds other examples "
                            "than the slow pipeline's",
                       hint="shuffle with the same generator: rng = "
                            "np.random.default_rng([seed, epoch]); order = "
                            "rng.permutation(len(images)), before any flip is drawn")
            if not np.array_equal(g[0], w[0]):
                why = _flip_mistake(g[0], images, idx[k], draws[k])
                refuse(EX4, f"batch {k} (seed={seed}, epoch={epoch}) has the right examples "
                            f"but different images: {why or 'other flips'}",
                       hint="draw the flips from the same generator after the permutation, "
                            "one draw per example in batch order (rng.random(batch_size) "
                            "gives the same numbers as batch_size calls of rng.random()), "
                            "and mirror with [:, :, ::-1] where the draw is below 0.5")
            if not np.array_equal(g[2], w[2]):
                refuse(EX4, f"batch {k}'s weights are not all 1",
                       hint="every example of a full batch is real: weights of 1.0")
    if not timed:
        return ok(EX4, "same batches as slow_batches")
    fashion_like = np.tile(images, (-(-10_000 // n_images), 1, 1))[:10_000]
    fashion_labels = np.tile(labels, -(-10_000 // n_images))[:10_000]
    count = 20
    _time_pipeline(fast_batches, fashion_like, fashion_labels, 2, repeats=1)  # warm-up
    slow_s = _time_pipeline(slow_batches, fashion_like, fashion_labels, count)
    fast_s = _time_pipeline(fast_batches, fashion_like, fashion_labels, count)
    speedup = slow_s / max(fast_s, 1e-9)
    if speedup < PIPELINE_SPEEDUP:
        refuse(EX4, f"same batches, but only {speedup:.1f}x faster than slow_batches "
                    f"({count} batches: {slow_s * 1e3:.0f} ms vs {fast_s * 1e3:.0f} ms); "
                    f"at least {PIPELINE_SPEEDUP:.0f}x is asked",
               hint="work on whole batches: images[idx] gathers a batch in one call, and "
                    "np.where(flip[:, None, None], x[:, :, ::-1], x) flips them all at "
                    "once; no Python loop over examples or pixels")
    return ok(EX4, f"same batches as slow_batches, {speedup:.0f}x faster ({count} batches: "
                   f"{slow_s * 1e3:.0f} ms -> {fast_s * 1e3:.1f} ms, measured in this run)")


# -- Exercise 5 ------------------------------------------------------------------------

#: A model the checker has just built is at chance level (10 %); above this it came
#: with trained weights (or looks the test set up), which is not training.
UNTRAINED_MAX = 0.5
#: Steps of the run compared with one honest update (the first and others drawn at
#: random in each run, so no step can tell whether it is watched).
AUDITED_STEPS = 4
#: The course's configuration, shown by ``checks.reveal`` after an attempt.
COURSE_CONFIG = {"batch_size": 64, "learning_rate": 5e-3, "warmup_steps": 50}


def _fashion() -> tuple[Any, Any, Any, Any]:
    """The first :data:`TRAIN_IMAGES` training images and labels, and the whole test set,
    loaded here (offline: ``TPU_COURSE_DATA`` or Debian's dataset-fashion-mnist)."""
    if "fashion" not in _CACHE:
        from tpu_course import data

        ds = data.load_fashion_mnist()
        _CACHE["fashion"] = (ds.train_images[:TRAIN_IMAGES], ds.train_labels[:TRAIN_IMAGES],
                             ds.test_images, ds.test_labels)
    return _CACHE["fashion"]


def _read_config(config: Any, steps_per_epoch: Any = None) -> dict:
    """``fashion_config`` checked and completed with defaults, or a Verdict that says why not."""
    example = ('fashion_config = {"batch_size": 64, "learning_rate": ..., '
               '"warmup_steps": ...}')
    if not isinstance(config, Mapping):
        refuse(EX5, f"fashion_config should be a dict of hyperparameters, not a "
                    f"{type(config).__name__}", hint=example)
    unknown = sorted(str(k) for k in config if k not in CONFIG_KEYS)
    if unknown:
        hint = f"it takes {', '.join(CONFIG_KEYS)}; {example}"
        if any("epoch" in k for k in unknown):
            hint = (f"the checker trains exactly {EPOCHS} epochs on the first "
                    f"{TRAIN_IMAGES:,} training images: that is the exercise. " + hint)
        refuse(EX5, f"fashion_config has keys the checker does not use: {unknown}", hint=hint)
    if "learning_rate" not in config:
        refuse(EX5, "fashion_config has no 'learning_rate'", hint=example)
    out = {k: default for k, (_, default) in CONFIG_KEYS.items()} | dict(config)
    for key in ("batch_size", "warmup_steps"):
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            refuse(EX5, f"fashion_config[{key!r}] should be a whole number, not {value!r:.40}",
                   hint=example)
        out[key] = int(value)
    lo, hi = BATCH_SIZES
    if not lo <= out["batch_size"] <= hi:
        refuse(EX5, f"a batch size of {out['batch_size']} is outside {lo}..{hi}",
               hint="64 or 128 train well here; tiny batches make 3 epochs slow on a CPU")
    lr = as_number(EX5, out["learning_rate"], "fashion_config['learning_rate']")
    if not 0 < lr <= 1:
        refuse(EX5, f"a learning rate of {lr:g} is not a step size Adam can use",
               hint="Adam's peak learning rate is positive and small: try 1e-3 to 1e-2")
    out["learning_rate"] = lr
    total = EPOCHS * (TRAIN_IMAGES // out["batch_size"])
    if not 0 <= out["warmup_steps"] < total:
        refuse(EX5, f"{out['warmup_steps']} warm-up steps, but the run has {total} steps in "
                    "all", hint="warm up for a few dozen steps, then let the cosine decay run")
    return out


def _forward_flops(model: Any) -> float | None:
    """XLA's FLOPs of one image's forward pass, or None when the backend does not say."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tpu_course import hlo

    graphdef, params = nnx.split(model, nnx.Param, ...)[:2]
    x = jnp.zeros((1, 28, 28, 1), jnp.float32)
    compiled = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x)).lower(params, x).compile()
    return hlo.normalise_cost(compiled.cost_analysis()).get("flops")


def _checked_batches(fast_batches: Any, images: Any, labels: Any, batch_size: int,
                     epoch: int) -> Any:
    """The learner's batches for one epoch, each compared with the expected one first."""
    expected = _answers.fast_batches(images, labels, batch_size, seed=0, epoch=epoch)
    count = 0
    for got in fast_batches(images, labels, batch_size, seed=0, epoch=epoch):
        want = next(expected, None)
        arrays = tuple(np.asarray(x) for x in got)
        if want is None or len(arrays) != 3 or not all(
                a.shape == b.shape and np.array_equal(a, b) for a, b in zip(arrays, want)):
            what = ("more batches than the epoch has" if want is None else
                    f"batch {count + 1} of epoch {epoch + 1} differs from the expected one")
            refuse(EX5, f"your fast_batches, given the training images, yields {what}: the "
                        "model must train on exactly the checker's training images",
                   hint="pass Exercise 4 first: fast_batches yields the batches of "
                        "slow_batches for the images and labels it is given, and nothing else")
        count += 1
        yield Batch(*arrays)
    if next(expected, None) is not None:
        refuse(EX5, f"your fast_batches stopped after {count} batches in epoch {epoch + 1}; "
                    f"the epoch has {len(images) // batch_size}",
               hint="pass Exercise 4 first: every full batch, as slow_batches")


def _audited_step(train_step: Any, model: Any, optimizer: Any, batch: Any, step: int) -> Any:
    """The learner's step, compared with one honest update from the same state."""
    from flax import nnx

    before = _param_leaves(model)
    ref_model, ref_opt = nnx.clone(model), nnx.clone(optimizer)
    out = train_step(model, optimizer, batch, MAX_GRAD_NORM)
    _reference_step()(ref_model, ref_opt, batch, MAX_GRAD_NORM)
    after, want = _param_leaves(model), _param_leaves(ref_model)
    move = max(float(np.max(np.abs(w - b))) for w, b in zip(want, before))
    diff = max(float(np.max(np.abs(a - w))) for a, w in zip(after, want))
    if diff > 1e-6 + 1e-2 * move:
        refuse(EX5, f"at step {step + 1} your train_step did not make one optimizer update on "
                    "the batch it was given",
               hint="pass Exercise 3 first: the step trains on its batch, with the optimizer "
                    "it is given, once per call (and on nothing else)")
    return out


def _train(FashionModel: Any, train_step: Any, fast_batches: Any, config: dict) -> dict:
    """Build the learner's model, train it :data:`EPOCHS` epochs here, evaluate it here."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from tpu_course import runtime, train

    train_x, train_y, test_x, test_y = _fashion()
    model = _instantiate(EX5, FashionModel)
    if jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param))):
        refuse(EX5, "the model holds state that is not nnx.Param",
               hint="pass Exercise 1 first (no BatchNorm or Dropout)")
    n_params = sum(int(np.size(x)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    if n_params > PARAM_BUDGET:
        refuse(EX5, f"the model has {n_params:,} parameters, over exercise 1's budget of "
                    f"{PARAM_BUDGET:,}", hint="pass Exercise 1 first: the target is to be "
                                              "reached within the budget")
    platform = runtime.describe().platform
    if platform == "cpu":
        flops = _forward_flops(model)
        if flops and flops > CPU_MAX_FORWARD_FLOPS:
            refuse(EX5, f"your model costs {flops / 1e6:,.0f} MFLOP per image; on a CPU the "
                        f"checker trains models up to {CPU_MAX_FORWARD_FLOPS / 1e6:.0f} MFLOP "
                        "(3 epochs of a bigger one take many minutes)",
                   hint="fewer channels or a pooling earlier: a CNN like chapter 5's costs "
                        "2.4 MFLOP and reaches the target (or run on a TPU or GPU runtime)")
    start = train.evaluate_model(model, test_x, test_y)
    if start.accuracy > UNTRAINED_MAX:
        refuse(EX5, f"FashionModel(rngs=nnx.Rngs(0)) reaches {start.accuracy:.0%} on the test "
                    "set before any training: a new model must start from random weights",
               hint="build the layers from rngs in __init__; load no trained weights and "
                    "look nothing up: the checker trains the model")
    batch_size = config["batch_size"]
    total = EPOCHS * (len(train_x) // batch_size)
    schedule = optax.warmup_cosine_decay_schedule(0.0, config["learning_rate"],
                                                  config["warmup_steps"], total)
    optimizer = nnx.Optimizer(model, optax.adam(schedule), wrt=nnx.Param)
    draw = np.random.default_rng()  # unpredictable on purpose: any step may be watched
    audit = {0, *draw.choice(np.arange(1, total), AUDITED_STEPS - 1, replace=False).tolist()}
    step, epoch_losses = 0, []
    t0 = time.perf_counter()
    for epoch in range(EPOCHS):
        losses = []
        for batch in train.prefetch_to_device(
                _checked_batches(fast_batches, train_x, train_y, batch_size, epoch)):
            if step in audit:
                out = _audited_step(train_step, model, optimizer, batch, step)
            else:
                out = train_step(model, optimizer, batch, MAX_GRAD_NORM)
            if not isinstance(out, Mapping) or "loss" not in out:
                refuse(EX5, f"train_step returned a {type(out).__name__}, not the dict of "
                            "Exercise 3", hint="pass Exercise 3 first")
            losses.append(jnp.asarray(out["loss"], jnp.float32).reshape(()))
            step += 1
        epoch_losses.append(float(jnp.mean(jnp.stack(losses))))
    seconds = time.perf_counter() - t0
    ev = train.evaluate_model(model, test_x, test_y)
    return {"accuracy": ev.accuracy, "loss": ev.loss, "count": ev.count, "steps": step,
            "epoch_losses": epoch_losses, "seconds": seconds, "platform": platform,
            "train_images": len(train_x)}


def _course_config_answer() -> str:
    c = COURSE_CONFIG
    return (f"{TARGET_ACCURACY:.0%} test accuracy; chapter 5's CNN with its dense layer cut "
            f"to 60 wide (two 3x3 convolutions 16 and 32 wide with 2x2 pooling, then "
            f"1,568 -> 60 -> 10: 99,550 parameters) with batch_size "
            f"{c['batch_size']}, learning_rate {c['learning_rate']:g} and warmup_steps "
            f"{c['warmup_steps']} reaches it (86 % on a CPU)")


def _grade_training(FashionModel: Any, train_step: Any, fast_batches: Any,
                    config: dict) -> CheckResult:
    run = _train(FashionModel, train_step, fast_batches, config)
    losses = " -> ".join(f"{x:.3f}" for x in run["epoch_losses"])
    acc, lr = run["accuracy"], config["learning_rate"]
    if not (math.isfinite(run["loss"]) and all(map(math.isfinite, run["epoch_losses"]))):
        refuse(EX5, f"training diverged (training loss per epoch {losses})",
               hint=f"lower the learning rate (yours peaks at {lr:g}) or warm up longer",
               answer=_course_config_answer())
    if acc < TARGET_ACCURACY:
        hint = ("a CNN (two 3x3 convolutions with pooling, then a dense layer) gets there in "
                f"{EPOCHS} epochs with Adam peaking near 3e-3 to 5e-3 after a short warm-up")
        if acc < 0.2:
            hint = ("that is chance level: the model did not learn. "
                    + (f"A peak learning rate of {lr:g} is too high for Adam"
                       if lr > 0.03 else f"A peak learning rate of {lr:g} is too small"
                       if lr < 1e-4 else "Is the step updating the model (Exercise 3)?"))
        elif lr < 5e-4:
            hint = (f"the training loss is still falling ({losses}): a peak learning rate of "
                    f"{lr:g} is small for {EPOCHS} epochs; try 3e-3 to 5e-3")
        elif lr > 0.02:
            hint = (f"a peak learning rate of {lr:g} is high for Adam: try 3e-3 to 5e-3 with "
                    "a short warm-up")
        refuse(EX5, f"test accuracy {acc:.2%} after {EPOCHS} epochs (training loss per epoch "
                    f"{losses}); the target is {TARGET_ACCURACY:.0%}",
               hint=hint, answer=_course_config_answer())
    return ok(EX5, f"test accuracy {acc:.2%} on all {run['count']:,} test images after "
                   f"{EPOCHS} epochs ({run['steps']} steps) on the first "
                   f"{run['train_images']:,} training images (target {TARGET_ACCURACY:.0%}); "
                   f"training loss per epoch {losses}; trained here in {run['seconds']:.0f} s "
                   f"on {run['platform']}")


@LAB.exercise(EX5, minutes=15, kind="write")
def check_accuracy(FashionModel: Any, train_step: Any, fast_batches: Any,
                   fashion_config: Any) -> CheckResult:
    """Train the learner's model with their step and pipeline here, exactly :data:`EPOCHS`
    epochs on the first :data:`TRAIN_IMAGES` training images with Adam and the config's
    warm-up-cosine schedule, and grade its accuracy on the whole test set."""
    config = _read_config(fashion_config)
    _refuse_course_model(EX5, FashionModel)
    for answer, course in ((train_step, _course_steps()), (fast_batches, _course_pipelines())):
        if not callable(answer):
            refuse(EX5, f"{'train_step' if answer is train_step else 'fast_batches'} should be "
                        f"a function, not a {type(answer).__name__}",
                   hint="pass Exercises 3 and 4 first")
        refuse_course_code(EX5, answer, *course)
    if not hasattr(train_step, "lower"):
        refuse(EX5, "train_step is not compiled: 3 epochs op by op would take very long",
               hint="pass Exercise 3 first (@nnx.jit)")
    key = (FashionModel, train_step, fast_batches)
    last = _TRAINED.get("run")
    if last is not None and all(a is b for a, b in zip(last["key"], key)) \
            and last["config"] == config:
        result = last["result"]
        return CheckResult(result.exercise, result.status,
                           result.message + " (the training run above: same model, step, "
                                            "pipeline and config)", result.hint, result.answer)
    try:
        result = _grade_training(FashionModel, train_step, fast_batches, config)
    except Verdict as stop:
        result = stop.result
    _TRAINED["run"] = {"key": key, "config": dict(config), "result": result}
    return result
