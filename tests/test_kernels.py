"""tpu_course.kernels: where kernels run, and the TPU compiler's verdict on their blocks,
checked against the compiler itself (compile-only targets, when libtpu is installed)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from tpu_course import errors, hlo, kernels
from tpu_course.checks._answers import ch07 as answers

COMPILER = hlo.tpu_compiler_problem() is None
needs_compiler = pytest.mark.skipif(not COMPILER, reason="needs the TPU compiler (libtpu)")
S = jax.ShapeDtypeStruct


def test_interpret_mode_per_platform():
    assert kernels.interpret_mode("tpu") is False
    params = kernels.interpret_mode("cpu")
    assert type(params).__name__ == "InterpretParams"
    assert "interpreter" in kernels.where_kernels_run("gpu")
    assert "TPU timings" in kernels.where_kernels_run("tpu")
    for bad in ("TPU ", "cuda", 3):
        with pytest.raises(errors.CourseValueError, match="platform"):
            kernels.interpret_mode(bad)


def test_matmul_ktiled_against_numpy_in_the_interpreter():
    """The chapter's K-tiled kernel: x @ y over several K steps and output blocks, and the
    float32 accumulator keeps bf16 inputs' sums (within bf16's output rounding)."""
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 384)).astype(np.float32)
    y = rng.standard_normal((384, 256)).astype(np.float32)
    got = kernels.matmul_ktiled(jnp.asarray(x), jnp.asarray(y), 8, 128, 128,
                                kernels.interpret_mode("cpu"))
    assert np.allclose(np.asarray(got), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)
    xb, yb = jnp.asarray(x, jnp.bfloat16), jnp.asarray(y, jnp.bfloat16)
    got = kernels.matmul_ktiled(xb, yb, 8, 128, 128, kernels.interpret_mode("cpu"))
    want = np.asarray(xb, np.float64) @ np.asarray(yb, np.float64)
    assert got.dtype == jnp.bfloat16
    assert np.abs(np.asarray(got, np.float64) - want).max() <= 2**-7 * np.abs(want).max()


def test_parse_vmem_oom():
    assert kernels.parse_vmem_oom("size 22.00M and limit 16.00M") == (22 * 2**20, 16 * 2**20)
    assert kernels.parse_vmem_oom("size 512K and limit 1.5G") == (512 * 2**10, 3 * 2**29)
    assert kernels.parse_vmem_oom("no numbers") is None


def test_scoped_vmem_limit_refuses_a_non_name():
    with pytest.raises(errors.CourseTypeError, match="topology name"):
        kernels.scoped_vmem_limit(["v5e:1x1"])


@needs_compiler
def test_scoped_vmem_limit_measured():
    # what the compiler says today: 16 MiB on a v5e, 32 MiB on a v6e, of 128 MiB of VMEM
    assert kernels.scoped_vmem_limit("v5e:1x1") == 16 * 2**20
    assert kernels.scoped_vmem_limit("V6E:1x1") == 32 * 2**20


@needs_compiler
def test_compile_verdicts_against_the_compiler():
    big = (S((4096, 4096), jnp.bfloat16), S((4096, 4096), jnp.bfloat16))
    ref = kernels.matmul_ktiled
    assert kernels.compile_verdict(functools.partial(ref, bm=512, bk=512, bn=512), *big).status \
        == kernels.FITS
    v = kernels.compile_verdict(functools.partial(ref, bm=1024, bk=512, bn=2048), *big)
    # the model counts every byte the compiler asks for here
    assert v.status == kernels.TOO_BIG and v.needed_bytes == answers.footprint(1024, 512, 2048, 2)
    assert v.limit_bytes == 16 * 2**20 and "22.00 MiB" in str(v)
    # the same blocks fit once vmem_limit_bytes raises the limit
    roomy = functools.partial(ref, bm=1024, bk=512, bn=2048, vmem_limit_bytes=32 * 2**20)
    assert kernels.compile_verdict(roomy, *big).status == kernels.FITS
    odd = functools.partial(ref, bm=256, bk=64, bn=256)
    assert kernels.compile_verdict(odd, *big).status == kernels.MISALIGNED


@needs_compiler
def test_compile_verdict_reraises_a_kernel_bug():
    def broken(x_ref, o_ref):
        o_ref[...] = x_ref[...] @ jnp.ones((3, 3))  # shapes do not match

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    fn = pl.pallas_call(broken, out_shape=S((8, 128), jnp.float32), grid=(1,),
                        in_specs=[spec], out_specs=spec)
    with pytest.raises(Exception):  # a bug in the kernel is an error, not a verdict
        kernels.compile_verdict(fn, S((8, 128), jnp.float32))
