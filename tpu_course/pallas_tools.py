"""Pallas helpers for chapter 7: where a kernel runs, the TPU compiler's verdict on its
blocks, and the compiler's scoped VMEM limit (the kernels themselves are written in the
chapter and the lab).

* :func:`interpret_mode`: the ``interpret=`` argument for ``pl.pallas_call`` on this
  runtime: ``False`` on a TPU (the kernel runs for real, compiled by Mosaic), otherwise
  ``pltpu.InterpretParams()``, Pallas's TPU interpreter, which runs a TPU kernel on the
  CPU (or beside a GPU) with the TPU's semantics: a sequential grid, VMEM scratch that
  persists between grid steps, and uninitialised memory filled with NaN so that a missing
  initialisation shows.
* :func:`compile_verdict`: compile a kernel for a compile-only TPU target and say whether
  its blocks are legal and fit the compiler's scoped VMEM limit, with the bytes the
  compiler asked for. Blocks are checked first (positive integers, no larger than the
  array, a grid with at least one step); a kernel that fails before the TPU compiler sees
  it is a :class:`KernelBug`, not a verdict.
* :func:`scoped_vmem_limit`: that limit, measured from the compiler itself.
* :func:`block_copies`: how often each operand's block moves between HBM and VMEM as the
  kernel's grid runs, read from its own index maps (what a traffic model must match);
  :func:`plot_blocks` draws one grid step: the blocks it uses and the VMEM they take.
* :func:`ktiled_kernel` and :func:`matmul_ktiled`: the chapter's K-tiled matmul (the
  chapter's cell is this source), which lab 7 compiles to measure VMEM footprints and the
  tests use to check the compiler's verdicts.

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
import numbers
import re
from typing import Any, Callable, Iterator

from tpu_course import errors

#: Verdicts of :func:`compile_verdict`.
FITS, MISALIGNED, TOO_BIG = "fits", "misaligned", "too big"

# How libtpu words a refusal for VMEM (each seen with jax 0.7.2 + libtpu 0.0.23 and jax
# 0.12 + libtpu 0.0.50): over the scoped limit ("scoped"), or over the whole VMEM
# ("capacity": v4, whose scoped limit is all of its 16 MiB, says only this).
_SCOPED_RE = re.compile(r"size\s+([\d.]+)([KMG]?)\s+and\s+limit\s+([\d.]+)([KMG]?)")
_USED_RE = re.compile(r"Used\s+([\d.]+)([KMG]?)\s+of\s+([\d.]+)([KMG]?)\s+vmem")
_ALLOC_RE = re.compile(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
_MISALIGNED_TEXT = "divisible by 8 and 128"  # Pallas's TPU lowering, jax 0.7.2 to 0.12
#: Keywords of a ``functools.partial`` that :func:`compile_verdict` reads as block sizes.
_BLOCK_KEYWORD = re.compile(r"^(b[a-z]|block_\w+)$")


class KernelBug(errors.CourseValueError):
    """The function or its kernel fails before the TPU compiler sees it (a block with the
    wrong number of dimensions, shapes that do not match, no ``pallas_call`` at all):
    a bug to fix, not a verdict on its blocks."""


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


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit])


def _vmem_refusal(message: str) -> tuple[str, int, int] | None:
    """``(kind, bytes asked for, limit in bytes)`` from a libtpu VMEM refusal: kind
    ``"scoped"`` (over the scoped limit) or ``"capacity"`` (over the whole VMEM)."""
    text = str(message)
    if match := _SCOPED_RE.search(text):
        size, su, limit, lu = match.groups()
        return "scoped", _bytes(size, su), _bytes(limit, lu)
    if match := _USED_RE.search(text):
        size, su, limit, lu = match.groups()
        return "capacity", _bytes(size, su), _bytes(limit, lu)
    if match := _ALLOC_RE.search(text):
        return "capacity", int(match.group(1)), int(match.group(2))
    return None


def parse_vmem_oom(message: str) -> tuple[int, int] | None:
    """(bytes asked for, limit in bytes) from the TPU compiler's VMEM refusal, or None
    when the message has no such numbers. The limit is the scoped VMEM limit
    (``CompileTimeScopedVmemOom``), or the whole VMEM where the compiler says only that
    (``Ran out of memory in memory space vmem. Used ... of ...``).

    >>> parse_vmem_oom("Scoped allocation with size 18.36M and limit 16.00M exceeded")
    (19251855, 16777216)
    >>> parse_vmem_oom("Ran out of memory in memory space vmem. Used 24.00M of 16.00M vmem.")
    (25165824, 16777216)
    """
    found = _vmem_refusal(message)
    return None if found is None else found[1:]


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


def _fn_name(fn: Any) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(inner, "__name__", type(inner).__name__)


def _check_target(target: Any) -> str:
    """The target's name; None only on a TPU runtime (this machine's own chip)."""
    if target is None:
        from tpu_course import runtime

        platform = runtime.describe().platform
        if platform != "tpu":
            raise errors.CourseValueError(
                f"target=None compiles for this runtime's own device, a {platform.upper()}, "
                "where a Pallas TPU kernel runs only in interpret mode and the TPU compiler "
                "gives no verdict. Pass a compile-only TPU target such as target='v5e:1x1' "
                "(or run the kernel with interpret=pallas_tools.interpret_mode()).")
        return "tpu"
    if not isinstance(target, str):
        from tpu_course.hlo import aot

        if isinstance(target, aot.Topology):
            return target.name
        raise errors.CourseTypeError(f"target={target!r}: expected a compile-only TPU topology "
                                     "name such as 'v5e:1x1'")
    return target


def _check_partial_blocks(fn: Any) -> None:
    """The block sizes a ``functools.partial`` fixes (``bm``, ``bk``, ``bn``, ``bq``,
    ``block_*``) must be positive integers: checked before anything is traced."""
    while isinstance(fn, functools.partial):
        for name, value in fn.keywords.items():
            if _BLOCK_KEYWORD.match(name):
                if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                    raise errors.CourseTypeError(
                        f"{name}={value!r}: a block size is a positive integer, not a "
                        f"{type(value).__name__}"
                        + (f"; write {int(value)}" if isinstance(value, float)
                           and value.is_integer() else ""))
                if value < 1:
                    raise errors.CourseValueError(
                        f"{name}={value}: a block size is a positive integer (a block of "
                        f"{value} elements holds nothing); use a multiple of 8 or 128 that "
                        "divides the array")
        fn = fn.func


def _pallas_calls(jaxpr: Any) -> Iterator[Any]:
    """Every ``pallas_call`` equation of ``jaxpr``, nested ones (under a jit) included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn
            continue
        for value in eqn.params.values():
            subs = value if isinstance(value, (tuple, list)) else (value,)
            for sub in subs:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _pallas_calls(inner)


def _block_sizes(block_shape: Any) -> list[Any]:
    """A block shape as plain sizes (``None`` for a squeezed dimension)."""
    sizes = []
    for dim in block_shape:
        size = getattr(dim, "block_size", dim)
        sizes.append(None if size is None or type(size).__name__ == "Squeezed" else size)
    return sizes


def _array_of(block: Any) -> Any:
    """The whole array a block mapping cuts into blocks (its shape and dtype)."""
    return getattr(block, "array_aval", None) or block.array_shape_dtype  # jax 0.7.2


def _block_index(block: Any, step: tuple[int, ...]) -> tuple[int, ...]:
    """The block index an operand's ``BlockSpec`` index map gives at grid ``step``."""
    import jax
    import numpy as np

    closed = block.index_map_jaxpr
    return tuple(int(i) for i in jax.core.eval_jaxpr(closed.jaxpr, closed.consts,
                                                     *(np.int32(i) for i in step)))


def _check_kernels(fn: Any, args: tuple) -> None:
    """Trace ``fn(*args)``; refuse a function with no kernel, a grid with no steps and a
    block that is not a positive integer or is larger than its array."""
    import jax

    name = _fn_name(fn)
    try:
        closed = jax.make_jaxpr(fn)(*args)
    except Exception as err:  # the learner's code failed: say so, keep the cause
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise KernelBug(
            f"{name} fails before the TPU compiler sees it: {type(err).__name__}: {first}. "
            "That is a bug in the function or its kernel (a block with the wrong number of "
            "dimensions, shapes that do not match, a block size of 0), not a verdict on its "
            "blocks: run it in the interpreter (interpret=pallas_tools.interpret_mode()) to "
            "see where.") from err
    calls = list(_pallas_calls(closed.jaxpr))
    if not calls:
        raise KernelBug(
            f"{name} runs no pallas_call: compile_verdict grades a Pallas kernel's blocks, and "
            "this function has none (XLA compiles plain jnp code itself; hlo.inspect shows "
            "what it made).")
    for eqn in calls:
        mapping = eqn.params["grid_mapping"]
        grid = tuple(mapping.grid)
        if any(isinstance(g, numbers.Integral) and g < 1 for g in grid):
            raise errors.CourseValueError(
                f"{name}'s pallas_call has grid {grid}: an axis with 0 steps computes "
                "nothing (a block larger than its array makes array // block = 0). Use "
                "blocks no larger than the arrays, that divide them.")
        for which, block in enumerate(mapping.block_mappings):
            shape = tuple(_array_of(block).shape)
            sizes = _block_sizes(block.block_shape)
            for size, dim in zip(sizes, shape):
                if size is None:
                    continue
                if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
                    raise errors.CourseValueError(
                        f"{name}: operand {which}'s block {tuple(sizes)} has the size "
                        f"{size!r}: block sizes are positive integers")
                if size > dim:
                    raise errors.CourseValueError(
                        f"{name}: operand {which}'s block {tuple(sizes)} is larger than its "
                        f"array {shape}: a block is at most the array (use the array's size "
                        "for the whole dimension)")


def compile_verdict(fn: Callable, *args: Any, target: Any = "v5e:1x1") -> Verdict:
    """Compile ``fn(*args)`` (``jax.ShapeDtypeStruct`` placeholders are enough) for the
    compile-only TPU ``target`` and report the compiler's verdict on its kernels' blocks.

    First the blocks are checked: a ``functools.partial``'s block sizes (``bm``, ``bk``,
    ``bn``, ``bq``, ``block_*``) must be positive integers, and in the traced program every
    ``pallas_call``'s grid must have at least one step and every block fit its array.
    ``target=None`` means this runtime's own TPU (refused elsewhere).

    Raises:
        CourseValueError, CourseTypeError: a bad block, grid or target.
        KernelBug: ``fn`` fails before the TPU compiler sees it, or runs no ``pallas_call``.
        TpuCompilerMissing: the TPU compiler is not installed.
        errors.CourseError: the compiler refused the program for another reason (its first
            line is quoted): a verdict is given only for blocks and VMEM.
    """
    if not callable(fn):
        raise errors.CourseTypeError(f"fn={fn!r}: expected the function that runs the kernel")
    name = _check_target(target)
    _check_partial_blocks(fn)
    _check_kernels(fn, args)
    from tpu_course import hlo

    try:
        hlo.inspect(fn, *args, target=target)
    except errors.CourseError:
        raise
    except Exception as err:  # sorted below: a verdict, or a course error
        text = str(err)
        if isinstance(err, ValueError) and _MISALIGNED_TEXT in text:
            return Verdict(MISALIGNED, name, text.splitlines()[0])
        found = _vmem_refusal(text)
        if found is not None or "VmemOom" in text:
            lines = text.splitlines()
            first = next((ln for ln in lines if _vmem_refusal(ln)),  # the line with numbers
                         next((ln for ln in lines if "vmem" in ln.lower()), lines[0]))
            for marker in ("Scoped allocation", "Used ", "Allocation (size="):
                if marker in first:  # from the numbers on, not the HLO before them
                    first = first[first.index(marker):]
                    break
            needed, limit = found[1:] if found else (None, None)
            return Verdict(TOO_BIG, name, first[:300], needed, limit)
        first = (text.strip().splitlines() or [""])[0][:300]
        raise errors.CourseError(
            f"the TPU compiler refused {_fn_name(fn)} for {name} for a reason other than its "
            f"blocks or VMEM ({type(err).__name__}: {first}); no verdict.") from err
    return Verdict(FITS, name)


@dataclasses.dataclass(frozen=True)
class BlockTraffic:
    """One operand of a kernel as its grid runs: how many times its block is copied
    between HBM and VMEM (``copies``) and the bytes that moves."""

    operand: str  # "input 0", "input 1", ..., "output 0"
    array_shape: tuple[int, ...]
    block_shape: tuple[int, ...]
    copies: int
    bytes: int

    def __str__(self) -> str:
        return (f"{self.operand}: array {self.array_shape}, block {self.block_shape}, "
                f"{self.copies:,} copies = {self.bytes / 2**20:,.2f} MiB")


def block_copies(fn: Callable, *args: Any) -> tuple[BlockTraffic, ...]:
    """The HBM traffic of ``fn(*args)``'s Pallas kernel, read from the kernel's own grid and
    ``BlockSpec`` index maps: the grid is walked in the order the TPU runs it (the last axis
    fastest), and an operand's block is copied at the first step and whenever its block
    index differs from the previous step's; an unchanged block's copy is skipped (JAX's
    Pallas TPU docs, "Pipelining"). Outputs are written back by the same rule.

    Works on any backend without running the kernel (it evaluates only the index maps), so
    a traffic model can be checked against it on a CPU. One ``pallas_call`` with a static
    grid and no scalar prefetch.
    """
    return _traffic(_one_static_kernel(fn, args, "block_copies").params["grid_mapping"])


def _one_static_kernel(fn: Callable, args: tuple, who: str) -> Any:
    """The one ``pallas_call`` equation of ``fn(*args)``, whose grid is static and whose
    index maps read the grid indices only; anything else is refused, naming ``who``."""
    import jax

    name = _fn_name(fn)
    calls = list(_pallas_calls(jax.make_jaxpr(fn)(*args).jaxpr))
    if len(calls) != 1:
        raise errors.CourseValueError(
            f"{name} runs {len(calls)} pallas_calls: {who} reads exactly one kernel "
            "(time each kernel in a function of its own)")
    mapping = calls[0].params["grid_mapping"]
    grid = tuple(mapping.grid)
    if not all(isinstance(g, numbers.Integral) for g in grid) or mapping.num_index_operands:
        raise errors.CourseValueError(
            f"{name}'s grid {grid} is dynamic or uses scalar prefetch: {who} needs a "
            "static grid whose index maps depend on the grid indices only")
    return calls[0]


def _traffic(mapping: Any) -> tuple[BlockTraffic, ...]:
    """:func:`block_copies` for a kernel's grid mapping."""
    import itertools

    import numpy as np

    rows = []
    for which, block in enumerate(mapping.block_mappings):
        array = _array_of(block)
        sizes = _block_sizes(block.block_shape)
        previous, copies = None, 0
        for step in itertools.product(*(range(int(g)) for g in mapping.grid)):
            indices = _block_index(block, step)
            copies += indices != previous
            previous = indices
        elements = int(np.prod([1 if s is None else s for s in sizes]))
        kind = "input" if which < mapping.num_inputs else "output"
        index = which if kind == "input" else which - mapping.num_inputs
        rows.append(BlockTraffic(f"{kind} {index}", tuple(array.shape),
                                 tuple(1 if s is None else int(s) for s in sizes), copies,
                                 copies * elements * np.dtype(array.dtype).itemsize))
    return tuple(rows)


def plot_blocks(fn: Callable, *args: Any, step: tuple[int, ...] | None = None) -> Any:
    """A picture of ``fn(*args)``'s kernel at one grid step: each operand's array cut into
    its blocks, the block that step uses filled in, and beside them VMEM, holding two
    buffers of each block (Pallas double-buffers: the next block arrives while this one is
    used), drawn to the same scale in bytes. Read from the kernel's own grid and index
    maps, like :func:`block_copies`; ``step`` defaults to the middle of the grid.
    """
    import itertools

    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    call = _one_static_kernel(fn, args, "plot_blocks")
    mapping = call.params["grid_mapping"]
    traffic = _traffic(mapping)
    scratch = call.params["jaxpr"].invars[len(call.params["jaxpr"].invars)
                                          - mapping.num_scratch_operands:]
    grid = tuple(int(g) for g in mapping.grid)
    step = tuple(g // 2 for g in grid) if step is None else tuple(step)
    if len(step) != len(grid) or any(not 0 <= s < g for s, g in zip(step, grid)):
        raise errors.CourseValueError(f"step={step}: a grid step of {grid} is one index per "
                                      "axis, each from 0 to that axis's size minus 1")
    fig, axes = plt.subplots(1, len(traffic) + 1, figsize=(3.2 * (len(traffic) + 1), 3.4),
                             gridspec_kw={"width_ratios": [1] * len(traffic) + [0.6]})
    vmem = []
    for ax, row, block in zip(axes, traffic, mapping.block_mappings):
        rows, cols = (row.array_shape + (1,))[:2] if len(row.array_shape) < 2 else row.array_shape[-2:]
        brows, bcols = row.block_shape[-2:] if len(row.block_shape) >= 2 else (1, row.block_shape[0])
        index = _block_index(block, step)[-2:]
        for r, c in itertools.product(range(rows // brows), range(cols // bcols)):
            ax.add_patch(Rectangle((c * bcols, r * brows), bcols, brows, fill=False, lw=0.6,
                                   ec="#57606a"))
        ax.add_patch(Rectangle((index[-1] * bcols, index[0] * brows), bcols, brows,
                               color="#0969da", alpha=0.6))
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_aspect("equal")
        ax.set_title(f"{row.operand} {list(row.array_shape)}\nblock {list(row.block_shape)}, "
                     f"copied {row.copies}x", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        vmem.append((row.operand, row.bytes // max(row.copies, 1)))
    ax = axes[-1]
    bottom = 0.0
    for i, (operand, nbytes) in enumerate(vmem):
        for buffer in range(2):
            ax.bar(0, nbytes / 2**20, bottom=bottom, color=f"C{i}", edgecolor="white",
                   label=operand if buffer == 0 else None)
            bottom += nbytes / 2**20
    for var in scratch:  # one buffer each: scratch stays in VMEM for the whole grid
        aval = getattr(var.aval, "inner_aval", var.aval)
        nbytes = int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize
        ax.bar(0, nbytes / 2**20, bottom=bottom, color="#8250df", edgecolor="white",
               label=f"scratch {list(aval.shape)} {np.dtype(aval.dtype).name}")
        bottom += nbytes / 2**20
    ax.set_xticks([])
    ax.set_ylabel("MiB of VMEM (2 buffers per block)")
    ax.set_title(f"VMEM at step {step}", fontsize=9)
    ax.set_ylim(0, bottom * 1.75)  # room for the legend above the bar
    ax.legend(fontsize=7, loc="upper center")
    fig.suptitle(f"{_fn_name(fn)}: grid {grid}; blue = the blocks step {step} works on",
                 fontsize=10)
    fig.tight_layout()
    return fig


def ktiled_kernel(x_ref, y_ref, o_ref, acc_ref):
    """One grid step (i, j, k): add x's block (i, k) times y's block (k, j) into a
    float32 accumulator that stays in VMEM across the K steps; zero it at the first K
    step, write the output block (i, j) at the last."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    @pl.when(pl.program_id(2) == 0)  # a new output block starts: clear the accumulator
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # the MXU multiplies bf16 blocks and sums in float32: keep the float32 sums
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)  # all of K is in: write once
    def _write():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_ktiled(x, y, bm=512, bk=512, bn=512, interpret=False, vmem_limit_bytes=None,
                  dimension_semantics=("parallel", "parallel", "arbitrary")):
    """``x @ y`` on a 3-D grid (M / bm, N / bn, K / bk), K innermost: each step reads a
    (bm, bk) block of x and a (bk, bn) block of y, whatever K is.
    ``dimension_semantics`` tells the compiler which grid axes are independent
    ("parallel": M and N blocks) and which carry a dependence from step to step
    ("arbitrary": K, through the accumulator)."""
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
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],  # the accumulator, float32
        compiler_params=pltpu.CompilerParams(dimension_semantics=dimension_semantics,
                                             vmem_limit_bytes=vmem_limit_bytes),
        interpret=interpret,
    )(x, y)


def _copy_kernel(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...]


#: The first probe's float32 block: 12 MiB, so 48 MiB double-buffered in and out (jax 0.12
#: counts 4 buffers) or 24 MiB (jax 0.7.2 with libtpu 0.0.23 counts 2): above the 16 MiB
#: default of v5e and v5p either way, and above v6e's 32 MiB only when double-buffered.
_PROBE_START_BYTES = 12 * 2**20
_PROBE_ROW_BYTES = 1024 * 4  # one row of the probe's (rows, 1024) float32 block


def scoped_vmem_limit(target: str = "v5e:1x1") -> int:
    """The TPU compiler's default scoped VMEM limit for ``target``, in bytes, measured:
    compile a copy kernel with one float32 block and read the limit from the compiler's
    refusal. The block starts at 12 MiB and doubles while the kernel fits (how many
    buffers the compiler counts depends on the jax and libtpu: jax 0.7.2 with libtpu
    0.0.23 counts 24 MiB for it, so on a v6e, whose limit is 32 MiB, it fits), and halves
    while it is over the chip's whole VMEM. A v4 has 16 MiB of VMEM in all and its
    compiler refuses only against that, so there the whole VMEM is the limit.

    This limit, not the chip's whole VMEM (``hardware.get(chip).vmem_bytes``), is what a
    ``pallas_call``'s buffers must fit by default; ``pltpu.CompilerParams(
    vmem_limit_bytes=...)`` raises it for one kernel.
    """
    if not isinstance(target, str):
        raise errors.CourseTypeError(f"target={target!r}: expected a topology name such as "
                                     "'v5e:1x1'")
    return _measured_limit(target.strip().lower())


def _search_limit(refusal_at: Callable[[int], tuple[str, int, int] | None],
                  start: int = _PROBE_START_BYTES, largest: int = 2**31) -> int:
    """The scoped limit from probes: ``refusal_at(block_bytes)`` compiles the probe with a
    block of that many bytes and returns None (it fits) or ``(kind, asked, limit)`` (see
    :func:`_vmem_refusal`). Grow the block while it fits, shrink it while it is over the
    whole VMEM; between the largest that fits and the smallest over the whole VMEM, look
    for a scoped refusal, and where there is none the whole VMEM is the limit."""
    def rows(nbytes: int) -> int:  # whole rows, a multiple of 8
        return max(8, nbytes // _PROBE_ROW_BYTES // 8 * 8) * _PROBE_ROW_BYTES

    fit, over, capacity, block = 0, 0, 0, rows(start)
    for _ in range(32):
        found = refusal_at(block)
        if found is None:
            fit = block
        elif found[0] == "scoped":
            return found[2]
        else:
            over, capacity = block, found[2]
        if not over:  # everything fitted so far: grow
            if block * 2 > largest:
                break
            block = rows(block * 2)
        elif not fit:  # everything was over the whole VMEM: shrink
            if block <= _PROBE_ROW_BYTES * 8:
                break
            block = rows(block // 2)
        elif over - fit <= max(over // 8, 2**20):  # no scoped refusal in between
            return capacity
        else:
            block = rows((fit + over) // 2)
    raise errors.CourseValueError(
        f"could not measure the scoped VMEM limit: probes from {start / 2**20:.0f} MiB "
        f"blocks (largest that fitted {fit / 2**20:.2f} MiB, smallest refused "
        f"{over / 2**20:.2f} MiB) gave no refusal that names a limit; this libtpu words its "
        "refusals differently: report it with your jax and libtpu versions.")


@functools.lru_cache(maxsize=None)
def _measured_limit(target: str) -> int:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def refusal_at(block_bytes: int) -> tuple[str, int, int] | None:
        block = (block_bytes // _PROBE_ROW_BYTES, 1024)
        spec = pl.BlockSpec(block, lambda i: (i, 0))
        array = jax.ShapeDtypeStruct((2 * block[0], block[1]), jnp.float32)
        probe = pl.pallas_call(_copy_kernel, out_shape=array, grid=(2,), in_specs=[spec],
                               out_specs=spec)  # two grid steps: both buffers are real
        verdict = compile_verdict(probe, array, target=target)
        if verdict.status == FITS:
            return None
        found = _vmem_refusal(verdict.message)
        if found is None:
            raise errors.CourseValueError(
                f"could not read the scoped VMEM limit for {target!r} from the compiler "
                f"(verdict: {verdict.status}, {verdict.message[:200]!r}); this libtpu words "
                "its refusal differently: report it with your jax and libtpu versions.")
        return found

    try:
        return _search_limit(refusal_at)
    except errors.CourseValueError as err:
        raise errors.CourseValueError(f"{target}: {err}") from None
