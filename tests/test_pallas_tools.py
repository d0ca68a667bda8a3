"""tpu_course.pallas_tools: where kernels run, and the TPU compiler's verdict on their
blocks, checked against the compiler itself (compile-only targets, when libtpu is
installed); bad blocks and non-kernels are refused before any compiler runs."""

from __future__ import annotations

import functools
import importlib.metadata as md

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from tpu_course import errors, hlo, pallas_tools
from tpu_course.checks import ch07

COMPILER = hlo.tpu_compiler_problem() is None
needs_compiler = pytest.mark.skipif(not COMPILER, reason="needs the TPU compiler (libtpu)")
S = jax.ShapeDtypeStruct


def test_interpret_mode_per_platform():
    assert pallas_tools.interpret_mode("tpu") is False
    params = pallas_tools.interpret_mode("cpu")
    assert type(params).__name__ == "InterpretParams"
    assert "interpreter" in pallas_tools.where_kernels_run("gpu")
    assert "TPU timings" in pallas_tools.where_kernels_run("tpu")
    for bad in ("TPU ", "cuda", 3):
        with pytest.raises(errors.CourseValueError, match="platform"):
            pallas_tools.interpret_mode(bad)


def test_matmul_ktiled_against_numpy_in_the_interpreter():
    """The chapter's K-tiled kernel: x @ y over several K steps and output blocks, and the
    float32 accumulator keeps bf16 inputs' sums (within bf16's output rounding)."""
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 384)).astype(np.float32)
    y = rng.standard_normal((384, 256)).astype(np.float32)
    got = pallas_tools.matmul_ktiled(jnp.asarray(x), jnp.asarray(y), 8, 128, 128,
                                pallas_tools.interpret_mode("cpu"))
    assert np.allclose(np.asarray(got), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)
    xb, yb = jnp.asarray(x, jnp.bfloat16), jnp.asarray(y, jnp.bfloat16)
    got = pallas_tools.matmul_ktiled(xb, yb, 8, 128, 128, pallas_tools.interpret_mode("cpu"))
    want = np.asarray(xb, np.float64) @ np.asarray(yb, np.float64)
    assert got.dtype == jnp.bfloat16
    assert np.abs(np.asarray(got, np.float64) - want).max() <= 2**-7 * np.abs(want).max()


def test_parse_vmem_oom():
    assert pallas_tools.parse_vmem_oom("size 22.00M and limit 16.00M") == (22 * 2**20, 16 * 2**20)
    assert pallas_tools.parse_vmem_oom("size 512K and limit 1.5G") == (512 * 2**10, 3 * 2**29)
    assert pallas_tools.parse_vmem_oom("no numbers") is None
    # over the whole VMEM (a v4), in libtpu 0.0.23's and 0.0.50's words
    assert pallas_tools.parse_vmem_oom("Ran out of memory in memory space vmem. Used 24.00M "
                                       "of 16.00M vmem.") == (24 * 2**20, 16 * 2**20)
    assert pallas_tools.parse_vmem_oom("Allocation (size=25165824) would exceed memory "
                                       "(size=16777216) :: #allocation3") == (24 * 2**20, 2**24)


def test_scoped_vmem_limit_refuses_a_non_name():
    with pytest.raises(errors.CourseTypeError, match="topology name"):
        pallas_tools.scoped_vmem_limit(["v5e:1x1"])


@needs_compiler
def test_scoped_vmem_limit_measured():
    # what the compiler says (libtpu 0.0.23 and 0.0.50 alike): 16 MiB on a v5e and a v5p,
    # 32 MiB on a v6e (of 128, 64 and 128 MiB of VMEM); a v4 refuses only against its
    # whole 16 MiB of VMEM, so that is its limit
    assert pallas_tools.scoped_vmem_limit("v5e:1x1") == 16 * 2**20
    assert pallas_tools.scoped_vmem_limit("V6E:1x1") == 32 * 2**20
    assert pallas_tools.scoped_vmem_limit("v5p:2x2x1") == 16 * 2**20
    assert pallas_tools.scoped_vmem_limit("v4:2x2x1") == 16 * 2**20


def _versions(*names):
    try:
        return tuple(md.version(n) for n in names)
    except md.PackageNotFoundError:
        return None


@pytest.mark.skipif(_versions("jax", "libtpu") != ("0.7.2", "0.0.23"),
                    reason="needs jax 0.7.2 with libtpu 0.0.23 (what Colab's setup upgrade "
                           "installs)")
def test_scoped_vmem_limit_on_jax_072_with_libtpu_0023():
    """That libtpu counts the probe's first block once, not twice (24 MiB): it fits a v6e's
    32 MiB, which once stopped chapter 7; the search grows it until refused."""
    fn, array = _copy_probe(12 * 2**20)
    assert pallas_tools.compile_verdict(fn, array, target="v6e:1x1").status == pallas_tools.FITS
    assert pallas_tools.scoped_vmem_limit("v6e:1x1") == 32 * 2**20
    assert pallas_tools.scoped_vmem_limit("v4:2x2x1") == 16 * 2**20


def _copy_probe(block_bytes):
    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    block = (block_bytes // 4096, 1024)
    spec = pl.BlockSpec(block, lambda i: (i, 0))
    array = S((2 * block[0], 1024), jnp.float32)
    return pl.pallas_call(copy, out_shape=array, grid=(2,), in_specs=[spec],
                          out_specs=spec), array


MiB = 2**20


def _fake_compiler(limit=None, capacity=128 * MiB, buffers=4, words=True):
    """A stand-in for libtpu: the probe with a block of b bytes asks for buffers * b."""
    asked = []

    def refusal_at(block):
        asked.append(block)
        need = buffers * block
        if need > capacity:
            return ("capacity", need, capacity) if words else None
        if limit is not None and need > limit:
            return ("scoped", need, limit) if words else None
        return None

    return refusal_at, asked


@pytest.mark.parametrize("limit, capacity, buffers, probes", [
    (16 * MiB, 128 * MiB, 4, 1),   # v5e, jax 0.12: the first probe is refused
    (32 * MiB, 128 * MiB, 2, 2),   # v6e, jax 0.7.2 + libtpu 0.0.23: it fits, then the next
    (16 * MiB, 64 * MiB, 2, 1),    # v5p counting two buffers
    (96 * MiB, 128 * MiB, 4, None),  # a limit between a fit and the whole VMEM: bisected
])
def test_the_limit_search_finds_a_scoped_limit(limit, capacity, buffers, probes):
    refusal_at, asked = _fake_compiler(limit, capacity, buffers)
    assert pallas_tools._search_limit(refusal_at) == limit
    if probes is not None:
        assert len(asked) == probes
    assert all(block % 4096 == 0 and block // 4096 % 8 == 0 for block in asked)


def test_the_limit_search_takes_the_whole_vmem_where_the_compiler_names_nothing_else():
    # v4: no scoped refusal below its 16 MiB; the search shrinks from 48 MiB, then narrows
    refusal_at, asked = _fake_compiler(None, 16 * MiB, 4)
    assert pallas_tools._search_limit(refusal_at) == 16 * MiB
    assert len(asked) <= 8


def test_the_limit_search_says_so_when_no_refusal_names_a_limit():
    never = _fake_compiler(None, capacity=2**40)[0]
    with pytest.raises(errors.CourseValueError, match="could not measure"):
        pallas_tools._search_limit(never)
    mute = _fake_compiler(16 * MiB, words=False)[0]  # refusals without numbers read as fits
    with pytest.raises(errors.CourseValueError, match="report it"):
        pallas_tools._search_limit(mute)


# -- compile_verdict refuses what is not a verdict, before any compiler runs ---------------

BIG = (S((4096, 4096), jnp.bfloat16), S((4096, 4096), jnp.bfloat16))


@pytest.mark.parametrize("blocks, error, words", [
    (dict(bm=0, bk=128, bn=128), errors.CourseValueError, "bm=0: a block size is a positive"),
    (dict(bm=-8, bk=128, bn=128), errors.CourseValueError, "bm=-8"),
    (dict(bm=128.0, bk=128, bn=128), errors.CourseTypeError, "not a float; write 128"),
    (dict(bm="128", bk=128, bn=128), errors.CourseTypeError, "not a str"),
    (dict(bm=None, bk=128, bn=128), errors.CourseTypeError, "bm=None"),
    (dict(bm=8192, bk=512, bn=512), errors.CourseValueError, "0 steps computes nothing"),
])
def test_compile_verdict_validates_the_blocks(blocks, error, words):
    fn = functools.partial(pallas_tools.matmul_ktiled, **blocks)
    with pytest.raises(error, match=words):
        pallas_tools.compile_verdict(fn, *BIG)


def test_compile_verdict_refuses_a_block_larger_than_its_array():
    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    spec = pl.BlockSpec((16, 256), lambda i: (0, 0))
    fn = pl.pallas_call(copy, out_shape=S((8, 128), jnp.float32), grid=(1,), in_specs=[spec],
                        out_specs=spec)
    with pytest.raises(errors.CourseValueError, match=r"larger than its array \(8, 128\)"):
        pallas_tools.compile_verdict(fn, S((8, 128), jnp.float32))


def test_compile_verdict_reports_a_kernel_bug_as_a_bug():
    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    one_d = pl.BlockSpec((8,), lambda i: (i,))  # a 1-D block for a 2-D array
    fn = pl.pallas_call(copy, out_shape=S((16, 128), jnp.float32), grid=(2,),
                        in_specs=[one_d], out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
    with pytest.raises(pallas_tools.KernelBug, match="fails before the TPU compiler") as got:
        pallas_tools.compile_verdict(fn, S((16, 128), jnp.float32))
    assert "same number of dimensions" in str(got.value)


def test_compile_verdict_refuses_a_function_with_no_kernel():
    with pytest.raises(pallas_tools.KernelBug, match="runs no pallas_call"):
        pallas_tools.compile_verdict(lambda a, b: jnp.dot(a, b), *BIG)
    with pytest.raises(errors.CourseTypeError, match="expected the function"):
        pallas_tools.compile_verdict("matmul", *BIG)


def test_compile_verdict_with_no_target_off_a_tpu():
    with pytest.raises(errors.CourseValueError, match="target=None compiles for this runtime"):
        pallas_tools.compile_verdict(functools.partial(pallas_tools.matmul_ktiled, bm=512,
                                                       bk=512, bn=512), *BIG, target=None)
    with pytest.raises(errors.CourseTypeError, match="topology name"):
        pallas_tools.compile_verdict(pallas_tools.matmul_ktiled, *BIG, target=5)


@needs_compiler
def test_compile_verdicts_against_the_compiler():
    big = (S((4096, 4096), jnp.bfloat16), S((4096, 4096), jnp.bfloat16))
    ref = pallas_tools.matmul_ktiled
    fits = pallas_tools.compile_verdict(functools.partial(ref, bm=512, bk=512, bn=512), *big)
    assert fits.status == pallas_tools.FITS
    v = pallas_tools.compile_verdict(functools.partial(ref, bm=1024, bk=512, bn=2048), *big)
    # the model counts every byte the compiler asks for here
    assert v.status == pallas_tools.TOO_BIG
    assert v.needed_bytes == ch07.vmem_buffers(1024, 512, 2048, 2)
    assert v.limit_bytes == 16 * 2**20 and "22.00 MiB" in str(v)
    # the same blocks fit once vmem_limit_bytes raises the limit
    roomy = functools.partial(ref, bm=1024, bk=512, bn=2048, vmem_limit_bytes=32 * 2**20)
    assert pallas_tools.compile_verdict(roomy, *big).status == pallas_tools.FITS
    odd = functools.partial(ref, bm=256, bk=64, bn=256)
    assert pallas_tools.compile_verdict(odd, *big).status == pallas_tools.MISALIGNED


@needs_compiler
def test_compile_verdict_reports_a_bug_the_tracer_finds():
    def broken(x_ref, o_ref):
        o_ref[...] = x_ref[...] @ jnp.ones((3, 3))  # shapes do not match

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    fn = pl.pallas_call(broken, out_shape=S((8, 128), jnp.float32), grid=(1,),
                        in_specs=[spec], out_specs=spec)
    with pytest.raises(pallas_tools.KernelBug):  # a bug in the kernel is not a verdict
        pallas_tools.compile_verdict(fn, S((8, 128), jnp.float32))


def _chapter7_cells(*starts: str) -> dict:
    """Run the chapter-7 twin's code cells that begin with ``starts`` (the kernel and the
    traffic model exactly as the chapter shows them) and return their namespace."""
    from jax.experimental.pallas import tpu as pltpu

    from tools import notebooks
    from tpu_course import hardware, roofline

    nb = notebooks.read_twin(notebooks.ROOT / "notebooks" / "07_pallas_kernels.py")
    namespace = {"jax": jax, "jnp": jnp, "pl": pl, "pltpu": pltpu, "hardware": hardware,
                 "roofline": roofline}
    for start in starts:
        (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(start)]
        exec(compile(cell.source, f"chapter 7: {start}", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("m, k, n, bm, bk, bn", [
    (512, 256, 1024, 128, 128, 256), (256, 512, 512, 128, 256, 128), (1024, 256, 256, 256, 64, 128),
])
def test_the_chapters_traffic_model_is_the_kernels_own_block_schedule(m, k, n, bm, bk, bn):
    """Issue 24: chapter 7's HBM traffic model (x once on the 2-D grid, once per column of
    tiles on the 3-D grid) against the bytes the kernels' own index maps move, walked in
    grid order with Pallas's skip-an-unchanged-block rule (at least two blocks per axis)."""
    ch7 = _chapter7_cells("def matmul_kernel", "def kernel_hbm_bytes")
    x, y = S((m, k), jnp.bfloat16), S((k, n), jnp.bfloat16)
    two_d = pallas_tools.block_copies(functools.partial(ch7["matmul"], bm=bm, bn=bn), x, y)
    assert [r.copies for r in two_d] == [m // bm, (m // bm) * (n // bn), (m // bm) * (n // bn)]
    assert sum(r.bytes for r in two_d) == ch7["kernel_hbm_bytes"](m, k, n, bm, bn, 2)
    three_d = pallas_tools.block_copies(
        functools.partial(pallas_tools.matmul_ktiled, bm=bm, bk=bk, bn=bn), x, y)
    assert sum(r.bytes for r in three_d) == ch7["kernel_hbm_bytes"](m, k, n, bm, bn, 2,
                                                                     k_tiled=True)
    assert str(three_d[0]).startswith("input 0: array")


def test_block_copies_needs_one_static_kernel():
    with pytest.raises(errors.CourseValueError, match="0 pallas_calls"):
        pallas_tools.block_copies(lambda a: a + 1, S((8, 128), jnp.float32))


def test_plot_blocks_draws_the_steps_blocks_and_the_vmem_buffers():
    import matplotlib

    matplotlib.use("Agg")
    x, y = S((1024, 512), jnp.bfloat16), S((512, 1024), jnp.bfloat16)
    fn = functools.partial(pallas_tools.matmul_ktiled, bm=256, bk=128, bn=256)
    fig = pallas_tools.plot_blocks(fn, x, y, step=(1, 2, 1))
    x_ax, y_ax, out_ax, vmem_ax = fig.axes[:4]
    filled = [p for p in x_ax.patches if p.get_fill()]
    assert [(p.get_x(), p.get_y()) for p in filled] == [(128, 256)]  # x's block (i=1, k=1)
    assert [(p.get_x(), p.get_y()) for p in y_ax.patches if p.get_fill()] == [(512, 128)]
    assert [(p.get_x(), p.get_y()) for p in out_ax.patches if p.get_fill()] == [(512, 256)]
    heights = [round(b.get_height() * 2**20) for b in vmem_ax.patches]
    block = {"x": 256 * 128 * 2, "y": 128 * 256 * 2, "out": 256 * 256 * 2, "acc": 256 * 256 * 4}
    assert heights == [block["x"]] * 2 + [block["y"]] * 2 + [block["out"]] * 2 + [block["acc"]]
    with pytest.raises(errors.CourseValueError, match="step="):
        pallas_tools.plot_blocks(fn, x, y, step=(9, 0, 0))
