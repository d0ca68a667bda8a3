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
# # Lab 2: measure a runtime yourself
#
# Four exercises, each followed by a checker cell that says whether your answer is right
# and, if not, what it looks like you did. Fill in every `NotImplementedError`, then run
# the checker below it. The checkers compare against the course's own harness on the
# runtime you are on, so they work on a TPU, a GPU and a CPU.

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
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from tpu_course import hardware, runtime
from tpu_course.checks import ch02

print(runtime.describe().banner())

# %% [markdown]
# ## Exercise 1: count the FLOPs of a matmul
# Write `matmul_flops(m, k, n)`: the floating-point operations of an (m x k) @ (k x n)
# matrix product. Every output element c[i, j] is a sum over k of products.

# %%
def matmul_flops(m: int, k: int, n: int) -> int:
    raise NotImplementedError("Exercise 1 (matmul FLOPs): write your code here")


ch02.check_matmul_flops(matmul_flops)

# %% [markdown]
# ## Exercise 2: time a call correctly
# Write `time_call(fn, *args)` returning the seconds one call of the jitted `fn` takes.
# Remember the two traps of the chapter: the first call compiles, and a call returns
# before the device has finished (the result may be a tuple or a dict of arrays).

# %%
def time_call(fn, *args, repeats: int = 5) -> float:
    raise NotImplementedError("Exercise 2 (timing a call): write your code here")


ch02.check_time_call(time_call)

# %% [markdown]
# ## Exercise 3: host-to-device bandwidth
# Write `h2d_bandwidth(host_array)`: copy a NumPy array to the default device and return
# the bandwidth in **bytes per second**. Take the median of a few copies.

# %%
def h2d_bandwidth(host_array: np.ndarray, repeats: int = 5) -> float:
    raise NotImplementedError("Exercise 3 (host-to-device bandwidth): write your code here")


ch02.check_h2d_bandwidth(h2d_bandwidth)

# %% [markdown]
# ## Exercise 4: how close to the peak?
# Write `fraction_of_peak(flops, seconds, chip)` for a chip name of the hardware table
# (`'v5e'`, `'v6e'`, `'h100'`, ...): achieved FLOP/s divided by the chip's dense bf16 peak,
# as a fraction between 0 and 1. Take the peak from `tpu_course.hardware`, never type it.

# %%
def fraction_of_peak(flops: float, seconds: float, chip: str) -> float:
    raise NotImplementedError("Exercise 4 (fraction of peak): write your code here")


ch02.check_fraction_of_peak(fraction_of_peak)

# %% [markdown]
# ## Putting it together
# Your own timer and FLOP count on a matmul of this runtime. On a CPU there is no peak in
# the table, and the number is a CPU number, not a TPU one.

# %% tags=["nbval-ignore-output"]
rt = runtime.describe()
size = 1024 if rt.platform == "cpu" else 8192
dtype = jnp.float32 if rt.platform == "cpu" else jnp.bfloat16
a = jnp.ones((size, size), dtype)
seconds = time_call(jax.jit(jnp.matmul), a, a)
rate = matmul_flops(size, size, size) / seconds
print(f"{size}^3 {jnp.dtype(dtype).name} matmul: {seconds * 1e3:.2f} ms, {rate / 1e12:.3f} TFLOP/s on {rt.device_kind}")
if rt.chip:
    print(f"= {fraction_of_peak(matmul_flops(size, size, size), seconds, rt.chip.name):.0%} of peak")
