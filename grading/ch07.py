"""Lab 7's hidden cases and known mistakes. The kernels' usual mistakes are the exercises'
rules: running wrong kernels on every case would cost the grader more than it tells."""

from __future__ import annotations

from grading import Key
from tpu_course.checks.ch07 import _dense_case, _footprint_case, _scores_case
from tpu_course.checks.engine import Mistake

def _dense_hidden(rng):  # odd, non-square block grids; 3 or 5 K steps, or K in one block
    return [_dense_case(mb * bm, steps * bk, nb * bn, bm, bk, bn, dtype,
                        int(rng.integers(10, 10**6)))
            for dtype, steps, (bm, bk, bn) in (
                ("float32", int(rng.choice([3, 5])), (16, 64, 128)), ("bfloat16", 1, (8, 256, 256)))
            for mb, nb in [[(1, 3), (3, 1), (3, 2), (2, 3)][int(rng.integers(4))]]]

def _scores_hidden(rng):  # odd numbers of query blocks, other head dims, both dtypes
    return [_scores_case(bq * int(rng.choice([3, 5])), int(rng.choice([128, 384])), d, bq,
                         dtype, scale, int(rng.integers(10, 10**6)))
            for dtype, scale in (("float32", 1.0), ("bfloat16", 7.0))
            for bq, d in [(int(rng.choice([8, 16])), int(rng.choice([32, 96])))]]

def _footprint(acc=4, buffers=2, out_buffers=2, unit=1, elements=False):  # acc None: itemsize
    return lambda bm, bk, bn, s: ((buffers * (bm * bk + bk * bn) + out_buffers * bm * bn) * (
        1 if elements else s) + (s if acc is None else acc) * bm * bn) / unit

_RIGHT = {**dict.fromkeys("acf", "fits"), **dict.fromkeys("be", "misaligned"),
          **dict.fromkeys("dg", "too big")}
KEYS = {
    "Exercise 1": Key(hidden=_dense_hidden),
    "Exercise 2": Key(hidden=lambda rng: [_footprint_case(
        int(rng.choice([8, 16, 128, 256, 1024])), int(rng.choice([128, 256, 2048])),
        int(rng.choice([128, 384, 512])), size) for size in (1, int(rng.choice([2, 4])))],
        mistakes=[Mistake(hint, _footprint(**wrong)) for hint, wrong in [
            ("return bytes; divide by 2**20 only to print", {"unit": 2**20}),
            ("return bytes, not MB (10**6 bytes)", {"unit": 1e6}),
            ("multiply each block's elements by itemsize (the float32 accumulator's by 4)",
             {"acc": 1, "elements": True}),
            ("itemsize is in bytes: 2 for bfloat16, 4 for float32", {"unit": 1 / 8}),
            ("Pallas double-buffers every block it copies in or out: it fetches the next block "
             "while the MXU works on this one", {"buffers": 1, "out_buffers": 1}),
            ("the scratch accumulator lives in VMEM too (float32)", {"acc": 0}),
            ("the accumulator is float32 (4 bytes) whatever the inputs' dtype", {"acc": None}),
            ("the accumulator is scratch: single, as it is never copied in or out", {"acc": 8}),
            ("the output block is double-buffered too: copied out while the next is computed",
             {"out_buffers": 1})]]),
    "Exercise 3": Key(mistakes=[Mistake(hint, _RIGHT | wrong) for hint, wrong in [
        ("every block is double-buffered: count your vmem_footprint against the 16 MiB "
         "scoped limit, not the chip's whole VMEM", {"d": "fits", "g": "fits"}),
        ("a block is misaligned when one of its last two dims is not a multiple of 8 (second "
         "to last) and 128 (last), whatever its size", {"b": "fits", "e": "fits"}),
        ("a dim that is a multiple of 8 (second to last) or 128 (last) is aligned, however "
         "large", {"c": "misaligned", "f": "misaligned"})]]),
    "Exercise 4": Key(hidden=_scores_hidden),
}
