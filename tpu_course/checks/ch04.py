"""Lab 4 (ask the compiler, predict, compile, measure). XLA measures Exercises 1, 4 and 6
live (6 with the TPU compiler, for a v5e); the keys in ``grading/ch04.py`` judge 2, 3, 5."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Mapping, Sequence

from tpu_course import hardware
from tpu_course.checks.engine import Case, Exercise, Lab, Mistake, Wrong, close, equal, number

LAB = Lab(4, "Ask the compiler, predict, compile, measure")
LAYER_4 = (256, 4, 512)  #: Exercise 4's layer: a first layer on only 4 input features
LN_SHAPE = (4096, 1024)  #: Exercise 6's layer norm: a bf16 [tokens, features] array

@contextlib.contextmanager
def no_compiler(what: str) -> Iterator[None]:
    """While a prediction runs, lowering to a cost or compiling raises :class:`Wrong`."""
    import jax
    def refuse(*_: Any, **__: Any) -> Any:
        raise Wrong(f"your {what} asks the compiler: this is a prediction",
                    "count by hand, from the shapes; the check asks the compiler itself")
    saved = [(cls, name, vars(cls)[name]) for cls in (jax.stages.Lowered, jax.stages.Compiled)
             for name in ("compile", "cost_analysis", "memory_analysis") if name in vars(cls)]
    for cls, name, _ in saved:
        setattr(cls, name, refuse)
    try:
        yield
    finally:
        for cls, name, value in saved:
            setattr(cls, name, value)

def _predicted(answer: Mapping[str, Any], name: str, what: str, *args: Any) -> float:
    """The learner's function ``name`` called on ``args`` with no compiler: one number."""
    with no_compiler(name):
        return number(answer[name](*args), what)

# -- Exercise 1: XLA's FLOPs and bytes for any function -------------------------------------
def layer(x: Any, w: Any, b: Any) -> Any:
    """Exercise 1's and 4's layer: ``relu(x @ w + b)``."""
    import jax
    return jax.nn.relu(x @ w + b)

@functools.lru_cache(maxsize=1)
def _functions() -> dict[str, Callable]:
    """Exercise 1's functions, made once so that XLA's cache holds across calls."""
    import jax
    import jax.numpy as jnp
    return {"layer": layer, "softmax": lambda x: jax.nn.softmax(x, axis=-1),
            "two matmuls": lambda x, w1, w2: (x @ w1) @ w2,
            "pytree": lambda params, x: jnp.tanh(x @ params["w"]) + params["b"],
            "jitted": jax.jit(lambda x, y: jnp.sin(x) * y + x.sum(0))}

def cost_case(kind: str, dims: Sequence[int], dtype: str) -> tuple[Callable, tuple]:
    """The function of one Exercise 1 input and its ``jax.ShapeDtypeStruct`` arguments."""
    import jax
    a, b, c = dims
    S = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
    args = {"layer": (S(a, b), S(b, c), S(c)), "softmax": (S(a, b),),
            "two matmuls": (S(a, b), S(b, c), S(c, a)), "jitted": (S(a, b), S(a, b)),
            "pytree": ({"w": S(b, c), "b": S(c)}, S(a, b))}[kind]
    return _functions()[kind], args

def xla_counts(kind: str, dims: tuple, dtype: str) -> tuple[float, float]:
    """The instrument: (FLOPs, bytes accessed) of the compiled program, from XLA."""
    from tpu_course import hlo
    fn, args = cost_case(kind, dims, dtype)
    report = hlo.inspect(fn, *args)
    return float(report.flops), float(report.bytes_accessed)

def _probe_cost(answer: Mapping[str, Any], case: Case) -> tuple:
    fn, args = cost_case(**case.args)
    try:
        got = answer["xla_cost"](fn, *args)
    except (TypeError, AttributeError) as err:
        if "ShapeDtypeStruct" not in str(err):
            raise
        raise Wrong("your function ran fn on its arguments, which are shapes (jax."
                    "ShapeDtypeStruct), not arrays", "nothing needs to run: lower the jitted "
                    "function at these arguments, compile it, ask the compiled program") from None
    if isinstance(got, (str, bytes, Mapping)) or not hasattr(got, "__len__") or len(got) != 2:
        raise Wrong(f"you returned {type(got).__name__} {got!r:.50}, not a pair",
                    "return the pair (flops, bytes accessed): two numbers")
    return number(got[0], "the FLOPs"), number(got[1], "the bytes accessed")

def _cost(kind: str, dims: tuple, dtype: str, label: str) -> Case:
    return Case(f"{label} at {dims}, {dtype}", {"kind": kind, "dims": dims, "dtype": dtype})

check_xla_cost = LAB.add(Exercise(
    "Exercise 1 (XLA's FLOPs and bytes for any function)", minutes=12, provides=("xla_cost",),
    cases=(_cost("layer", (64, 512, 256), "float32", "the layer relu(x @ w + b)"),
           _cost("softmax", (96, 200, 1), "float32", "a row softmax")),
    probe=_probe_cost, expect=lambda case: xla_counts(**case.args),
    compare=close(1e-6, what="your (FLOPs, bytes accessed)"),
    hint="ask the compiler for the function and the arguments you are given: the compiled "
         "program's cost analysis has entries 'flops' and 'bytes accessed'"))

# -- Exercise 2: the batch where a layer turns compute-bound ----------------------------------
def _probe_batch(answer: Mapping[str, Any], case: Case) -> Any:
    got = answer["compute_bound_batch"](case.args["k"], case.args["n"],
                                        hardware.get(case.args["chip"]))
    return None if got is None else number(got, "your batch")

def _batch_compare(got: Any, want: Any, case: Case) -> str | None:
    if (got is None) != (want is None):
        return ("you said no batch reaches the ridge, but one does" if got is None else
                f"no batch is large enough here, and you gave {got:g}")
    return None if got == want else f"m = {got:g} is not the least batch at the ridge"

def _batch(k: int, n: int, chip: str) -> Case:
    return Case(f"weights [{k}, {n}] on a {chip}", {"k": k, "n": n, "chip": chip})

check_compute_bound_batch = LAB.add(Exercise(
    "Exercise 2 (the batch where a layer turns compute-bound)", minutes=10, kind="apply",
    provides=("compute_bound_batch",),
    cases=(_batch(4096, 4096, "v5e"), _batch(8192, 2048, "v6e"), _batch(256, 256, "v6e")),
    probe=_probe_batch, compare=_batch_compare,
    hint="write the FLOPs and the bytes of x, w and y in terms of m, then solve intensity >= "
         "this chip's ridge point (its bf16 peak / HBM bytes/s); as m grows the intensity "
         "tends to a limit"))

# -- Exercise 3: the least time of a chain of kernels -----------------------------------------
def matmul_kernel(n: int) -> tuple[float, float]:
    """(FLOPs, bytes) of an n x n x n bf16 matmul reading its inputs and writing once."""
    return 2.0 * n**3, 3.0 * n * n * 2

def elementwise_kernel(elements: int, flops_per: int = 8) -> tuple[float, float]:
    """(FLOPs, bytes) of a bf16 elementwise kernel reading one array, writing one."""
    return float(flops_per * elements), 2.0 * elements * 2

def _chain(kernels: Sequence[tuple[float, float]], chip: str, label: str) -> Case:
    return Case(f"{label} on a {chip}", {"kernels": tuple(kernels), "chip": chip})

check_chain_time = LAB.add(Exercise(
    "Exercise 3 (the least time of a chain of kernels)", minutes=10, kind="apply",
    provides=("chain_time_s",),
    cases=(_chain((matmul_kernel(4096), elementwise_kernel(2 * 8192 * 8192)), "v5e",
                  "a matmul, then a large elementwise kernel"),
           _chain((elementwise_kernel(4096 * 4096), matmul_kernel(8192),
                   elementwise_kernel(4096 * 4096, 2)), "v6e", "three kernels")),
    probe=lambda answer, case: number(answer["chain_time_s"](
        [tuple(k) for k in case.args["kernels"]], hardware.get(case.args["chip"])),
        "the time in seconds"),
    compare=close(0.02, what="your time"),
    hint="the chapter's roofline per kernel (with the peak and bandwidth of the chip you are "
         "given), then the kernels in sequence"))

# -- Exercise 4: a layer by hand, against XLA ----------------------------------------------------
def xla_layer_flops(shape: tuple[int, int, int]) -> float:
    """The instrument: XLA's FLOPs of :func:`layer` at ``(M, D, H)`` in float32 here."""
    from tpu_course import hlo
    flops = hlo.inspect(layer, *cost_case("layer", shape, "float32")[1]).flops
    if flops is None:
        raise LookupError("this backend reports no FLOP count to compare with")
    return flops

check_xla_flops = LAB.add(Exercise(
    "Exercise 4 (a layer by hand, against XLA)", minutes=10, kind="predict",
    provides=("layer_flops",),
    cases=(Case(f"M, D, H = {LAYER_4}: a layer on 4 input features", {"shape": LAYER_4}),),
    probe=lambda answer, case: _predicted(answer, "layer_flops", "your FLOP count",
                                          *case.args["shape"]), expect=lambda case: xla_layer_flops(tuple(case.args["shape"])),
    compare=close(0.05, what="your FLOP count"),
    success="with so few inputs per output, the bias add and the relu are a large share",
    hint="the matmul's 2*M*D*H, plus one FLOP per output element for each elementwise op"))

# -- Exercise 5: how big an array is on a TPU -------------------------------------------------------
def _array(shape: tuple[int, int], itemsize: int) -> Case:
    dtype = {2: "bf16", 4: "f32"}[itemsize]
    return Case(f"{dtype}{list(shape)}", {"shape": shape, "itemsize": itemsize})

check_tpu_bytes = LAB.add(Exercise(
    "Exercise 5 (how big an array is on a TPU)", minutes=12, kind="apply",
    provides=("tpu_bytes",),
    cases=(_array((40, 300), 4), _array((17, 127), 2), _array((1000, 12), 4)),
    probe=lambda answer, case: _predicted(answer, "tpu_bytes", "your byte count",
                                          tuple(case.args["shape"]), case.args["itemsize"]), compare=equal("your byte count"),
    hint="pad each of the two dimensions up to its tile, in the order that wastes less, then "
         "multiply by itemsize"))

# -- Exercise 6: layer norm on a v5e ----------------------------------------------------------------
def layer_norm(x: Any, gamma: Any, beta: Any, eps: float = 1e-5) -> Any:
    """Exercise 6's operation: layer norm over the last axis (statistics in float32)."""
    import jax
    import jax.numpy as jnp
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * gamma + beta).astype(x.dtype)

def compile_layer_norm(target: str | None = "v5e:2x2") -> Any:
    """:func:`layer_norm` on a bf16 :data:`LN_SHAPE` array, compiled (only) for ``target``."""
    import jax
    from tpu_course import hlo
    t, f = LN_SHAPE
    S = lambda *shape: jax.ShapeDtypeStruct(shape, "bfloat16")
    return hlo.inspect(layer_norm, S(t, f), S(f), S(f), target=target)

def layer_norm_truth() -> dict:
    """The instrument: the TPU compiler's FLOPs, the least bytes (arguments, outputs), roof."""
    report = compile_layer_norm()
    least = report.argument_bytes + report.output_bytes
    ridge = hardware.get("v5e").critical_intensity()
    return {"flops": report.flops, "bytes": least,
            "roof": "memory" if report.flops / least < ridge else "compute"}

def _probe_ln(answer: Mapping[str, Any], case: Case) -> dict:
    roof = str(answer["predicted_ln_roof"]).strip().lower()
    roof = roof.replace("-bound", "").replace(" bound", "")
    if roof not in ("memory", "compute"):
        raise Wrong(f"predicted_ln_roof should be 'memory' or 'compute', not {roof!r:.40}",
                    "predicted_ln_roof = 'memory' (or 'compute')")
    return {"flops": number(answer["predicted_ln_flops"], "predicted_ln_flops"),
            "bytes": number(answer["predicted_ln_bytes"], "predicted_ln_bytes"), "roof": roof}

SLACK = {"flops": 3.0, "bytes": 1.5}
_within = lambda value, want, slack: 1 / slack <= value / want <= slack

def _ln_compare(got: Any, want: Any, case: Case) -> str | None:
    if not _within(got["flops"], want["flops"], SLACK["flops"]):
        return (f"your FLOPs are {got['flops'] / want['flops']:.3g}x XLA's (tolerance "
                f"{SLACK['flops']:g}x)")
    if not _within(got["bytes"], want["bytes"], SLACK["bytes"]):
        return f"your bytes are {got['bytes'] / want['bytes']:.3g}x the least a kernel moves"
    if got["roof"] != want["roof"]:
        return f"layer norm is not {got['roof']}-bound on a v5e"
    return None

def _ln_rule(entry: str, times: float, hint: str, slack: float | None = None) -> Mistake:
    """The mistake of an ``entry`` off by a factor ``times`` (``got * times`` is right)."""
    slack = slack or SLACK[entry]
    return Mistake(hint, when=lambda got, want, case: not _within(
        got[entry], want[entry], slack) and _within(got[entry] * times, want[entry], slack))

_T, _F = LN_SHAPE
_ELEMENTS = f"multiply by the number of elements ({_T} x {_F})"
check_layer_norm = LAB.add(Exercise(
    "Exercise 6 (layer norm on a v5e)", minutes=15, kind="predict", needs="tpu-compiler",
    provides=("predicted_ln_flops", "predicted_ln_bytes", "predicted_ln_roof"),
    cases=(Case(f"layer norm of a bf16 {list(LN_SHAPE)} array, compiled for a v5e"),),
    probe=_probe_ln, expect=lambda case: layer_norm_truth(), compare=_ln_compare,
    success="XLA's TPU byte count is larger than the least: each fusion that needs x reads it "
            "from HBM again (the cell above lists them)",
    rules=(_ln_rule("flops", _T * _F, f"that is per element: {_ELEMENTS}"),
           _ln_rule("flops", _T, f"that is one row: multiply by the number of rows ({_T})"),
           _ln_rule("bytes", _T * _F, f"that is bytes per element: {_ELEMENTS}"),
           _ln_rule("bytes", 2, "bf16 is 2 bytes per element, and y is written as well as x "
                    "read", 1.1),
           _ln_rule("bytes", 0.5, "the array is bf16 (2 bytes), not float32: the float32 "
                    "math stays on chip", 1.1),
           Mistake("a handful of FLOPs per element: the mean (an add), the difference, its "
                   "square, the variance (an add), the scaling, gamma and beta; then times "
                   "the number of elements", when=lambda got, want, case:
                   got["flops"] < want["flops"] / SLACK["flops"]),
           Mistake("its intensity (a few FLOPs per byte) against the v5e's ridge point",
                   when=lambda got, want, case: got["roof"] != want["roof"])),
    hint="count each elementwise operation once per element; the least bytes: read x once, "
         "write y once"))
