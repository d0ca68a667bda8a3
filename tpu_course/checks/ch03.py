"""Lab 3 (JAX for PyTorch people): each exercise declared once (see
:mod:`tpu_course.checks.engine`; references, hidden cases and mistakes live in the
repository's ``grading/ch03.py``). Also the lab's fixture: the PyTorch model of Exercise 5
(:data:`LAB_CONFIG`, :func:`torch_lab_model`), one run of it (:func:`make_reference`, stored
by ``scripts/make_parity_reference.py``) and :func:`reference`, live or stored, which
chapter 3 shows. JAX is imported inside the probes: importing this starts no backend.
"""

from __future__ import annotations

import collections
import functools
import json
from typing import Any, Mapping

import numpy as np

from tpu_course import parity
from tpu_course.checks.engine import Case, Exercise, Lab, Mistake, Wrong, array, close, number

LAB = Lab(3, "JAX for PyTorch people")

#: Exercise 1's learning rate: ``clipped_update`` returns ``w - LR * g * scale``.
LR = 0.1
#: Exercise 3's learning-rate decay: the rate halves every ``HALVING`` steps.
HALVING = 100

# -- the lab's model and its PyTorch run -----------------------------------------------------

#: The lab's model: conv 3->4 (3x3, padding 1) on 6x6 images, ReLU, flatten (PyTorch's
#: C, H, W order), Linear 144->16, ReLU, Linear 16->10; cross-entropy (mean); SGD lr 0.1.
LAB_CONFIG = {"name": "parity_cnn", "seed": 0, "batch": 8, "channels": 3, "size": 6,
              "conv_channels": 4, "hidden": 16, "classes": 10, "lr": 0.1,
              "optimizer": "SGD", "loss": "cross_entropy (mean)"}


def torch_lab_model(seed: int = 0) -> Any:
    """The lab's small CNN in PyTorch, initialised from ``torch.manual_seed(seed)``."""
    torch = parity.require_torch()
    nn, c = torch.nn, LAB_CONFIG
    torch.manual_seed(seed)
    return nn.Sequential(collections.OrderedDict([
        ("conv", nn.Conv2d(c["channels"], c["conv_channels"], 3, padding=1)),
        ("act1", nn.ReLU()), ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(c["conv_channels"] * c["size"] ** 2, c["hidden"])),
        ("act2", nn.ReLU()), ("fc2", nn.Linear(c["hidden"], c["classes"]))]))


def make_reference(seed: int = 0) -> dict[str, np.ndarray]:
    """Run the lab's PyTorch model once and return every array (needs torch): what
    ``scripts/make_parity_reference.py`` stores in ``tpu_course/reference/parity_cnn.npz``."""
    torch = parity.require_torch()
    c = LAB_CONFIG
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(c["batch"], c["channels"], c["size"], c["size"], generator=gen)
    y = torch.randint(0, c["classes"], (c["batch"],), generator=gen)
    arrays = parity.torch_trace(torch_lab_model(seed), x, y,
                                loss_fn=torch.nn.functional.cross_entropy,
                                optimizer=lambda ps: torch.optim.SGD(ps, lr=c["lr"]))
    meta = dict(c, seed=seed, torch_version=str(torch.__version__))
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    return arrays


def reference(live: bool | None = None, seed: int = 0) -> parity.Reference:
    """The lab's PyTorch run: live when torch is installed (``live=True`` insists on it),
    else the stored one (``live=False`` always reads the stored file)."""
    if live is None:
        live = parity.torch_available()
    if live:
        torch = parity.require_torch()
        return parity.Reference.from_arrays(make_reference(seed),
                                            f"live: torch {torch.__version__}")
    return parity.load_reference(LAB_CONFIG["name"])


def _tracer_errors() -> tuple[type[BaseException], ...]:
    import jax

    e = jax.errors
    return (e.TracerBoolConversionError, e.ConcretizationTypeError,
            e.TracerIntegerConversionError, e.TracerArrayConversionError)


def _stack(outputs: list, shape: tuple, what: str) -> np.ndarray:
    bad = [np.shape(o) for o in outputs if np.shape(o) != tuple(shape)]
    if bad:
        raise Wrong(f"{what} has shape {bad[0]}, but w has shape {tuple(shape)}",
                    "the update has w's shape: the norm is one number for the whole of g")
    return np.stack([np.asarray(o) for o in outputs])


# -- Exercise 1: make it jit -------------------------------------------------------------------

#: The gradients of each case, by their norm as a multiple of max_norm (0: a zero gradient).
CLIP_RATIOS = (0.3, 3.0, 20.0, 0.0)
TRACED_HINT = ("under jit a value computed from the arguments is a tracer with no value yet: "
               "no Python `if`, float() or int() on it; select with jnp.where(norm > "
               "max_norm, ...), or use jnp.minimum / lax.cond")


def _probe_clip(answer: Mapping[str, Any], case: Case) -> np.ndarray:
    """The learner's update, jitted with max_norm traced, on gradients below, above and far
    above the limit and a zero one."""
    import jax
    import jax.numpy as jnp

    shape, m = tuple(case.args["shape"]), case.args["max_norm"]
    rng = np.random.default_rng(case.args["seed"])
    w, d = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape)
    fn, outs = jax.jit(answer["clipped_update"]), []
    for ratio in CLIP_RATIOS:
        g = (d / np.sqrt(np.sum(d * d)) * ratio * m).astype(np.float32)
        try:
            outs.append(fn(jnp.asarray(w), jnp.asarray(g), jnp.float32(m)))
        except _tracer_errors() as err:
            raise Wrong(f"under jax.jit your update raised {type(err).__name__}: a traced "
                        "value was used as a Python value", TRACED_HINT) from None
    return _stack(outs, shape, "your update")


def clip_case(shape: tuple[int, ...], max_norm: float, seed: int) -> Case:
    what = f"a {'x'.join(map(str, shape))} gradient" if len(shape) > 1 else (
        f"a vector gradient of {shape[0]} element{'s' * (shape[0] > 1)}")
    return Case(f"{what}, max_norm = {max_norm:g} (norms 0.3x, 3x, 20x the limit, and 0)",
                {"shape": shape, "max_norm": max_norm, "seed": seed})


check_jit_fix = LAB.add(Exercise(
    "Exercise 1 (make it jit)", minutes=10, provides=("clipped_update",),
    cases=(clip_case((5,), 1.0, 3), clip_case((3, 4), 2.0, 4)),
    probe=_probe_clip, compare=close(1e-5, 1e-6, "your updates (one per gradient)"),
    rules=(Mistake("a zero gradient has norm 0: max_norm / 0 is inf and 0 * inf is NaN; "
                   "min(1, inf) is 1, or select with jnp.where",
                   when=lambda got, want, case: not np.all(np.isfinite(got))),),
    hint="clip only when the norm exceeds max_norm: w - LR * g * min(1, max_norm / ||g||), "
         "||g|| over every element of g"))


# -- Exercise 2: predict the compilations --------------------------------------------------

#: The calls of Exercise 2, as the lab shows them: ``f = jax.jit(lambda x, scale: x * scale)``.
COMPILE_QUIZ = ("f(jnp.ones(8), 2.0)", "f(jnp.ones(8), 3.0)", "f(jnp.ones(16), 2.0)",
                "f(jnp.ones(8, jnp.int32), 2.0)", "f(jnp.ones(8), 2)",
                "f(jnp.ones((2, 4)), 2.0)", "f(jnp.ones(8), 5.0)")


def run_compile_quiz(show: bool = False) -> list[int]:
    """Run :data:`COMPILE_QUIZ` on a fresh ``jax.jit`` and return, per call, how many new
    compiled versions it added (JAX's own count: the jitted function's cache size). The
    lab shows it only once your prediction is recorded (``LAB.predicted``)."""
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


@functools.lru_cache(maxsize=1)
def _quiz_total() -> int:
    """JAX's count, measured once per process."""
    return sum(run_compile_quiz())


def _probe_count(answer: Mapping[str, Any], case: Case) -> int:
    got = number(answer["predicted_compiles"], "predicted_compiles")
    if got != int(got) or not 1 <= got <= len(COMPILE_QUIZ):
        raise Wrong(f"{got:g} cannot be a count of compilations over {len(COMPILE_QUIZ)} calls",
                    f"a whole number from 1 (the first call always compiles) to "
                    f"{len(COMPILE_QUIZ)}")
    return int(got)


check_compile_prediction = LAB.add(Exercise(
    "Exercise 2 (predict the compilations)", minutes=10, kind="predict",
    provides=("predicted_compiles",), probe=_probe_count,
    expect=lambda case: _quiz_total(),
    compare=lambda got, want, case: None if got == want else (
        f"your count is {'too high' if got > want else 'too low'}"),
    hint="the cache key is every argument's shape, dtype and weak type, not its value: "
         "which calls repeat an earlier call's shapes and dtypes exactly?"))


# -- Exercise 3: find the recompilation ------------------------------------------------------

#: The steps at which the visible case calls the learner's update ...
STEPS = (0, 1, 2, 50, 99, 100, 150, 250, 400, 1000)
#: ... and the base learning rate of each call (a sweep over rates must not recompile).
LRS = (0.1, 0.1, 0.05, 0.1, 0.3, 0.3, 0.1, 0.02, 0.1, 0.05)
NOT_JITTED_HINT = "update_fixed = jax.jit(...) (or decorate it with @jax.jit)"


def _probe_decay(answer: Mapping[str, Any], case: Case) -> tuple:
    """(the updates, the call at which a second compiled version appeared (-1: none;
    counted by JAX from an empty cache, stopping there), which of lr and step compile
    again for a value not used before)."""
    import jax.numpy as jnp

    fn, (lrs, steps) = answer["update_fixed"], (case.args["lrs"], case.args["steps"])
    rng = np.random.default_rng(case.args["seed"])
    w, g = (jnp.asarray(rng.standard_normal(case.args["size"]).astype(np.float32))
            for _ in range(2))
    if not (hasattr(fn, "clear_cache") and hasattr(fn, "_cache_size")):
        fn(w, g, lrs[0], steps[0])  # the lab's stub raises: "not written yet"
        raise Wrong("update_fixed is not a jitted function", NOT_JITTED_HINT)
    fn.clear_cache()
    outs, again = [], -1
    try:
        for i, (lr, step) in enumerate(zip(lrs, steps)):
            outs.append(fn(w, g, lr, step))
            if fn._cache_size() > 1:
                again = i
                break
        static = []
        for name, lr, step in (("lr", 0.0123, steps[0]), ("step", lrs[0], 7919)):
            before = fn._cache_size()
            fn(w, g, lr, step)
            static += [name] if fn._cache_size() > before else []
    except _tracer_errors() as err:
        raise Wrong(f"with traced lr and step your update raised {type(err).__name__}",
                    f"a traced step has no Python value: no int(step), float(lr) or `if` on "
                    f"them; step // {HALVING} and 0.5 ** (...) work on tracers") from None
    return _stack(outs, w.shape, "your update"), again, tuple(static)


def _compare_decay(got: Any, want: Any, case: Case) -> str | None:
    if not isinstance(got, tuple) or len(got) != 3:
        raise Wrong("the probe could not read your update", NOT_JITTED_HINT)
    (_, again, static), names = got, " and ".join(got[2])
    if got[1:] != want[1:]:
        at = "" if again < 0 else (f" at call {again + 1} (step {case.args['steps'][again]}, "
                                   f"lr {case.args['lrs'][again]:g})")
        return (f"update_fixed compiled a second version{at}"
                + (f": {names} {'are' if len(static) > 1 else 'is'} still static" if names else ""))
    return close(1e-5, 1e-6, "your updates (one per call)")(got[0], want[0], case)


def decay_case(label: str, lrs: tuple, steps: tuple, size: int, seed: int) -> Case:
    return Case(label, {"lrs": tuple(lrs), "steps": tuple(steps), "size": size, "seed": seed})


check_recompile_fix = LAB.add(Exercise(
    "Exercise 3 (find the recompilation)", minutes=15, kind="apply", provides=("update_fixed",),
    cases=(decay_case(f"{len(STEPS)} calls, steps 0 to 1000, {len(set(LRS))} learning rates",
                      LRS, STEPS, 4, 6),),
    probe=_probe_decay, compare=_compare_decay,
    hint="an argument in static_argnums/static_argnames is part of the cache key, so every "
         f"new value compiles again; keep the decay lr * 0.5 ** (step // {HALVING})"))


# -- Exercise 4: per-example gradient norms ------------------------------------------------------


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


#: The hints of outputs of the wrong kind (Exercise 4): a dict, one number, one per leaf.
NORMS_HINTS = {
    "dict": "reduce every example's gradient pytree to one number: the square root of the "
            "sum of squares over all its leaves",
    "one": "one number for the whole batch: vmap the gradient of ONE example's loss over "
           "the examples (in_axes=(None, 0, 0)) and keep the example axis",
    "flat": "one norm per example, in an array of shape (n,): reshape it",
    "leaves": "one norm per parameter array: combine them, sqrt of the sum of their "
              "squares, into one global norm per example",
}


def _probe_norms(answer: Mapping[str, Any], case: Case) -> Any:
    import jax
    import jax.numpy as jnp

    params, X, Y = mlp_batch(**case.args)
    with jax.default_matmul_precision("float32"):
        return answer["per_example_grad_norms"](jax.tree.map(jnp.asarray, params),
                                                jnp.asarray(X), jnp.asarray(Y))


def _compare_norms(got: Any, want: Any, case: Case) -> str | None:
    n = case.args.get("n", 6)
    if isinstance(got, dict):
        raise Wrong("you returned a dict (the gradients?), not one norm per example",
                    NORMS_HINTS["dict"])
    got = array(got, "your norms")
    if got.shape != (n,):
        kind = ("flat" if got.size == n else "one" if got.size == 1 else
                "leaves" if got.size == 4 * n else "dict")
        raise Wrong(f"expected shape ({n},), one norm per example; got {got.shape}",
                    NORMS_HINTS[kind])
    return close(1e-4, 1e-5, "your norms")(got, want, case)


check_per_example_norms = LAB.add(Exercise(
    "Exercise 4 (per-example gradient norms)", minutes=15, kind="apply",
    provides=("per_example_grad_norms",),
    cases=(Case("the notebook's batch of 6 examples (3 inputs, 5 hidden units, 2 outputs)",
                {"seed": 5, "n": 6}),),
    probe=_probe_norms, compare=_compare_norms,
    rules=(Mistake("look for a division or a log that gives NaN or inf",
                   when=lambda got, want, case: not np.all(np.isfinite(got))),),
    hint="each norm is sqrt(sum over all leaves of that example's gradient squared), the "
         "gradient of ONE example's loss"))


# -- Exercise 5: port the training step ---------------------------------------------------------


def port_inputs(seed: int | None = None, batch: int = 8) -> tuple[dict, np.ndarray, np.ndarray]:
    """(PyTorch-layout weights, images NCHW, labels): the stored PyTorch run's for
    ``seed=None``, else weights drawn as PyTorch's default init does and a batch of
    ``batch`` images, from ``seed``."""
    if seed is None:
        ref = reference(live=False)
        return dict(ref.torch_state_dict), ref["input/x"], ref["input/y"]
    c, rng = LAB_CONFIG, np.random.default_rng(seed)
    k, cin, hw, hidden = c["conv_channels"], c["channels"], c["size"], c["hidden"]

    def init(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return rng.uniform(-fan_in ** -0.5, fan_in ** -0.5, shape).astype(np.float32)

    sd = {"conv.weight": init((k, cin, 3, 3), cin * 9), "conv.bias": init((k,), cin * 9),
          "fc1.weight": init((hidden, k * hw * hw), k * hw * hw),
          "fc1.bias": init((hidden,), k * hw * hw),
          "fc2.weight": init((c["classes"], hidden), hidden), "fc2.bias": init((c["classes"],), hidden)}
    x = rng.standard_normal((batch, cin, hw, hw)).astype(np.float32)
    return sd, x, rng.integers(0, c["classes"], batch).astype(np.int32)


_SHAPE_WORDS = ("shape", "dot_general", "conv", "dimension", "incompatible", "broadcast")


def _role(item: Any, params: Any, state: Any) -> str:
    import jax

    if isinstance(item, float) or (getattr(item, "shape", None) == ()
                                   and np.dtype(item.dtype).kind in "fc"):
        return "loss"
    tree = jax.tree.structure(item)
    return ("params" if tree == jax.tree.structure(params) else
            "opt_state" if tree == jax.tree.structure(state) else f"a {type(item).__name__}")


def _probe_port(answer: Mapping[str, Any], case: Case) -> dict:
    """The port's arrays under the parity harness's names (params, forward, loss, grad,
    step); where it stopped (a function raised, or train_step returned the wrong things),
    those before and ``"error"``: (message, hint)."""
    import jax
    import jax.numpy as jnp

    sd, x, y = port_inputs(**case.args)
    x, y, out, stage = jnp.asarray(parity.nchw_to_nhwc(x)), jnp.asarray(y), {}, "convert_params"
    try:
        with jax.default_matmul_precision("highest"):
            params = answer["convert_params"]({k: v.copy() for k, v in sd.items()})
            out |= {f"params/{k}": v for k, v in parity.flatten(params).items()}
            stage = "forward"
            out |= {f"forward/{k}": v for k, v in dict(answer["forward"](params, x)).items()}
            stage = "loss_fn"
            loss, grads = jax.value_and_grad(answer["loss_fn"])(params, x, y)
            out |= {"loss": loss} | {f"grad/{k}": v for k, v in parity.flatten(grads).items()}
            stage = "train_step"
            state = answer["optimizer"].init(params)
            got = answer["train_step"](params, state, x, y)
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - a learner's code may raise anything
        msg = str(err).strip().split("\n")[0][:200]
        out["error"] = (f"{stage} raised {type(err).__name__}: {msg}",
                        "a shape error in a matmul or conv usually means a weight kept "
                        "PyTorch's layout (or the flatten order is wrong)"
                        if any(w in msg.lower() for w in _SHAPE_WORDS) else
                        f"run {stage} yourself on these arrays and read what it gets and returns")
        return out
    roles = [_role(v, params, state) for v in got] if isinstance(got, (tuple, list)) else []
    if roles == ["params", "opt_state", "loss"]:
        return out | {f"step/{k}": v for k, v in parity.flatten(got[0]).items()}
    order = sorted(roles) == ["loss", "opt_state", "params"]
    return out | {"error": (
        f"train_step returned {'(' + ', '.join(roles) + ')' if roles else type(got).__name__}"
        + (": the right values in the wrong order" if order else ", not (params, opt_state, "
           "loss)"), "return new_params, opt_state, loss, in that order: a training loop "
        "unpacks them by position")}


def _flatten_order(want: Mapping[str, Any], got: Mapping[str, Any]) -> bool:
    """True when the port's fc1 output is what a channels-last (H, W, C) flatten gives."""
    h = np.maximum(np.asarray(want["forward/conv"], np.float64), 0.0)  # NHWC
    hwc = h.reshape(h.shape[0], -1) @ want["params/fc1.kernel"] + want["params/fc1.bias"]
    fc1 = np.asarray(got["forward/fc1"], np.float64)
    return fc1.shape == hwc.shape and np.allclose(fc1, hwc, rtol=1e-4, atol=1e-4)


def _step_diagnosis(want: Mapping[str, Any], got: Mapping[str, Any]) -> tuple[str, str]:
    """(key, diagnosis) of an optimizer step that differs while the gradients match."""
    names = [n[len("step/"):] for n in want if n.startswith("step/")]
    moved = [np.asarray(got[f"step/{n}"], np.float64) - want[f"params/{n}"] for n in names]
    sgd = [want[f"step/{n}"].astype(np.float64) - want[f"params/{n}"] for n in names]
    if any(m.shape != s.shape for m, s in zip(moved, sgd)):
        return "step", "the step's parameters have other shapes than params"
    m, s = np.concatenate([a.ravel() for a in moved]), np.concatenate([a.ravel() for a in sgd])
    big, lr = float(np.abs(s).max()), LAB_CONFIG["lr"]
    if float(np.abs(m).max()) <= 1e-3 * big:
        return "unchanged", ("train_step returns the parameters it was given, unchanged: the "
                             "updates were never applied")
    new = np.concatenate([np.asarray(got[f"step/{n}"], np.float64).ravel() for n in names])
    if np.allclose(new, s, rtol=1e-3, atol=1e-6 * big):
        return "updates", "train_step returns the updates (-lr * grad), not the new parameters"
    k = float(m @ s) / float(s @ s)
    if np.allclose(m, k * s, rtol=1e-3, atol=1e-6 * big):
        if abs(k + 1) < 1e-3:
            return "sign", "the parameters moved along the gradient instead of against it"
        return "scale", (f"the parameters moved {k:.3g} times as far as SGD with lr = {lr} "
                         f"moves them (a learning rate of {k * lr:.3g}?)")
    steps = np.abs(m[np.abs(s) > 1e-3 * big])
    if steps.size and np.quantile(steps, 0.9) <= 1.2 * np.quantile(steps, 0.1):
        return "uniform", ("every parameter moved by about the same amount, whatever its "
                           "gradient: an Adam (or sign-based) first step, not plain SGD")
    return "step", "the parameters after one step differ"


def _port_diagnosis(got: Any, want: Mapping[str, Any]) -> tuple[str, str]:
    """("", "") when the port matches, else (the kind of mistake, what differs)."""
    if not isinstance(got, dict):
        raise Wrong(f"the port gave {type(got).__name__}, not its arrays",
                    "run the check cell as the lab wrote it")
    arrays = {k: v for k, v in got.items() if k != "error"}
    report = parity.compare(want, arrays)
    f = report.first_failure
    if "error" in got and (f is None or f.kind != "params" or f.diagnosis.startswith("missing")):
        raise Wrong(*got["error"])
    if f is None:
        return "", ""
    key, diagnosis = f.kind, f.diagnosis
    if diagnosis.startswith("missing"):
        key = "missing"
    elif f.name == "forward/fc1" and _flatten_order(want, arrays):
        key, diagnosis = "flatten", ("flatten order: you flattened channels-last (H, W, C) "
                                     "activations, PyTorch flattened NCHW as (C, H, W)")
    elif f.kind == "step":
        key, diagnosis = _step_diagnosis(want, arrays)
    bad = sum(not r.passed for r in report.rows)
    return key, (f"{bad} of {len(report.rows)} arrays differ from the reference; first at "
                 f"layer '{f.layer}' ({f.name}): {diagnosis}")


_APPLY = ("updates, opt_state = optimizer.update(grads, opt_state, params); then return "
          "optax.apply_updates(params, updates), opt_state, loss")
_SGD = (f"optimizer = optax.sgd({LAB_CONFIG['lr']}), the step PyTorch's "
        f"torch.optim.SGD(lr={LAB_CONFIG['lr']}) takes")
#: The kinds of porting mistake the diagnosis tells apart, with the hint that names each.
PORT_HINTS = {
    "missing": "return every layer's output under the PyTorch layer names ('conv', 'fc1', "
               "'fc2') and params as {layer: {'kernel', 'bias'}}",
    "flatten": "transpose the activations to (0, 3, 1, 2) before the reshape (or permute "
               "fc1's kernel rows), so that they flatten in PyTorch's (C, H, W) order",
    "unchanged": _APPLY, "updates": _APPLY,
    "sign": "optax's updates already carry the minus sign: add them with "
            "optax.apply_updates(params, updates), do not subtract them",
    "scale": _SGD, "uniform": _SGD,
    "params": "check convert_params: Linear weight -> kernel = weight.T; Conv2d weight OIHW "
              "-> kernel HWIO = weight.transpose(2, 3, 1, 0); copy every bias",
    "forward": "check forward at this layer (the layers before it match)",
    "loss": "the logits match, so the loss differs: PyTorch's cross_entropy takes the mean "
            "over the batch of -log softmax at the label",
    "grad": "the loss matches but its gradient does not: is the gradient taken with respect "
            "to params (argument 0), of the same loss?",
    "step": f"gradients match but the update does not: SGD is p - lr * g with lr = "
            f"{LAB_CONFIG['lr']}; return the new params from train_step",
}


def port_case(seed: int | None, batch: int, label: str) -> Case:
    return Case(label, {"seed": seed, "batch": batch})


check_port = LAB.add(Exercise(
    "Exercise 5 (port the training step)", minutes=30,
    provides=("convert_params", "forward", "loss_fn", "train_step", "optimizer"),
    cases=(port_case(None, 8, "the PyTorch run's weights and batch of 8 images"),),
    probe=_probe_port, compare=lambda got, want, case: _port_diagnosis(got, want)[1] or None,
    rules=tuple(Mistake(hint, when=lambda got, want, case, k=k: _port_diagnosis(got, want)[0] == k)
                for k, hint in PORT_HINTS.items()),
    hint="compare your port with the parity report, array by array"))
