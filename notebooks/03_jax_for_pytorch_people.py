# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 8, "agenda": "one-day"}
# # Chapter 3: JAX for PyTorch people
#
# A PyTorch programmer already knows tensors, autograd, modules and optimizers. JAX has
# each of them, but built on one different idea: **a program is a pure function that a
# compiler (XLA) sees whole**. Most surprises in a first JAX week come from habits that
# are right in PyTorch and wrong under that idea. This chapter sets each JAX idea beside
# its PyTorch twin and shows, in a few lines you can run, exactly where the habit breaks.
#
# The second half is the question a PyTorch team faces when it wants TPUs (keep PyTorch,
# or port to JAX?) and the step every answer needs before scaling up: proving that the
# TPU program computes what the original computed, layer by layer.
#
# **Notation.** *Trace*: running a Python function once with abstract values
# (*tracers*: shape and dtype, no numbers) to record the operations it performs.
# *Compile*: XLA turning that record into a program for the device. *Pytree*: any
# nesting of lists, tuples and dicts whose leaves are arrays.

# %% slideshow={"slide_type": "skip"} cellView="form" jupyter={"source_hidden": true} tags=["course-setup"]
# @title Install the course where it is missing { display-mode: "form" }
import importlib.util, os, shlex, subprocess, sys
if importlib.util.find_spec("tpu_course") is None:  # Colab, Kaggle: the course alone
    course = os.environ.get("TPU_COURSE_SPEC",
                            "tpu-course @ git+https://github.com/tpu-course/tpu-course")
    status, said = subprocess.getstatusoutput(shlex.join(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", course]))
    if status:  # pip's own words, then the usual fixes
        sys.exit(f"{said}\nSetup failed: pip could not install {course}. Fix: turn on "
                 "the internet (Kaggle: Settings > Internet on) or set TPU_COURSE_SPEC")
import tpu_course.setup  # the rest: tpu_course/setup.py
tpu_course.setup.finish()

# %% slideshow={"slide_type": "skip"}
from tpu_course import runtime

rt = runtime.describe()
print(rt.banner())

# %% [markdown] slideshow={"slide_type": "skip"}
# PyTorch is optional here. When it is installed, every PyTorch twin below is run and
# the parity section compares a JAX port with live PyTorch. When it is not (the CI
# machine that executed the saved outputs has no torch), the PyTorch code is shown but
# not run, and the parity section uses reference outputs that PyTorch produced and the
# repository stores (`tpu_course/reference/`, written by
# `scripts/make_parity_reference.py`). `pip install tpu-course[parity]` adds torch.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
import functools
import textwrap

import jax
import jax.numpy as jnp
import numpy as np

from tpu_course import bench, parity

HAVE_TORCH = parity.torch_available()
if HAVE_TORCH:
    import torch
    print(f"torch {torch.__version__} is installed: PyTorch twins run live.")
else:
    print("torch is not installed: PyTorch twins are shown, not run;\n"
          "the parity section uses the stored reference.")


def pytorch(code: str) -> None:
    """Show a PyTorch twin; run it (printing what it prints) when torch is installed."""
    code = textwrap.dedent(code).strip()
    print(textwrap.indent(code, "  torch> "))
    if HAVE_TORCH:
        exec(code, {"torch": torch})
    else:
        print("  (torch not installed: shown, not run)")


# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 4, "agenda": "one-day"}
# ## 1. Arrays are immutable
#
# In PyTorch, `x[1] = 5` writes into the tensor's memory, and every other name for that
# tensor sees the change. A JAX array cannot be changed. The indexed update
# `x.at[1].set(5.0)` returns a **new** array; `x` is untouched.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
pytorch("""
x = torch.zeros(3)
y = x            # another name for the same memory
x[1] = 5.0       # in place
print(x.tolist(), y.tolist())
""")

# %% slideshow={"slide_type": "skip"}
x = jnp.zeros(3)
try:
    x[1] = 5.0
except TypeError as err:
    print("TypeError:", str(err).split(".")[0])
y = x.at[1].set(5.0)            # a new array; also .add, .mul, .min, .max, .get
print("x =", x.tolist(), " y =", y.tolist())

# %% [markdown] slideshow={"slide_type": "skip"}
# "A new array on every update" sounds expensive, but under `jit` it usually is not:
# XLA sees the whole function, notices that the old value is dead after the update, and
# writes in place. Across the boundary of a jitted call, *donating* an argument
# (`donate_argnums`) tells XLA that the caller will not use the input again, so the
# output may reuse its buffer (a training step donates the old parameters). The jaxpr
# shows the update as a `scatter`, a pure operation that XLA is free to do in place.

# %% slideshow={"slide_type": "skip"}
def bump(x):
    return x.at[1].add(1.0)

jaxpr_lines = str(jax.make_jaxpr(bump)(jnp.zeros(3))).splitlines()
print("\n".join(l if len(l) <= 88 else l[:84] + " ..." for l in jaxpr_lines))

bump_donating = jax.jit(bump, donate_argnums=0)
old = jnp.zeros(3)
new = bump_donating(old)
print("new =", new.tolist())
print("old was donated and is now deleted:", old.is_deleted())
try:
    old + 1
except RuntimeError as err:
    print("using it again:", str(err).split(" with ")[0])

# %% [markdown] slideshow={"slide_type": "skip"}
# Every backend honours donation, the CPU included (checked on JAX 0.7.2, Colab's
# version, and on 0.12): the output takes over the donated buffer, the donated array is
# deleted, and touching it again is an error rather than a silent copy. Honouring it is
# not the same as computing right with it: jax 0.7.2's CPU backend computes a *training
# step* that donates its state wrongly (three SGD steps of a two-layer MLP end at loss 2.06
# donated against 1.43 not donated), so the course probes the backend once with
# `runtime.donation_is_safe()` and donates only where the probe passes (chapter 5).
# Nothing warns when donation works. JAX warns only when a donated buffer cannot be
# reused because no output has its shape and dtype, as here, where a sum returns a
# scalar:

# %% slideshow={"slide_type": "skip"}
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    x4 = jnp.zeros(4)
    total = jax.jit(jnp.sum, donate_argnums=0)(x4)
print("warning:", [str(w.message).splitlines()[0] for w in caught])
print("x4 deleted:", x4.is_deleted())
print("a donated training step computes right on this runtime:",
      runtime.donation_is_safe())

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 10, "agenda": "one-day"}
# ## 2. `jit` and tracing
#
# `torch.compile` is an optional speed-up over eager PyTorch. In JAX, `jax.jit` is how
# real programs run: the first call **traces** the Python function with tracers, which
# carry a shape and a dtype but no values, hands the recorded program to XLA, and caches
# the compiled result under the input shapes and dtypes. Later calls with the same
# shapes skip Python entirely. A `print` inside shows what the function sees while it is
# traced:

# %% slideshow={"slide_type": "subslide"}
@jax.jit
def scaled(x):
    print("  tracing with x =", x)          # runs while tracing, not on every call
    return 2 * x

print("first call:");  scaled(jnp.ones(3))
print("second call, same shape: (nothing printed: cached)");  scaled(jnp.ones(3))

# %% [markdown] slideshow={"slide_type": "slide"}
# ### Where the habit breaks: Python control flow on values
#
# `if x.sum() > 0:` needs a Python `bool`, but a tracer has no value yet, so `jit`
# refuses. PyTorch's eager mode never notices, since every tensor has its value.
# Branch on *values* with `jnp.where` (compute both sides, select elementwise) or
# `lax.cond` (run one side); branch in Python only on things that are known while
# tracing: shapes, dtypes and static arguments.

# %% slideshow={"slide_type": "skip"}
def relu_or_flip(x):
    if x.sum() > 0:               # the PyTorch habit
        return jnp.maximum(x, 0)
    return -x

try:
    jax.jit(relu_or_flip)(jnp.array([1.0, -2.0]))
except jax.errors.TracerBoolConversionError as err:
    print(type(err).__name__ + ":\n ", str(err).split("\n")[0])

@jax.jit
def relu_or_flip_where(x):
    return jnp.where(x.sum() > 0, jnp.maximum(x, 0), -x)

@jax.jit
def relu_or_flip_cond(x):
    return jax.lax.cond(x.sum() > 0, lambda v: jnp.maximum(v, 0), lambda v: -v, x)

for v in (jnp.array([3.0, -1.0]), jnp.array([1.0, -2.0])):
    print(v.tolist(), "->", relu_or_flip_where(v).tolist(),
          relu_or_flip_cond(v).tolist())

# %% [markdown] slideshow={"slide_type": "slide"}
# ### Static shapes and `static_argnums`
#
# Every array in a compiled program has a shape fixed at compile time. A shape that
# depends on an argument's *value* (`jnp.ones(n)`) therefore needs `n` to be **static**:
# part of the cache key rather than a traced input. Each new value of a static argument
# is a new compilation.

# %% slideshow={"slide_type": "subslide"}
def ones_of_length(n):
    return jnp.ones(n)

try:
    jax.jit(ones_of_length)(3)
except TypeError as err:   # ConcretizationTypeError is a TypeError
    print(type(err).__name__ + ":\n ", str(err).split("\n")[0][:86])

@functools.partial(jax.jit, static_argnums=0)      # n is part of the cache key
def ones_static(n):
    return jnp.ones(n)

print(ones_static(3).tolist(), ones_static(2).tolist(), ones_static(3).tolist())
print("compiled versions cached (n = 3 and n = 2):", ones_static._cache_size())

# %% [markdown] slideshow={"slide_type": "slide"}
# ### Recompilation: a new shape is a new program
#
# The cache key includes every input's shape, so a function called with a new shape is
# traced and compiled again. On a TPU a compile can take seconds to minutes, so the
# classic bug is a data loader whose **last batch is smaller**: each epoch ends with a
# compile, and an evaluation set of awkward size can compile for each of several sizes.
#
# We count compilations with what JAX itself reports, not a counter of our own: a jitted
# function's cache size (`f._cache_size()`, the number of compiled versions it holds)
# and JAX's compile events (`jax.monitoring`, which `bench.compile_counts()` listens to).

# %% slideshow={"slide_type": "skip"}
W = jnp.asarray(np.random.default_rng(0).standard_normal((16, 4)), jnp.float32)

@jax.jit
def predict(x):
    return jnp.tanh(x @ W)

# A loader over 100 examples in batches of 32 hands out 32, 32, 32 and a last batch of
# 4; other splits (an evaluation set of 90, a dataset of 77) end with other sizes.
sizes = [32, 32, 32, 4] + [32, 32, 26] + [32, 32, 13]
batches = [np.ones((n, 16), np.float32) for n in sizes]
before = bench.compile_counts()["compiles"]
for b in batches:
    predict(b).block_until_ready()
after = bench.compile_counts()["compiles"]
print(f"batch sizes {sorted(set(sizes))}: predict holds {predict._cache_size()} "
      f"compiled versions;\nJAX's compile events during the loop: {after - before}")

# %% [markdown] slideshow={"slide_type": "skip"}
# The fix is to give the compiler only a few shapes: **pad** each batch up to the
# smallest of a few *bucket* sizes (on the host, with numpy, where padding costs
# nothing to compile), run, and drop the padded rows. A row-wise model gives the real
# rows the same result; a loss must mask the padded rows out (a weight of 0 per row).
# With one bucket per power of two, no batch wastes more than half its rows.

# %% slideshow={"slide_type": "skip"}
BUCKETS = (8, 16, 32)

def pad_to_bucket(x: np.ndarray, buckets=BUCKETS) -> tuple[np.ndarray, int]:
    n = x.shape[0]
    size = next(b for b in buckets if b >= n)
    return np.pad(x, ((0, size - n), (0, 0))), n

@jax.jit
def predict_bucketed(x):
    return jnp.tanh(x @ W)

before = bench.compile_counts()["compiles"]
for b in batches:
    padded, n = pad_to_bucket(b)
    out = np.asarray(predict_bucketed(padded))[:n]
    # the real rows are unchanged (to this runtime's matmul precision: section 10)
    assert np.allclose(out, np.asarray(predict(b)), atol=1e-2)
after = bench.compile_counts()["compiles"]
print(f"padded to buckets {BUCKETS}: {predict_bucketed._cache_size()} compiled "
      f"versions;\nJAX's compile events during the loop: {after - before}")

# %% [markdown] slideshow={"slide_type": "skip"}
# ### Python numbers are *weakly typed*
#
# The cache key holds each argument's dtype too, and a plain Python number has a dtype of
# its own kind: `2.0` is a **weakly typed** float32 (it takes the dtype of whatever array
# it meets, so `bf16_array * 2.0` stays bf16), `2` a weakly typed int32. A numpy or JAX
# scalar such as `np.float32(2.0)` is *strongly* typed, and it promotes a bf16 array to
# float32 (the last line). Weak and strong, int and float are different keys; the value
# never is.

# %% slideshow={"slide_type": "skip"}
@jax.jit
def scale(x, s):
    return x * s

x8 = jnp.ones(8, jnp.bfloat16)
for s in (2.0, 3.0, 2, np.float32(2.0)):
    out = scale(x8, s)
    print(f"s = {s!r:<18} result dtype {str(out.dtype):<9} compiled versions so far: "
          f"{scale._cache_size()}")

# %% [markdown] slideshow={"slide_type": "skip"} workshop={"minutes": 4, "agenda": "one-day"}
# (Two other fixes: drop the last partial batch in training, as
# `DataLoader(drop_last=True)` does; or pad every batch to the full size with a mask.)
#
# ## 3. `grad` and `value_and_grad` instead of `loss.backward()`
#
# PyTorch records operations on tensors that have `requires_grad` and `loss.backward()`
# writes gradients into each parameter's `.grad`, adding to whatever was there (hence
# `optimizer.zero_grad()`). JAX transforms a *function*: `jax.grad(loss)` is a new
# function returning d loss / d (first argument), with the same pytree structure as that
# argument. Nothing is stored on the parameters, so there is nothing to zero.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
pytorch("""
w = torch.tensor([1.0, 2.0], requires_grad=True)
x = torch.tensor([3.0, 4.0])
loss = ((w * x).sum() - 1.0) ** 2
loss.backward()
print("loss", loss.item(), "grad", w.grad.tolist())
""")

# %% slideshow={"slide_type": "skip"}
def loss_fn(w, x):
    return ((w * x).sum() - 1.0) ** 2

w, x = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
print("grad           ", jax.grad(loss_fn)(w, x).tolist())
value, g = jax.value_and_grad(loss_fn)(w, x)    # the loss and its gradient in one pass
print("value_and_grad ", float(value), g.tolist())

# %% [markdown] slideshow={"slide_type": "skip"}
# Two more things `backward()` does implicitly: returning extra outputs (logits,
# accuracy) alongside the loss is `has_aux=True`, and the parameters can be any pytree:
# the gradient comes back in the same shape, dict for dict.

# %% slideshow={"slide_type": "skip"}
def model_loss(params, x, y):
    pred = x @ params["dense"]["kernel"] + params["dense"]["bias"]
    loss = jnp.mean((pred - y) ** 2)
    return loss, {"pred": pred}          # (loss, aux)

params = {"dense": {"kernel": jnp.ones((2, 1)), "bias": jnp.zeros(1)}}
xb, yb = jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.array([[1.0], [2.0]])
(loss, aux), grads = jax.value_and_grad(model_loss, has_aux=True)(params, xb, yb)
print("loss", float(loss), " aux pred", aux["pred"].ravel().tolist())
print("grads", jax.tree.map(lambda a: a.ravel().tolist(), grads))

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 4, "agenda": "one-day"}
# ## 4. `vmap` instead of writing the batch dimension by hand
#
# A PyTorch model is written for a batch: every layer knows that axis 0 is the batch.
# In JAX you can write the function for **one example** and let `jax.vmap` add the
# batch axis. The payoff is per-example gradients, which PyTorch's `backward()` cannot
# give (it sums over the batch; `torch.func.vmap` now borrows JAX's answer). They are
# what differential privacy clips, and what gradient-noise diagnostics need.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
pytorch("""
w = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
X, Y = torch.ones(4, 3), torch.arange(4.0)
rows = []
for x, y in zip(X, Y):  # the classic way: one backward pass per example
    w.grad = None
    (0.5 * (x @ w - y) ** 2).backward()
    rows.append(w.grad.clone())
print(torch.stack(rows).shape)
""")

# %% slideshow={"slide_type": "skip"}
def example_loss(w, x, y):                  # one example: x (d,), y scalar
    return 0.5 * (x @ w - y) ** 2

rng = np.random.default_rng(1)
w = jnp.asarray(rng.standard_normal(3), jnp.float32)
X = jnp.asarray(rng.standard_normal((4, 3)), jnp.float32)
Y = jnp.asarray(rng.standard_normal(4), jnp.float32)

batched_loss = jax.vmap(example_loss, in_axes=(None, 0, 0))  # w shared, x, y batched
per_example = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(w, X, Y)
closed_form = (X @ w - Y)[:, None] * X  # d/dw of 0.5 (x.w - y)^2
print("losses", [round(float(v), 3) for v in batched_loss(w, X, Y)])
# (tolerances allow for a TPU's default bfloat16 matmul pass, section 10)
print("per-example grads, shape", per_example.shape, "match closed form:",
      bool(jnp.allclose(per_example, closed_form, rtol=1e-2, atol=1e-2)))
batch_grad = jax.grad(lambda w: batched_loss(w, X, Y).sum())(w)
print("their sum is the batch gradient:",
      bool(jnp.allclose(per_example.sum(0), batch_grad, rtol=1e-2, atol=1e-2)))

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "two-days"}
# ## 5. Explicit random keys instead of a global seed
#
# `torch.manual_seed(0)` sets a hidden global state that every random call advances, so
# a result depends on how many random numbers were drawn before, in which order, on
# which thread. JAX has no hidden state: a random function takes a **key** and is a pure
# function of it. The same key gives the same numbers, always. New keys come from
# `split` (one key in, several independent keys out) and `fold_in` (a key and an integer,
# such as a step number or a device index, give a new key).

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
pytorch("""
torch.manual_seed(0)
a = torch.rand(2)
b = torch.rand(2)          # different: the global state moved on
torch.manual_seed(0)
print(a.tolist(), b.tolist(), torch.rand(2).tolist())
""")

# %% slideshow={"slide_type": "skip"}
key = jax.random.key(0)
def draw(k, shape=(2,)):
    values = np.asarray(jax.random.uniform(k, shape)).reshape(-1)
    return [round(float(v), 4) for v in values] if shape else round(float(values[0]), 4)

print("same key, same numbers:", draw(key), draw(key))
init_key, dropout_key = jax.random.split(key)
print("after split:           ", draw(init_key), draw(dropout_key))
step_keys = [jax.random.fold_in(dropout_key, step) for step in range(3)]
print("fold_in(step):         ", [draw(k, ()) for k in step_keys])

# %% [markdown] slideshow={"slide_type": "skip"} workshop={"minutes": 4, "agenda": "two-days"}
# Why this matters on many chips: with a global seed, each device's random stream
# depends on the order in which work happened to run there, so a 256-chip run cannot be
# reproduced on 8 chips. With keys, the dropout mask of example *i* at step *s* is a
# function of `fold_in(fold_in(key, s), i)` alone: the same on any number of devices,
# in any order, after any restart. (The order in which each key's numbers are laid out
# is part of the contract too: JAX's default `threefry` generator gives the same numbers
# for a key on CPU, GPU and TPU.)
#
# ## 6. Pytrees: parameters as nested dicts
#
# A PyTorch module owns its parameters as attributes (`model.fc1.weight`) and
# `model.parameters()` walks them. In JAX the parameters are just data: a pytree, usually
# a nested dict. `jax.tree.map` applies a function to every leaf (several trees at
# once, as long as they share the structure): an SGD step is one line.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
pytorch("""
model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
model(torch.ones(1, 3)).sum().backward()
with torch.no_grad():
    for name, p in model.named_parameters():  # on the module, in place
        p -= 0.1 * p.grad
print([(name, tuple(p.shape)) for name, p in model.named_parameters()])
""")

# %% slideshow={"slide_type": "skip"}
params = {"fc1": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)},
          "fc2": {"kernel": jnp.ones((2, 1)), "bias": jnp.zeros(1)}}
grads = jax.tree.map(jnp.ones_like, params)
new_params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)   # SGD, every leaf
print("shapes:\n ", jax.tree.map(jnp.shape, new_params))
print("leaves:", len(jax.tree.leaves(params)),
      " parameters:", sum(leaf.size for leaf in jax.tree.leaves(params)))

# %% [markdown] slideshow={"slide_type": "skip"}
# That `tree.map` line is what an optimizer does, and **Optax** (the optimizer library of
# the JAX ecosystem, chapter 5 uses it throughout) packages it as a pair of pure
# functions: `init` makes the optimizer's state (empty for plain SGD, two moments per
# parameter for Adam), `update` turns gradients into updates, and `apply_updates` adds
# them. Nothing is updated in place: the new parameters and state come back.

# %% slideshow={"slide_type": "skip"}
import optax

tx = optax.sgd(0.1)
opt_state = tx.init(params)
updates, opt_state = tx.update(grads, opt_state, params)
optax_params = optax.apply_updates(params, updates)
same = jax.tree.map(lambda a, b: bool(jnp.allclose(a, b)), optax_params, new_params)
print("optax.sgd's step equals the tree.map step on every leaf:",
      all(jax.tree.leaves(same)))

# %% [markdown] slideshow={"slide_type": "skip"}
# Flax NNX brings back the PyTorch feel (a `Module` object with attributes), and
# `nnx.split` turns it into the same thing underneath: a static graph definition and a
# `State` pytree of arrays, which `jax.tree.map`, `jit` and `grad` all accept.

# %% slideshow={"slide_type": "skip"}
from flax import nnx

layer = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
graphdef, state = nnx.split(layer)
print(type(state).__name__, jax.tree.map(jnp.shape, nnx.to_pure_dict(state)))

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 3, "agenda": "two-days"}
# ## 7. Pure functions: side effects run once, while tracing
#
# `jit` runs your Python once to trace it. Whatever the function does *besides*
# computing its output (printing, appending to a global list, reading a global that
# later changes, drawing from NumPy's random state) happens during that trace, and not
# on later calls, which run the compiled program. `jax.debug.print` is the print that
# belongs to the program and runs on every call.

# %% slideshow={"slide_type": "subslide"}
log = []
scale = 2.0

@jax.jit
def impure(x):
    print("  python print (trace time)")
    jax.debug.print("  jax.debug.print: x.sum() = {s}", s=x.sum())
    log.append("called")            # a side effect on Python state
    return x * scale                # the global is read once and baked in

for i in range(3):
    impure(np.full(2, i, np.float32)).block_until_ready()
scale = 100.0                       # too late: the compiled program holds 2.0
print("log:", log, "| impure(ones) =", impure(np.ones(2, np.float32)).tolist())

# %% [markdown] slideshow={"slide_type": "skip"} workshop={"minutes": 4, "agenda": "two-days"}
# The rule that follows: a jitted function should take everything it reads as an
# argument and return everything it changes. That is why a JAX training step looks like
# `params, opt_state = step(params, opt_state, batch)` rather than `optimizer.step()`.
#
# ## 8. Control flow that compiles: `lax.scan`, `lax.fori_loop`, `lax.cond`
#
# A Python `for` loop under `jit` is unrolled: 1000 iterations become 1000 copies of the
# body in the program (slow to compile, but fine for a few). `lax.fori_loop` and
# `lax.scan` compile the body once and loop on the device; `scan` also stacks a
# per-step output, which makes it the tool for RNNs and layer stacks.

# %% slideshow={"slide_type": "skip"}
def running_sum(xs):
    def step(carry, x):
        carry = carry + x
        return carry, carry            # (new carry, output of this step)
    total, partial = jax.lax.scan(step, 0.0, xs)
    return total, partial

xs = jnp.arange(1.0, 6.0)
total, partial = jax.jit(running_sum)(xs)
print("scan:      total", float(total), "partials", partial.tolist())

def power(x, n):
    return jax.lax.fori_loop(0, n, lambda i, acc: acc * x, 1.0)
print("fori_loop: 3**4 =", float(jax.jit(power)(3.0, 4)))

# A Python loop unrolls; scan does not: count the operations in each program.
unrolled = jax.make_jaxpr(lambda xs: sum(xs[i] for i in range(50)))(jnp.ones(50))
scanned = jax.make_jaxpr(
    lambda xs: jax.lax.scan(lambda c, x: (c + x, None), 0.0, xs)[0])(jnp.ones(50))
print("equations: Python loop", len(unrolled.eqns), "| lax.scan", len(scanned.eqns))

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 2, "agenda": "self-paced"}
# ## 9. Asynchronous dispatch: a call returns before the work is done
#
# Like CUDA in PyTorch, JAX queues work on the device and returns at once; the Python
# value is a future. Time with `block_until_ready()` (chapter 2), or better with
# `tpu_course.bench`, which also keeps compile time out of the measurement.

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
import time

big = jnp.ones((1024, 1024))
matmul = jax.jit(lambda a: a @ a)
matmul(big).block_until_ready()                  # compile first
t0 = time.perf_counter()
out = matmul(big)
t_dispatch = time.perf_counter() - t0
out.block_until_ready()
t_done = time.perf_counter() - t0
print(f"returned after {t_dispatch * 1e3:.2f} ms, finished after {t_done * 1e3:.2f} ms "
      f"({rt.platform.upper()} timings)")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 4, "agenda": "two-days"}
# ## 10. Matmul precision: "the TPU cannot do arithmetic"
#
# On a TPU, a float32 matrix multiply with the default precision is **not** computed in
# float32: the matrix unit rounds both inputs to bfloat16 (8 significant bits) and
# accumulates in float32, one pass. That is fast and usually fine for training, but a
# port checked against PyTorch on a CPU then differs in the third significant digit,
# and people conclude the TPU is broken. A GPU does something similar for float32 on
# Ampere and later when TF32 is enabled (`torch.backends.cuda.matmul.allow_tf32`).
#
# The knobs: `precision=jax.lax.Precision.HIGHEST` on one operation (`jnp.dot`,
# `jnp.matmul`, `lax.conv`), or `jax.default_matmul_precision("float32")` around a block
# of code (or for a whole program, the `jax_default_matmul_precision` config option).
# On a TPU the three levels are bfloat16 passes over the MXU, as the names of JAX's dot
# algorithms say (`jax.lax.DotAlgorithmPreset`, and JAX's "Matmul precision" guide):
#
# | level | also called | on a TPU, a float32 matmul is |
# | --- | --- | --- |
# | `DEFAULT` | `"bfloat16"` | **one** bf16 pass, f32 accumulation (`BF16_BF16_F32`) |
# | `HIGH` | `"bfloat16_3x"` | three bf16 passes (`BF16_BF16_F32_X3`) |
# | `HIGHEST` | `"float32"` | six bf16 passes (`BF16_BF16_F32_X6`): correct to float32 rounding, several times slower |
#
# A CPU computes float32 matmuls in float32 whatever the precision says, so to *show*
# the TPU's default here we do its rounding by hand: round the inputs to bfloat16, then
# multiply in float32. That is one bfloat16 pass with float32 accumulation.

# %% slideshow={"slide_type": "subslide"}
rng = np.random.default_rng(2)
a = rng.standard_normal((256, 256)).astype(np.float32)
b = rng.standard_normal((256, 256)).astype(np.float32)
exact = a.astype(np.float64) @ b.astype(np.float64)

def rel_err(c):
    return float(np.abs(np.asarray(c, np.float64) - exact).max() / np.abs(exact).max())

HIGHEST = jax.lax.Precision.HIGHEST
full_fp32 = jnp.dot(a, b, precision=HIGHEST)
bf16 = lambda m: jnp.asarray(m).astype(jnp.bfloat16).astype(jnp.float32)
one_bf16_pass = jnp.dot(bf16(a), bf16(b), precision=HIGHEST)  # DEFAULT on a TPU
print(f"float32 (HIGHEST):              max error / max |C| = {rel_err(full_fp32):.0e}"
      if rel_err(full_fp32) < 1e-6 else "unexpected float32 error")
print("one bf16 pass (TPU's DEFAULT):  max error / max |C| = "
      f"{rel_err(one_bf16_pass):.0e}")

# %% [markdown] slideshow={"slide_type": "skip"}
# On the runtime this notebook runs on, the real default against float32 (on a CPU both
# are float32, so the two lines agree; on a TPU the default line shows the bfloat16
# error above; on a recent NVIDIA GPU, XLA's default for float32 may use TF32, whose
# 10-bit mantissa gives an error between the two):

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "skip"}
default = jnp.dot(a, b)
with jax.default_matmul_precision("float32"):
    scoped = jnp.dot(a, b)
print(f"{rt.platform.upper()}: default precision  max error / max |C| = "
      f"{rel_err(default):.0e}")
print(f"{rt.platform.upper()}: inside jax.default_matmul_precision('float32'): "
      f"{rel_err(scoped):.0e}")

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 10, "agenda": "self-paced"}
# ## 11. The route question: keep PyTorch, or port to JAX?
#
# A PyTorch team that wants TPUs has three routes, each with a different cost:
#
# | route | what it is | cheap when | costly when |
# | --- | --- | --- | --- |
# | **PyTorch/XLA** (`torch_xla`) | PyTorch code runs through XLA: operations are recorded lazily into graphs that XLA compiles for the TPU | the model is standard `nn` layers, the code is large, the team must ship soon | the code has dynamic shapes or data-dependent Python control flow (each new graph is a recompile), or much host-side logic between steps |
# | **A native PyTorch TPU backend** | eager PyTorch on the TPU as a device like `cuda` (Google is building one, called TorchTPU) | the timeline is long enough to wait for it to mature | a deadline depends on features or performance that are not there yet: check its current status, not a roadmap |
# | **Port to JAX** | rewrite the model and the training step in JAX (Flax/Optax), or adopt a JAX reference trainer such as MaxText for standard LLMs | the model is a standard architecture (then it is mostly a configuration and a weight conversion), or the team will live on TPUs for years | the model has a lot of custom code: every module, loss and data path is rewritten and must be proved equal |
#
# Three questions decide it. **How much custom code?** Custom CUDA kernels run on no
# TPU route: each must be rewritten (in Pallas, or as plain JAX/XLA operations) whichever
# route is taken. **What timeline?** PyTorch/XLA is the quickest start; a port is weeks
# of work that pays back over a long run. **What risk?** Every route changes the
# numerics (a different compiler, bfloat16 matmuls, different kernels), so every route
# ends with the same step before any scaling: **prove numerical parity** on one device,
# then scale.

# %% [markdown] workshop={"minutes": 8, "agenda": "two-days"}
# ## 12. Proving parity, layer by layer
#
# Parity means: same weights, same inputs, and then the same output at **every layer**,
# the same loss, the same gradient for **every parameter**, and the same parameters
# after one optimizer step, within tolerances that fit the dtype. Comparing only the
# final loss hides mistakes that cancel or that only show in training; comparing layer by
# layer points at the first place the port goes wrong.
#
# `tpu_course.parity` does this. The PyTorch side records each layer's output with
# forward hooks and converts everything to JAX's conventions (a `Linear` weight is
# (out, in), a Dense kernel (in, out); a `Conv2d` weight is OIHW and its activations
# NCHW, JAX's are HWIO and NHWC). The comparison itself needs only numpy, so it runs
# without torch against a stored reference. Our subject is a small CNN, lab 3's model
# (it comes with the lab's checker, `tpu_course.checks.ch03`):
#
# ```python
# model = nn.Sequential(OrderedDict(
#     conv=nn.Conv2d(3, 4, 3, padding=1), act1=nn.ReLU(), flatten=nn.Flatten(),
#     fc1=nn.Linear(4 * 6 * 6, 16), act2=nn.ReLU(), fc2=nn.Linear(16, 10)))
# loss = F.cross_entropy(model(x), y)              # mean over the batch
# loss.backward(); torch.optim.SGD(model.parameters(), lr=0.1).step()
# ```

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "subslide"}
from tpu_course.checks import ch03

ref = ch03.reference()            # live PyTorch when installed, else the stored arrays
print(ref)
print("model:", {k: ref.meta[k] for k in ("batch", "channels", "size", "hidden")})
print("      ", {k: ref.meta[k] for k in ("classes", "optimizer", "lr")})

# %% slideshow={"slide_type": "skip"}
print("PyTorch weights (state_dict):")
for k, v in ref.torch_state_dict.items():
    print(f"  {k}: {tuple(v.shape)}")
print("arrays to match:", len(ref.expected), "=",
      {kind: sum(n.split("/")[0] == kind for n in ref.expected)
       for kind in parity.KINDS})

# %% [markdown] slideshow={"slide_type": "skip"}
# The JAX port: convert the weights, then write the forward pass in NHWC. One trap is
# hidden in `nn.Flatten`: PyTorch flattens NCHW activations in (C, H, W) order, so the
# port transposes its NHWC activations to NCHW before flattening (or permutes `fc1`'s
# kernel rows once). The port returns every layer's output by name: JAX has no forward
# hooks, so the function hands over what the hooks recorded on the PyTorch side.

# %% slideshow={"slide_type": "skip"}
sd = ref.torch_state_dict
jax_params = {"conv": parity.conv2d_to_jax(sd["conv.weight"], sd["conv.bias"]),
              "fc1": parity.linear_to_jax(sd["fc1.weight"], sd["fc1.bias"]),
              "fc2": parity.linear_to_jax(sd["fc2.weight"], sd["fc2.bias"])}
jax_params = jax.tree.map(jnp.asarray, jax_params)

def forward(params, x, flatten_like_torch=True):
    c = jax.lax.conv_general_dilated(x, params["conv"]["kernel"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    c = c + params["conv"]["bias"]
    h = jax.nn.relu(c)
    if flatten_like_torch:
        h = h.transpose(0, 3, 1, 2)               # NHWC -> NCHW, then (C, H, W) order
    f1 = h.reshape(h.shape[0], -1) @ params["fc1"]["kernel"] + params["fc1"]["bias"]
    f2 = jax.nn.relu(f1) @ params["fc2"]["kernel"] + params["fc2"]["bias"]
    return {"conv": c, "fc1": f1, "fc2": f2}

def cross_entropy(params, x, y, forward=forward, reduce=jnp.mean):
    logp = jax.nn.log_softmax(forward(params, x)["fc2"])
    return reduce(-jnp.take_along_axis(logp, y[:, None], axis=1))

def sgd_step(loss):
    def step(params, x, y):
        g = jax.grad(loss)(params, x, y)
        return jax.tree.map(lambda p, d: p - ref.meta["lr"] * d, params, g)
    return step

x_nhwc = jnp.asarray(parity.nchw_to_nhwc(ref["input/x"]))
y = jnp.asarray(ref["input/y"])
ours = parity.jax_trace(jax_params, x_nhwc, y, forward=forward, loss_fn=cross_entropy,
                        step=sgd_step(cross_entropy))
report = parity.compare(ref.expected, ours)
print(report.summary())

# %% tags=["nbval-ignore-output"] slideshow={"slide_type": "slide"}
report  # the full table (errors at the level of float32 rounding vary by machine)

# %% [markdown] slideshow={"slide_type": "skip"}
# `jax_trace` runs the port under `jax.default_matmul_precision("highest")` by default:
# the reference was computed in float32 on a CPU, and section 10 showed what a TPU's
# default bfloat16 pass would do to that comparison. Once parity holds in float32, run
# the same comparison in bfloat16 with bfloat16 tolerances (`parity.tolerance_for`).
#
# Now plant the mistakes that ports really contain, one at a time, and read the report.
# It names the **first** array that diverges, in the order parameters, layer outputs,
# loss, gradients, step, and what the difference looks like.

# %% slideshow={"slide_type": "skip"}
ports = {"the port above": report}


def plant(name, params=jax_params, fwd=forward, reduce=jnp.mean):
    loss = lambda p, x, y: cross_entropy(p, x, y, forward=fwd, reduce=reduce)
    got = parity.jax_trace(params, x_nhwc, y, forward=fwd, loss_fn=loss,
                           step=sgd_step(loss))
    ports[name] = parity.compare(ref.expected, got)
    show(name, ports[name])


def show(name, result):  # the one-line summary, wrapped to the page
    print(f"{name}:\n" + textwrap.fill(result.summary(), 88, initial_indent="  ",
                                       subsequent_indent="    ") + "\n")


fc2_weight = jnp.asarray(sd["fc2.weight"])
transposed = dict(jax_params, fc2=dict(jax_params["fc2"], kernel=fc2_weight))
# (just the parameters: with a transposed kernel the forward pass would not even run)
show("transposed fc2 weight", parity.compare(
    ref.expected, parity.jax_trace(transposed, x_nhwc),
    names=[n for n in ref.expected if n.startswith("params/")]))

def forward_no_bias(params, x):
    out = forward(params, x)
    f1 = out["fc1"] - params["fc1"]["bias"]  # as if the bias were forgotten
    f2 = jax.nn.relu(f1) @ params["fc2"]["kernel"] + params["fc2"]["bias"]
    return dict(out, fc1=f1, fc2=f2)

plant("fc1 bias forgotten", fwd=forward_no_bias)
plant("flattened NHWC, not NCHW",
      fwd=lambda p, x: forward(p, x, flatten_like_torch=False))
plant("loss summed, not averaged", reduce=jnp.sum)

# %% slideshow={"slide_type": "subslide"}
# Grid of ports (rows) by arrays (columns): green within tolerance, red past it
# (columns in the order the report reads them)
ax = parity.plot_reports(ports)  # assigned: only the figure is shown

# %% [markdown] slideshow={"slide_type": "slide"} workshop={"minutes": 2, "agenda": "one-day"}
# Each mistake is named at the layer where it happens: the transposed kernel at
# `fc2`'s parameters; the missing bias at `fc1`'s output (the difference is the same
# for every example: a per-feature offset); the summed loss at the loss, scaled by the
# batch size 8 (and every gradient with it). The flatten order shows up at `fc1` as
# "values differ": nothing about the numbers betrays a permutation of the inputs, which
# is why the lab's checker, knowing the model, tests that hypothesis explicitly.
#
# ## Takeaways
#
# * JAX arrays are immutable; `x.at[i].set(v)` returns a new array, and under `jit` XLA
#   makes it in place. Donate buffers a step no longer needs.
# * `jit` traces with shapes, not values: branch on values with `jnp.where` or
#   `lax.cond`; make shape-deciding arguments static; every new shape is a compile, so
#   pad ragged batches to a few buckets. Count compiles with JAX's own numbers.
# * `grad` transforms functions and returns gradients as a pytree like the parameters;
#   `has_aux` carries extra outputs; `vmap` gives per-example gradients.
# * Randomness is a key passed in, split and folded, never a global seed.
# * Side effects run once, while tracing: use `jax.debug.print`, pass state in and out.
# * On a TPU, float32 matmuls default to one bfloat16 pass; ask for `HIGHEST` (or
#   `default_matmul_precision("float32")`) when comparing with a float32 reference.
# * Whatever the route to TPUs, prove parity layer by layer (outputs, loss, gradients,
#   one step) before scaling.
