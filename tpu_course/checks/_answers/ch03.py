"""Lab 3's own answers, for its checkers only (private: an answer that is, or calls, one of
these is refused, since the learner writes it).

Exercises 1, 3 and 4 have numpy references (float64, no JAX, so computing the expected
value compiles nothing); Exercise 5 has the course's JAX port of the lab's PyTorch model,
which makes the reference for the grader's unseen weights, images and batch sizes (the
tests check that it matches the stored PyTorch run).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Exercise 1's learning rate (``checks.ch03.LR`` is the same number).
LR = 0.1
#: Exercise 3's learning-rate decay: the rate halves every ``HALVING`` steps.
HALVING = 100


# ------------------------------------------------------------------------ Exercise 1


def clipped_update_reference(w: Any, g: Any, max_norm: float, lr: float = LR) -> np.ndarray:
    """``w - lr * g * min(1, max_norm / ||g||)``, ``||g||`` the norm over every element."""
    w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
    norm = float(np.sqrt(np.sum(g ** 2)))
    scale = 1.0 if norm <= max_norm else max_norm / norm
    return w - lr * g * scale


# ------------------------------------------------------------------------ Exercise 3


def decayed_update_reference(w: Any, g: Any, lr: float, step: int) -> np.ndarray:
    """``w - lr * 0.5 ** (step // HALVING) * g``."""
    return np.asarray(w, np.float64) - lr * 0.5 ** (step // HALVING) * np.asarray(g, np.float64)


# ------------------------------------------------------------------------ Exercise 4


def per_example_grads(params: Any, X: Any, Y: Any) -> dict[str, np.ndarray]:
    """Each example's gradient of ``checks.ch03.mlp_loss``
    (``0.5 * ||tanh(x @ w1 + b1) @ w2 + b2 - y||^2``), by hand in float64: per leaf, an
    array with a leading example axis."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    X, Y = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    h = np.tanh(X @ p["w1"] + p["b1"])            # (n, hidden)
    e = h @ p["w2"] + p["b2"] - Y                 # d loss / d output, (n, out)
    dz = (e @ p["w2"].T) * (1.0 - h ** 2)         # d loss / d pre-activation, (n, hidden)
    return {"w1": X[:, :, None] * dz[:, None, :], "b1": dz,
            "w2": h[:, :, None] * e[:, None, :], "b2": e}


def per_example_squares(params: Any, X: Any, Y: Any) -> dict[str, np.ndarray]:
    """Per leaf, each example's sum of squared gradient entries: shape (n,)."""
    return {k: np.sum(g.reshape(len(g), -1) ** 2, axis=1)
            for k, g in per_example_grads(params, X, Y).items()}


def per_example_norms_reference(params: Any, X: Any, Y: Any) -> np.ndarray:
    """The global L2 norm of each example's gradient, over all four parameter arrays."""
    return np.sqrt(sum(per_example_squares(params, X, Y).values()))


#: Exercise 4's answers, refused as answers.
EX4_FUNCTIONS = (per_example_norms_reference, per_example_squares, per_example_grads)


# ------------------------------------------------------------------------ Exercise 5


def convert_params(state_dict: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """PyTorch layout -> JAX layout: Linear (out, in) -> (in, out); Conv OIHW -> HWIO."""
    import jax.numpy as jnp

    sd = state_dict
    return {"conv": {"kernel": jnp.asarray(sd["conv.weight"].transpose(2, 3, 1, 0)),
                     "bias": jnp.asarray(sd["conv.bias"])},
            "fc1": {"kernel": jnp.asarray(sd["fc1.weight"].T), "bias": jnp.asarray(sd["fc1.bias"])},
            "fc2": {"kernel": jnp.asarray(sd["fc2.weight"].T), "bias": jnp.asarray(sd["fc2.bias"])}}


def forward(params: Any, x: Any) -> dict[str, Any]:
    """Each layer's output before its activation; ``x`` is NHWC."""
    import jax

    c = jax.lax.conv_general_dilated(x, params["conv"]["kernel"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    c = c + params["conv"]["bias"]
    h = jax.nn.relu(c).transpose(0, 3, 1, 2)
    f1 = h.reshape(h.shape[0], -1) @ params["fc1"]["kernel"] + params["fc1"]["bias"]
    f2 = jax.nn.relu(f1) @ params["fc2"]["kernel"] + params["fc2"]["bias"]
    return {"conv": c, "fc1": f1, "fc2": f2}


def loss_fn(params: Any, x: Any, y: Any) -> Any:
    """PyTorch's ``cross_entropy``: the batch mean of -log softmax at the label."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(forward(params, x)["fc2"])
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def sgd_step(params: Any, x: Any, y: Any, lr: float = LR) -> Any:
    """One SGD step, ``p - lr * grad``."""
    import jax

    grads = jax.grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, d: p - lr * d, params, grads)


def port_arrays(seed: int, batch: int, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """A run of the port on weights and a batch drawn from ``seed``, recorded under the
    names of a stored PyTorch reference (``torch/...`` weights, ``input/x`` NCHW,
    ``input/y``, then params, forward, loss, grad, step)."""
    from tpu_course import parity

    c = config
    rng = np.random.default_rng(seed)

    def uniform(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        bound = 1.0 / np.sqrt(fan_in)  # PyTorch's default init range
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    k, cin, hw = c["conv_channels"], c["channels"], c["size"]
    flat = k * hw * hw
    sd = {"conv.weight": uniform((k, cin, 3, 3), cin * 9), "conv.bias": uniform((k,), cin * 9),
          "fc1.weight": uniform((c["hidden"], flat), flat),
          "fc1.bias": uniform((c["hidden"],), flat),
          "fc2.weight": uniform((c["classes"], c["hidden"]), c["hidden"]),
          "fc2.bias": uniform((c["classes"],), c["hidden"])}
    x = rng.standard_normal((batch, cin, hw, hw)).astype(np.float32)
    y = rng.integers(0, c["classes"], batch).astype(np.int32)
    params = convert_params(sd)
    traced = parity.jax_trace(params, parity.nchw_to_nhwc(x), y, forward=forward,
                              loss_fn=loss_fn,
                              step=lambda p, xb, yb: sgd_step(p, xb, yb, c["lr"]))
    arrays = {f"torch/{name}": v for name, v in sd.items()}
    arrays.update({"input/x": x, "input/y": y})
    arrays.update({name: np.asarray(v) for name, v in traced.items()})
    return arrays


#: Exercise 5's answers, refused as answers.
EX5_FUNCTIONS = (convert_params, forward, loss_fn, sgd_step, port_arrays)
