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
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 5: write the train step and a prefetching input pipeline
#
# Two exercises, each followed by a checker:
#
# 1. **The train step**: a pure function `(state, batch) -> (state, metrics)` that takes
#    one Optax step. The checker verifies that the loss goes down on a fixed batch and that
#    the parameters change *only* through the optimizer.
# 2. **Prefetch to device**: an iterator that keeps `depth` batches travelling to the
#    device while the current step runs. The checker verifies order, completeness
#    (nothing dropped or repeated), placement on the device, and that the transfers really
#    run ahead of the consumer.
#
# Then you train a model with both and time the pipeline with prefetching off and on.

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

# %% tags=["nbval-ignore-output"]
from tpu_course import runtime

rt = runtime.describe()
print(rt.banner())

# %%
import collections

import jax
import numpy as np
import optax
from flax import nnx

from tpu_course import data, models, train
from tpu_course.checks import ch05
from tpu_course.train import Batch, TrainState

ON_CPU = rt.platform == "cpu"

# %% [markdown]
# ## Exercise 1: the train step
#
# The state is one pytree, `TrainState(step, params, opt_state)`; a batch is
# `Batch(images, labels, weights)`. `train.loss_fn(params, graphdef, batch)` returns
# `(loss, logits)`: the weighted mean cross-entropy and the logits.
#
# Write `make_train_step(graphdef, tx)` returning `train_step(state, batch)` that
# 1. computes the loss and its gradient with respect to `state.params`
#    (`jax.value_and_grad(..., has_aux=True)`),
# 2. asks the optimizer for updates: `tx.update(grads, state.opt_state, state.params)`,
# 3. applies them with `optax.apply_updates`,
# 4. returns `(TrainState(step + 1, new params, new opt_state), {"loss": loss})`.
#
# Nothing else may touch the parameters: no hand-written `p - lr * g`, no extra decay.

# %%
def make_train_step(graphdef, tx):
    def train_step(state, batch):
        raise NotImplementedError("Exercise 1 (train step): write your code here")

    return train_step


# %%
ch05.check_train_step(make_train_step)

# %% [markdown]
# ## Exercise 2: prefetch to device
#
# `jax.device_put(x)` starts copying `x` to the device and returns at once. Write a
# generator `prefetch_to_device(iterator, depth)` that keeps a first-in, first-out queue
# (`collections.deque`) of up to `depth` items already put on the device, yields the
# oldest one only when the queue holds more than `depth`, and empties the queue at the
# end. With `depth=2`, when the consumer receives batch i, batches i+1 and i+2 are
# already on their way.

# %%
def prefetch_to_device(iterator, depth=2):
    raise NotImplementedError("Exercise 2 (prefetch to device): write your code here")


# %%
ch05.check_prefetch(prefetch_to_device)

# %% [markdown]
# ## Use them: train with your step and your pipeline
#
# One epoch of MNIST (the small MLP on a CPU, the CNN on an accelerator), batch 64,
# Adam, your step jitted with donated state, fed by your prefetching pipeline.
# Evaluation uses the package's `train.evaluate` on all 10,000 test images.

# %%
ds = data.load_mnist()
model = models.MLP(rngs=nnx.Rngs(0)) if ON_CPU else models.CNN(rngs=nnx.Rngs(0))
tx = optax.adam(1e-3)
graphdef, state = train.init_state(model, tx)
step = jax.jit(make_train_step(graphdef, tx), donate_argnums=0)

losses = []
host = train.batches(ds.train_images, ds.train_labels, 64, seed=0, epoch=0)
for batch in prefetch_to_device(host, depth=2):
    state, metrics = step(state, batch)
    losses.append(metrics["loss"])
losses = np.asarray(jax.device_get(losses))
ev = train.evaluate(train.to_model(graphdef, state), ds.test_images, ds.test_labels)
print(f"{len(losses)} steps on {ds.train_set}; mean loss first 20 steps "
      f"{losses[:20].mean():.2f}, last 20 {losses[-20:].mean():.2f}")
print(f"test accuracy above 90 % after one epoch: {ev.accuracy > 0.90} (count {ev.count:,})")

# %% tags=["nbval-ignore-output"]
print(f"test accuracy: {ev.accuracy:.2%}")

# %% [markdown]
# ## Does prefetching help here?
#
# Time the same number of steps fed with `depth=0` (no prefetch) and `depth=2`, using
# `train.time_steps` (warm-up steps excluded, waits for the last result). On a CPU the
# "device" is the host itself, so expect little difference; on a TPU or GPU, with a
# host that has other work to do, prefetching hides the copies.

# %% tags=["nbval-ignore-output"]
for depth in (0, 2):
    host = train.batches(ds.train_images, ds.train_labels, 64, seed=0, epoch=1)
    state, t = train.time_steps(step, state, prefetch_to_device(host, depth))
    print(f"depth {depth}: {t}  ({rt.platform.upper()} timing)")
