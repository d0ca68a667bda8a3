"""Lab 4's keys: references, hidden cases and known mistakes (see :mod:`grading`)."""

from __future__ import annotations

import math

import jax

from grading import Key
from tpu_course.checks.ch04 import (LN_SHAPE, _array, _batch, _chain, _cost, check_layer_norm,
                                    elementwise_kernel, matmul_kernel)
from tpu_course.checks.engine import Case, Mistake

CHIPS = ("v4", "v5p", "v6e", "7x", "h100", "a100", "v3", "v5e")  #: hidden cases' chips
_chips = lambda rng: [str(c) for c in rng.choice(CHIPS, 2, replace=False)]

# -- Exercise 1 ----------------------------------------------------------------------------
def _ex1_hidden(rng):
    dims = lambda: tuple(int(v) for v in rng.integers(8, 300, 3))
    return [_cost("two matmuls", dims(), "bfloat16", "two matmuls in a row, in bf16"),
            _cost("pytree", dims(), "float32", "a function of a dict of parameters"),
            _cost("jitted", dims(), "float32", "a function that is already jitted"),
            _cost("softmax", dims(), "bfloat16", "a row softmax in bf16")]

def _cost_of(pick):
    """A wrong ``xla_cost``: ``pick(compiled, lowered)`` of the two cost analyses."""
    def xla_cost(fn, *args):
        lowered = jax.jit(fn).lower(*args)
        first = lambda c: c[0] if isinstance(c, (list, tuple)) else c
        return pick(first(lowered.compile().cost_analysis()), first(lowered.cost_analysis()))
    return xla_cost

EX1 = Key(hidden=_ex1_hidden, mistakes=[Mistake(hint, _cost_of(pick)) for hint, pick in [
    ("the FLOPs first, then the bytes accessed", lambda c, _: (c["bytes accessed"], c["flops"])),
    ("Lowered.cost_analysis() counts the program before XLA optimised (fused) it; compile() "
     "first and ask the Compiled object", lambda _, b: (b["flops"], b["bytes accessed"])),
    ("the entry is 'flops', not 'transcendentals'",
     lambda c, _: (c.get("transcendentals", 0.0), c["bytes accessed"])),
    ("the entry 'bytes accessed' of the compiled program's cost analysis",
     lambda c, _: (c["flops"], c["flops"]))]])

# -- Exercise 2 ----------------------------------------------------------------------------
def make_batch(out=True, size=2, round_=math.ceil, ridge_only=False, always=False):
    def compute_bound_batch(k, n, chip):
        r = chip.peak_bf16_flops_per_s / chip.hbm_bytes_per_s
        if ridge_only:
            return math.ceil(r)
        room = 2 * k * n - size * r * (k + (n if out else 0))
        if room <= 0:
            return 1 if always else None
        return round_(size * r * k * n / room)
    return compute_bound_batch

def _ex2_hidden(rng):
    a, b = _chips(rng)
    k, n = (int(v) for v in rng.integers(1024, 16384, 2))
    small = int(rng.integers(32, 96))
    return [_batch(k, n, a), _batch(n + 7, 3 * k + 1, b), _batch(small, small + 5, a)]

EX2 = Key(reference=make_batch(), hidden=_ex2_hidden, mistakes=[
    Mistake("the rule of thumb 'batch = ridge' counts only the weights' bytes; the activations "
            "x and outputs y are bytes too: count them and solve for m",
            make_batch(ridge_only=True)),
    Mistake("y, [m, n], is written to HBM too: count its bytes", make_batch(out=False)),
    Mistake("bf16 is 2 bytes per element: count bytes, not elements", make_batch(size=1)),
    Mistake("the least batch AT or above the ridge: round up, not down",
            make_batch(round_=math.floor)),
    Mistake("a batch is a whole number: round up", make_batch(round_=lambda m: m)),
    Mistake("as m grows, the intensity 2mkn / (2(mk + kn + mn)) tends to a limit: compare that "
            "limit with the ridge point; below it no batch is enough", make_batch(always=True))])

# -- Exercise 3 ----------------------------------------------------------------------------
def make_chain(per_kernel=max, pool=False, unit=1.0):
    def chain_time_s(kernels, chip):
        P, W = chip.peak_bf16_flops_per_s, chip.hbm_bytes_per_s
        if pool:
            return unit * max(sum(f for f, _ in kernels) / P, sum(b for _, b in kernels) / W)
        return unit * sum(per_kernel(f / P, b / W) for f, b in kernels)
    return chain_time_s

def _ex3_hidden(rng):
    a, b = _chips(rng)
    n = int(rng.integers(1024, 8192))
    chain = (matmul_kernel(n), elementwise_kernel(n * n * int(rng.integers(2, 6))),
             matmul_kernel(int(rng.integers(128, 512))),
             elementwise_kernel(int(rng.integers(10**6, 10**8)), 3))
    return [_chain(chain, a, "four kernels"), _chain(chain[::-1][:3], b, "three kernels"),
            _chain(chain[2:3], a, "one small matmul")]

EX3 = Key(reference=make_chain(), hidden=_ex3_hidden, mistakes=[
    Mistake("kernels run one after another: one kernel's compute does not hide another "
            "kernel's memory traffic", make_chain(pool=True)),
    Mistake("inside one kernel compute and memory overlap: its time is the larger of the two, "
            "not their sum", make_chain(lambda a, b: a + b)),
    Mistake("the kernels run one after another: their times add, not just the slowest",
            lambda kernels, chip: max(make_chain()([k], chip) for k in kernels)),
    Mistake("the larger of a kernel's compute and memory times binds", make_chain(min)),
    *[Mistake(f"that looks like {unit}: return seconds", make_chain(unit=times))
      for unit, times in (("microseconds", 1e6), ("milliseconds", 1e3))]])

# -- Exercise 4 ----------------------------------------------------------------------------
def _ex4_hidden(rng):
    shape = tuple(int(rng.integers(*r)) for r in ((16, 300), (2, 7), (64, 700)))
    return [Case(f"another layer on a few input features, M, D, H = {shape}", {"shape": shape})]

EX4 = Key(hidden=_ex4_hidden, mistakes=[
    Mistake("that is the matmul alone; with only a few inputs per output, the bias add and the "
            "relu (one FLOP per output element each) are a large share: count them",
            lambda M, D, H: 2 * M * D * H),
    *[Mistake("counted multiply-adds? each is 2 FLOPs", f) for f in (
        lambda M, D, H: M * D * H + 2 * M * H, lambda M, D, H: M * D * H)],
    Mistake("that is the count for one row of x: multiply by the batch M (the rows of x)",
            lambda M, D, H: 2 * D * H + 2 * H)])

# -- Exercise 5 ----------------------------------------------------------------------------
_pad = lambda d, to: -(-d // to) * to
_tiles = lambda r, c, sublanes=8: _pad(r, sublanes) * _pad(c, 128)

def tpu_bytes(shape, size):
    """The T(8,128) layout, laid out whichever way round pads less."""
    return min(_tiles(*shape), _tiles(*shape[::-1])) * size

#: Shapes whose HBM bytes the TPU compiler (v5e, f32 and bf16) gives as :func:`tpu_bytes`:
#: row-major pads less for the first, column-major ({0,1}) for the second (a test checks).
ROW_MAJOR_WINS = ((129, 128), (12, 1000), (57, 130), (200, 520), (9, 777), (33, 256), (24, 900))
COLUMN_MAJOR_WINS = ((300, 200), (640, 129), (100, 260), (515, 300), (130, 57), (127, 17))

def _ex5_hidden(rng):
    a = ROW_MAJOR_WINS[int(rng.integers(len(ROW_MAJOR_WINS)))]
    b, c = (COLUMN_MAJOR_WINS[i] for i in rng.choice(len(COLUMN_MAJOR_WINS), 2, replace=False))
    return [_array(a, 2), _array(b, 4), _array(c, 2)]

EX5 = Key(reference=tpu_bytes, hidden=_ex5_hidden, mistakes=[
    Mistake("HBM holds whole tiles: look at the T(...) in the layouts the chapter printed, and "
            "at the bytes beside them", lambda s, size: s[0] * s[1] * size),
    Mistake("the layout {0,1} (column-major) is the compiler's choice when it pads less: try "
            "both orders of the two dimensions", lambda s, size: _tiles(*s) * size),
    Mistake("in the layout {1,0} the LAST dimension is minor: it pads to 128 lanes, the one "
            "before to 8 sublanes", lambda s, size: _pad(s[0], 128) * _pad(s[1], 8) * size),
    Mistake("you counted padded elements: multiply by itemsize", lambda s, size: tpu_bytes(s, 1)),
    Mistake("a bf16 array's tile is still T(8,128); the (2,1) after it says how two bf16 values "
            "share one 32-bit word, not a bigger tile", lambda s, size: size * min(
                _tiles(*s, 32 // size), _tiles(*s[::-1], 32 // size))),
    Mistake("the dimension before the minor one pads to a multiple of 8 too",
            lambda s, size: size * min(s[0] * _pad(s[1], 128), s[1] * _pad(s[0], 128)))])

# -- Exercise 6: one wrong prediction per rule of the exercise, in the rules' order ---------
_N, _R = LN_SHAPE[0] * LN_SHAPE[1], LN_SHAPE[0]
EX6 = Key(mistakes=[Mistake(rule.hint, dict(zip(check_layer_norm.exercise.provides, values)))
                    for rule, values in zip(check_layer_norm.exercise.rules, [
    (7, 4 * _N, "memory"),  # FLOPs per element
    (7 * _N // _R, 4 * _N, "memory"),  # FLOPs of one row
    (7 * _N, 4, "memory"),  # bytes per element
    (7 * _N, 2 * _N, "memory"),  # x read only
    (7 * _N, 8 * _N, "memory"),  # float32 bytes
    (_N, 4 * _N, "memory"),  # one FLOP per element
    (7 * _N, 4 * _N, "compute")])])

KEYS = {"Exercise 1": EX1, "Exercise 2": EX2, "Exercise 3": EX3, "Exercise 4": EX4,
        "Exercise 5": EX5, "Exercise 6": EX6}
