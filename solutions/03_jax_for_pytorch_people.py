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
# Five exercises, **about 80 minutes** in all (the plan below gives each one's time), each
# about a PyTorch habit that breaks or changes in JAX:
#
# 1. make a gradient-clipping update run under `jax.jit`;
# 2. predict how many times a jitted function compiles, then count;
# 3. find why an update recompiles on every step, and fix it;
# 4. per-example gradient norms of an MLP with `vmap(grad)` (the first step of
#    per-example clipping);
# 5. port a small PyTorch training step (a CNN, cross-entropy, SGD) to JAX and Optax, and
#    prove with the parity harness that it matches PyTorch layer by layer.
#
# Write your code where a cell says so, then run the check cell below it. A failed check
# says what is wrong and gives a hint; `checks.reveal("Exercise 2")` shows the expected
# answer once an attempt of yours has been checked. The last cell is your scorecard.
#
# Exercise 2 is a prediction: you record it with `checks.ch03.LAB.predict(...)` before
# the count is shown, and once the count has been shown in this session your prediction
# is locked (the check grades the one you recorded). `tpu-course grade` re-runs the
# notebook from the top, so it grades the value in the cell; it also checks your
# functions on inputs the notebook does not show (other shapes, sizes, learning rates).

# %% cellView="form" jupyter={"source_hidden": true} tags=["course-setup"]
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
from tpu_course.checks import NotWritten

checks.ch03.LAB

# %% [markdown] workshop={"agenda": "one-day"}
# ## Exercise 1: make it `jit` (10 min)
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
# `w - LR * g * min(1, max_norm / ||g||)`, with `max_norm` a traced argument. `g` has the
# shape of `w` (a vector or a matrix), and `||g||` is the norm over all its elements.

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

# %% [markdown] workshop={"agenda": "one-day"}
# ## Exercise 2: predict the compilations (10 min)
#
# `f = jax.jit(lambda x, scale: x * scale)` is called seven times, in this order:
#
# ```python
# f(jnp.ones(8), 2.0)
# f(jnp.ones(8), 3.0)
# f(jnp.ones(16), 2.0)
# f(jnp.ones(8, jnp.int32), 2.0)
# f(jnp.ones(8), 2)
# f(jnp.ones((2, 4)), 2.0)
# f(jnp.ones(8), 5.0)
# ```
#
# **Before running them**, predict how many times `f` compiles (the chapter: what is the
# cache key of a jitted function?), assign it to `predicted_compiles`, and record it with
# the cell after it. The count is shown only once a prediction is recorded, and from then
# on the prediction is locked.

# %%
### BEGIN SOLUTION Exercise 2 (predict the compilations)
# New: the first call; ones(16) (shape); int32 (dtype); 2 (a Python int is a weakly
# typed int, not a float); (2, 4) (shape). Cached: 3.0 and 5.0 (only values change).
predicted_compiles = 5
### END SOLUTION

# %%
checks.ch03.LAB.predict("Exercise 2", predicted_compiles)

# %% [markdown]
# Now run them on a fresh `jax.jit` and count with JAX's own count (the function's
# cache size):

# %%
if checks.ch03.LAB.predicted("Exercise 2"):
    checks.ch03.run_compile_quiz(show=True)

# %%
checks.ch03.check_compile_prediction(predicted_compiles)

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 3: find the recompilation (15 min)
#
# A training loop decays its learning rate by half every 100 steps. Someone wrote the
# update below, and the step takes as long as a compile, every step. Find why (print
# `update_slow._cache_size()` after a few calls), then write `update_fixed(w, g, lr,
# step)`: the same update, jitted, compiling once for every step of a run and every base
# learning rate (a sweep over rates must not recompile either). The checker empties its
# cache, calls it at ten steps between 0 and 1000 with several learning rates, and counts
# its compiled versions.

# %%
import functools


@functools.partial(jax.jit, static_argnames=("lr", "step"))
def update_slow(w, g, lr, step):
    lr_t = lr * 0.5 ** (step // checks.ch03.HALVING)
    return w - lr_t * g


for step in range(5):
    update_slow(jnp.ones(4), jnp.ones(4), 0.1, step)
print("update_slow holds", update_slow._cache_size(), "compiled versions after 5 steps")

# %%
### BEGIN SOLUTION Exercise 3 (find the recompilation)
@jax.jit  # lr and step are traced: their values are not part of the cache key
def update_fixed(w, g, lr, step):
    lr_t = lr * 0.5 ** (step // checks.ch03.HALVING)
    return w - lr_t * g
### END SOLUTION


# %%
checks.ch03.check_recompile_fix(update_fixed)

# %% [markdown] workshop={"agenda": "two-days"}
# ## Exercise 4: per-example gradient norms (15 min)
#
# Differentially private training (DP-SGD) clips each example's gradient before
# averaging, so it needs every example's gradient norm; PyTorch's `backward()` gives
# only the batch's sum. The chapter's `vmap` example was a linear model; here the model is
# a two-layer MLP whose parameters are a dict (`checks.ch03.mlp_loss(params, x, y)`, the
# loss of ONE example). Write `per_example_grad_norms(params, X, Y)`: for a batch `X` (n,
# 3), `Y` (n, 2), return an array (n,) holding the global L2 norm of each example's
# gradient (over all four parameter arrays together). Write it for any batch size and
# layer sizes: the grader also tries others.

# %%
def per_example_grad_norms(params, X, Y):
    ### BEGIN SOLUTION Exercise 4 (per-example gradient norms)
    grads = jax.vmap(jax.grad(checks.ch03.mlp_loss), in_axes=(None, 0, 0))(params, X, Y)
    # each leaf has a leading example axis
    squares = [jnp.sum(leaf.reshape(leaf.shape[0], -1) ** 2, axis=1)
               for leaf in jax.tree.leaves(grads)]
    return jnp.sqrt(sum(squares))
    ### END SOLUTION


# %%
checks.ch03.check_per_example_norms(per_example_grad_norms)

# %% [markdown]
# With the norms, per-example clipping is one more line: scale each example's gradient
# by `min(1, C / norm)` before the mean.

# %% [markdown] workshop={"agenda": "self-paced"}
# ## Exercise 5: port a PyTorch training step and prove parity (30 min)
#
# The PyTorch original (its outputs are stored in `tpu_course/reference/`; with torch
# installed, `checks.ch03.reference()` runs it live instead):
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
# 6 parameters after the step) and names the first that differs and how (the grader
# also runs your port on other weights and batch sizes). Convert the weights yourself:
# `parity.linear_to_jax` and `parity.conv2d_to_jax` are the course's answer to 5a.

# %% tags=["nbval-ignore-output"]
ref = checks.ch03.reference()  # live PyTorch when installed, else the stored arrays
print(ref)
for k, v in ref.torch_state_dict.items():
    print(f"{k}: {v.shape}")

# %%
optimizer = optax.sgd(0.1)


def convert_params(state_dict):
    ### BEGIN SOLUTION Exercise 5a (convert the weights)
    sd = state_dict
    return {
        "conv": {"kernel": jnp.asarray(sd["conv.weight"].transpose(2, 3, 1, 0)),  # HWIO
                 "bias": jnp.asarray(sd["conv.bias"])},
        "fc1": {"kernel": jnp.asarray(sd["fc1.weight"].T),
                "bias": jnp.asarray(sd["fc1.bias"])},
        "fc2": {"kernel": jnp.asarray(sd["fc2.weight"].T),
                "bias": jnp.asarray(sd["fc2.bias"])},
    }
    ### END SOLUTION


def forward(params, x):
    ### BEGIN SOLUTION Exercise 5b (the forward pass)
    c = jax.lax.conv_general_dilated(x, params["conv"]["kernel"], window_strides=(1, 1),
                                     padding="SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    c = c + params["conv"]["bias"]
    h = jax.nn.relu(c).transpose(0, 3, 1, 2)  # flatten in PyTorch's (C, H, W) order
    h = h.reshape(h.shape[0], -1)
    f1 = h @ params["fc1"]["kernel"] + params["fc1"]["bias"]
    f2 = jax.nn.relu(f1) @ params["fc2"]["kernel"] + params["fc2"]["bias"]
    return {"conv": c, "fc1": f1, "fc2": f2}
    ### END SOLUTION


def loss_fn(params, x, y):
    ### BEGIN SOLUTION Exercise 5c (the loss)
    logits = forward(params, x)["fc2"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    ### END SOLUTION


def train_step(params, opt_state, x, y):
    ### BEGIN SOLUTION Exercise 5d (one optimizer step)
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
with checks.skip_if_not_written():
    params = convert_params(ref.torch_state_dict)
    x = jnp.asarray(parity.nchw_to_nhwc(ref["input/x"]))
    y = jnp.asarray(ref["input/y"])
    display(parity.compare(ref.expected, parity.jax_trace(
        params, x, y, forward=forward, loss_fn=loss_fn,
        step=lambda p, x, y: train_step(p, optimizer.init(p), x, y)[0])))

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

# %% [markdown]
# ## Scorecard

# %%
checks.ch03.LAB.scorecard(globals())


# %% [markdown]
# ## Hand in
#
# Write the id your instructor asked for (your course login or e-mail) between the quotes
# and run the cell: it records who hands the lab in, inside the notebook itself. Then save
# the notebook as the cell says and hand in the `.ipynb` file.

# %%
from tpu_course import checks

MY_ID = ""
checks.hand_in(checks.lab(3), MY_ID)
