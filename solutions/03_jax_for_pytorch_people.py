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

# %% [markdown]
# # Lab 3 (solution): JAX for PyTorch people
#
# Four exercises, each about a PyTorch habit that breaks in JAX:
#
# 1. make a gradient-clipping update run under `jax.jit`;
# 2. stop a function recompiling for every batch size;
# 3. compute per-example gradients with `vmap`;
# 4. port a small PyTorch training step (a CNN, cross-entropy, SGD) to JAX and Optax, and
#    prove with the parity harness that it matches PyTorch layer by layer.
#
# Write your code where a cell raises `NotImplementedError`, then run the check cell
# below it. A failed check says what it expected, what came back and what the mistake
# looks like. Chapter 3's notebook covers everything used here.

# %%
# Setup: installs the course package where it is missing (Colab, Kaggle) and nothing
# else: the runtime's own jax, jaxlib and libtpu stay. Where jax is older than the
# course's floor, it upgrades them together to a tested set and asks for one restart.
import importlib.metadata as md, importlib.util, os, re, shutil, subprocess, sys
class SetupStop(Exception):  # ends "Run all" with this message instead of a traceback
    def _render_traceback_(self): return [str(self)]
def setup_course(floor="0.7.2"):
    def version(p):
        try: return tuple(int(x) for x in re.findall(r"\d+", md.version(p))[:3])
        except md.PackageNotFoundError: return None
    course = os.environ.get("TPU_COURSE_SPEC",
                            "tpu-course @ git+https://github.com/tpu-course/tpu-course")
    jax_now = version("jax")
    upgrade = jax_now is not None and jax_now < tuple(map(int, floor.split(".")))
    if upgrade:  # one consistent set: jax, jaxlib and the runtime's plugin together
        kind = ("[tpu]" if importlib.util.find_spec("libtpu") else "[cuda12]"
                if version("jax-cuda12-plugin") or shutil.which("nvidia-smi") else "")
        wanted = [f"jax{kind}=={floor}", f"jaxlib=={floor}", course]
    elif importlib.util.find_spec("tpu_course") is None:  # pin the runtime's own jax
        wanted = [f"{p}=={md.version(p)}" for p in ("jax", "jaxlib", "libtpu") if version(p)]
        wanted.append(course)
    else:
        return
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *wanted],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        cause = (pip.stderr or pip.stdout).strip().splitlines()[-6:]
        raise SetupStop("Setup failed: pip could not install " + " ".join(wanted) + ":\n  "
                        + "\n  ".join(cause) + "\nFix: make sure the runtime reaches the "
                        "internet (Kaggle: Settings > Internet on), then run this cell again.")
    if upgrade:
        raise SetupStop(f"Setup: this runtime's jax {'.'.join(map(str, jax_now))} is older "
                        f"than the course's floor {floor}, so jax, jaxlib and the course were"
                        " installed together. Restart the runtime once (Colab: Runtime > "
                        "Restart session) and run all again: the new jax loads only in a "
                        "fresh process, and this cell will then install nothing.")
setup_course()

# %%
from tpu_course import runtime

print(runtime.describe().banner())

# %%
import jax
import jax.numpy as jnp
import numpy as np
import optax

from tpu_course import checks, parity
import tpu_course.checks.ch03  # noqa: F401  (loads checks.ch03)

# %% [markdown]
# ## Exercise 1: make it `jit`
#
# A PyTorch training loop clips the gradient when its norm is too large:
#
# ```python
# norm = g.norm()
# if norm > max_norm:
#     g = g * (max_norm / norm)
# w -= lr * g
# ```
#
# Translated word for word, this fails under `jax.jit`: the norm is a tracer while the
# function is traced, and a Python `if` needs a `bool`. Rewrite `clipped_update` so that
# `jax.jit(clipped_update)(w, g, max_norm)` works, returning
# `w - LR * g * min(1, max_norm / ||g||)`, with `max_norm` a traced argument.

# %%
LR = checks.ch03.LR


def clipped_update(w, g, max_norm):
    norm = jnp.sqrt(jnp.sum(g ** 2))
    ### BEGIN SOLUTION Exercise 1 (make it jit)
    # min(1, max_norm / norm) is 1 below the limit; a zero gradient gives inf -> 1.
    return w - LR * g * jnp.minimum(1.0, max_norm / norm)
    ### END SOLUTION


# %%
checks.ch03.check_jit_fix(clipped_update)

# %% [markdown]
# ## Exercise 2: no recompilation for the last, smaller batch
#
# A data loader hands out batches of 32 and then a smaller last batch, whose size
# depends on the dataset. Each new batch size is a new shape, and each new shape is a
# compilation. Write `bucketed(fn, x, buckets)`: pad `x` (rows along axis 0) with zero
# rows up to the smallest bucket that holds it, call the jitted `fn`, and return only the
# real rows. The checker feeds 11 batches of 8 different sizes and counts the
# compilations with JAX's own count (`fn._cache_size()`): at most one per bucket.

# %%
def bucketed(fn, x, buckets=checks.ch03.BUCKETS):
    ### BEGIN SOLUTION Exercise 2 (no recompilation)
    n = x.shape[0]
    size = next(b for b in buckets if b >= n)
    padded = jnp.pad(x, ((0, size - n),) + ((0, 0),) * (x.ndim - 1))
    return fn(padded)[:n]
    ### END SOLUTION


# %%
checks.ch03.check_bucketing(bucketed)

# %% [markdown]
# ## Exercise 3: per-example gradients
#
# For a linear model with the loss `0.5 * (x . w - y)**2` on one example, return the
# gradient with respect to `w` for **every** example of a batch `X` (n, d), `Y` (n,):
# an array (n, d). PyTorch's `backward()` only gives the sum over the batch. Write the
# loss for one example, take its `jax.grad`, and `jax.vmap` it over the examples.

# %%
def per_example_grads(w, X, Y):
    ### BEGIN SOLUTION Exercise 3 (per-example gradients)
    def loss(w, x, y):
        return 0.5 * (x @ w - y) ** 2
    return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(w, X, Y)
    ### END SOLUTION


# %%
checks.ch03.check_per_example_grads(per_example_grads)

# %% [markdown]
# ## Exercise 4: port a PyTorch training step and prove parity
#
# The PyTorch original (its outputs are stored in `tpu_course/reference/`; with torch
# installed, the checker runs it live instead):
#
# ```python
# model = nn.Sequential(OrderedDict(
#     conv=nn.Conv2d(3, 4, 3, padding=1),      # weight (4, 3, 3, 3): OIHW
#     act1=nn.ReLU(),
#     flatten=nn.Flatten(),                   # NCHW -> (N, C*H*W), in (C, H, W) order
#     fc1=nn.Linear(4 * 6 * 6, 16),           # weight (16, 144): (out, in)
#     act2=nn.ReLU(),
#     fc2=nn.Linear(16, 10)))
# optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
#
# logits = model(x)                           # x: (8, 3, 6, 6), NCHW
# loss = F.cross_entropy(logits, y)           # mean over the batch
# optimizer.zero_grad(); loss.backward(); optimizer.step()
# ```
#
# Write four functions:
#
# * `convert_params(state_dict)`: PyTorch weights (numpy arrays, PyTorch layout) to
#   `{"conv": {"kernel", "bias"}, "fc1": {...}, "fc2": {...}}` in JAX layout (Dense
#   kernel (in, out); Conv kernel HWIO).
# * `forward(params, x)`: `x` is NHWC (JAX's layout); return each layer's output before
#   its activation, `{"conv": ..., "fc1": ..., "fc2": logits}` (the parity harness
#   compares them with what PyTorch's forward hooks recorded).
# * `loss_fn(params, x, y)`: the cross-entropy PyTorch computes.
# * `train_step(params, opt_state, x, y)`: one Optax step, returning
#   `(params, opt_state, loss)`.
#
# The checker compares 22 arrays (6 parameters, 3 layer outputs, the loss, 6 gradients,
# 6 parameters after the step) and names the first that differs and how.

# %% tags=["nbval-ignore-output"]
ref = parity.reference()       # live PyTorch when installed, else the stored arrays
print(ref)
print({k: v.shape for k, v in ref.torch_state_dict.items()})

# %%
optimizer = optax.sgd(0.1)


def convert_params(state_dict):
    ### BEGIN SOLUTION Exercise 4a (convert the weights)
    sd = state_dict
    return {
        "conv": {"kernel": jnp.asarray(sd["conv.weight"].transpose(2, 3, 1, 0)),  # OIHW->HWIO
                 "bias": jnp.asarray(sd["conv.bias"])},
        "fc1": {"kernel": jnp.asarray(sd["fc1.weight"].T), "bias": jnp.asarray(sd["fc1.bias"])},
        "fc2": {"kernel": jnp.asarray(sd["fc2.weight"].T), "bias": jnp.asarray(sd["fc2.bias"])},
    }
    ### END SOLUTION


def forward(params, x):
    ### BEGIN SOLUTION Exercise 4b (the forward pass)
    c = jax.lax.conv_general_dilated(x, params["conv"]["kernel"], window_strides=(1, 1),
                                     padding="SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    c = c + params["conv"]["bias"]
    h = jax.nn.relu(c).transpose(0, 3, 1, 2)          # flatten in PyTorch's (C, H, W) order
    h = h.reshape(h.shape[0], -1)
    f1 = h @ params["fc1"]["kernel"] + params["fc1"]["bias"]
    f2 = jax.nn.relu(f1) @ params["fc2"]["kernel"] + params["fc2"]["bias"]
    return {"conv": c, "fc1": f1, "fc2": f2}
    ### END SOLUTION


def loss_fn(params, x, y):
    ### BEGIN SOLUTION Exercise 4c (the loss)
    logits = forward(params, x)["fc2"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    ### END SOLUTION


def train_step(params, opt_state, x, y):
    ### BEGIN SOLUTION Exercise 4d (one optimizer step)
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
    ### END SOLUTION


# %%
checks.ch03.check_port(convert_params, forward, loss_fn, train_step, optimizer)

# %% [markdown]
# The whole report, array by array (the errors are float32 rounding, and their last
# digits vary from machine to machine):

# %% tags=["nbval-ignore-output"]
params = convert_params(ref.torch_state_dict)
x = jnp.asarray(parity.nchw_to_nhwc(ref["input/x"]))
y = jnp.asarray(ref["input/y"])
parity.compare(ref.expected, parity.jax_trace(
    params, x, y, forward=forward, loss_fn=loss_fn,
    step=lambda p, x, y: train_step(p, optimizer.init(p), x, y)[0]))

# %% [markdown]
# ## Going further
#
# * With parity in float32, jit the train step and run a few steps: the losses should
#   follow PyTorch's (for a small model, to about six digits for several steps).
# * Swap SGD for Adam on both sides (`torch.optim.Adam`, `optax.adam`). Note that after
#   one Adam step every parameter moves by about the learning rate whatever its gradient,
#   so a one-step comparison after Adam cannot see a loss scaled by the batch size:
#   compare gradients, not just the step.
# * On a TPU, run the parity check with `precision=None` in `parity.jax_trace` and read
#   which layer fails first, and by how much.
