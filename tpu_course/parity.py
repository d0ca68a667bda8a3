"""Prove that a JAX port computes what the PyTorch original computes, layer by layer.

Before a port is scaled up, it must agree with the original on the same weights and the
same inputs: the forward output of every layer, the loss, the gradient of every
parameter, and the parameters after one optimizer step. This module does that
comparison and says where the two first part ways, and what the difference looks like
(a transposed weight, a channels-first layout, a sum where a mean was meant, a missing
bias).

Everything is a flat mapping of *names* to numpy arrays, in JAX's conventions:

==================  ==========================================================
``params/L.p``      parameter ``p`` of layer ``L`` (``kernel``, ``bias``, ``scale``,
                    ``embedding``), in JAX layout: a Dense kernel is (in, out), a Conv
                    kernel HWIO
``forward/L``       the output of layer ``L`` (4-D activations NHWC)
``loss``            the scalar loss
``grad/L.p``        d loss / d parameter, same layout as the parameter
``step/L.p``        the parameter after one optimizer step
==================  ==========================================================

The comparison (:func:`compare`) and the diagnosis (:func:`diagnose`) need numpy only,
so a port can be graded against a *stored* reference (:func:`load_reference`) on a
machine without PyTorch. The PyTorch side (:func:`torch_trace`) imports torch lazily: ``pip install tpu-course[parity]``. :func:`jax_trace` records the
same names from a JAX port.

Tolerances are dtype-aware (:func:`tolerance_for`): elementwise
``|got - ref| <= atol + rtol * |ref|`` (numpy's ``allclose`` rule), with ``rtol`` a few
hundred units in the last place of the *less* precise of the two dtypes, because two
correct programs sum in different orders.

Weight conversion (PyTorch -> JAX), all numpy, no torch needed:

* ``nn.Linear``: ``weight`` (out, in) -> ``kernel`` (in, out) = ``weight.T``; ``bias``.
* ``nn.Conv2d``: ``weight`` OIHW -> ``kernel`` HWIO = ``weight.transpose(2, 3, 1, 0)``;
  activations NCHW -> NHWC = ``x.transpose(0, 2, 3, 1)``.
* ``nn.LayerNorm``: ``weight`` -> ``scale``, ``bias`` -> ``bias`` (same shapes). Note
  ``eps``: both default to 1e-5 in PyTorch and Flax NNX's ``LayerNorm`` (1e-6 in Linen).
* ``nn.Embedding``: ``weight`` (vocab, features) -> ``embedding``, unchanged.
"""

from __future__ import annotations

import dataclasses
import html
import json
import pathlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from tpu_course import errors, tables

REFERENCE_DIR = pathlib.Path(__file__).resolve().parent / "reference"
KINDS = ("params", "forward", "loss", "grad", "step")

# --------------------------------------------------------------------------- tolerances


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Elementwise tolerance: ``|got - ref| <= atol + rtol * |ref|``."""

    rtol: float
    atol: float

    def __str__(self) -> str:
        return f"rtol={self.rtol:.0e}, atol={self.atol:.0e}"


# Machine epsilons: fp32 2**-23, bf16 2**-7, fp16 2**-10, fp64 2**-52. A correct port
# differs from the original by rounding in a different summation order, which grows with
# the length of the sums; a few hundred ulps covers the small layers this course uses.
_TOLERANCES = {
    "float64": Tolerance(rtol=1e-10, atol=1e-12),
    "float32": Tolerance(rtol=1e-4, atol=1e-5),   # ~800 ulps of 2**-23
    "float16": Tolerance(rtol=1e-2, atol=1e-3),   # ~10 ulps of 2**-10
    "bfloat16": Tolerance(rtol=4e-2, atol=1e-2),  # ~5 ulps of 2**-7
}


def _dtype_name(a: Any) -> str:
    return str(getattr(a, "dtype", np.asarray(a).dtype))


def tolerance_for(*dtypes: Any) -> Tolerance:
    """The tolerance for comparing arrays of these dtypes: that of the least precise.

    Integer and boolean arrays must match exactly.

    >>> tolerance_for("float32")
    Tolerance(rtol=0.0001, atol=1e-05)
    >>> tolerance_for("float32", "bfloat16")
    Tolerance(rtol=0.04, atol=0.01)
    """
    names = [str(d) for d in dtypes]
    if not names:
        raise ValueError("tolerance_for() needs at least one dtype")
    order = ["float64", "float32", "float16", "bfloat16"]
    floats = [n for n in names if n in order]
    if not floats:
        return Tolerance(rtol=0.0, atol=0.0)  # integers, booleans: exact
    return _TOLERANCES[max(floats, key=order.index)]


# ------------------------------------------------------------------ weight conversion


def to_numpy(x: Any) -> np.ndarray:
    """A numpy copy of a numpy/JAX array or a torch tensor (detached, on the CPU).

    bfloat16 tensors become float32 (numpy has no bfloat16 of its own).
    """
    if hasattr(x, "detach"):  # a torch tensor
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.numpy().copy()
    return np.array(x)


def linear_to_jax(weight: Any, bias: Any | None = None) -> dict[str, np.ndarray]:
    """PyTorch ``nn.Linear`` (weight (out, in)) -> a Dense layer's ``kernel`` (in, out).

    PyTorch computes ``x @ weight.T + bias``; JAX/Flax compute ``x @ kernel + bias``.

    >>> p = linear_to_jax(np.arange(6.0).reshape(3, 2), np.zeros(3))
    >>> p["kernel"].shape, p["bias"].shape
    ((2, 3), (3,))
    """
    out = {"kernel": to_numpy(weight).T.copy()}
    if bias is not None:
        out["bias"] = to_numpy(bias)
    return out


def conv2d_to_jax(weight: Any, bias: Any | None = None) -> dict[str, np.ndarray]:
    """PyTorch ``nn.Conv2d`` weight OIHW -> JAX/Flax ``kernel`` HWIO.

    Use with activations converted NCHW -> NHWC (:func:`nchw_to_nhwc`).

    >>> conv2d_to_jax(np.zeros((8, 3, 5, 5)))["kernel"].shape
    (5, 5, 3, 8)
    """
    w = to_numpy(weight)
    if w.ndim != 4:
        raise ValueError(f"conv2d_to_jax expects a 4-D OIHW weight, got shape {w.shape}")
    out = {"kernel": w.transpose(2, 3, 1, 0).copy()}
    if bias is not None:
        out["bias"] = to_numpy(bias)
    return out


def layernorm_to_jax(weight: Any | None, bias: Any | None) -> dict[str, np.ndarray]:
    """PyTorch ``nn.LayerNorm`` -> ``scale`` and ``bias`` (same shapes, renamed)."""
    out = {}
    if weight is not None:
        out["scale"] = to_numpy(weight)
    if bias is not None:
        out["bias"] = to_numpy(bias)
    return out


def embedding_to_jax(weight: Any) -> dict[str, np.ndarray]:
    """PyTorch ``nn.Embedding`` weight (vocab, features) -> ``embedding``, unchanged."""
    return {"embedding": to_numpy(weight)}


def nchw_to_nhwc(x: Any) -> np.ndarray:
    """Activations from PyTorch's channels-first NCHW to JAX's channels-last NHWC.

    >>> nchw_to_nhwc(np.zeros((2, 3, 4, 5))).shape
    (2, 4, 5, 3)
    """
    a = to_numpy(x)
    if a.ndim != 4:
        raise ValueError(f"nchw_to_nhwc expects a 4-D array, got shape {a.shape}")
    return a.transpose(0, 2, 3, 1).copy()


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """A nested mapping of arrays as one flat dict with dotted names.

    >>> sorted(flatten({"fc": {"kernel": np.zeros(2), "bias": np.zeros(1)}}))
    ['fc.bias', 'fc.kernel']
    """
    out: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = to_numpy(value)
    return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`flatten`: dotted names back to nested dicts.

    >>> unflatten({"fc.kernel": 1, "fc.bias": 2})
    {'fc': {'kernel': 1, 'bias': 2}}
    """
    out: dict[str, Any] = {}
    for name, value in flat.items():
        node = out
        *path, leaf = name.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


# ---------------------------------------------------------------------- diagnosis

_PERMUTATIONS = {
    (0, 3, 1, 2): "channels-first NCHW where channels-last NHWC was expected "
                  "(PyTorch's layout: transpose with x.transpose(0, 2, 3, 1))",
    (0, 2, 3, 1): "channels-last NHWC where channels-first NCHW was expected",
    (3, 2, 0, 1): "a conv kernel in PyTorch's OIHW layout where JAX expects HWIO "
                  "(use weight.transpose(2, 3, 1, 0))",
    (0, 1, 3, 2): "a conv kernel with input and output channels swapped (HWOI, not HWIO)",
}


def _close(got: np.ndarray, ref: np.ndarray, tol: Tolerance) -> bool:
    return got.shape == ref.shape and bool(
        np.all(np.abs(got - ref) <= tol.atol + tol.rtol * np.abs(ref)))


def diagnose(reference: Any, got: Any, tol: Tolerance | None = None) -> str:
    """Name the common porting mistake that turns ``reference`` into ``got``, if any.

    Recognised: a transposed 2-D weight, a 4-D layout permutation (NCHW vs NHWC, OIHW vs
    HWIO), a uniform scale (a sum where a mean was meant gives the batch size; -1 a
    flipped sign), a constant per-feature offset (a missing or extra bias), all zeros,
    NaN or inf. Returns an empty string when the two arrays agree within ``tol``.

    >>> w = np.arange(6.0).reshape(2, 3)
    >>> diagnose(w, w.T)[:10]
    'transposed'
    >>> diagnose(np.array(0.5), np.array(4.0))[:14]
    'scaled by 8: a'
    """
    ref = np.asarray(to_numpy(reference), dtype=np.float64)
    g = np.asarray(to_numpy(got), dtype=np.float64)
    tol = tol or tolerance_for(_dtype_name(reference), _dtype_name(got))
    if _close(g, ref, tol):
        return ""
    if not np.all(np.isfinite(g)):
        return "contains NaN or inf"
    if g.shape != ref.shape:
        if g.ndim == 2 and ref.ndim == 2 and _close(g, ref.T, tol):
            return ("transposed: this is the reference's transpose (a PyTorch Linear weight "
                    "is (out, in), a JAX Dense kernel (in, out): use weight.T)")
        if g.ndim == 4 and ref.ndim == 4:
            for perm, label in _PERMUTATIONS.items():
                if _close(g, ref.transpose(perm), tol):
                    return label
        if g.size == ref.size:
            return (f"shape {g.shape} where {ref.shape} was expected, same number of "
                    "elements: a reshape or transpose in the wrong order")
        return f"shape {g.shape} where {ref.shape} was expected"
    if g.ndim == 4:  # same shape, but a permutation can still fit (H == W == C)
        for perm, label in _PERMUTATIONS.items():
            if not _close(ref, ref.transpose(perm), tol) and _close(g, ref.transpose(perm), tol):
                return label
    if g.ndim == 2 and g.shape[0] == g.shape[1] and not _close(ref, ref.T, tol) \
            and _close(g, ref.T, tol):
        return ("transposed: this is the reference's transpose (a PyTorch Linear weight "
                "is (out, in), a JAX Dense kernel (in, out): use weight.T)")
    if np.allclose(g, 0.0) and not np.allclose(ref, 0.0):
        return "all zeros where the reference is not (a missing gradient or an unused value?)"
    denom = float(np.sum(ref * ref))
    if denom > 0:
        k = float(np.sum(g * ref)) / denom
        if abs(k - 1.0) > 1e-3 and _close(g, k * ref, tol):
            if abs(k + 1.0) < 1e-3:
                return "sign flipped (subtracting where the reference adds, or the reverse)"
            n = round(k) if abs(k) >= 1 else round(1.0 / k)
            if abs(n) >= 2 and (abs(k - n) < 1e-3 * abs(n) or abs(1.0 / k - n) < 1e-3 * abs(n)):
                if abs(k) >= 1:
                    return (f"scaled by {n}: a sum where the reference takes a mean over {n} "
                            "items (check the loss reduction)")
                return (f"scaled by 1/{n}: a mean where the reference takes a sum over {n} "
                        "items (check the loss reduction)")
            return f"scaled by {k:.4g} (a learning rate, a loss weight or a reduction?)"
    if ref.ndim >= 2:
        d = (g - ref).reshape(-1, ref.shape[-1])
        if np.allclose(d, d[0], rtol=0.0, atol=tol.atol + tol.rtol * float(np.abs(ref).max())):
            return ("a constant offset per feature, the same for every example: a missing "
                    "or extra bias")
    return "values differ (not a transpose, layout, scale or bias mistake)"


# ----------------------------------------------------------------------- comparison


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One named array: reference vs the port."""

    name: str
    passed: bool
    shape: tuple[int, ...]
    max_abs_err: float  # max |got - ref|; inf when shapes differ or the name is missing
    max_ref: float  # max |ref|, for scale
    tolerance: Tolerance
    diagnosis: str = ""  # "" when passed

    @property
    def kind(self) -> str:
        """``params``, ``forward``, ``loss``, ``grad`` or ``step``."""
        return self.name.split("/", 1)[0]

    @property
    def layer(self) -> str:
        """The layer name: ``fc1`` for ``grad/fc1.kernel`` (``loss`` for the loss)."""
        rest = self.name.split("/", 1)[-1]
        return rest.split(".", 1)[0]

    def __str__(self) -> str:
        mark = "ok  " if self.passed else "FAIL"
        err = "-" if not np.isfinite(self.max_abs_err) else f"{self.max_abs_err:.2g}"
        line = f"{mark} {self.name:<22} {str(self.shape):<16} max|err| {err:<8}"
        return line + (f" {self.diagnosis}" if self.diagnosis else "")


@dataclasses.dataclass(frozen=True)
class ParityReport:
    """The verdict on a port: every comparison, in the reference's order."""

    rows: tuple[Comparison, ...]
    ignored: tuple[str, ...] = ()  # names the port returned that the reference lacks

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def first_failure(self) -> Comparison | None:
        """The first diverging array in order params, forward, loss, grad, step."""
        return next((r for r in self.rows if not r.passed), None)

    def summary(self) -> str:
        """One line: all matched, or where the port first diverges and how."""
        if self.passed:
            return f"parity: all {len(self.rows)} arrays match the reference"
        f = self.first_failure
        assert f is not None
        err = "" if not np.isfinite(f.max_abs_err) else (
            f" by up to {f.max_abs_err:.2g} (values up to {f.max_ref:.2g}; {f.tolerance})")
        bad = sum(not r.passed for r in self.rows)
        return (f"parity: {bad} of {len(self.rows)} arrays differ; first at layer "
                f"'{f.layer}' ({f.name}){err}: {f.diagnosis}")

    def __str__(self) -> str:
        return "\n".join([self.summary()] + [str(r) for r in self.rows])

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.passed else "#cf222e"
        rows = [(r.name, r.shape, "-" if not np.isfinite(r.max_abs_err) else f"{r.max_abs_err:.2g}",
                 f"{r.max_ref:.2g}", r.tolerance,
                 "ok" if r.passed else tables.Html(
                     f"<b style='color:#cf222e'>{html.escape(r.diagnosis)}</b>"))
                for r in self.rows]
        return (f"<p style='color:{colour}'><b>{html.escape(self.summary())}</b></p>"
                + tables.html(rows, header=("array", "shape", "max |err|", "max |ref|",
                                            "tolerance", "verdict")))


def plot_reports(reports: Mapping[str, ParityReport], ax: Any = None) -> Any:
    """A heatmap of several ports against one reference: one row per port, one column per
    array (in order: parameters, layer outputs, loss, gradients, step), coloured by how far
    the error is past its tolerance, ``max|err| / (atol + rtol * max|ref|)`` on a log scale.
    Green cells are within tolerance, red ones not; a cross marks an array of the wrong
    shape (or missing). The first red cell of a row is where that port goes wrong.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    if not reports:
        raise errors.CourseValueError("reports={}: give at least one {name: ParityReport}")
    names = [r.name for r in next(iter(reports.values())).rows]
    grid = np.full((len(reports), len(names)), np.nan)
    crosses = []
    for i, report in enumerate(reports.values()):
        by_name = {r.name: r for r in report.rows}
        for j, name in enumerate(names):
            row = by_name.get(name)
            if row is None or not np.isfinite(row.max_abs_err):
                crosses.append((j, i))
                continue
            allowed = row.tolerance.atol + row.tolerance.rtol * row.max_ref
            grid[i, j] = max(row.max_abs_err / allowed, 1e-3)
    if ax is None:
        ax = plt.subplots(figsize=(min(12, 1.2 + 0.45 * len(names)), 0.9 + 0.5 * len(reports)))[1]
    image = ax.imshow(grid, cmap="RdYlGn_r", norm=LogNorm(1e-3, 1e3), aspect="auto")
    for j, i in crosses:
        ax.text(j, i, "x", ha="center", va="center", color="#cf222e", fontweight="bold")
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", rotation_mode="anchor",
                  fontsize=8)
    ax.set_yticks(range(len(reports)), list(reports), fontsize=9)
    ax.figure.colorbar(image, ax=ax, label="error / tolerance (1 = the limit)")
    ax.set_title("Where each port first leaves the reference")
    return ax


def _sort_key(name: str) -> int:
    kind = name.split("/", 1)[0]
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


def compare(reference: Mapping[str, Any], got: Mapping[str, Any], *,
            tolerance: Tolerance | None = None,
            names: Iterable[str] | None = None) -> ParityReport:
    """Compare a port's named arrays with the reference's, in order.

    Args:
        reference: name -> array (see the module docstring for names); its order (stable
            by kind: params, forward, loss, grad, step) is the order of the report.
        got: the port's arrays under the same names.
        tolerance: one tolerance for every array; by default :func:`tolerance_for` the
            two arrays' dtypes.
        names: compare only these names (default: every name in ``reference`` whose kind
            is in :data:`KINDS`).

    Returns:
        A :class:`ParityReport`; ``report.first_failure`` is the first layer that
        diverges, with a :func:`diagnose` line.
    """
    chosen = list(names) if names is not None else [
        n for n in reference if n.split("/", 1)[0] in KINDS]
    missing_ref = [n for n in chosen if n not in reference]
    if missing_ref:
        raise KeyError(f"names not in the reference: {missing_ref}; it has {list(reference)}")
    chosen.sort(key=_sort_key)  # stable: keeps the reference's order inside a kind
    rows = []
    for name in chosen:
        ref = to_numpy(reference[name])
        refd = np.asarray(ref, dtype=np.float64)
        max_ref = float(np.abs(refd).max()) if refd.size else 0.0
        if name not in got:
            tol = tolerance or tolerance_for(ref.dtype)
            rows.append(Comparison(name, False, tuple(ref.shape), float("inf"), max_ref, tol,
                                   f"missing: the port returned no '{name}'"))
            continue
        g = to_numpy(got[name])
        tol = tolerance or tolerance_for(ref.dtype, g.dtype)
        if g.shape == ref.shape:
            gd = np.asarray(g, dtype=np.float64)
            err = np.abs(gd - refd)
            max_err = float(np.nanmax(err)) if err.size else 0.0
            if not np.all(np.isfinite(gd)):
                max_err = float("inf")
            passed = bool(np.all(err <= tol.atol + tol.rtol * np.abs(refd)))
        else:
            max_err, passed = float("inf"), False
        rows.append(Comparison(name, passed, tuple(ref.shape), max_err, max_ref, tol,
                               "" if passed else diagnose(ref, g, tol)))
    ignored = tuple(n for n in got if n not in reference and n.split("/", 1)[0] in KINDS)
    return ParityReport(tuple(rows), ignored)


# --------------------------------------------------------------------- the JAX side


def jax_trace(params: Mapping[str, Any], x: Any, y: Any | None = None, *,
              forward: Callable[[Any, Any], Mapping[str, Any]] | None = None,
              loss_fn: Callable[[Any, Any, Any], Any] | None = None,
              step: Callable[[Any, Any, Any], Any] | None = None,
              precision: str | None = "highest") -> dict[str, np.ndarray]:
    """Record a JAX port's arrays under the names :func:`compare` expects.

    Args:
        params: the port's parameters, a nested dict ``{layer: {name: array}}``.
        x, y: the inputs and targets (in the port's layout, e.g. NHWC).
        forward: ``forward(params, x) -> {layer: output}``, every layer's output by name
            (JAX has no forward hooks: the port returns what PyTorch hooks would record).
        loss_fn: ``loss_fn(params, x, y) -> scalar``; its gradient is taken with
            ``jax.grad``.
        step: ``step(params, x, y) -> new params`` (one optimizer step).
        precision: ``jax.default_matmul_precision`` for the trace. ``"highest"`` makes a
            TPU multiply float32 matrices in full float32, as PyTorch on a CPU does; with
            ``None`` a TPU uses one bfloat16 pass and fails a float32 tolerance.

    Returns:
        name -> numpy array.
    """
    import contextlib

    import jax

    ctx = jax.default_matmul_precision(precision) if precision else contextlib.nullcontext()
    out: dict[str, np.ndarray] = {}
    with ctx:
        out.update({f"params/{k}": v for k, v in flatten(params).items()})
        if forward is not None:
            acts = forward(params, x)
            if not isinstance(acts, Mapping):
                raise TypeError("forward(params, x) must return a dict {layer name: output}, "
                                f"got {type(acts).__name__}")
            out.update({f"forward/{k}": to_numpy(v) for k, v in acts.items()})
        if loss_fn is not None:
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            out["loss"] = to_numpy(loss)
            out.update({f"grad/{k}": v for k, v in flatten(grads).items()})
        if step is not None:
            out.update({f"step/{k}": v for k, v in flatten(step(params, x, y)).items()})
    return out


# ------------------------------------------------------------------- the torch side


def require_torch() -> Any:
    """``import torch``, or an ImportError that says how to install it."""
    try:
        import torch
    except ImportError as err:
        raise ImportError(
            "this needs PyTorch, which is not installed: `pip install tpu-course[parity]` "
            "(or `pip install torch`), or use the stored reference: "
            "tpu_course.parity.load_reference()") from err
    return torch


def torch_available() -> bool:
    """True when ``import torch`` works (without importing it when it is absent)."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _module_to_jax(name: str, m: Any, tensors: dict[str, Any]) -> dict[str, np.ndarray]:
    """One layer's named tensors (its parameters, or their gradients) in JAX layout."""
    nn = require_torch().nn
    if isinstance(m, nn.Linear):
        return linear_to_jax(tensors["weight"], tensors.get("bias"))
    if isinstance(m, nn.Conv2d):
        return conv2d_to_jax(tensors["weight"], tensors.get("bias"))
    if isinstance(m, nn.LayerNorm):
        return layernorm_to_jax(tensors.get("weight"), tensors.get("bias"))
    if isinstance(m, nn.Embedding):
        return embedding_to_jax(tensors["weight"])
    raise TypeError(
        f"no converter for {type(m).__name__} ('{name}'): convert its parameters "
        "by hand and add them to the dict (known: Linear, Conv2d, LayerNorm, Embedding)")


def torch_layer_params(module: Any) -> dict[str, dict[str, np.ndarray]]:
    """A PyTorch module's parameters as ``{layer: {name: array}}`` in JAX layout.

    Knows ``Linear``, ``Conv2d``, ``LayerNorm`` and ``Embedding``; any other module that
    owns parameters raises a ``TypeError`` naming it.
    """
    return {name: _module_to_jax(name, m, dict(m.named_parameters(recurse=False)))
            for name, m in module.named_modules() if list(m.parameters(recurse=False))}


def _grads_in_jax_layout(module: Any) -> dict[str, dict[str, np.ndarray]]:
    """The gradients of :func:`torch_layer_params`, same layout (zeros where none)."""
    torch = require_torch()
    return {name: _module_to_jax(name, m, {k: (p.grad if p.grad is not None else torch.zeros_like(p))
                                           for k, p in m.named_parameters(recurse=False)})
            for name, m in module.named_modules() if list(m.parameters(recurse=False))}


def torch_trace(module: Any, x: Any, y: Any | None = None, *,
                loss_fn: Callable[[Any, Any], Any] | None = None,
                optimizer: Callable[[Any], Any] | None = None,
                layers: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Run a PyTorch module once and record its arrays in JAX layout (needs torch).

    Records ``input/x`` (as given, e.g. NCHW), ``input/y``, ``torch/<state_dict key>``
    (weights in PyTorch layout, what a port starts from), ``params/...``,
    ``forward/<layer>`` (by forward hooks; 4-D outputs made NHWC), ``loss``,
    ``grad/...`` and, with ``optimizer``, ``step/...`` after one ``optimizer.step()``.

    Args:
        module: the PyTorch model (float32, on the CPU).
        x, y: a batch; tensors or numpy arrays.
        loss_fn: ``loss_fn(output, y)``, e.g. ``torch.nn.functional.cross_entropy``.
        optimizer: ``optimizer(module.parameters())``, e.g.
            ``lambda ps: torch.optim.SGD(ps, lr=0.1)``.
        layers: module names to hook (default: every module that owns parameters).
    """
    torch = require_torch()
    xt = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    yt = None if y is None else (y if isinstance(y, torch.Tensor) else torch.as_tensor(np.asarray(y)))
    names = list(layers) if layers is not None else [
        n for n, m in module.named_modules() if list(m.parameters(recurse=False))]
    modules = dict(module.named_modules())
    unknown = [n for n in names if n not in modules]
    if unknown:
        raise KeyError(f"no sub-modules named {unknown}; the module has {list(modules)}")
    out: dict[str, np.ndarray] = {"input/x": to_numpy(xt)}
    if yt is not None:
        out["input/y"] = to_numpy(yt)
    out.update({f"torch/{k}": to_numpy(v) for k, v in module.state_dict().items()})
    out.update({f"params/{k}": v for k, v in flatten(torch_layer_params(module)).items()})
    acts: dict[str, np.ndarray] = {}

    def hook(name: str) -> Callable[..., None]:
        def record(_m: Any, _inputs: Any, output: Any) -> None:
            a = to_numpy(output)
            acts[name] = nchw_to_nhwc(a) if a.ndim == 4 else a
        return record

    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        module.zero_grad(set_to_none=True)
        output = module(xt)
    finally:
        for h in handles:
            h.remove()
    out.update({f"forward/{n}": acts[n] for n in names if n in acts})
    if loss_fn is not None:
        loss = loss_fn(output, yt)
        out["loss"] = to_numpy(loss)
        loss.backward()
        out.update({f"grad/{k}": v for k, v in flatten(_grads_in_jax_layout(module)).items()})
        if optimizer is not None:
            opt = optimizer(module.parameters())
            opt.step()
            out.update({f"step/{k}": v for k, v in flatten(torch_layer_params(module)).items()})
    return out


# ------------------------------------------------------------------ stored references


@dataclasses.dataclass(frozen=True)
class Reference:
    """A stored (or freshly computed) PyTorch run: arrays by name, and how it was made."""

    arrays: Mapping[str, np.ndarray]
    meta: Mapping[str, Any]
    source: str  # "stored: <path>" or "live: torch <version>"

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    @property
    def torch_state_dict(self) -> dict[str, np.ndarray]:
        """The weights in PyTorch layout, as ``module.state_dict()`` gives them."""
        return {k[len("torch/"):]: v for k, v in self.arrays.items() if k.startswith("torch/")}

    @property
    def expected(self) -> dict[str, np.ndarray]:
        """The arrays a port is compared on (params, forward, loss, grad, step)."""
        return {k: v for k, v in self.arrays.items() if k.split("/", 1)[0] in KINDS}

    def __repr__(self) -> str:
        return (f"Reference({self.meta.get('name')}, {len(self.expected)} arrays, "
                f"{self.source})")

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], source: str) -> "Reference":
        """A reference from a traced run's arrays; a ``meta`` entry (JSON) becomes ``meta``."""
        arrays = dict(arrays)
        meta = json.loads(str(arrays.pop("meta"))) if "meta" in arrays else {}
        return cls(arrays, meta, source)


def load_reference(name: str = "parity_cnn") -> Reference:
    """The stored reference ``tpu_course/reference/<name>.npz`` (no torch needed).

    ``parity_cnn`` is lab 3's (its model and the live run are in
    :mod:`tpu_course.checks.ch03`); regenerate it with
    ``python scripts/make_parity_reference.py`` (needs torch).
    """
    path = REFERENCE_DIR / f"{name}.npz"
    if not path.exists():
        have = sorted(p.stem for p in REFERENCE_DIR.glob("*.npz"))
        raise FileNotFoundError(f"no stored reference {path}; stored: {have}. Run "
                                "`python scripts/make_parity_reference.py` (needs torch).")
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return Reference.from_arrays(arrays, f"stored: tpu_course/reference/{path.name}")

