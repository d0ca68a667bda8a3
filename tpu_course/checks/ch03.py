"""Lab 3 checkers: JAX for PyTorch people.

* :func:`check_jit_fix`: a gradient-clipping update that used a Python ``if`` on a traced
  value now runs under ``jax.jit`` and clips like the reference (below, above and far
  above the limit, a zero gradient; the grader adds other shapes and limits).
* :func:`check_compile_prediction`: how many times a jitted function compiles over a
  list of calls, predicted (locked with ``LAB.predict`` before the count is shown), then
  counted by JAX itself (the function's cache size).
* :func:`check_recompile_fix`: a planted recompilation (a schedule's values passed as
  static arguments) found and fixed: one compiled version for every step AND every
  learning rate, counted from an empty cache; a failure names which argument is still
  static.
* :func:`check_per_example_norms`: per-example gradient norms of an MLP with
  ``vmap(grad)``, against each example's gradient worked out by hand; a failure names
  the mistake (one batch norm repeated, squared norms, leaves left out...).
* :func:`check_port`: the PyTorch training step ported to JAX/Optax, compared with
  PyTorch by :mod:`tpu_course.parity` over parameters, every layer's output, the loss,
  the gradients and one optimizer step; a failure names the first layer that diverges
  and the porting mistake it looks like (a layout, the flatten order, the return order
  of ``train_step``, updates never applied).

The course's own answers live in :mod:`tpu_course.checks._answers.ch03` and are refused
as answers. The lab's fixture is here: the PyTorch model the port is compared with
(:data:`LAB_CONFIG`, :func:`torch_lab_model`), one run of it (:func:`make_reference`,
stored by ``scripts/make_parity_reference.py`` as ``tpu_course/reference/parity_cnn.npz``)
and :func:`reference`, live or stored, which chapter 3 shows and :func:`check_port`
grades against.

JAX is imported inside the checkers, so importing this module starts no backend.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from tpu_course import parity
from tpu_course.checks._answers import ch03 as _answers
from tpu_course.checks._core import (
    CheckResult, Lab, Verdict, as_number, ok, refuse, refuse_course_code,
)

LAB = Lab(3, "JAX for PyTorch people")


# ------------------------------------------------- the lab's model and its reference

#: The lab's model: conv 3->4 (3x3, padding 1) on 6x6 images, ReLU, flatten (PyTorch's
#: C, H, W order), Linear 144->16, ReLU, Linear 16->10; cross-entropy (mean); SGD lr 0.1.
LAB_CONFIG = {"name": "parity_cnn", "seed": 0, "batch": 8, "channels": 3, "size": 6,
              "conv_channels": 4, "hidden": 16, "classes": 10, "lr": 0.1,
              "optimizer": "SGD", "loss": "cross_entropy (mean)"}


def torch_lab_model(seed: int = 0) -> Any:
    """The lab's small CNN in PyTorch, initialised from ``torch.manual_seed(seed)``."""
    torch = parity.require_torch()
    nn = torch.nn
    c = LAB_CONFIG
    torch.manual_seed(seed)
    return nn.Sequential(collections.OrderedDict([
        ("conv", nn.Conv2d(c["channels"], c["conv_channels"], 3, padding=1)),
        ("act1", nn.ReLU()),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(c["conv_channels"] * c["size"] ** 2, c["hidden"])),
        ("act2", nn.ReLU()),
        ("fc2", nn.Linear(c["hidden"], c["classes"])),
    ]))


def make_reference(seed: int = 0) -> dict[str, np.ndarray]:
    """Run the lab's PyTorch model once and return every array (needs torch).

    This is what ``scripts/make_parity_reference.py`` stores in
    ``tpu_course/reference/parity_cnn.npz``.
    """
    torch = parity.require_torch()
    c = LAB_CONFIG
    model = torch_lab_model(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(c["batch"], c["channels"], c["size"], c["size"], generator=gen)
    y = torch.randint(0, c["classes"], (c["batch"],), generator=gen)
    arrays = parity.torch_trace(
        model, x, y, loss_fn=torch.nn.functional.cross_entropy,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=c["lr"]))
    meta = dict(c, seed=seed, torch_version=str(torch.__version__))
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    return arrays


def reference(live: bool | None = None, seed: int = 0) -> parity.Reference:
    """The lab's reference: live from PyTorch when it is installed, else the stored one.

    ``live=True`` insists on torch; ``live=False`` always reads the stored file.
    """
    if live is None:
        live = parity.torch_available()
    if live:
        torch = parity.require_torch()
        return parity.Reference.from_arrays(make_reference(seed),
                                            f"live: torch {torch.__version__}")
    return parity.load_reference(LAB_CONFIG["name"])


EX1 = "Exercise 1 (make it jit)"
EX2 = "Exercise 2 (predict the compilations)"
EX3 = "Exercise 3 (find the recompilation)"
EX4 = "Exercise 4 (per-example gradient norms)"
EX5 = "Exercise 5 (port the training step)"

#: The jax errors a traced value used as a Python value raises (a tuple for ``except``).
def _concrete_errors() -> tuple[type[BaseException], ...]:
    import jax

    return (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
            jax.errors.TracerArrayConversionError)


# ----------------------------------------------------------------- Exercise 1: jit fix

#: Exercise 1's learning rate: ``clipped_update`` returns ``w - LR * g * scale``.
LR = _answers.LR

#: Exercise 1's gradients, by their norm as a multiple of ``max_norm``.
_CLIP_CASES = (("a gradient below the limit", 0.3), ("a gradient above the limit", 3.0),
               ("a gradient far above the limit", 20.0), ("a zero gradient", 0.0))


def _clip_mistake(w: np.ndarray, g: np.ndarray, m: float, got: np.ndarray) -> str:
    """A hint naming the clipping mistake that gives ``got``, or a general one."""
    norm = float(np.sqrt(np.sum(np.asarray(g, np.float64) ** 2)))
    close = lambda want: np.allclose(got, want, rtol=1e-5, atol=1e-6)
    if close(w - LR * np.clip(g, -m, m)):
        return ("you clipped each element to [-max_norm, max_norm] (clipping by value); "
                "clip the gradient's global norm: scale = min(1, max_norm / ||g||)")
    if norm > 0 and close(w - LR * g * (m / norm)):
        return ("you rescale the gradient even when its norm is below max_norm: "
                "clip only when the norm exceeds it, scale = min(1, max_norm / norm)")
    if close(w - g * min(1.0, m / norm if norm else 1.0)):
        return f"the clipped gradient is right, but the step is not multiplied by LR ({LR})"
    if g.ndim > 1:
        return ("||g|| is the norm over EVERY element of g (the global norm), not one norm "
                "per row or column")
    return "clip only when the norm exceeds max_norm: scale = min(1, max_norm / norm)"


@LAB.exercise(EX1, minutes=10, kind="write", hidden=lambda rng: [
    (f"a 2-D gradient of shape {(int(r), int(c))} with max_norm = {m:g}",
     {"shape": (int(r), int(c)), "max_norm": m, "seed": int(seed)})
    for r, c, m, seed in [(*rng.integers(2, 7, 2), float(rng.choice([0.5, 2.0, 5.0])),
                           rng.integers(1 << 16))]] + [
    (f"a vector of {int(n)} elements with max_norm = {m:g}",
     {"shape": (int(n),), "max_norm": m, "seed": int(seed)})
    for n, m, seed in [(rng.integers(6, 40), float(rng.choice([0.25, 3.0, 10.0])),
                        rng.integers(1 << 16))]])
def check_jit_fix(clipped_update: Callable[[Any, Any, Any], Any], *,
                  shape: tuple[int, ...] = (5,), max_norm: float = 1.0,
                  seed: int = 3) -> CheckResult:
    """``jax.jit(clipped_update)(w, g, max_norm)`` must run and clip like the reference
    for gradients below, above and far above ``max_norm``, and a zero gradient.

    ``max_norm`` is passed as a traced argument (not static), so a Python ``if`` on any
    value computed from the arguments fails; ``jnp.where``, ``jnp.minimum`` or
    ``lax.cond`` work.
    """
    import jax
    import jax.numpy as jnp

    refuse_course_code(EX1, clipped_update, _answers.clipped_update_reference)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    direction = rng.standard_normal(shape)
    direction /= np.sqrt(np.sum(direction ** 2))
    fn = jax.jit(clipped_update)
    for what, ratio in _CLIP_CASES:
        g = (direction * ratio * max_norm).astype(np.float32)
        try:
            got = np.asarray(fn(jnp.asarray(w), jnp.asarray(g), jnp.float32(max_norm)))
        except jax.errors.TracerBoolConversionError:
            refuse(EX1, "still a Python `if` on a traced value: under jit the norm is a "
                        "tracer with no value yet",
                   hint="compute both outcomes and select with jnp.where(norm > max_norm, "
                        "...), or use jnp.minimum / lax.cond")
        except _concrete_errors() as err:
            refuse(EX1, f"a traced value was used where Python needs a concrete one "
                        f"({type(err).__name__})",
                   hint="under jit, float(...), int(...) and `if` need values the tracer does "
                        "not have yet: use jnp.where / jnp.minimum / lax.cond")
        want = _answers.clipped_update_reference(w, g, max_norm)
        answer = f"with {what}: {np.round(want, 4).tolist()}"
        if got.shape != want.shape:
            refuse(EX1, f"your update has shape {got.shape}, w has shape {want.shape}",
                   hint="the update has w's shape: the norm is one number for the whole g",
                   answer=answer)
        if not np.all(np.isfinite(got)):
            refuse(EX1, f"with {what} your update holds NaN or inf",
                   hint="a zero gradient has norm 0: max_norm / 0 is inf, and 0 * inf is NaN. "
                        "min(1, inf) is 1, or select with jnp.where", answer=answer)
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            refuse(EX1, f"with {what} (||g|| = {ratio:g} x max_norm) your update differs from "
                        "the clipped one",
                   hint=_clip_mistake(w, g, max_norm, got), answer=answer)
    return ok(EX1, "runs under jax.jit and clips exactly like the reference "
                   f"on {len(_CLIP_CASES)} gradients (below, above, far above the limit, zero)")


# ------------------------------------------------ Exercise 2: predict the compilations

#: The calls of Exercise 2, as the lab shows them: ``f = jax.jit(lambda x, scale: x * scale)``.
COMPILE_QUIZ = (
    "f(jnp.ones(8), 2.0)",
    "f(jnp.ones(8), 3.0)",
    "f(jnp.ones(16), 2.0)",
    "f(jnp.ones(8, jnp.int32), 2.0)",
    "f(jnp.ones(8), 2)",
    "f(jnp.ones((2, 4)), 2.0)",
    "f(jnp.ones(8), 5.0)",
)


def run_compile_quiz(show: bool = False) -> list[int]:
    """Run :data:`COMPILE_QUIZ` on a fresh ``jax.jit`` and return, per call, how many new
    compiled versions it added (JAX's own count: the jitted function's cache size).

    The lab shows it only once your prediction is recorded (``LAB.predicted``)."""
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda x, scale: x * scale)
    added = []
    for call in COMPILE_QUIZ:
        before = f._cache_size()
        eval(call, {"f": f, "jnp": jnp})  # noqa: S307 - our own fixed strings
        added.append(f._cache_size() - before)
        if show:
            print(f"{call:34s} {'compiles' if added[-1] else 'cached'}")
    if show:
        print(f"{sum(added)} compilations for {len(added)} calls")
    return added


@LAB.exercise(EX2, minutes=10, kind="predict")
def check_compile_prediction(predicted_compiles: Any) -> CheckResult:
    """Exercise 2: how many times ``f`` compiles over :data:`COMPILE_QUIZ` (exact)."""
    got = as_number(EX2, predicted_compiles, "the number of compilations")
    added = run_compile_quiz()
    want = sum(added)
    answer = "; ".join(f"{c}: {'compiles' if a else 'cached'}" for c, a in zip(COMPILE_QUIZ, added))
    answer = f"{want}: {answer}"
    if got == want:
        return ok(EX2, f"{want} compilations for {len(added)} calls: a new shape, a new dtype "
                       "or a Python int where a float was (a different weak type) each make a "
                       "new version; a new value of a traced argument does not")
    if got != int(got) or not 1 <= got <= len(COMPILE_QUIZ):
        refuse(EX2, f"{got:g} cannot be a count of compilations over {len(COMPILE_QUIZ)} calls",
               hint=f"a whole number from 1 (the first call always compiles) to "
                    f"{len(COMPILE_QUIZ)}", answer=answer)
    if got == len(COMPILE_QUIZ):
        hint = "a traced argument's VALUE is not part of the cache key: 2.0 and 3.0 share one version"
    elif got < want:
        hint = ("the cache key is every argument's shape AND dtype (a Python int is a "
                "weakly typed int32, a Python float a weakly typed float32)")
    else:
        hint = "which calls repeat an earlier call's shapes and dtypes exactly?"
    refuse(EX2, f"your count is {'too high' if got > want else 'too low'}", hint=hint,
           answer=answer)


# -------------------------------------------------- Exercise 3: find the recompilation

#: Exercise 3's learning-rate decay: the rate halves every ``HALVING`` steps.
HALVING = _answers.HALVING
#: The steps at which the checker calls the learner's update ...
STEPS = (0, 1, 2, 50, 99, 100, 150, 250, 400, 1000)
#: ... and the base learning rate of each call (a sweep over rates must not recompile).
LRS = (0.1, 0.1, 0.05, 0.1, 0.3, 0.3, 0.1, 0.02, 0.1, 0.05)


def _ex3_hidden(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for _ in range(2):
        n = int(rng.integers(5, 9))
        steps = sorted(int(s) for s in rng.choice(5000, n, replace=False))
        lrs = [float(v) for v in rng.choice([0.5, 0.2, 0.1, 0.03, 0.01, 0.004], n)]
        lrs[1] = 0.7 if lrs[0] != 0.7 else 0.6  # at least two rates, always
        size = int(rng.integers(2, 12))
        cases.append((f"{n} other steps up to {steps[-1]}, {len(set(lrs))} other learning "
                      f"rates, w of {size} elements",
                      {"lrs": tuple(lrs), "steps": tuple(steps), "size": size,
                       "seed": int(rng.integers(1 << 16))}))
    return cases


def _decay_mistake(w: np.ndarray, g: np.ndarray, lr: float, step: int, got: np.ndarray,
                   lrs: tuple[float, ...]) -> str:
    close = lambda want: np.allclose(got, want, rtol=1e-5, atol=1e-6)
    if close(w - lr * 0.5 ** (step / HALVING) * g):
        return (f"your rate decays smoothly (step / {HALVING}); it halves every {HALVING} "
                f"steps: integer division, step // {HALVING}, works on a traced step too")
    if close(w - lr * g):
        return f"the rate does not decay: multiply lr by 0.5 ** (step // {HALVING})"
    for other in {0.1, *lrs} - {lr}:
        if close(_answers.decayed_update_reference(w, g, other, step)):
            return (f"your update ignores the lr argument (it used {other:g}, the call passed "
                    f"{lr:g}): use the lr the caller passes")
    return f"keep the decay, lr * 0.5 ** (step // {HALVING}), and the update w - lr_t * g"


def _static_arguments(fn: Any, w: Any, g: Any) -> list[str]:
    """Which of lr, step compile again for a new value (the function's cache, cleared
    before each probe)."""
    found = []
    for name, calls in (("lr", ((0.1, 3), (0.2, 3))), ("step", ((0.1, 3), (0.1, 4)))):
        fn.clear_cache()
        for lr, step in calls:
            fn(w, g, lr, step)
        if fn._cache_size() > 1:
            found.append(name)
    return found


@LAB.exercise(EX3, minutes=15, kind="apply", hidden=_ex3_hidden)
def check_recompile_fix(update_fixed: Callable[..., Any], *, lrs: tuple[float, ...] = LRS,
                        steps: tuple[int, ...] = STEPS, size: int = 4,
                        seed: int = 6) -> CheckResult:
    """Exercise 3: ``update_fixed(w, g, lr, step)`` (jitted) must give the decayed update
    for every (lr, step) pair while compiling once, counted by JAX (its cache size, from
    an empty cache)."""
    import jax.numpy as jnp

    refuse_course_code(EX3, update_fixed, _answers.decayed_update_reference)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(size).astype(np.float32)
    g = rng.standard_normal(size).astype(np.float32)
    wj, gj = jnp.asarray(w), jnp.asarray(g)
    if not hasattr(update_fixed, "_cache_size"):
        update_fixed(wj, gj, lrs[0], steps[0])  # the lab's stub raises: "not written yet"
        refuse(EX3, "update_fixed is not a jitted function",
               hint="update_fixed = jax.jit(...) (or decorate it with @jax.jit)")
    clear = getattr(update_fixed, "clear_cache", None)
    if clear is not None:
        clear()  # count this run's versions only, whatever ran before
    before = update_fixed._cache_size()
    for lr, step in zip(lrs, steps):
        try:
            got = np.asarray(update_fixed(wj, gj, lr, step))
        except _concrete_errors() as err:
            refuse(EX3, f"with traced lr and step your update raised {type(err).__name__}",
                   hint="a traced step has no Python value: no int(step), float(lr) or `if` "
                        f"on them; step // {HALVING} and 0.5 ** (...) work on tracers")
        want = _answers.decayed_update_reference(w, g, lr, step)
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            refuse(EX3, f"at step {step} with lr = {lr:g} the update differs from "
                        f"w - lr * 0.5 ** (step // {HALVING}) * g",
                   hint=_decay_mistake(w, g, lr, step, got, lrs),
                   answer=f"{np.round(want, 5).tolist()}")
    total = update_fixed._cache_size() - before  # JAX's own count of compiled versions
    if total > 1:
        static = _static_arguments(update_fixed, wj, gj) if clear is not None else []
        calls = f"{len(steps)} calls ({len(set(steps))} steps, {len(set(lrs))} learning rates)"
        if static:
            which = " and ".join(static)
            other = {"lr": "step", "step": "lr"}
            hint = (f"an argument in static_argnums/static_argnames is part of the cache key, "
                    f"so every new value of {which} compiles again: pass "
                    + ("lr and step" if len(static) == 2 else
                       f"{which} as an ordinary (traced) argument too, like {other[which]}"))
            refuse(EX3, f"update_fixed compiled {total} versions for {calls}: {which} "
                        f"{'are' if len(static) == 2 else 'is'} still static", hint=hint)
        refuse(EX3, f"update_fixed compiled {total} versions for {calls}",
               hint="an argument listed in static_argnums/static_argnames is part of the "
                    "cache key: every new value compiles again. Pass lr and step as "
                    "ordinary (traced) arguments")
    return ok(EX3, f"{len(steps)} calls over {len(set(steps))} steps and {len(set(lrs))} "
                   "learning rates, one compiled version (counted by JAX), the same updates "
                   "as the planted version")


# -------------------------------------------------- Exercise 4: per-example grad norms


def mlp_loss(params: Any, x: Any, y: Any) -> Any:
    """Exercise 4's loss for ONE example: a two-layer tanh MLP, squared error."""
    import jax.numpy as jnp

    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return 0.5 * jnp.sum((h @ params["w2"] + params["b2"] - y) ** 2)


def mlp_batch(seed: int = 5, n: int = 6, d_in: int = 3, d_hidden: int = 5,
              d_out: int = 2) -> tuple[dict, np.ndarray, np.ndarray]:
    """Parameters and a batch (X (n, d_in), Y (n, d_out)) for Exercise 4."""
    rng = np.random.default_rng(seed)
    params = {"w1": rng.standard_normal((d_in, d_hidden)), "b1": rng.standard_normal(d_hidden),
              "w2": rng.standard_normal((d_hidden, d_out)), "b2": rng.standard_normal(d_out)}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    return (params, rng.standard_normal((n, d_in)).astype(np.float32),
            rng.standard_normal((n, d_out)).astype(np.float32))


def _norms_mistake(got: np.ndarray, params: dict, X: np.ndarray, Y: np.ndarray
                   ) -> tuple[str, str]:
    """(message, hint) naming the mistake that gives ``got``, or a general pair."""
    import itertools

    squares = _answers.per_example_squares(params, X, Y)
    want = np.sqrt(sum(squares.values()))
    n = len(want)
    close = lambda ref: np.allclose(got, ref, rtol=1e-4, atol=1e-5)
    grads = _answers.per_example_grads(params, X, Y)
    batch_norm = float(np.sqrt(sum(np.sum(g.mean(axis=0) ** 2) for g in grads.values())))
    per_example = ("take the gradient of ONE example's loss and vmap it over the examples: "
                   "jax.vmap(jax.grad(mlp_loss), in_axes=(None, 0, 0)), then reduce each "
                   "example's gradient to its own norm")
    if n > 1 and np.ptp(got) <= 1e-6 * max(1.0, float(np.abs(got).max())):
        for scale, what in ((1, "mean"), (n, "sum")):
            if close(np.full(n, scale * batch_norm)):
                return (f"all {n} norms are the same number, the norm of the batch's {what} "
                        "gradient: one norm for the whole batch, repeated, not one per "
                        "example", per_example)
        return (f"all {n} norms are the same number: one value for the whole batch, "
                "repeated, not one per example", per_example)
    if close(want / n):
        return (f"your norms are {n}x too small",
                "take the gradient of one example's loss, not of the batch mean")
    if close(want ** 2):
        return "those are squared norms", "take the square root of the sum of squares"
    if close(sum(np.sqrt(s) for s in squares.values())):
        return ("you added the norms of the four parameter arrays",
                "the global norm is the square root of the sum of ALL squares: "
                "sqrt(sum over leaves of the leaf's squared norm)")
    leaves = list(squares)
    for k in range(1, len(leaves)):
        for kept in itertools.combinations(leaves, k):
            if close(np.sqrt(sum(squares[name] for name in kept))):
                missing = ", ".join(name for name in leaves if name not in kept)
                return (f"your norms are too small: they leave out {missing}",
                        "sum the squares over EVERY leaf (w1, b1, w2, b2), e.g. with "
                        "jax.tree.leaves")
    return ("wrong values", "each norm is sqrt(sum over all leaves of the example's gradient "
                            "squared)")


def _ex4_hidden(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    d_in, d_hidden, d_out = (int(v) for v in rng.integers(2, 9, 3))
    n = int(rng.integers(7, 13))
    return [("a batch of one example", {"n": 1, "seed": int(rng.integers(1 << 16))}),
            (f"a batch of {n} examples with {d_in} inputs, {d_hidden} hidden units and "
             f"{d_out} outputs", {"n": n, "d_in": d_in, "d_hidden": d_hidden, "d_out": d_out,
                                  "seed": int(rng.integers(1 << 16))})]


@LAB.exercise(EX4, minutes=15, kind="apply", hidden=_ex4_hidden)
def check_per_example_norms(per_example_grad_norms: Callable[[Any, Any, Any], Any], *,
                            seed: int = 5, n: int = 6, d_in: int = 3, d_hidden: int = 5,
                            d_out: int = 2) -> CheckResult:
    """Exercise 4: ``per_example_grad_norms(params, X, Y)`` -> (n,) global gradient norms
    of :func:`mlp_loss`, one per example (the first step of DP-SGD's per-example clip),
    against each example's gradient worked out by hand."""
    import jax
    import jax.numpy as jnp

    refuse_course_code(EX4, per_example_grad_norms, *_answers.EX4_FUNCTIONS)
    params, X, Y = mlp_batch(seed, n, d_in, d_hidden, d_out)
    want = _answers.per_example_norms_reference(params, X, Y)
    with jax.default_matmul_precision("float32"):
        got = per_example_grad_norms(jax.tree.map(jnp.asarray, params), jnp.asarray(X),
                                     jnp.asarray(Y))
    if isinstance(got, dict):
        refuse(EX4, "you returned a dict (the gradients?), not one norm per example",
               hint="reduce every example's gradient pytree to one number: the square "
                    "root of the sum of squares over all its leaves")
    got = np.asarray(got, np.float64)
    if got.shape != (n,):
        if got.size == 1 and n > 1:
            hint = ("one number for the whole batch: vmap the gradient of ONE example's loss "
                    "over the examples (in_axes=(None, 0, 0)) and keep the example axis")
        elif got.size == n:
            hint = f"one norm per example in a flat array: reshape to ({n},)"
        elif got.size == 4 * n:
            hint = ("one norm per parameter array: combine them, sqrt of the sum of their "
                    "squares, into one global norm per example")
        else:
            hint = "one global norm per example, over all parameters together"
        refuse(EX4, f"expected shape ({n},), one norm per example; got {got.shape}", hint=hint)
    if not np.all(np.isfinite(got)):
        refuse(EX4, "your norms hold NaN or inf", hint="look for a division or a log")
    answer = f"norms {np.round(want, 4).tolist()}"
    if np.allclose(got, want, rtol=1e-4, atol=1e-5):
        return ok(EX4, f"{n} per-example gradient norms equal each example's own gradient")
    message, hint = _norms_mistake(got, params, X, Y)
    refuse(EX4, message, hint=hint, answer=answer)


# --------------------------------------------------------------- Exercise 5: the port


def _flatten_order_explains(ref: parity.Reference, got: dict[str, np.ndarray]) -> bool:
    """True when the port's fc1 output is what a channels-last (H, W, C) flatten gives."""
    if "forward/fc1" not in got:
        return False
    h = np.maximum(ref["forward/conv"].astype(np.float64), 0.0)  # NHWC, after ReLU
    hwc = h.reshape(h.shape[0], -1) @ ref["params/fc1.kernel"] + ref["params/fc1.bias"]
    g = np.asarray(got["forward/fc1"], np.float64)
    return g.shape == hwc.shape and np.allclose(g, hwc, rtol=1e-4, atol=1e-4)


_HINTS = {
    "params": "check convert_params: Linear weight -> kernel = weight.T; Conv2d weight "
              "OIHW -> kernel HWIO = weight.transpose(2, 3, 1, 0); copy every bias.",
    "forward": "check forward at this layer (the layers before it match).",
    "loss": "the logits match, so the loss function differs: PyTorch's cross_entropy "
            "takes the mean over the batch of -log softmax at the label.",
    "grad": "the loss matches but its gradient does not: is the gradient taken with "
            "respect to params (argument 0), of the same loss?",
    "step": "gradients match but the update does not: SGD is p - lr * g with "
            f"lr = {LAB_CONFIG['lr']}; return the new params from train_step.",
}

#: Words of an exception's message that say a shape did not fit (a layout mistake?).
_SHAPE_WORDS = ("shape", "dot_general", "conv", "dimension", "incompatible", "broadcast")


def _calling(what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose exception ends the check with a failure naming ``what`` raised it."""
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except (Verdict, NotImplementedError):
            raise
        except Exception as err:  # noqa: BLE001 - the learner's code may raise anything
            msg = str(err).strip().split("\n")[0][:300]
            layout = any(word in msg.lower() for word in _SHAPE_WORDS)
            refuse(EX5, f"{what} raised {type(err).__name__}: {msg}",
                   hint="a shape error in a matmul or conv usually means a weight kept "
                        "PyTorch's layout (or the flatten order is wrong)" if layout else
                        f"run {what.split('(')[0]} yourself on the reference's arrays and "
                        "look at what it gets and returns")
    return call


def _role(item: Any, params: Any, state: Any) -> str:
    """What one value train_step returned looks like: "params", "opt_state", "loss"."""
    import jax

    shape = getattr(item, "shape", None)
    if isinstance(item, float) or (shape == () and np.dtype(item.dtype).kind in "fc"):
        return "loss"
    structure = jax.tree.structure(item)
    if structure == jax.tree.structure(params):
        return "params"
    if structure == jax.tree.structure(state):
        return "opt_state"
    return f"an array of shape {tuple(shape)}" if shape is not None else type(item).__name__


def _stepped(train_step: Callable[..., Any], optimizer: Any) -> Callable[[Any, Any, Any], Any]:
    """``step(params, x, y) -> new params`` from the learner's ``train_step``, after
    checking that it returns ``(params, opt_state, loss)`` in that order."""
    def step(params: Any, x: Any, y: Any) -> Any:
        state = _calling("optimizer.init(params)", optimizer.init)(params)
        out = _calling("train_step(params, opt_state, x, y)", train_step)(params, state, x, y)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            got = (f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list))
                   else f"a {type(out).__name__}")
            refuse(EX5, f"train_step returned {got}, not the three values (params, "
                        "opt_state, loss)",
                   hint="end train_step with: return new_params, opt_state, loss")
        roles = [_role(item, params, state) for item in out]
        if roles != ["params", "opt_state", "loss"]:
            if sorted(roles) == ["loss", "opt_state", "params"]:
                refuse(EX5, f"train_step returned ({', '.join(roles)}): the values are right "
                            "but in the wrong order; it returns (params, opt_state, loss)",
                       hint="return new_params, opt_state, loss, in that order: a training "
                            "loop (and this check) unpacks them by position")
            refuse(EX5, f"train_step returned ({', '.join(roles)}), not (params, opt_state, "
                        "loss): "
                        + ("the first value is not a parameter tree shaped like params"
                           if roles[0] != "params" else "one value is not what it should be"),
                   hint="return the new parameters (same tree as params), the optimizer's new "
                        "state and the loss (a scalar), in that order")
        return out[0]
    return step


def _step_mistake(ref: parity.Reference, got: dict[str, Any]) -> tuple[str, str] | None:
    """(diagnosis, hint) naming the optimizer-step mistake that gives ``got``'s
    ``step/...`` arrays, when the parameters and gradients before it match."""
    names = [n[len("step/"):] for n in ref.expected if n.startswith("step/")]
    if not all(f"step/{n}" in got and f"params/{n}" in got for n in names):
        return None
    try:
        new = [np.asarray(got[f"step/{n}"], np.float64) for n in names]
        old = [np.asarray(got[f"params/{n}"], np.float64) for n in names]
        want = [ref[f"step/{n}"].astype(np.float64) - ref[f"params/{n}"] for n in names]
        moved = [a - b for a, b in zip(new, old)]
        if any(m.shape != w.shape for m, w in zip(moved, want)):
            return None
    except Exception:  # noqa: BLE001 - shapes that do not subtract: the generic diagnosis
        return None
    big = max(float(np.abs(w).max()) for w in want)
    lr = LAB_CONFIG["lr"]
    apply = ("updates, opt_state = optimizer.update(grads, opt_state, params); then return "
             "optax.apply_updates(params, updates), opt_state, loss")
    sgd = f"optimizer = optax.sgd({lr}), the step PyTorch's torch.optim.SGD(lr={lr}) takes"
    if all(float(np.abs(m).max()) <= 1e-3 * big for m in moved):
        return ("train_step returns the parameters it was given, unchanged: the updates were "
                "never applied (optax.apply_updates)", apply)
    if all(np.allclose(a, w, rtol=1e-3, atol=1e-6 * big) for a, w in zip(new, want)):
        return ("train_step returns the updates (-lr * grad), not the new parameters "
                "(optax.apply_updates adds them to params)", apply)
    flat_m, flat_w = np.concatenate([m.ravel() for m in moved]), np.concatenate(
        [w.ravel() for w in want])
    k = float(flat_m @ flat_w) / float(flat_w @ flat_w)
    if np.allclose(flat_m, k * flat_w, rtol=1e-3, atol=1e-6 * big):
        if abs(k + 1) < 1e-3:
            return ("the parameters moved along the gradient instead of against it: SGD "
                    "subtracts, p - lr * g",
                    "optax's updates already carry the minus sign: add them with "
                    "optax.apply_updates(params, updates), do not subtract them")
        return (f"the parameters moved {k:.3g} times as far as SGD with lr = {lr} moves them "
                f"(a learning rate of {k * lr:.3g}?)", sgd)
    nonzero = np.abs(flat_m[np.abs(flat_w) > 1e-3 * big])
    if nonzero.size and np.quantile(nonzero, 0.9) <= 1.2 * np.quantile(nonzero, 0.1):
        return ("every parameter moved by about the same amount, whatever its gradient: an "
                "Adam (or sign-based) first step, where PyTorch's model takes a plain SGD "
                "step", sgd)
    return None


#: The course's functions that answer part of Exercise 5 (the weight conversion).
_CONVERTERS = (parity.linear_to_jax, parity.conv2d_to_jax, parity.torch_layer_params)


def _ex5_hidden(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    batch = int(rng.choice([3, 5, 11]))
    return [(f"other weights and images, a batch of {batch}",
             {"seed": int(rng.integers(1, 1 << 16)), "batch": batch})]


@LAB.exercise(EX5, minutes=30, kind="write", hidden=_ex5_hidden)
def check_port(convert_params: Callable[[dict[str, np.ndarray]], Any],
               forward: Callable[[Any, Any], dict[str, Any]],
               loss_fn: Callable[[Any, Any, Any], Any],
               train_step: Callable[[Any, Any, Any, Any], Any],
               optimizer: Any, *, live: bool | None = None, seed: int | None = None,
               batch: int = 8) -> CheckResult:
    """Grade a JAX port of the lab's PyTorch training step with the parity harness.

    Args:
        convert_params: PyTorch ``state_dict`` (numpy arrays, PyTorch layout) -> params
            ``{"conv": {"kernel", "bias"}, "fc1": {...}, "fc2": {...}}`` in JAX layout.
        forward: ``forward(params, x_nhwc) -> {"conv": ..., "fc1": ..., "fc2": ...}``,
            each layer's output before its activation (``fc2`` is the logits).
        loss_fn: ``loss_fn(params, x, y) -> scalar``.
        train_step: ``train_step(params, opt_state, x, y) -> (params, opt_state, loss)``.
        optimizer: the Optax optimizer ``train_step`` uses (for ``optimizer.init``).
        live: compare with live PyTorch (``True``), the stored reference (``False``), or
            live when torch is installed (``None``).
        seed, batch: the grader's unseen case: weights and a batch of ``batch`` images
            drawn from ``seed``, against the same model run by the course's own port
            (itself checked against PyTorch by the tests); None is the PyTorch run.
    """
    import jax.numpy as jnp

    for answer in (convert_params, forward, loss_fn, train_step):
        refuse_course_code(EX5, answer, *_CONVERTERS, *_answers.EX5_FUNCTIONS)
    if seed is None:
        ref = reference(live=live)
        against = "PyTorch"
    else:
        ref = parity.Reference.from_arrays(_answers.port_arrays(seed, batch, LAB_CONFIG),
                                           "the same model, other weights")
        against = "the reference"
    params = _calling("convert_params(state_dict)", convert_params)(dict(ref.torch_state_dict))
    x = jnp.asarray(parity.nchw_to_nhwc(ref["input/x"]))
    y = jnp.asarray(ref["input/y"])
    got = parity.jax_trace(params, x, y)
    report = parity.compare(ref.expected, got,
                            names=[n for n in ref.expected if n.startswith("params/")])
    if report.passed:
        got = parity.jax_trace(params, x, y, forward=_calling("forward(params, x)", forward),
                               loss_fn=_calling("loss_fn(params, x, y)", loss_fn),
                               step=_stepped(train_step, optimizer))
        report = parity.compare(ref.expected, got)
    if report.passed:
        # The message is the same against live torch and the stored reference, so a
        # notebook's saved output does not depend on whether torch is installed.
        return ok(EX5, f"{len(report.rows)} arrays match {against}: parameters, every "
                       "layer's output, the loss, every gradient and one SGD step")
    f = report.first_failure
    assert f is not None
    diagnosis = f.diagnosis
    if f.name == "forward/fc1" and report.rows and all(
            r.passed for r in report.rows if r.name == "forward/conv") \
            and _flatten_order_explains(ref, got):
        diagnosis = ("flatten order: you flattened channels-last (H, W, C) activations, "
                     "PyTorch flattened NCHW as (C, H, W); transpose to (0, 3, 1, 2) before "
                     "reshape (or permute fc1's kernel rows)")
    hint = _HINTS.get(f.kind, "")
    named = _step_mistake(ref, got) if f.kind == "step" else None
    if named is not None:
        diagnosis, hint = named
    if f.diagnosis.startswith("missing"):
        hint = ("return every layer's output under the PyTorch layer names "
                "('conv', 'fc1', 'fc2') and params as {layer: {'kernel', 'bias'}}.")
    bad = sum(not r.passed for r in report.rows)
    source = ref.source if seed is None else f"batch of {batch}"
    refuse(EX5, f"{bad} of {len(report.rows)} arrays differ from {against} ({source}); "
                f"first at layer '{f.layer}' ({f.name}): {diagnosis}", hint=hint)
