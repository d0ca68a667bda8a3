"""Lab 3 checkers: JAX for PyTorch people.

* :func:`check_jit_fix`: a gradient-clipping update that used a Python ``if`` on a traced
  value now runs under ``jax.jit`` and gives the right numbers.
* :func:`check_bucketing`: padding ragged batches to a few bucket sizes bounds the number
  of compilations (counted by JAX itself: the jitted function's cache size).
* :func:`check_per_example_grads`: ``vmap`` of ``grad`` against the closed form.
* :func:`check_port`: the PyTorch training step ported to JAX/Optax, compared with
  PyTorch by :mod:`tpu_course.parity` over parameters, every layer's output, the loss,
  the gradients and one optimizer step; a failure names the first layer that diverges
  and the porting mistake it looks like.

JAX is imported inside the checkers, so importing this module starts no backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tpu_course import parity
from tpu_course.checks._core import CheckResult, fail, ok

# ----------------------------------------------------------------- Exercise 1: jit fix

LR = 0.1


def clipped_update_reference(w: np.ndarray, g: np.ndarray, max_norm: float) -> np.ndarray:
    """``w - LR * g * min(1, max_norm / ||g||)`` (gradient clipping by global norm)."""
    norm = float(np.sqrt(np.sum(np.asarray(g, np.float64) ** 2)))
    scale = 1.0 if norm <= max_norm else max_norm / norm
    return w - LR * g * scale


def check_jit_fix(clipped_update: Callable[[Any, Any, Any], Any]) -> CheckResult:
    """``jax.jit(clipped_update)(w, g, max_norm)`` must run and clip like the reference.

    ``max_norm`` is passed as a traced argument (not static), so a Python ``if`` on any
    value computed from the arguments fails; ``jnp.where``, ``jnp.minimum`` or
    ``lax.cond`` work.
    """
    import jax
    import jax.numpy as jnp

    name = "Exercise 1 (make it jit)"
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
                return fail(name, f"with ||g|| = {norm:.3g} and max_norm = {m}: expected "
                            f"{np.round(want, 4)}, got {np.round(got, 4)}. Clip only when the "
                            "norm exceeds max_norm: scale = min(1, max_norm / norm).")
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


# ---------------------------------------------------------- Exercise 2: recompilation

BUCKETS = (8, 16, 32)
#: Batch sizes a data loader hands out: full batches, then a smaller last one, over
#: a few epochs with different dataset sizes.
RAGGED_SIZES = (32, 32, 32, 7, 32, 20, 1, 16, 9, 32, 13)


def check_bucketing(bucketed: Callable[..., Any], buckets: tuple[int, ...] = BUCKETS
                    ) -> CheckResult:
    """``bucketed(fn, x, buckets)`` pads the batch to a bucket, runs ``fn``, un-pads.

    The checker jits a row-wise model ``fn(x) = tanh(x @ W)``, feeds batches of the
    sizes in :data:`RAGGED_SIZES`, and counts compilations with JAX's own count, the
    jitted function's cache size. At most ``len(buckets)`` compilations are allowed and
    every output must equal the unpadded result.
    """
    import jax
    import jax.numpy as jnp

    name = "Exercise 2 (no recompilation)"
    rng = np.random.default_rng(4)
    W = rng.standard_normal((6, 3)).astype(np.float32)
    Wj = jnp.asarray(W)
    fn = jax.jit(lambda x: jnp.tanh(x @ Wj))
    for n in RAGGED_SIZES:
        x = rng.standard_normal((n, 6)).astype(np.float32)
        # float32 matmuls (a TPU's default is one bfloat16 pass, a GPU's may be TF32)
        with jax.default_matmul_precision("float32"):
            got = np.asarray(bucketed(fn, jnp.asarray(x), buckets))
        want = np.tanh(x.astype(np.float64) @ W)
        if got.shape != want.shape:
            return fail(name, f"a batch of {n} rows gave an output of shape {got.shape}, "
                        f"expected {want.shape}: slice the padded rows off (out[:n]).")
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            return fail(name, f"a batch of {n} rows gave wrong values: pad with rows of "
                        "zeros after the real rows, and keep the real rows first.")
    compiles = fn._cache_size()  # JAX's own count of compiled shapes for this function
    sizes = sorted(set(RAGGED_SIZES))
    if compiles > len(buckets):
        return fail(name, f"fn compiled {compiles} times for batch sizes {sizes} (one per "
                    f"distinct shape); expected at most {len(buckets)}: pad each batch up "
                    f"to the smallest bucket in {buckets} that holds it.")
    return ok(name, f"{len(RAGGED_SIZES)} batches of sizes {sizes}: {compiles} compilations "
              f"(counted by JAX), outputs equal to the unpadded ones")


# ------------------------------------------------------ Exercise 3: per-example grads


def per_example_grads_reference(w: np.ndarray, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Closed form for ``loss(w, x, y) = 0.5 * (x . w - y)**2``: ``(x . w - y) * x``."""
    r = X.astype(np.float64) @ w - Y
    return r[:, None] * X


def check_per_example_grads(per_example_grads: Callable[[Any, Any, Any], Any]
                            ) -> CheckResult:
    """``per_example_grads(w, X, Y)`` returns one gradient row per example (n, d)."""
    import jax
    import jax.numpy as jnp

    name = "Exercise 3 (per-example gradients)"
    rng = np.random.default_rng(5)
    n, d = 7, 4
    w = rng.standard_normal(d).astype(np.float32)
    X = rng.standard_normal((n, d)).astype(np.float32)
    Y = rng.standard_normal(n).astype(np.float32)
    with jax.default_matmul_precision("float32"):  # not bf16 (TPU) or TF32 (GPU) passes
        got = np.asarray(per_example_grads(jnp.asarray(w), jnp.asarray(X), jnp.asarray(Y)))
    want = per_example_grads_reference(w, X, Y)
    if got.shape != want.shape:
        hint = ""
        if got.shape == (d,):
            hint = (" That is one gradient for the whole batch: vmap the gradient of a "
                    "single example's loss, with in_axes=(None, 0, 0).")
        return fail(name, f"expected shape {want.shape} (examples, parameters), got "
                    f"{got.shape}.{hint}")
    if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        if np.allclose(got.sum(0), want.sum(0), rtol=1e-4, atol=1e-5):
            return fail(name, "the rows sum to the batch gradient but are not per example")
        return fail(name, "wrong values: each row should be the gradient of "
                    "0.5 * (x . w - y)**2 for that row's x and y alone, i.e. (x . w - y) x.")
    return ok(name, f"{n} per-example gradients equal the closed form (x . w - y) x")


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
            f"lr = {parity.LAB_CONFIG['lr']}; return the new params from train_step.",
}


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
    name = "Exercise 4 (port the training step)"
    ref = parity.reference(live=live)
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
    except Exception as err:  # the learner's code raised: say where, and what to look at
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
