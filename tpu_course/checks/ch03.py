"""Lab 3 (JAX for PyTorch people), declared for :mod:`tpu_course.checks.engine` (keys in
``grading/ch03.py``), and the lab's PyTorch model and run. JAX is imported by the probes."""

from __future__ import annotations

import collections
import functools
import json
from typing import Any, Mapping

import numpy as np

from tpu_course import parity
from tpu_course.checks.engine import Case, Exercise, Lab, Mistake, Wrong, array, close, number

LAB = Lab(3, "JAX for PyTorch people")
LR, HALVING = 0.1, 100  #: Exercise 1's learning rate; Exercise 3's rate halves every HALVING steps
#: Exercise 5's model: conv 3->4 (3x3, padding 1) on 6x6 images, ReLU, flatten (C, H, W), Linear
#: 144->16, ReLU, Linear 16->10; cross-entropy (mean); SGD lr 0.1.
LAB_CONFIG = {"name": "parity_cnn", "seed": 0, "batch": 8, "channels": 3, "size": 6,
              "conv_channels": 4, "hidden": 16, "classes": 10, "lr": 0.1,
              "optimizer": "SGD", "loss": "cross_entropy (mean)"}


def make_reference(seed: int = 0) -> dict[str, np.ndarray]:
    """Every array of one PyTorch run of the model (needs torch), as scripts/ stores it."""
    torch, c = parity.require_torch(), LAB_CONFIG
    nn = torch.nn
    torch.manual_seed(seed)
    model = nn.Sequential(collections.OrderedDict(
        conv=nn.Conv2d(c["channels"], c["conv_channels"], 3, padding=1), act1=nn.ReLU(),
        flatten=nn.Flatten(), fc1=nn.Linear(c["conv_channels"] * c["size"] ** 2, c["hidden"]),
        act2=nn.ReLU(), fc2=nn.Linear(c["hidden"], c["classes"])))
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(c["batch"], c["channels"], c["size"], c["size"], generator=gen)
    y = torch.randint(0, c["classes"], (c["batch"],), generator=gen)
    arrays = parity.torch_trace(model, x, y, loss_fn=nn.functional.cross_entropy,
                                optimizer=lambda ps: torch.optim.SGD(ps, lr=c["lr"]))
    meta = json.dumps(dict(c, seed=seed, torch_version=str(torch.__version__)), sort_keys=True)
    return arrays | {"meta": np.array(meta)}

def reference(live: bool | None = None, seed: int = 0) -> parity.Reference:
    """The PyTorch run: live when torch is installed (``live=True`` insists), else stored."""
    if live or (live is None and parity.torch_available()):
        source = f"live: torch {parity.require_torch().__version__}"
        return parity.Reference.from_arrays(make_reference(seed), source)
    return parity.load_reference(LAB_CONFIG["name"])

def _not_finite(got: Any, want: Any, case: Case) -> bool:
    return not np.all(np.isfinite(got))

# -- Exercise 1: make it jit -------------------------------------------------------------------
CLIP_RATIOS = (0.3, 3.0, 20.0, 0.0)  #: each case's gradient norms, as multiples of max_norm

def _probe_clip(answer: Mapping[str, Any], case: Case) -> np.ndarray:
    import jax
    import jax.numpy as jnp
    shape, m = tuple(case.args["shape"]), case.args["max_norm"]
    rng = np.random.default_rng(case.args["seed"])
    w, d = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape)
    fn, outs = jax.jit(answer["clipped_update"]), []
    for ratio in CLIP_RATIOS:  # max_norm traced
        g = (d / np.sqrt(np.sum(d * d)) * ratio * m).astype(np.float32)
        try:
            outs.append(fn(jnp.asarray(w), jnp.asarray(g), jnp.float32(m)))
        except jax.errors.JAXTypeError as err:  # bool(tracer), int(tracer), ...
            raise Wrong(f"under jax.jit your update raised {type(err).__name__}: a traced "
                        "value was used as a Python value", "under jit a value computed from "
                        "the arguments is a tracer with no value yet: no Python `if`, float() "
                        "or int() on it; use jnp.where, jnp.minimum or lax.cond") from None
    return np.stack(outs)

def clip_case(shape: tuple[int, ...], max_norm: float, seed: int) -> Case:
    return Case(f"a gradient of shape {shape}, max_norm = {max_norm:g} (norms 0.3x, 3x, 20x "
                "the limit, and 0)", {"shape": shape, "max_norm": max_norm, "seed": seed})

check_jit_fix = LAB.add(Exercise(
    "Exercise 1 (make it jit)", minutes=10, provides=("clipped_update",),
    cases=(clip_case((5,), 1.0, 3), clip_case((3, 4), 2.0, 4)),
    probe=_probe_clip, compare=close(1e-5, 1e-6, "your updates (one per gradient)"),
    rules=(Mistake("a zero gradient has norm 0: max_norm / 0 is inf and 0 * inf is NaN; "
                   "min(1, inf) is 1, or select with jnp.where", when=_not_finite),),
    hint="clip only when the norm exceeds max_norm: w - LR * g * min(1, max_norm / ||g||), "
         "||g|| over every element of g"))

# -- Exercise 2: predict the compilations --------------------------------------------------
#: Exercise 2's calls of ``f = jax.jit(lambda x, scale: x * scale)``, as the lab shows them.
COMPILE_QUIZ = ("f(jnp.ones(8), 2.0)", "f(jnp.ones(8), 3.0)", "f(jnp.ones(16), 2.0)",
                "f(jnp.ones(8, jnp.int32), 2.0)", "f(jnp.ones(8), 2)",
                "f(jnp.ones((2, 4)), 2.0)", "f(jnp.ones(8), 5.0)")

def run_compile_quiz(show: bool = False) -> list[int]:
    """Per call of COMPILE_QUIZ on a fresh ``jax.jit``, the compiled versions it added."""
    import jax
    import jax.numpy as jnp
    f, added, say = jax.jit(lambda x, scale: x * scale), [], print if show else lambda _: None
    for call in COMPILE_QUIZ:
        before = f._cache_size()
        eval(call, {"f": f, "jnp": jnp})  # noqa: S307 - our own fixed strings
        added.append(f._cache_size() - before)
        say(f"{call:34s} {'compiles' if added[-1] else 'cached'}")
    say(f"{sum(added)} compilations for {len(added)} calls")
    return added

def _probe_count(answer: Mapping[str, Any], case: Case) -> int:
    got, n = number(answer["predicted_compiles"], "predicted_compiles"), len(COMPILE_QUIZ)
    if got != int(got) or not 1 <= got <= n:
        raise Wrong(f"{got:g} cannot be a count of compilations over {n} calls",
                    f"a whole number from 1 (the first call always compiles) to {n}")
    return int(got)

_quiz_total = functools.cache(lambda: sum(run_compile_quiz()))  # JAX's count, once

check_compile_prediction = LAB.add(Exercise(
    "Exercise 2 (predict the compilations)", minutes=10, kind="predict",
    provides=("predicted_compiles",), probe=_probe_count,
    expect=lambda case: _quiz_total(),
    compare=lambda got, want, case: None if got == want else (
        f"your count is {'too high' if got > want else 'too low'}"),
    hint="the cache key is every argument's shape, dtype and weak type, not its value: "
         "which calls repeat an earlier call's shapes and dtypes exactly?"))

# -- Exercise 3: find the recompilation ------------------------------------------------------
#: The visible case's steps and base learning rates (a sweep over rates must not recompile).
STEPS = (0, 1, 2, 50, 99, 100, 150, 250, 400, 1000)
LRS = (0.1, 0.1, 0.05, 0.1, 0.3, 0.3, 0.1, 0.02, 0.1, 0.05)

def _probe_decay(answer: Mapping[str, Any], case: Case) -> tuple:
    """(the updates until a second compiled version, the versions, which of lr and step compile
    again for a new value)."""
    import jax
    import jax.numpy as jnp
    fn, lrs, steps = answer["update_fixed"], case.args["lrs"], case.args["steps"]
    rng = np.random.default_rng(case.args["seed"])
    w, g = (jnp.asarray(rng.standard_normal(case.args["size"]).astype(np.float32))
            for _ in range(2))
    if not (hasattr(fn, "clear_cache") and hasattr(fn, "_cache_size")):
        fn(w, g, lrs[0], steps[0])  # the lab's stub raises: "not written yet"
        raise Wrong("update_fixed is not a jitted function",
                    "update_fixed = jax.jit(...) (or decorate it with @jax.jit)")
    fn.clear_cache()
    outs, static = [], []
    try:
        for lr, step in zip(lrs, steps):
            outs.append(fn(w, g, lr, step))
            if fn._cache_size() > 1:
                break
        versions = fn._cache_size()
        for name, lr, step in (("lr", 0.0123, steps[0]), ("step", lrs[0], 7919)):
            before = fn._cache_size()
            fn(w, g, lr, step)
            static += [name] if fn._cache_size() > before else []
    except jax.errors.JAXTypeError as err:
        raise Wrong(f"with traced lr and step your update raised {type(err).__name__}",
                    f"a traced step has no Python value: no int(step), float(lr) or `if` on "
                    f"them; step // {HALVING} and 0.5 ** (...) work on tracers") from None
    return np.stack(outs), versions, tuple(static)

def _compare_decay(got: Any, want: Any, case: Case) -> str | None:
    outs, versions, static = got
    if got[1:] != want[1:]:
        i = len(outs) - 1
        return (f"update_fixed compiled a second version at call {i + 1} (step "
                f"{case.args['steps'][i]}, lr {case.args['lrs'][i]:g})" if versions > 1 else
                "update_fixed compiled again for a new value") + (
            f": {' and '.join(static)} {'are' if static[1:] else 'is'} still static" * bool(static))
    return close(1e-5, 1e-6, "your updates (one per call)")(outs, want[0], case)

check_recompile_fix = LAB.add(Exercise(
    "Exercise 3 (find the recompilation)", minutes=15, kind="apply", provides=("update_fixed",),
    cases=(Case(f"{len(STEPS)} calls, steps 0 to 1000, {len(set(LRS))} learning rates",
                {"lrs": LRS, "steps": STEPS, "size": 4, "seed": 6}),),
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
    """Exercise 4's float32 parameters and batch: X (n, d_in), Y (n, d_out)."""
    rng = np.random.default_rng(seed)
    a = {k: rng.standard_normal(s).astype(np.float32) for k, s in (
        ("w1", (d_in, d_hidden)), ("b1", d_hidden), ("w2", (d_hidden, d_out)), ("b2", d_out),
        ("X", (n, d_in)), ("Y", (n, d_out)))}
    return {k: a[k] for k in ("w1", "b1", "w2", "b2")}, a["X"], a["Y"]

#: Exercise 4's hints for outputs of the wrong kind: a dict, one number, one per leaf.
NORMS_HINTS = {
    "dict": "reduce each example's gradient to one number: sqrt of the sum of all its squares",
    "one": "one number for the whole batch: vmap the gradient of ONE example's loss over the "
           "examples (in_axes=(None, 0, 0)) and keep the example axis",
    "flat": "one norm per example, in an array of shape (n,): reshape it",
    "leaves": "one norm per parameter array: combine them (sqrt of the sum of their squares)"}

def _probe_norms(answer: Mapping[str, Any], case: Case) -> Any:
    import jax
    import jax.numpy as jnp
    params, X, Y = jax.tree.map(jnp.asarray, mlp_batch(**case.args))
    with jax.default_matmul_precision("float32"):
        return answer["per_example_grad_norms"](params, X, Y)

def _compare_norms(got: Any, want: Any, case: Case) -> str | None:
    n = case.args.get("n", 6)
    if isinstance(got, dict):
        raise Wrong("you returned a dict (the gradients?), not one norm per example",
                    NORMS_HINTS["dict"])
    got = array(got, "your norms")
    if got.shape != (n,):
        raise Wrong(f"expected shape ({n},), one norm per example; got {got.shape}",
                    NORMS_HINTS[{1: "one", 4 * n: "leaves", n: "flat"}.get(got.size, "dict")])
    return close(1e-4, 1e-5, "your norms")(got, want, case)

check_per_example_norms = LAB.add(Exercise(
    "Exercise 4 (per-example gradient norms)", minutes=15, kind="apply",
    provides=("per_example_grad_norms",),
    cases=(Case("the notebook's batch of 6 examples (3 inputs, 5 hidden units, 2 outputs)",
                {"seed": 5, "n": 6}),),
    probe=_probe_norms, compare=_compare_norms,
    rules=(Mistake("look for a division or a log that gives NaN or inf", when=_not_finite),),
    hint="each norm is sqrt(sum over all leaves of that example's gradient squared), the "
         "gradient of ONE example's loss"))

# -- Exercise 5: port the training step ---------------------------------------------------------
def port_inputs(seed: int | None = None, batch: int = 8) -> tuple[dict, np.ndarray, np.ndarray]:
    """(PyTorch-layout weights, NCHW images, labels): the stored run's, or drawn from seed."""
    ref = reference(live=False)
    sd, x = dict(ref.torch_state_dict), ref["input/x"]
    if seed is None:
        return sd, x, ref["input/y"]
    rng = np.random.default_rng(seed)
    bound = {k: sd[k.split(".")[0] + ".weight"][0].size ** -0.5 for k in sd}  # 1/sqrt(fan_in)
    sd = {k: rng.uniform(-b, b, sd[k].shape).astype(np.float32) for k, b in bound.items()}
    x = rng.standard_normal((batch, *x.shape[1:])).astype(np.float32)
    return sd, x, rng.integers(0, LAB_CONFIG["classes"], batch).astype(np.int32)

def _role(item: Any, params: Any, state: Any) -> str:
    import jax
    if isinstance(item, float) or (getattr(item, "shape", None) == ()
                                   and np.dtype(item.dtype).kind in "fc"):
        return "loss"
    tree = jax.tree.structure(item)
    return ("params" if tree == jax.tree.structure(params) else
            "opt_state" if tree == jax.tree.structure(state) else f"a {type(item).__name__}")

def _probe_port(answer: Mapping[str, Any], case: Case) -> dict:
    """The port's arrays under the parity harness's names; where it failed, those before it
    and "error": (message, hint)."""
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
            stage, state = "train_step", answer["optimizer"].init(params)
            got = answer["train_step"](params, state, x, y)
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - a learner's code may raise anything
        msg = str(err).strip().split("\n")[0][:200]
        shape = any(w in msg.lower() for w in ("shape", "dot_general", "conv", "dimension",
                                                "incompatible", "broadcast"))
        return out | {"error": (f"{stage} raised {type(err).__name__}: {msg}", (
            "a shape error in a matmul or conv usually means a weight kept PyTorch's layout "
            "(or the flatten order is wrong)" if shape else
            f"run {stage} yourself on these arrays and read what it gets and returns"))}
    roles = [_role(v, params, state) for v in got] if isinstance(got, (tuple, list)) else []
    if roles == ["params", "opt_state", "loss"]:
        return out | {f"step/{k}": v for k, v in parity.flatten(got[0]).items()}
    what = f"({', '.join(roles)})" if roles else type(got).__name__
    return out | {"error": (f"train_step returned {what}, not (params, opt_state, loss)", "return "
                            "new_params, opt_state, loss, in that order: a loop unpacks them so")}

def _step_kind(want: Mapping[str, Any], got: Mapping[str, Any]) -> tuple[str, str]:
    """(hint, what the step did) of an optimizer step that differs while the gradients match."""
    names = [n[len("step/"):] for n in want if n.startswith("step/")]
    if any(np.shape(got[f"step/{n}"]) != np.shape(want[f"step/{n}"]) for n in names):
        return "step", ""
    new, old, sgd = (np.concatenate([np.asarray(d[f"{p}/{n}"], np.float64).ravel() for n in names])
                     for d, p in ((got, "step"), (want, "params"), (want, "step")))
    m, s = new - old, sgd - old  # the port's move and SGD's
    big, k = float(np.abs(s).max()), float(m @ s) / float(s @ s)
    near, moves = lambda a, b: np.allclose(a, b, 1e-3, 1e-6 * big), np.abs(m[np.abs(s) > 1e-3 * big])
    return next(((hint, f" ({what})") for hint, found, what in (
        ("apply", np.abs(m).max() <= 1e-3 * big, "train_step returns the parameters unchanged"),
        ("apply", near(new, s), "train_step returns the updates (-lr * grad), not new parameters"),
        ("sign", near(m, -s), "the parameters moved along the gradient instead of against it"),
        ("sgd", near(m, k * s), f"the parameters moved {k:.3g} times as far as SGD with lr = "
                                f"{LR} moves them: a learning rate of {k * LR:.3g}?"),
        ("sgd", moves.size and np.quantile(moves, 0.9) <= 1.2 * np.quantile(moves, 0.1),
         "every parameter moved by about the same amount, whatever its gradient: an Adam "
         "(or sign-based) step")) if found), ("step", ""))

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
    h = np.maximum(want["forward/conv"], 0.0)  # NHWC: what fc1 gives flattened (H, W, C)
    hwc = h.reshape(len(h), -1) @ want["params/fc1.kernel"] + want["params/fc1.bias"]
    fc1 = np.asarray(arrays.get("forward/fc1"), np.float64)
    kind, extra = ("missing", "") if f.diagnosis.startswith("missing") else (
        "flatten", "") if f.name == "forward/fc1" and fc1.shape == hwc.shape and np.allclose(
        fc1, hwc, 1e-4, 1e-4) else _step_kind(want, arrays) if f.kind == "step" else (f.kind, "")
    bad = sum(not r.passed for r in report.rows)
    return kind, (f"{bad} of {len(report.rows)} arrays differ from the reference; first at "
                  f"layer '{f.layer}' ({f.name}): {f.diagnosis}{extra}")

#: The kinds of porting mistake the parity diagnosis tells apart, with the hint of each.
PORT_HINTS = {
    "missing": "return every layer's output under the PyTorch layer names ('conv', 'fc1', "
               "'fc2') and params as {layer: {'kernel', 'bias'}}",
    "flatten": "fc1 is right for activations flattened channels-last (H, W, C); PyTorch "
               "flattens NCHW as (C, H, W): transpose them to (0, 3, 1, 2) before the reshape",
    "params": "check convert_params: Linear weight -> kernel = weight.T; Conv2d weight OIHW "
              "-> kernel HWIO = weight.transpose(2, 3, 1, 0); copy every bias",
    "forward": "check forward at this layer (the layers before it match)",
    "loss": "the logits match, so the loss differs: PyTorch's cross_entropy takes the mean "
            "over the batch of -log softmax at the label",
    "grad": "the loss matches but its gradient does not: is the gradient taken with respect "
            "to params (argument 0), of the same loss?",
    "apply": "updates, opt_state = optimizer.update(grads, opt_state, params); then return "
             "optax.apply_updates(params, updates), opt_state, loss",
    "sign": "optax's updates already carry the minus sign: add them with "
            "optax.apply_updates(params, updates), do not subtract them",
    "sgd": f"optimizer = optax.sgd({LR}), the step PyTorch's torch.optim.SGD(lr={LR}) takes",
    "step": f"gradients match but the update does not: SGD is p - lr * g with lr = {LR}; "
            "return the new params from train_step"}

check_port = LAB.add(Exercise(
    "Exercise 5 (port the training step)", minutes=30,
    provides=("convert_params", "forward", "loss_fn", "train_step", "optimizer"),
    cases=(Case("the PyTorch run's weights and batch of 8 images", {"seed": None, "batch": 8}),),
    probe=_probe_port, compare=lambda got, want, case: _port_diagnosis(got, want)[1] or None,
    rules=tuple(Mistake(hint, when=lambda got, want, case, k=k: _port_diagnosis(got, want)[0] == k)
                for k, hint in PORT_HINTS.items()),
    hint="compare your port with the parity report, array by array"))
