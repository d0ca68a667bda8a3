"""Lab 2's keys (see :mod:`grading`). Exercises 2 to 4 measure their own instrument and name
mistakes by public rules (tests/test_lab02.py holds a wrong answer for each)."""

from __future__ import annotations

import numpy as np

from grading import Key
from tpu_course import hardware
from tpu_course.checks import ch02
from tpu_course.checks.engine import Case, Mistake


def _ex1_hidden(rng):
    m, k, n = (int(v) for v in rng.choice(np.arange(2, 3000), 3, replace=False))
    big = lambda: int(rng.integers(3000, 5000))
    return [Case(f"another shape ({m}x{k}) @ ({k}x{n}), m, k, n all different",
                 {"m": m, "k": k, "n": n}),
            Case("a row vector times a wide matrix",
                 {"m": 1, "k": int(rng.integers(300, 900)), "n": int(rng.integers(1000, 5000))}),
            Case("a product too large for 32-bit integers", {"m": big(), "k": 4099, "n": big()})]


EX1 = Key(reference=lambda m, k, n: 2 * m * k * n, hidden=_ex1_hidden, mistakes=[
    Mistake("each multiply-accumulate is a multiply and an add: 2 FLOPs",
            lambda m, k, n: m * k * n),
    *[Mistake("every output element c[i, j] needs k multiply-adds: one dimension is missing", f)
      for f in (lambda m, k, n: 2 * m * n, lambda m, k, n: 2 * m * k, lambda m, k, n: 2 * k * n)]])

EX2 = Key(hidden=lambda rng: [
    Case("a slower function of two arguments returning a tuple, a longer compile",
         {"work_s": float(rng.uniform(0.08, 0.4)), "compile_s": float(rng.uniform(2, 6)),
          "nargs": 2, "result": "tuple"}),
    Case("a fast function (a few milliseconds a call) returning one array",
         {"work_s": float(rng.uniform(0.002, 0.008)), "compile_s": 0.3, "nargs": 1,
          "result": "array"})])

EX3 = Key(hidden=lambda rng: [
    Case("a float16 array of an odd shape on a slower link",
         {"shape": (int(rng.integers(200, 900)) | 1, int(rng.integers(200, 900))),
          "dtype": "float16", "link_bytes_per_s": float(rng.uniform(1.5e9, 4e9))}),
    Case("a 3-D float64 array on a faster link",
         {"shape": (3, int(rng.integers(200, 900)), int(rng.integers(100, 150))),
          "dtype": "float64", "link_bytes_per_s": float(rng.uniform(15e9, 40e9))})])

_peak = lambda chip: hardware.get(chip).peak_bf16_flops_per_s
EX5 = Key(
    reference=lambda flops, seconds, chip: flops / seconds / _peak(chip),
    hidden=lambda rng: [
        Case(f"another matmul and time on a {chip}",
             {"flops": float(2 * int(rng.integers(1000, 9000)) ** 3),
              "seconds": float(rng.uniform(0.002, 0.2)), "chip": str(chip)})
        for chip in rng.choice([c for c in ch02.PEAK_CHIPS if c != "v5e"], 2, replace=False)],
    mistakes=[
        Mistake("return a fraction between 0 and 1, not a percentage",
                lambda flops, seconds, chip: 100 * flops / seconds / _peak(chip)),
        Mistake("divide achieved FLOP/s (flops / seconds) by the peak, not the other way",
                lambda flops, seconds, chip: _peak(chip) * seconds / flops),
        Mistake("achieved FLOP/s is flops / seconds: you multiplied by the time",
                lambda flops, seconds, chip: flops * seconds / _peak(chip)),
        Mistake(ch02.check_fraction_of_peak.exercise.rules[0].hint,
                lambda flops, seconds, chip: flops / seconds / _peak("v5e"))])

KEYS = {"Exercise 1": EX1, "Exercise 2": EX2, "Exercise 3": EX3, "Exercise 5": EX5}
