"""Lab 6 checkers accept the solution and reject plausible wrong answers."""

from __future__ import annotations

import pytest
from jax.sharding import PartitionSpec as P

from tpu_course import comms, parallel
from tpu_course.checks import ch06

SHAPES = {"w1": (256, 1024), "w2": (1024, 256)}
COMPILED = {s: comms.collective_bytes(s, SHAPES, devices=8, batch=64, d_out=256).by_kind()
            for s in ("dp", "fsdp", "tp")}  # equal to XLA's: tests/test_parallel.py proves it


def test_block_specs_right_and_wrong():
    assert ch06.check_block_specs(parallel.mlp_block_specs)

    def swapped(strategy, axis):
        p, x = parallel.mlp_block_specs(strategy, axis)
        return ({"w1": p["w2"], "w2": p["w1"]}, x) if strategy == "tp" else (p, x)
    r = ch06.check_block_specs(swapped)
    assert not r and "swapped" in r.message

    def fsdp_replicated_batch(strategy, axis):
        p, x = parallel.mlp_block_specs(strategy, axis)
        return (p, P()) if strategy == "fsdp" else (p, x)
    r = ch06.check_block_specs(fsdp_replicated_batch)
    assert not r and "batch" in r.message


@pytest.mark.parametrize("strategy", ["dp", "fsdp", "tp"])
def test_prediction_accepts_the_cost_model(strategy):
    assert ch06.check_prediction(strategy, COMPILED[strategy], COMPILED[strategy], 8)


def test_prediction_fsdp_as_all_reduce_is_explained():
    wrong = {"all-reduce": (3, 2097156)}  # the DP answer given for FSDP
    r = ch06.check_prediction("fsdp", wrong, COMPILED["fsdp"], 8)
    assert not r and "reduce-scatter" in r.message and "shard" in r.message


def test_prediction_dtype_factor_is_explained():
    arrays, b = COMPILED["dp"]["all-reduce"]
    r = ch06.check_prediction("dp", {"all-reduce": (arrays, 2 * b)}, COMPILED["dp"], 8)
    assert not r and "fp32" in r.message
    r = ch06.check_prediction("dp", {"all-reduce": (arrays, b // 2)}, COMPILED["dp"], 8)
    assert not r and "not 2" in r.message


def test_prediction_all_gather_full_array_is_explained():
    wrong = dict(COMPILED["fsdp"])
    wrong["all-gather"] = (2, 8 * COMPILED["fsdp"]["all-gather"][1])
    r = ch06.check_prediction("fsdp", wrong, COMPILED["fsdp"], 8)
    assert not r and "shard" in r.message


def test_prediction_ring_factor_is_explained():
    arrays, b = COMPILED["tp"]["all-reduce"]
    r = ch06.check_prediction("tp", {"all-reduce": (arrays, b * 7 // 8)}, COMPILED["tp"], 8)
    assert not r and "(N-1)/N" in r.message


def test_prediction_tp_with_gathers_is_explained():
    wrong = {"all-gather": (1, 65536), "reduce-scatter": (1, 65536)}
    r = ch06.check_prediction("tp", wrong, COMPILED["tp"], 8)
    assert not r and "column-then-row" in r.message


def test_strategy_checker():
    def right(chip, params, tokens, slices):
        rec = comms.recommend(chip, params, tokens, slices)
        return rec.within_slice, rec.across_slices
    assert ch06.check_strategy(right)
    r = ch06.check_strategy(lambda *a: ("dp", "dp"))
    assert not r and "cost model" in r.message


RING = """
import json
from tpu_course import parallel
from tpu_course.checks import ch06
mesh = parallel.cpu_mesh((8,), ("data",))
import jax
good = ch06.check_ring(parallel.ring_all_reduce, mesh)
cheat = ch06.check_ring(lambda x, axis, n: jax.lax.psum(x, axis), mesh)
def half(x, axis, n):  # only the reduce-scatter phase
    out = x
    for s in range(n - 1):
        out = out + jax.lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)]) * 0
    return out
wrong = ch06.check_ring(half, mesh)
print(json.dumps([bool(good), bool(cheat), cheat.message, bool(wrong), wrong.message]))
"""


def test_ring_checker(subprocess_runner):
    good, cheat, cheat_msg, wrong, wrong_msg = subprocess_runner(RING, devices=8, timeout_s=180)
    assert good and not cheat and "all-reduce" in cheat_msg
    assert not wrong and "psum" in wrong_msg
