"""Instruments for writing Pallas kernels (chapter 7): where a kernel runs, and the TPU
compiler's verdict on a block choice.

The kernels are written in the chapter and the lab; this module holds what grades and
explains them, and the one kernel the lab and the tests reuse:

* :func:`ktiled_kernel` and :func:`matmul_ktiled`: the K-tiled matmul with a float32
  accumulator, as chapter 7 writes it (the chapter's cell is this source); lab 7 compiles
  it to measure VMEM footprints, and the tests grade the compiler's verdicts with it.

* :func:`interpret_mode`: the ``interpret=`` argument for ``pl.pallas_call`` on this
  runtime: ``False`` on a TPU (the kernel runs for real, compiled by Mosaic), otherwise
  ``pltpu.InterpretParams()``, Pallas's TPU interpreter, which runs a TPU kernel on the
  CPU (or beside a GPU) with the TPU's semantics: a sequential grid, VMEM scratch that
  persists between grid steps, and uninitialised memory filled with NaN so that a missing
  initialisation shows.
* :func:`compile_verdict`: compile a kernel for a compile-only TPU target and say whether
  its blocks are legal and fit the compiler's scoped VMEM limit, with the bytes the
  compiler asked for.
* :func:`scoped_vmem_limit`: that limit, measured from the compiler itself.

The Pallas API the course uses has the same names on jax 0.7.2 (Colab, August 2026) and
jax 0.12: ``pl.pallas_call``, ``pl.BlockSpec(block_shape, index_map)``, ``pl.program_id``,
``pl.num_programs``, ``pl.when``, ``pltpu.VMEM``, ``pltpu.CompilerParams(
dimension_semantics=..., vmem_limit_bytes=...)`` and ``pltpu.InterpretParams()``. Those
two public names first shipped in jax 0.6.2 (JAX's changelog lists the rename under
0.7.0; 0.6.0 and 0.6.1 export ``TPUCompilerParams``, and ``TPUInterpretParams`` was never
public in a release); the course's floor (:func:`tpu_course.jax_floor`) is newer, so no
shim is needed.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable

from tpu_course import errors

#: Verdicts of :func:`compile_verdict`.
FITS, MISALIGNED, TOO_BIG = "fits", "misaligned", "too big"

_OOM_RE = re.compile(r"size\s+([\d.]+)([KMG]?)\s+and\s+limit\s+([\d.]+)([KMG]?)")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def _platform(platform: str | None) -> str:
    if platform is None:
        from tpu_course import runtime

        return runtime.describe().platform
    if platform not in ("cpu", "gpu", "tpu"):
        raise errors.CourseValueError(f"platform={platform!r}: expected 'cpu', 'gpu', 'tpu' or "
                                      "None (this runtime's)")
    return platform


def interpret_mode(platform: str | None = None) -> Any:
    """The ``interpret=`` value for a Pallas TPU kernel on this runtime.

    ``False`` on a TPU (compile with Mosaic and run on the chip); elsewhere
    ``pltpu.InterpretParams()``: the TPU interpreter, which runs the kernel's grid step by
    step with the TPU's semantics (on a GPU too: a TPU kernel is not a GPU kernel).
    ``platform`` defaults to :func:`tpu_course.runtime.describe`'s.
    """
    platform = _platform(platform)
    if platform == "tpu":
        return False
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams()


def where_kernels_run(platform: str | None = None) -> str:
    """One sentence: how this runtime runs the chapter's Pallas TPU kernels."""
    platform = _platform(platform)
    if platform == "tpu":
        return "TPU: the kernels compile with Mosaic and run on the chip; timings are TPU timings."
    where = {"gpu": "GPU", "cpu": "CPU"}.get(platform, platform)
    return (f"{where}: the kernels run in Pallas's TPU interpreter (interpret mode), which "
            "checks their numbers, not their speed; the TPU compiler, where installed, "
            "grades their blocks without a TPU.")


def parse_vmem_oom(message: str) -> tuple[int, int] | None:
    """(bytes asked for, scoped limit in bytes) from the compiler's
    ``CompileTimeScopedVmemOom`` message, or None when the message has no such numbers.

    >>> parse_vmem_oom("Scoped allocation with size 18.36M and limit 16.00M exceeded")
    (19251855, 16777216)
    """
    match = _OOM_RE.search(str(message))
    if not match:
        return None
    size, su, limit, lu = match.groups()
    return round(float(size) * _UNITS[su]), round(float(limit) * _UNITS[lu])


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The TPU compiler's verdict on one kernel: ``status`` is :data:`FITS`,
    :data:`MISALIGNED` (a block breaks the (8, 128) rule) or :data:`TOO_BIG` (the
    buffers exceed the scoped VMEM limit; ``needed_bytes`` and ``limit_bytes`` say by
    how much); ``message`` is the compiler's first line."""

    status: str
    target: str
    message: str = ""
    needed_bytes: int | None = None
    limit_bytes: int | None = None

    def __str__(self) -> str:
        if self.status == TOO_BIG and self.needed_bytes and self.limit_bytes:
            return (f"{self.target}: too big: the kernel asks for {self.needed_bytes / 2**20:.2f} "
                    f"MiB of scoped VMEM, the limit is {self.limit_bytes / 2**20:.2f} MiB")
        if self.status == MISALIGNED:
            return f"{self.target}: misaligned: a block's last two dims break the (8, 128) rule"
        return f"{self.target}: {self.status}"


def compile_verdict(fn: Callable, *args: Any, target: str = "v5e:1x1") -> Verdict:
    """Compile ``fn(*args)`` (``jax.ShapeDtypeStruct`` placeholders are enough) for the
    compile-only TPU ``target`` and report the compiler's verdict on its kernels' blocks.

    Raises :class:`tpu_course.hlo.TpuCompilerMissing` where the TPU compiler is not
    installed, and re-raises any other error (a bug in the kernel is not a verdict).
    """
    from tpu_course import hlo

    try:
        hlo.inspect(fn, *args, target=target)
    except ValueError as err:
        text = str(err)
        if "divisible by 8 and 128" in text or "block shape" in text.lower():
            return Verdict(MISALIGNED, target, text.splitlines()[0])
        raise
    except Exception as err:
        text = str(err)
        if "RESOURCE_EXHAUSTED" not in text and "VmemOom" not in text:
            raise
        sizes = parse_vmem_oom(text)
        first = next((ln for ln in text.splitlines() if "Scoped allocation" in ln),
                     text.splitlines()[0])
        return Verdict(TOO_BIG, target, first[:300], *(sizes or (None, None)))
    return Verdict(FITS, target)


def ktiled_kernel(x_ref, y_ref, o_ref, acc_ref):
    """One grid step (i, j, k): add x's block (i, k) times y's block (k, j) into a float32
    accumulator that stays in VMEM across the K steps; zero it at the first K step, write
    the output block (i, j) at the last."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    @pl.when(pl.program_id(2) == 0)  # a new output block starts: clear the accumulator
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # the MXU multiplies bf16 blocks and sums in float32: keep the float32 sums
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)  # all of K is in: write, cast once
    def _write():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_ktiled(x, y, bm=512, bk=512, bn=512, interpret=False, vmem_limit_bytes=None,
                  dimension_semantics=("parallel", "parallel", "arbitrary")):
    """``x @ y`` on a 3-D grid (M / bm, N / bn, K / bk), K innermost: each step reads a
    (bm, bk) block of x and a (bk, bn) block of y, whatever K is. ``dimension_semantics``
    tells the compiler which grid axes are independent ("parallel": M and N blocks) and
    which carry a dependence from step to step ("arbitrary": K, through the accumulator)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        ktiled_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],  # the accumulator: one, float32
        compiler_params=pltpu.CompilerParams(dimension_semantics=dimension_semantics,
                                             vmem_limit_bytes=vmem_limit_bytes),
        interpret=interpret,
    )(x, y)


def _copy_kernel(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...]


def scoped_vmem_limit(target: str = "v5e:1x1") -> int:
    """The TPU compiler's default scoped VMEM limit for ``target``, in bytes, measured:
    compile a copy kernel whose one float32 block (12 MiB in and 12 MiB out, each
    double-buffered: 48 MiB) is above the default limit of every chip the course targets
    yet below their whole VMEM, and read the limit from the compiler's refusal.

    This limit, not the chip's whole VMEM (``hardware.get(chip).vmem_bytes``), is what a
    ``pallas_call``'s buffers must fit by default; ``pltpu.CompilerParams(
    vmem_limit_bytes=...)`` raises it for one kernel.
    """
    if not isinstance(target, str):
        raise errors.CourseTypeError(f"target={target!r}: expected a topology name such as "
                                     "'v5e:1x1'")
    return _measured_limit(target.strip().lower())


@functools.lru_cache(maxsize=None)
def _measured_limit(target: str) -> int:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    block = (2048, 1536)  # two grid steps, so both buffers of each block are real
    spec = pl.BlockSpec(block, lambda i: (i, 0))
    array = jax.ShapeDtypeStruct((2 * block[0], block[1]), jnp.float32)
    probe = pl.pallas_call(_copy_kernel, out_shape=array, grid=(2,), in_specs=[spec],
                           out_specs=spec)
    verdict = compile_verdict(probe, array, target=target)
    if verdict.limit_bytes is None:
        raise errors.CourseValueError(
            f"could not read the scoped VMEM limit for {target!r} from the compiler "
            f"(verdict: {verdict.status}, {verdict.message[:200]!r}); this libtpu words its "
            "refusal differently: report it with your jax and libtpu versions.")
    return verdict.limit_bytes
