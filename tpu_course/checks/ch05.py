"""Checkers for lab 5: a model, its cost, a train step and a fast pipeline for Fashion-MNIST.

The registry :data:`LAB` lists the exercises in order:

1. **A model for Fashion-MNIST** (write): the learner's ``FashionModel`` class builds
   from ``rngs=nnx.Rngs(0)``, holds ``nnx.Param`` state only, maps images
   ``(N, 28, 28, 1)`` to finite logits ``(N, 10)`` for any N, and compiles under ``nnx.jit``.
2. **Predict its size and its cost** (predict): before counting, the learner predicts the
   parameter count of their model and the FLOPs of one training step on a batch of 64;
   graded against ``models.count_params`` (exactly) and XLA's cost analysis of the
   compiled step (within 25 %: XLA also counts bias adds, ReLUs and the optimizer).
3. **The train step** (write): ``train_step(model, optimizer, batch)`` under ``nnx.jit``
   returning ``{'loss', 'accuracy'}``, weighted by ``batch.weights`` (padding counts for
   nothing), updating the model once through the optimizer.
4. **A faster input pipeline** (transfer): ``fast_batches`` yields exactly the batches of
   the planted :func:`slow_batches` (same shuffle, same random flips) at least
   :data:`PIPELINE_SPEEDUP` times faster, both timed here in the same run.
5. **Reach 85 % in 3 epochs** (write): the learner's trained model, trained for at most
   :data:`MAX_EPOCHS` epochs on the first 10,000 training images, reaches
   :data:`TARGET_ACCURACY` on all 10,000 Fashion-MNIST test images (evaluated here).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tpu_course.checks._core import CheckResult, Lab, as_number, fail, ok
from tpu_course.train import Batch

LAB = Lab(5, "A model, a step and a pipeline for Fashion-MNIST")

EX1 = "Exercise 1 (a model for Fashion-MNIST)"
EX2 = "Exercise 2 (predict its size and its cost)"
EX3 = "Exercise 3 (the train step)"
EX4 = "Exercise 4 (a faster input pipeline)"
EX5 = "Exercise 5 (reach 85 % in 3 epochs)"

#: The lab's accuracy target on the full Fashion-MNIST test set, and its epoch budget.
TARGET_ACCURACY = 0.85
MAX_EPOCHS = 3
#: How much faster ``fast_batches`` must be than :func:`slow_batches` (loose: a busy
#: 2-core machine; a vectorised pipeline is 30-100x faster).
PIPELINE_SPEEDUP = 5.0
#: Tolerance of the FLOPs prediction (the parameter count must be exact).
FLOPS_TOLERANCE = 0.25
PREDICT_BATCH = 64

_CACHE: dict[str, Any] = {}  # loaded data only (never a learner's answer)


def slow_batches(images, labels, batch_size, seed=0, epoch=0):
    """Shuffled batches with random left-right flips (data augmentation): correct, but slow.

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


def _instantiate(title: str, FashionModel: Any) -> Any:
    """``FashionModel(rngs=nnx.Rngs(0))`` or a failing result that says why not."""
    from flax import nnx

    if not callable(FashionModel):
        return fail(title, f"FashionModel should be a class (an nnx.Module subclass), but it is "
                           f"a {type(FashionModel).__name__}",
                    hint="write `class FashionModel(nnx.Module):` with __init__ and __call__")
    try:
        model = FashionModel(rngs=nnx.Rngs(0))
    except TypeError as err:
        return fail(title, f"FashionModel(rngs=nnx.Rngs(0)) raised TypeError: {err}",
                    hint="give __init__ the signature `def __init__(self, *, rngs: nnx.Rngs)` "
                         "(other arguments need defaults)")
    if not isinstance(model, nnx.Module):
        return fail(title, f"FashionModel(rngs=...) gave a {type(model).__name__}, not an "
                           "nnx.Module", hint="subclass nnx.Module")
    return model


def _param_leaves(model: Any) -> list:
    import jax
    from flax import nnx

    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


# -- Exercise 1 ------------------------------------------------------------------------


@LAB.exercise(EX1, minutes=15, kind="write")
def check_model(FashionModel: Any) -> CheckResult:
    """The model builds, holds parameters only, and maps (N, 28, 28, 1) to finite (N, 10)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    model = _instantiate(EX1, FashionModel)
    if isinstance(model, CheckResult):
        return model
    params = nnx.state(model, nnx.Param)
    n_params = sum(int(np.size(x)) for x in jax.tree.leaves(params))
    if n_params == 0:
        return fail(EX1, "the model has no parameters",
                    hint="create layers (nnx.Conv, nnx.Linear) in __init__ and keep them as "
                         "attributes (self.conv1 = ...)")
    rest = nnx.state(model, nnx.Not(nnx.Param))
    if jax.tree.leaves(rest):
        return fail(EX1, "the model holds state that is not nnx.Param (batch statistics, "
                           "dropout RNG counters): the lab's step updates parameters only",
                    hint="leave out BatchNorm and Dropout here; a plain CNN reaches the target")
    rng = np.random.default_rng(0)
    for n in (4, 1):
        x = jnp.asarray(rng.random((n, 28, 28, 1)), jnp.float32)
        try:
            out = model(x)
        except NotImplementedError:
            raise
        except Exception as err:  # noqa: BLE001 - a learner's model may raise anything
            return fail(EX1, f"calling the model on images of shape {(n, 28, 28, 1)} raised "
                               f"{type(err).__name__}: {str(err)[:200]}",
                        hint="check each layer's input size (after two 2x2 poolings 28 -> 7) "
                             "and flatten with x.reshape(x.shape[0], -1), not a fixed batch")
        shape = getattr(out, "shape", None)
        if shape != (n, 10):
            return fail(EX1, f"for images of shape {(n, 28, 28, 1)} the model returned "
                               f"{type(out).__name__} of shape {shape}, not (N, 10) logits",
                        hint="flatten with x.reshape(x.shape[0], -1) (not a fixed batch size) "
                             "and end with a 10-wide nnx.Linear, without a softmax")
        if not bool(jnp.all(jnp.isfinite(out))):
            return fail(EX1, "the logits contain NaN or infinity for ordinary images",
                        hint="look for a division or a log in __call__")
    out = nnx.jit(lambda m, x: m(x))(model, x)
    if getattr(out, "shape", None) != (1, 10):
        return fail(EX1, "under nnx.jit the model returned a different shape",
                    hint="avoid Python-side decisions on array values in __call__")
    return ok(EX1, f"{type(model).__name__}: {n_params:,} parameters, (N, 28, 28, 1) -> "
                     "(N, 10) logits")


# -- Exercise 2 ------------------------------------------------------------------------


def record_prediction(predicted_params: Any, predicted_step_flops: Any) -> None:
    """Echo the learner's prediction; it stays in the notebook's variables, where the
    check and the scorecard find it again."""
    from tpu_course.checks._core import NotWritten

    if isinstance(predicted_params, NotWritten) or isinstance(predicted_step_flops, NotWritten):
        text = "no prediction yet: assign predicted_params and predicted_step_flops first"
    else:
        text = (f"recorded: {predicted_params!r} parameters, {predicted_step_flops!r} FLOPs per "
                f"training step of {PREDICT_BATCH} images")
    print(text)


def measured_cost(FashionModel: Any) -> dict:
    """The model's parameter count and XLA's FLOPs for one jitted training step (batch 64).

    The step is the package's pure step (``train.make_train_step``, Adam) compiled for
    this runtime; ``flops`` comes from ``compiled.cost_analysis()``.
    """
    import jax
    import optax

    from tpu_course import hlo, models, train

    model = _instantiate(EX2, FashionModel)
    if isinstance(model, CheckResult):
        raise TypeError(model.message)
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
    if isinstance(p, CheckResult):
        return p
    f = as_number(EX2, predicted_step_flops, "predicted_step_flops")
    if isinstance(f, CheckResult):
        return f
    got = measured_cost(FashionModel)
    want_p, want_f = got["params"], got["step_flops"]
    answer = f"{want_p:,} parameters; XLA counts {want_f:,.0f} FLOPs per step of {PREDICT_BATCH}"
    if round(p) != want_p:
        hint = ("count every layer's weights AND biases: a Conv kernel has kh*kw*C_in*C_out "
                "weights and C_out biases, a Linear In*Out weights and Out biases; the first "
                "Linear after flattening has (height*width*channels) inputs")
        if round(p) == want_p - got["biases"]:
            hint = "close: you left out the biases (one per output of each layer)"
        return fail(EX2, f"your parameter count {p:,.0f} is {p / want_p:.2f}x the model's",
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
                   (1 / 6, "multiply-adds of the forward pass only: x2 for FLOPs, x3 for "
                           "forward + backward"),
                   (1 / (3 * PREDICT_BATCH), "one image's forward pass: x3 for the backward "
                                             "pass, x64 images"))
        r, why = min(guesses, key=lambda g: abs(math.log(ratio / g[0])) if ratio > 0 else 0)
        if ratio > 0 and abs(math.log(ratio / r)) < math.log(1.3):
            hint = f"your number looks like the {why}"
        return fail(EX2, f"parameters right; your step FLOPs are {ratio:.2f}x what XLA "
                             f"counts (allowed: within {FLOPS_TOLERANCE:.0%})",
                    hint=hint, answer=answer)
    return ok(EX2, f"parameters exact ({want_p:,}); step FLOPs within {abs(ratio - 1):.0%} "
                       f"of XLA's {want_f / 1e6:,.0f} MFLOP (XLA also counts bias adds, "
                       "activations and Adam's update)")


# -- Exercise 3 ------------------------------------------------------------------------


def _reference_step(model: Any, optimizer: Any, batch: Any) -> dict:
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from tpu_course import models

    def loss_fn(m):
        logits = m(models.prepare_images(batch.images))
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
        w = jnp.asarray(batch.weights, jnp.float32)
        return jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1.0), logits

    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    w = jnp.asarray(batch.weights, jnp.float32)
    hits = (jnp.argmax(logits, -1) == batch.labels).astype(jnp.float32)
    return {"loss": loss, "accuracy": jnp.sum(w * hits) / jnp.maximum(jnp.sum(w), 1.0)}


def _metrics(out: Any) -> dict | CheckResult:
    if not isinstance(out, Mapping):
        return fail(EX3, f"train_step returned a {type(out).__name__}; it should return a dict "
                          "{'loss': ..., 'accuracy': ...}",
                    hint="end the step with return {'loss': loss, 'accuracy': accuracy}")
    missing = [k for k in ("loss", "accuracy") if k not in out]
    if missing:
        return fail(EX3, f"the returned dict lacks {missing}",
                    hint="return {'loss': loss, 'accuracy': accuracy}")
    values = {}
    for k in ("loss", "accuracy"):
        v = out[k]
        if np.size(v) == 1 and not isinstance(v, (str, bool)):
            try:
                if math.isnan(float(np.asarray(v).ravel()[0])):
                    return fail(EX3, f"the {k} is NaN",
                                hint="use optax.softmax_cross_entropy_with_integer_labels on "
                                     "the logits (no softmax and log by hand), and divide by "
                                     "the sum of the weights")
            except (TypeError, ValueError):
                pass
        number = as_number(EX3, v, f"metrics[{k!r}]")
        if isinstance(number, CheckResult):
            return number
        values[k] = number
    return values


@LAB.exercise(EX3, minutes=15, kind="write")
def check_train_step(train_step: Any) -> CheckResult:
    """One jitted step: weighted metrics, one optimizer update, the loss falls."""
    import optax
    from flax import nnx

    from tpu_course import models

    if not callable(train_step):
        return fail(EX3, f"train_step should be a function, not a {type(train_step).__name__}")
    if not hasattr(train_step, "lower"):
        return fail(EX3, "train_step is not compiled: every call would run op by op in Python",
                    hint="decorate it with @nnx.jit (the model and optimizer go in as arguments)")

    def fresh():
        m = models.MLP(hidden=(32,), rngs=nnx.Rngs(0))
        return m, nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)

    batch = _fixed_batch(64, padded=16)
    model, optimizer = fresh()
    before = _param_leaves(model)
    got = _metrics(train_step(model, optimizer, batch))
    if isinstance(got, CheckResult):
        return got
    ref_model, ref_opt = fresh()
    want = {k: float(v) for k, v in _reference_step(ref_model, ref_opt, batch).items()}
    if not math.isfinite(got["loss"]):
        return fail(EX3, "the loss is not finite")
    if abs(got["loss"] - want["loss"]) > 1e-4 * max(1.0, abs(want["loss"])):
        m2, o2 = fresh()
        full = _batch(batch.images, batch.labels, np.ones_like(batch.weights))
        unweighted = float(_reference_step(m2, o2, full)["loss"])
        if abs(got["loss"] - unweighted) < 1e-4 * max(1.0, abs(unweighted)):
            return fail(EX3, "the loss counts the padding examples (weight 0) too",
                        hint="multiply each example's cross-entropy by batch.weights and divide "
                             "by the sum of the weights")
        if abs(got["loss"] - want["loss"] * 48) < 1e-3 * abs(want["loss"] * 48):
            return fail(EX3, "the loss is a sum over the batch, not a mean",
                        hint="divide the weighted sum by the sum of the weights")
        return fail(EX3, "the loss is not the weighted mean cross-entropy of the batch",
                    hint="loss = sum(w * CE(logits, labels)) / sum(w), with CE from "
                         "optax.softmax_cross_entropy_with_integer_labels and the images "
                         "through models.prepare_images (uint8 -> floats in [0, 1])")
    after = _param_leaves(model)
    if all(np.array_equal(a, b) for a, b in zip(before, after)):
        return fail(EX3, "the parameters did not change: the step does not update the model",
                    hint="call optimizer.update(model, grads) inside the step")
    want_after = _param_leaves(ref_model)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(after, want_after))
    if diff > 1e-5:
        return fail(EX3, f"after one step the parameters differ from one optimizer update by up "
                          f"to {diff:.1e}",
                    hint="compute grads with nnx.value_and_grad of the loss with respect to the "
                         "model and call optimizer.update(model, grads) exactly once (no extra "
                         "update by hand, no second update)")
    if abs(got["accuracy"] - want["accuracy"]) > 1e-5:
        return fail(EX3, "the accuracy is not the weighted fraction of correct predictions",
                    hint="accuracy = sum(w * (argmax(logits) == labels)) / sum(w): padding "
                         "examples must not count")
    losses = [got["loss"]]
    for _ in range(10):
        m = _metrics(train_step(model, optimizer, batch))
        if isinstance(m, CheckResult):
            return m
        losses.append(m["loss"])
    if not losses[-1] < 0.7 * losses[0]:
        return fail(EX3, f"on one fixed batch the loss went {losses[0]:.3f} -> {losses[-1]:.3f} "
                          "in 11 steps; it should fall well below its start")
    return ok(EX3, f"jitted, weighted, one Adam update per call; loss on a fixed batch "
                    f"{losses[0]:.3f} -> {losses[-1]:.3f} in 11 steps")


# -- Exercise 4 ------------------------------------------------------------------------


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


@LAB.exercise(EX4, minutes=15, kind="transfer")
def check_fast_batches(fast_batches: Any) -> CheckResult:
    """The same batches as :func:`slow_batches`, at least :data:`PIPELINE_SPEEDUP`x faster."""
    if not callable(fast_batches):
        return fail(EX4, f"fast_batches should be a function, not a "
                              f"{type(fast_batches).__name__}")
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (700, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, 700).astype(np.int32)
    for seed, epoch in ((0, 0), (0, 1), (3, 2)):
        want = _materialise(slow_batches(images, labels, 64, seed=seed, epoch=epoch), 99)
        got = _materialise(fast_batches(images, labels, 64, seed=seed, epoch=epoch), 99)
        if len(got) != len(want):
            return fail(EX4, f"700 examples in batches of 64 gave {len(got)} batches; the "
                                  f"slow pipeline gives {len(want)} (full batches only)",
                        hint="stop at the last full batch, as slow_batches does")
        for k, (g, w) in enumerate(zip(got, want)):
            if len(g) != 3:
                return fail(EX4, f"batch {k} has {len(g)} fields, not 3",
                            hint="yield Batch(images, labels, weights)")
            names = ("images", "labels", "weights")
            for name, a, b in zip(names, g, w):
                if a.shape != b.shape or a.dtype != b.dtype:
                    return fail(EX4, f"batch {k}'s {name} are {a.dtype}{list(a.shape)}, "
                                          f"expected {b.dtype}{list(b.shape)}",
                                hint="images stay uint8 (the chip converts them), labels int32, "
                                     "weights float32")
            if not np.array_equal(g[1], w[1]):
                return fail(EX4, f"batch {k} (seed={seed}, epoch={epoch}) holds other "
                                      "examples than the slow pipeline's",
                            hint="shuffle with the same generator: rng = "
                                 "np.random.default_rng([seed, epoch]); order = "
                                 "rng.permutation(len(images)), before any flip is drawn")
            if not np.array_equal(g[0], w[0]):
                return fail(EX4, f"batch {k} (seed={seed}, epoch={epoch}) has the right "
                                      "examples but different flips",
                            hint="draw the flips from the same generator after the permutation, "
                                 "one draw per example in batch order (rng.random(batch_size) "
                                 "gives the same numbers as batch_size calls of rng.random()), "
                                 "and mirror with [:, :, ::-1]")
    fashion_like = np.tile(images, (15, 1, 1))[:10_000]
    fashion_labels = np.tile(labels, 15)[:10_000]
    count = 20
    _time_pipeline(fast_batches, fashion_like, fashion_labels, 2, repeats=1)  # warm-up
    slow_s = _time_pipeline(slow_batches, fashion_like, fashion_labels, count)
    fast_s = _time_pipeline(fast_batches, fashion_like, fashion_labels, count)
    speedup = slow_s / max(fast_s, 1e-9)
    if speedup < PIPELINE_SPEEDUP:
        return fail(EX4, f"same batches, but only {speedup:.1f}x faster than slow_batches "
                              f"({count} batches: {slow_s * 1e3:.0f} ms vs {fast_s * 1e3:.0f} ms); "
                              f"at least {PIPELINE_SPEEDUP:.0f}x is asked",
                    hint="work on whole batches: images[idx] gathers a batch in one call, and "
                         "np.where(flip[:, None, None], x[:, :, ::-1], x) flips them all at "
                         "once; no Python loop over examples or pixels")
    return ok(EX4, f"same batches as slow_batches, {speedup:.0f}x faster ({count} batches: "
                        f"{slow_s * 1e3:.0f} ms -> {fast_s * 1e3:.1f} ms, measured in this run)")


# -- Exercise 5 ------------------------------------------------------------------------


def _fashion_test() -> tuple[Any, Any]:
    if "fashion" not in _CACHE:
        from tpu_course import data

        ds = data.load_fashion_mnist()
        _CACHE["fashion"] = (ds.test_images, ds.test_labels)
    return _CACHE["fashion"]


@LAB.exercise(EX5, minutes=10, kind="write")
def check_accuracy(trained_model: Any, fashion_epochs: Any) -> CheckResult:
    """The trained model's accuracy on all 10,000 Fashion-MNIST test images (evaluated here)."""
    from flax import nnx

    from tpu_course import train

    epochs = as_number(EX5, fashion_epochs, "fashion_epochs")
    if isinstance(epochs, CheckResult):
        return epochs
    if not isinstance(trained_model, nnx.Module):
        return fail(EX5, f"trained_model should be your trained nnx.Module, not a "
                              f"{type(trained_model).__name__}",
                    hint="train an instance of FashionModel in place and assign it")
    if epochs > MAX_EPOCHS:
        return fail(EX5, f"you trained {epochs:g} epochs; the exercise allows at most "
                              f"{MAX_EPOCHS}", hint="improve the model or the learning rate instead")
    images, labels = _fashion_test()
    ev = train.evaluate(trained_model, images, labels)
    if not math.isfinite(ev.loss):
        return fail(EX5, "the test loss is not finite: training diverged",
                    hint="lower the learning rate")
    if ev.accuracy < TARGET_ACCURACY:
        hint = ("a CNN (two 3x3 convolutions with pooling, then a dense layer) gets there in 3 "
                "epochs; so does Adam with a peak learning rate near 3e-3 to 5e-3 with a short "
                "warm-up and a cosine decay (optax.warmup_cosine_decay_schedule)")
        if ev.accuracy < 0.2:
            hint = "that is chance level: is the model trained in place (the same object)?"
        return fail(EX5, f"test accuracy {ev.accuracy:.2%} after {epochs:g} epoch(s); the "
                              f"target is {TARGET_ACCURACY:.0%}", hint=hint)
    return ok(EX5, f"test accuracy {ev.accuracy:.2%} on all {ev.count:,} test images after "
                        f"{epochs:g} epoch(s) (target {TARGET_ACCURACY:.0%})")
