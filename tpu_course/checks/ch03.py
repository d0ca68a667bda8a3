"""Lab 3 checkers: JAX for PyTorch people.

* :func:`check_jit_fix`: a gradient-clipping update that used a Python ``if`` on a traced
  value now runs under ``jax.jit`` and gives the right numbers.
* :func:`check_compile_prediction`: how many times a jitted function compiles over a
  list of calls, predicted, then counted by JAX itself (the function's cache size).
* :func:`check_recompile_fix`: a planted recompilation (a schedule's values passed as
  static arguments) found and fixed: one compiled version for every step.
* :func:`check_per_example_norms`: per-example gradient norms of an MLP with
  ``vmap(grad)``, against one ``jax.grad`` per example.
* :func:`check_port`: the PyTorch training step ported to JAX/Optax, compared with
  PyTorch by :mod:`tpu_course.parity` over parameters, every layer's output, the loss,
  the gradients and one optimizer step; a failure names the first layer that diverges
  and the porting mistake it looks like.

The lab's fixture is here too: the PyTorch model the port is compared with
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
from tpu_course.checks._core import CheckResult, Lab, as_number, fail, ok

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

# ----------------------------------------------------------------- Exercise 1: jit fix

LR = 0.1


def clipped_update_reference(w: np.ndarray, g: np.ndarray, max_norm: float) -> np.ndarray:
    """``w - LR * g * min(1, max_norm / ||g||)`` (gradient clipping by global norm)."""
    norm = float(np.sqrt(np.sum(np.asarray(g, np.float64) ** 2)))
    scale = 1.0 if norm <= max_norm else max_norm / norm
    return w - LR * g * scale


@LAB.exercise(EX1, minutes=10, kind="write")
def check_jit_fix(clipped_update: Callable[[Any, Any, Any], Any]) -> CheckResult:
    """``jax.jit(clipped_update)(w, g, max_norm)`` must run and clip like the reference.

    ``max_norm`` is passed as a traced argument (not static), so a Python ``if`` on any
    value computed from the arguments fails; ``jnp.where``, ``jnp.minimum`` or
    ``lax.cond`` work.
    """
    import jax
    import jax.numpy as jnp

    name = EX1
    rng = np.random.default_rng(3)
    w = rng.standard_normal(5).astype(np.float32)
    cases = [(rng.standard_normal(5).astype(np.float32) * s, m)
             for s, m in ((0.1, 1.0), (3.0, 1.0), (1.0, 10.0), (0.0, 1.0))]
    try:
        fn = jax.jit(clipped_update)
        for g, m in cases:
            got = np.asarray(fn(jnp.asarray(w), jnp.asarray(g), jnp.float32(m)))
            want = clipped_update_reference(w, g, m)
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-6):
                norm = float(np.linalg.norm(g))
                return fail(name, f"with ||g|| = {norm:.3g} and max_norm = {m} your update "
                            "differs from the clipped one",
                            hint="clip only when the norm exceeds max_norm: "
                                 "scale = min(1, max_norm / norm)",
                            answer=f"expected {np.round(want, 4)}, you gave {np.round(got, 4)}")
            if not np.all(np.isfinite(got)):
                return fail(name, "got NaN or inf (a zero gradient divides by a zero norm?)")
    except jax.errors.TracerBoolConversionError:
        return fail(name, "still a Python `if` on a traced value: under jit the norm is a "
                    "tracer with no value yet. Compute both outcomes and select with "
                    "jnp.where(norm > max_norm, ...), or use jnp.minimum / lax.cond.")
    except jax.errors.ConcretizationTypeError as err:
        return fail(name, f"a traced value was used where Python needs a concrete one "
                    f"({type(err).__name__}): use jnp.where / lax.cond, not float() or if.")
    return ok(name, "runs under jax.jit and clips exactly like the reference "
              f"on {len(cases)} cases (below, above, far below the limit, zero gradient)")


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
    compiled versions it added (JAX's own count: the jitted function's cache size)."""
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
    if isinstance(got, CheckResult):
        return got
    added = run_compile_quiz()
    want = sum(added)
    answer = "; ".join(f"{c}: {'compiles' if a else 'cached'}" for c, a in zip(COMPILE_QUIZ, added))
    if got == want:
        return ok(EX2, f"{want} compilations for {len(added)} calls: a new shape, a new dtype "
                       "or a Python int where a float was (a different weak type) each make a "
                       "new version; a new value of a traced argument does not")
    if got == len(COMPILE_QUIZ):
        hint = "a traced argument's VALUE is not part of the cache key: 2.0 and 3.0 share one version"
    elif got < want:
        hint = ("the cache key is every argument's shape AND dtype (a Python int is a "
                "weakly typed int32, a Python float a weakly typed float32)")
    else:
        hint = "which calls repeat an earlier call's shapes and dtypes exactly?"
    return fail(EX2, f"your count is {'too high' if got > want else 'too low'}", hint=hint,
                answer=f"{want}: {answer}")


# -------------------------------------------------- Exercise 3: find the recompilation

#: Exercise 3's learning-rate decay: the rate halves every ``HALVING`` steps.
HALVING = 100
#: The steps at which the checker calls the learner's update.
STEPS = (0, 1, 2, 50, 99, 100, 150, 250, 400, 1000)


def decayed_update_reference(w: np.ndarray, g: np.ndarray, lr: float, step: int) -> np.ndarray:
    """``w - lr * 0.5 ** (step // HALVING) * g``."""
    return w - lr * 0.5 ** (step // HALVING) * g


@LAB.exercise(EX3, minutes=15, kind="transfer")
def check_recompile_fix(update_fixed: Callable[..., Any]) -> CheckResult:
    """Exercise 3: ``update_fixed(w, g, lr, step)`` (jitted) must give the decayed update
    for every step of :data:`STEPS` while compiling once (its cache size)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(6)
    w = rng.standard_normal(4).astype(np.float32)
    g = rng.standard_normal(4).astype(np.float32)
    for step in STEPS:
        got = np.asarray(update_fixed(jnp.asarray(w), jnp.asarray(g), 0.1, step))
        want = decayed_update_reference(w, g, 0.1, step)
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            return fail(EX3, f"at step {step} the update differs from "
                             "w - lr * 0.5 ** (step // 100) * g",
                        hint="keep the decay: integer division works on a traced step too")
    if not hasattr(update_fixed, "_cache_size"):
        return fail(EX3, "update_fixed is not a jitted function",
                    hint="update_fixed = jax.jit(...) (or decorate it with @jax.jit)")
    total = update_fixed._cache_size()  # JAX's own count of compiled versions
    if total > 1:
        return fail(EX3, f"update_fixed holds {total} compiled versions after {len(STEPS)} calls",
                    hint="an argument listed in static_argnums/static_argnames is part of the "
                         "cache key: every new value compiles again. Pass lr and step as "
                         "ordinary (traced) arguments")
    return ok(EX3, f"{len(STEPS)} steps, one compiled version (counted by JAX), the same "
                   "updates as the planted version")


# -------------------------------------------------- Exercise 4: per-example grad norms


def mlp_loss(params: Any, x: Any, y: Any) -> Any:
    """Exercise 4's loss for ONE example: a two-layer tanh MLP, squared error."""
    import jax.numpy as jnp

    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return 0.5 * jnp.sum((h @ params["w2"] + params["b2"] - y) ** 2)


def mlp_batch(seed: int = 5, n: int = 6) -> tuple[dict, np.ndarray, np.ndarray]:
    """Parameters and a batch (X (n, 3), Y (n, 2)) for Exercise 4."""
    rng = np.random.default_rng(seed)
    params = {"w1": rng.standard_normal((3, 5)), "b1": rng.standard_normal(5),
              "w2": rng.standard_normal((5, 2)), "b2": rng.standard_normal(2)}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    return (params, rng.standard_normal((n, 3)).astype(np.float32),
            rng.standard_normal((n, 2)).astype(np.float32))


def per_example_norms_reference(params: Any, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """One ``jax.grad`` per example, in a Python loop: the global L2 norm of each."""
    import jax

    norms = []
    for x, y in zip(X, Y):
        grads = jax.grad(mlp_loss)(params, x, y)
        norms.append(np.sqrt(sum(float(np.sum(np.asarray(leaf, np.float64) ** 2))
                                 for leaf in jax.tree.leaves(grads))))
    return np.array(norms)


@LAB.exercise(EX4, minutes=15, kind="transfer")
def check_per_example_norms(per_example_grad_norms: Callable[[Any, Any, Any], Any]
                            ) -> CheckResult:
    """Exercise 4: ``per_example_grad_norms(params, X, Y)`` -> (n,) global gradient norms
    of :func:`mlp_loss`, one per example (the first step of DP-SGD's per-example clip)."""
    import jax
    import jax.numpy as jnp

    params, X, Y = mlp_batch()
    want = per_example_norms_reference(params, X, Y)
    with jax.default_matmul_precision("float32"):
        got = per_example_grad_norms(jax.tree.map(jnp.asarray, params), jnp.asarray(X),
                                     jnp.asarray(Y))
    if isinstance(got, dict):
        return fail(EX4, "you returned a dict (the gradients?), not one norm per example",
                    hint="reduce every example's gradient pytree to one number: the square "
                         "root of the sum of squares over all its leaves")
    got = np.asarray(got, np.float64)
    n = len(X)
    if got.shape != (n,):
        hint = ("one number for the whole batch: vmap the gradient of ONE example's loss over "
                "the examples (in_axes=(None, 0, 0))" if got.size == 1 else
                "one global norm per example, over all parameters together")
        return fail(EX4, f"expected shape ({n},), one norm per example; got {got.shape}",
                    hint=hint)
    answer = f"norms {np.round(want, 4).tolist()}"
    if np.allclose(got, want, rtol=1e-4, atol=1e-5):
        return ok(EX4, f"{n} per-example gradient norms equal {n} separate jax.grad calls")
    if np.allclose(got, want / n, rtol=1e-4, atol=1e-5):
        return fail(EX4, f"your norms are {n}x too small",
                    hint="take the gradient of one example's loss, not of the batch mean",
                    answer=answer)
    if np.allclose(got, want ** 2, rtol=1e-4, atol=1e-5):
        return fail(EX4, "those are squared norms", hint="take the square root", answer=answer)
    if np.all(got < want + 1e-6):
        return fail(EX4, "your norms are too small: some parameters are missing",
                    hint="sum the squares over EVERY leaf (w1, b1, w2, b2), e.g. with "
                         "jax.tree.leaves", answer=answer)
    return fail(EX4, "wrong values", hint="each norm is sqrt(sum over all leaves of the "
                                          "example's gradient squared)", answer=answer)


# --------------------------------------------------------------- Exercise 4: the port


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


@LAB.exercise(EX5, minutes=30, kind="write")
def check_port(convert_params: Callable[[dict[str, np.ndarray]], Any],
               forward: Callable[[Any, Any], dict[str, Any]],
               loss_fn: Callable[[Any, Any, Any], Any],
               train_step: Callable[[Any, Any, Any, Any], Any],
               optimizer: Any, *, live: bool | None = None) -> CheckResult:
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
    """
    name = EX5
    ref = reference(live=live)
    try:
        import jax.numpy as jnp

        params = convert_params(dict(ref.torch_state_dict))
        x = jnp.asarray(parity.nchw_to_nhwc(ref["input/x"]))
        y = jnp.asarray(ref["input/y"])
        got = parity.jax_trace(params, x, y)
        report = parity.compare(ref.expected, got,
                                names=[n for n in ref.expected if n.startswith("params/")])
        if report.passed:
            def step(p: Any, xb: Any, yb: Any) -> Any:
                return train_step(p, optimizer.init(p), xb, yb)[0]

            got = parity.jax_trace(params, x, y, forward=forward, loss_fn=loss_fn, step=step)
            report = parity.compare(ref.expected, got)
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - the learner's code raised: say where, and what to look at
        msg = str(err).strip().split("\n")[0][:300]
        return fail(name, f"your code raised {type(err).__name__}: {msg}. Shape errors in a "
                    "matmul or conv usually mean a weight kept PyTorch's layout.")
    if report.passed:
        # The message is the same against live torch and the stored reference, so a
        # notebook's saved output does not depend on whether torch is installed.
        return ok(name, f"{len(report.rows)} arrays match PyTorch: parameters, every "
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
    if f.diagnosis.startswith("missing"):
        hint = ("return every layer's output under the PyTorch layer names "
                "('conv', 'fc1', 'fc2') and params as {layer: {'kernel', 'bias'}}.")
    bad = sum(not r.passed for r in report.rows)
    return fail(name, f"{bad} of {len(report.rows)} arrays differ from PyTorch ({ref.source}); "
                f"first at layer '{f.layer}' ({f.name}): {diagnosis}. {hint}")
