"""Lab 2's keys: references, hidden cases and known mistakes (see :mod:`grading`).

Exercises 2 and 3 have no reference: the checker times a fresh instrument itself
(``ch02.measure_calls``, ``ch02.measure_link``). Their mistakes are wrong timers; the
rules of the public declaration name them from what the virtual clock saw."""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from grading import Key
from tpu_course import hardware
from tpu_course.checks import ch02
from tpu_course.checks.engine import Case, Mistake


def _hint(rules, message_start: str) -> str:
    """The hint of the public rule whose message starts so (one wording, kept there)."""
    (hint,) = [h for _, m, h in rules if isinstance(m, str) and m.startswith(message_start)]
    return hint


# -- Exercise 1 ----------------------------------------------------------------------------


def _ex1_hidden(rng):
    m, k, n = (int(v) for v in rng.choice(np.arange(2, 3000), 3, replace=False))
    return [Case(f"another shape ({m}x{k}) @ ({k}x{n}), m, k, n all different",
                 {"m": m, "k": k, "n": n}),
            Case("a row vector times a wide matrix",
                 {"m": 1, "k": int(rng.integers(300, 900)), "n": int(rng.integers(1000, 5000))}),
            Case("a product too large for 32-bit integers",
                 {"m": int(rng.integers(3000, 5000)), "k": 4099, "n": int(rng.integers(3000, 5000))})]


EX1 = Key(
    reference=lambda m, k, n: 2 * m * k * n,
    hidden=_ex1_hidden,
    mistakes=[
        Mistake("each multiply-accumulate is a multiply and an add: 2 FLOPs",
                lambda m, k, n: m * k * n),
        *[Mistake("every output element c[i, j] needs k multiply-adds: one dimension is "
                  "missing", f) for f in (lambda m, k, n: 2 * m * n, lambda m, k, n: 2 * m * k,
                                          lambda m, k, n: 2 * k * n)],
    ])


# -- Exercise 2 ----------------------------------------------------------------------------


def _ex2_hidden(rng):
    return [Case("a slower function of two arguments returning a tuple, a longer compile",
                 {"work_s": float(rng.uniform(0.08, 0.4)), "compile_s": float(rng.uniform(2, 6)),
                  "nargs": 2, "result": "tuple"}),
            Case("a fast function (a few milliseconds a call) returning one array",
                 {"work_s": float(rng.uniform(0.002, 0.008)), "compile_s": 0.3, "nargs": 1,
                  "result": "array"})]


def _samples(fn, args, n=5, warm=True, wait=jax.block_until_ready):
    if warm:
        wait(fn(*args))
    out = []
    for _ in range(n):
        start = time.perf_counter()
        wait(fn(*args))
        out.append(time.perf_counter() - start)
    return out


def _total(fn, *args):
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(5):
        jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _stops_early(fn, *args):
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        out = fn(*args)
        samples.append(time.perf_counter() - start)
        jax.block_until_ready(out)
    return statistics.median(samples)


def _first_leaf(out):
    first = out["small"] if isinstance(out, dict) else out[0] if isinstance(out, tuple) else out
    return first.block_until_ready()


R2 = ch02._TIMER_RULES
EX2 = Key(
    hidden=_ex2_hidden,
    mistakes=[
        Mistake(_hint(R2, "your timed region"),
                lambda fn, *a: statistics.median(_samples(fn, a, warm=False))),
        Mistake(_hint(R2, "you called fn once"), lambda fn, *a: _samples(fn, a, 1, False)[0]),
        Mistake(_hint(R2, "you timed a single"), lambda fn, *a: _samples(fn, a, 1)[0]),
        Mistake(_hint(R2, "your timer never waited"),
                lambda fn, *a: statistics.median(_samples(fn, a, wait=lambda out: out))),
        Mistake(_hint(R2, "your timer waited for one"),
                lambda fn, *a: statistics.median(_samples(fn, a, wait=_first_leaf))),
        Mistake(_hint(R2, "you returned the total"), _total),
        Mistake(_hint(R2, "your time is shorter"), _stops_early),
        Mistake(_hint(R2, "your time is about 1000x"),
                lambda fn, *a: 1e3 * statistics.median(_samples(fn, a))),
        Mistake(_hint(R2, "your time is about a million"),
                lambda fn, *a: 1e6 * statistics.median(_samples(fn, a))),
        Mistake(_hint(R2, "your answer was not measured"),
                lambda fn, *a: [jax.block_until_ready(fn(*a)) for _ in range(3)] and 0.031),
        Mistake(_hint(R2, "your function never called"), lambda fn, *a: 0.031),
    ])


# -- Exercise 3 ----------------------------------------------------------------------------


def _ex3_hidden(rng):
    rows, cols = (int(v) for v in rng.integers(200, 900, 2))
    return [Case("a float16 array of an odd shape on a slower link",
                 {"shape": (rows | 1, cols), "dtype": "float16",
                  "link_bytes_per_s": float(rng.uniform(1.5e9, 4e9))}),
            Case("a 3-D float64 array on a faster link",
                 {"shape": (3, cols, 100 + rows % 50), "dtype": "float64",
                  "link_bytes_per_s": float(rng.uniform(15e9, 40e9))})]


def _copies(host, n=3, warm=True, wait=True):
    if warm:
        copy = jax.device_put(host)
        copy.block_until_ready() if wait else None
    out = []
    for _ in range(n):
        start = time.perf_counter()
        copy = jax.device_put(host)
        if wait:
            copy.block_until_ready()
        out.append(time.perf_counter() - start)
    return out


def _rate(host):
    return host.nbytes / statistics.median(_copies(host))


def _several(host):
    jax.device_put(host).block_until_ready()
    start = time.perf_counter()
    jax.block_until_ready([jax.device_put(host) for _ in range(4)])
    return host.nbytes / (time.perf_counter() - start)


R3 = ch02._LINK_RULES
EX3 = Key(
    hidden=_ex3_hidden,
    mistakes=[
        Mistake(_hint(R3, "your timer never waited"),
                lambda h: h.nbytes / statistics.median(_copies(h, wait=False))),
        Mistake(_hint(R3, "that is elements"), lambda h: h.size / statistics.median(_copies(h))),
        Mistake(_hint(R3, "that is bits"), lambda h: 8 * _rate(h)),
        Mistake(_hint(R3, "that is 8x too small"), lambda h: _rate(h) / 8),
        Mistake(_hint(R3, "that is GB/s"), lambda h: _rate(h) / 1e9),
        Mistake(_hint(R3, "that is GB/s"), lambda h: _rate(h) / 2**30),
        Mistake(_hint(R3, "that is MB/s"), lambda h: _rate(h) / 1e6),
        Mistake(_hint(R3, "that is the seconds"), lambda h: statistics.median(_copies(h))),
        Mistake(_hint(R3, "you divided the bytes of one"), _several),
        Mistake(_hint(R3, "your answer includes the first"),
                lambda h: h.nbytes / statistics.mean(_copies(h, warm=False))),
        Mistake(_hint(R3, "your code never called"), lambda h: 7.3e9),
    ])


# -- Exercise 4 ----------------------------------------------------------------------------

BYTES, BW = 8192 * 8192 * 4, 3.1e9


def _said(start: str) -> str:
    (hint,) = [m.hint for m in ch02.check_copy_prediction.exercise.rules
               if m.hint.startswith(start)]
    return hint


EX4 = Key(
    mistakes=[
        Mistake(_said("you counted 2 bytes"), (BYTES / 2 / BW, BW)),
        Mistake(_said("count bytes, not elements"), (BYTES / 4 / BW, BW)),
        Mistake(_said("you counted bits"), (8 * BYTES / BW, BW)),
        Mistake(_said("bytes / (bytes per second)"), (BYTES / 8 / BW, BW)),
        Mistake(_said("float32 is 4 bytes"), (2 * BYTES / BW, BW)),
        Mistake(_said("that is milliseconds"), (1e3 * BYTES / BW, BW)),
        Mistake(_said("time = bytes / (bytes"), (BW / BYTES, BW)),
    ])


# -- Exercise 5 ----------------------------------------------------------------------------


def _ex5_hidden(rng):
    chips = [str(c) for c in rng.choice([c for c in ch02.PEAK_CHIPS if c != "v5e"], 2,
                                        replace=False)]
    return [Case(f"another matmul and time on a {chip}",
                 {"flops": float(2 * int(rng.integers(1000, 9000)) ** 3),
                  "seconds": float(rng.uniform(0.002, 0.2)), "chip": chip}) for chip in chips]


def _peak(chip):
    return hardware.get(chip).peak_bf16_flops_per_s


EX5 = Key(
    reference=lambda flops, seconds, chip: flops / seconds / _peak(chip),
    hidden=_ex5_hidden,
    mistakes=[
        Mistake("return a fraction between 0 and 1, not a percentage",
                lambda flops, seconds, chip: 100 * flops / seconds / _peak(chip)),
        Mistake("divide achieved FLOP/s (flops / seconds) by the peak, not the other way",
                lambda flops, seconds, chip: _peak(chip) * seconds / flops),
        Mistake("achieved FLOP/s is flops / seconds: you multiplied by the time",
                lambda flops, seconds, chip: flops * seconds / _peak(chip)),
        Mistake(ch02.check_fraction_of_peak.exercise.rules[0].hint,
                lambda flops, seconds, chip: flops / seconds / _peak("v5e")),
    ])

KEYS = {"Exercise 1": EX1, "Exercise 2": EX2, "Exercise 3": EX3, "Exercise 4": EX4,
        "Exercise 5": EX5}
