"""Lab 7's grading half: hidden cases and known mistakes (the expected outputs come from the
exercises' instruments: numpy, the chapter's kernel's BlockSpecs, the TPU compiler, the
chip). The kernels' usual mistakes are recognised from their outputs by the exercises'
rules (``tpu_course/checks/ch07.py``): running a wrong kernel on every case of every
submission would cost the grader more than it tells."""

from __future__ import annotations

from grading import Key
from tpu_course.checks.ch07 import _dense_case, _footprint_case, _scores_case
from tpu_course.checks.engine import Mistake


def _dense_hidden(rng):
    """Odd, non-square output grids with 3 or 5 K steps in float32, and K in one block
    (the zeroing, the bias and the ReLU at the same step) in bfloat16."""
    out = []  # blocks the notebook does not use; never as many row blocks as column blocks
    for dtype, steps, (bm, bk, bn) in (("float32", int(rng.choice([3, 5])), (16, 64, 128)),
                                       ("bfloat16", 1, (8, 256, 256))):
        mb, nb = [(1, 3), (3, 1), (3, 2), (2, 3)][int(rng.integers(4))]
        out.append(_dense_case(mb * bm, steps * bk, nb * bn, bm, bk, bn, dtype,
                               int(rng.integers(10, 10**6))))
    return out


def _footprint_hidden(rng):
    return [_footprint_case(int(rng.choice([8, 16, 128, 256, 1024])),
                            int(rng.choice([128, 256, 2048])), int(rng.choice([128, 384, 512])),
                            size) for size in (1, int(rng.choice([2, 4])))]


def _scores_hidden(rng):
    """Odd numbers of query blocks, head dims other than the notebook's, both dtypes."""
    out = []
    for dtype, scale in (("float32", 1.0), ("bfloat16", 7.0)):
        bq, d = int(rng.choice([8, 16])), int(rng.choice([32, 96]))
        out.append(_scores_case(bq * int(rng.choice([3, 5])), int(rng.choice([128, 384])), d,
                                bq, dtype, scale, int(rng.integers(10, 10**6))))
    return out


def _footprint(acc=4.0, buffers=2, out_buffers=2, unit=1.0, elements=False):
    def vmem_footprint(bm, bk, bn, itemsize):
        size = 1 if elements else itemsize
        blocks = buffers * (bm * bk + bk * bn) * size + out_buffers * bm * bn * size
        return (blocks + acc * bm * bn) / unit
    return vmem_footprint


_RIGHT = {"a": "fits", "b": "misaligned", "c": "fits", "d": "too big", "e": "misaligned",
          "f": "fits", "g": "too big"}

KEYS = {
    "Exercise 1": Key(hidden=_dense_hidden),
    "Exercise 2": Key(hidden=_footprint_hidden, mistakes=[
        Mistake("return bytes; divide by 2**20 only to print", _footprint(unit=2**20)),
        Mistake("return bytes, not MB: 1 MB is 10**6 bytes, and the check wants bytes",
                _footprint(unit=1e6)),
        Mistake("multiply each block's elements by itemsize (the float32 accumulator's by 4)",
                _footprint(acc=1, elements=True)),
        Mistake("itemsize is in bytes: 2 for bfloat16, 4 for float32", _footprint(unit=1 / 8)),
        Mistake("Pallas double-buffers every block it copies in or out: it fetches the next "
                "block while the MXU works on this one", _footprint(buffers=1, out_buffers=1)),
        Mistake("the scratch accumulator lives in VMEM too (float32)", _footprint(acc=0)),
        Mistake("the accumulator is float32 (4 bytes) whatever the inputs' dtype",
                lambda bm, bk, bn, s: _footprint(acc=0)(bm, bk, bn, s) + s * bm * bn),
        Mistake("the accumulator is scratch: single, since it is never copied in or out",
                _footprint(acc=8)),
        Mistake("the output block is copied out while the next one is computed: two buffers, "
                "like x's and y's", _footprint(out_buffers=1)),
    ]),
    "Exercise 3": Key(mistakes=[
        Mistake("every block is double-buffered: count your vmem_footprint against the 16 MiB "
                "scoped limit, not the chip's whole VMEM", _RIGHT | {"d": "fits", "g": "fits"}),
        Mistake("a block is misaligned when one of its last two dims is not a multiple of 8 "
                "(second to last) and 128 (last), whatever its size",
                _RIGHT | {"b": "fits", "e": "fits"}),
        Mistake("a dim that is a multiple of 8 (second to last) or 128 (last) is aligned, "
                "however large", _RIGHT | {"c": "misaligned", "f": "misaligned"}),
    ]),
    "Exercise 4": Key(hidden=_scores_hidden),
}
