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
# # Lab 4 (solution): Predict, compile, measure
#
# Each exercise asks you to **predict** a number with pencil-and-paper arithmetic
# (written as a small function), then the cell after it **compiles** the real program
# and asks XLA, and where this runtime allows it **measures**; the checker grades your
# prediction against the analytic model, XLA's cost or memory analysis, or the
# benchmark harness, with a tolerance, and explains any gap.
#
# Notation as in chapter 4: $F$ FLOPs (multiply + add = 2), $B$ bytes moved to and from
# HBM, $I = F/B$ arithmetic intensity, $P$ peak FLOP/s, $W$ HBM bytes/s, ridge $P/W$.
# The chip numbers come from `tpu_course.hardware`; never type them in.

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

rt = runtime.describe()
print(rt.banner())

# %%
import math
import time

import jax
import jax.numpy as jnp

from tpu_course import bench, hardware, hlo, roofline
from tpu_course.checks import ch04

print("compile-only TPU targets available:", hlo.compile_only_available())

# %% [markdown]
# ## Exercise 1: the FLOPs of a matmul
#
# Write `matmul_flops(m, k, n)`: the floating-point operations of `[m, k] @ [k, n]`.
# Then the cell compiles one and compares with XLA's count.

# %%
def matmul_flops(m, k, n):
    ### BEGIN SOLUTION Exercise 1 (matmul FLOPs)
    return 2 * m * k * n
    ### END SOLUTION


# %%
M, K, N = 256, 512, 384
xla = hlo.inspect(jnp.matmul, jax.ShapeDtypeStruct((M, K), jnp.bfloat16),
                  jax.ShapeDtypeStruct((K, N), jnp.bfloat16))
ch04.check_matmul_flops(matmul_flops(M, K, N), M, K, N, xla_flops=xla.flops)

# %% [markdown]
# ## Exercise 2: the bytes it must move
#
# Write `matmul_bytes(m, k, n, itemsize)`: the bytes read from and written to HBM if
# each input is read once and the output written once (the least any kernel can move).
# `itemsize` is bytes per element: 2 for bf16, 4 for fp32.

# %%
def matmul_bytes(m, k, n, itemsize):
    ### BEGIN SOLUTION Exercise 2 (matmul bytes)
    return (m * k + k * n + m * n) * itemsize
    ### END SOLUTION


# %%
ch04.check_matmul_bytes(matmul_bytes(M, K, N, 2), M, K, N, "bf16")

# %% [markdown]
# XLA's own byte count for this program, on this runtime, is below. On a CPU it
# matches the minimum; GPU and TPU cost models count the traffic of their tiled kernels
# and give more (chapter 4, section 3).

# %% tags=["nbval-ignore-output"]
print(f"your minimum: {matmul_bytes(M, K, N, 2):,} bytes; XLA on this runtime "
      f"({rt.platform}): {xla.bytes_accessed:,.0f}")

# %% [markdown]
# ## Exercise 3: intensity, and which roof binds
#
# Write `intensity(m, k, n, itemsize)` (FLOP per byte, from your two functions) and
# `which_roof(ai, chip)`, which returns `'memory'` or `'compute'` for a kernel of
# intensity `ai` on a `hardware.Chip`. The test case is a layer with a batch of 384
# tokens against a 4096 x 4096 bf16 weight, on a v5e and on a v6e.

# %%
def intensity(m, k, n, itemsize):
    ### BEGIN SOLUTION Exercise 3a (intensity)
    return matmul_flops(m, k, n) / matmul_bytes(m, k, n, itemsize)
    ### END SOLUTION


def which_roof(ai, chip):
    ### BEGIN SOLUTION Exercise 3b (which roof)
    ridge = chip.peak_bf16_flops_per_s / chip.hbm_bytes_per_s
    return "memory" if ai < ridge else "compute"
    ### END SOLUTION


# %%
ai = intensity(384, 4096, 4096, 2)
ch04.check_intensity(ai, 384, 4096, 4096, "bf16")

# %%
ch04.check_bound(which_roof(ai, hardware.get("v5e")), ai, "v5e")

# %%
ch04.check_bound(which_roof(ai, hardware.get("v6e")), ai, "v6e")

# %% [markdown]
# ## Exercise 4: the fastest it can possibly run
#
# Write `fastest_time_s(flops, nbytes, chip)`: the roofline's lower bound on the time
# of a kernel, in seconds. Compute and memory traffic overlap on a TPU.

# %%
def fastest_time_s(flops, nbytes, chip):
    ### BEGIN SOLUTION Exercise 4 (roofline time)
    return max(flops / chip.peak_bf16_flops_per_s, nbytes / chip.hbm_bytes_per_s)
    ### END SOLUTION


# %%
f4, b4 = matmul_flops(384, 4096, 4096), matmul_bytes(384, 4096, 4096, 2)
ch04.check_roofline_time(fastest_time_s(f4, b4, hardware.get("v6e")), f4, b4, "v6e")

# %% [markdown]
# ## Exercise 5: a layer by hand, against XLA
#
# Count the FLOPs of `relu(x @ w + b)` for `x: [B, D]`, `w: [D, H]`, `b: [H]` in
# `layer_flops(B, D, H)`. The checker compiles the layer and compares with XLA's cost
# analysis within 5 %; if you count only the matmul, it tells you what the gap is.

# %%
def layer_flops(B, D, H):
    ### BEGIN SOLUTION Exercise 5 (layer FLOPs)
    return 2 * B * D * H + B * H + B * H  # matmul, bias add, relu
    ### END SOLUTION


def layer(x, w, b):
    return jax.nn.relu(x @ w + b)


# %%
Bs, Ds, Hs = 32, 1024, 512
shapes = (jax.ShapeDtypeStruct((Bs, Ds), jnp.float32), jax.ShapeDtypeStruct((Ds, Hs), jnp.float32),
          jax.ShapeDtypeStruct((Hs,), jnp.float32))
ch04.check_xla_flops(layer_flops(Bs, Ds, Hs), layer, *shapes)

# %% [markdown]
# ## Exercise 6: how big is an array on a TPU?
#
# HBM stores a 2-D array in tiles of 8 rows x 128 columns (`T(8,128)` in the HLO): the
# last dimension pads up to a multiple of 128, the one before to a multiple of 8.
# Write `tpu_bytes(rows, cols, itemsize)`. With the TPU extra installed, the checker
# compiles a program for a TPU v5e that this machine does not have and reads the TPU
# compiler's memory analysis.

# %%
def tpu_bytes(rows, cols, itemsize):
    ### BEGIN SOLUTION Exercise 6 (TPU padded bytes)
    return math.ceil(rows / 8) * 8 * math.ceil(cols / 128) * 128 * itemsize
    ### END SOLUTION


# %%
ch04.check_padded_bytes(tpu_bytes(100, 100, 4), (100, 100), "fp32")

# %%
ch04.check_padded_bytes(tpu_bytes(129, 128, 4), (129, 128), "fp32")

# %% [markdown]
# ## Exercise 7: time it yourself
#
# Write `time_it(f, x)`: the time of one call of the jitted `f` on `x`, in seconds,
# measured correctly by hand (no harness): warm up, wait for the result, and take the
# best or the median of several runs. The checker times the same call with
# `bench.benchmark` and tells you which classic mistake a far-off number looks like.

# %%
def time_it(f, x):
    ### BEGIN SOLUTION Exercise 7 (a correct hand timing)
    f(x).block_until_ready()  # warm-up: trace and compile outside the timing
    times = []
    for _ in range(10):
        start = time.perf_counter()
        f(x).block_until_ready()  # wait for the device, not just the dispatch
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
    ### END SOLUTION


# %% tags=["nbval-ignore-output"]
g = jax.jit(lambda x: jnp.tanh(x @ x) @ x)
x7 = jax.random.normal(jax.random.key(0), (512, 512), jnp.float32)
ch04.check_timing(time_it(g, x7), g, x7)

# %% [markdown]
# ## Measure: the prediction against this runtime
#
# On a TPU or GPU, the last cell measures a large bf16 matmul and sets it against your
# roofline time for this chip. On a CPU there is no chip in the table to predict for,
# and the cell says so instead of comparing a CPU with a TPU.

# %% tags=["nbval-ignore-output"]
if rt.chip is None:
    print("No accelerator in tpu_course.hardware on this runtime: nothing to compare. "
          "Run this lab on a TPU or GPU runtime to close the loop.")
else:
    n = 8192
    a = jnp.ones((n, n), jnp.bfloat16)
    r = bench.benchmark(jax.jit(jnp.matmul), a, a, repeats=10, warn=False,
                        flops=matmul_flops(n, n, n))
    predicted = fastest_time_s(matmul_flops(n, n, n), matmul_bytes(n, n, n, 2), rt.chip)
    print(f"predicted at best {predicted * 1e3:.3f} ms, measured {r.median_s * 1e3:.3f} ms "
          f"on {rt.device_kind}: {predicted / r.median_s:.0%} of the roofline")
