"""tpu_course.systolic against numpy, its own closed form, and SCALE-Sim 3.0.0's reports."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_course import systolic as S
from tpu_course.systolic import batched
from tpu_course.systolic.batched import os_tags, stream_tags

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)

DATA = pathlib.Path(__file__).parent / "data" / "scalesim_cases.json"

shapes = st.tuples(st.integers(1, 11), st.integers(1, 11), st.integers(1, 11))
arrays = st.tuples(st.integers(1, 6), st.integers(1, 6))
dataflows = st.sampled_from(S.DATAFLOWS)
timings = st.sampled_from(S.TIMINGS)


def _ints(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(-9, 10, (m, k)), rng.integers(-9, 10, (k, n))


@settings(max_examples=120, deadline=None)
@given(shapes, arrays, dataflows, timings)
def test_result_and_cycles_match_matmul_and_closed_form(mkn, rc, dataflow, timing):
    m, k, n = mkn
    rows, cols = rc
    a, b = _ints(m, k, n)
    run = S.simulate(a, b, rows, cols, dataflow, timing)
    assert run.result.dtype == np.int64
    np.testing.assert_array_equal(run.result, a @ b)
    assert run.cycles == S.cycle_count(m, k, n, rows, cols, dataflow, timing)
    assert (run.preload_cycles + run.fill_cycles + run.steady_cycles + run.drain_cycles
            + run.count_offset) == run.cycles
    assert min(run.preload_cycles, run.fill_cycles, run.steady_cycles, run.drain_cycles) >= 0
    assert run.folds == S.fold_count(m, k, n, rows, cols, dataflow) == len(run.fold_stats)
    # every useful MAC happened exactly once, in some cycle
    assert int(run.macs_per_cycle.sum()) == m * k * n == run.useful_macs
    assert run.utilization == pytest.approx(S.utilization(m, k, n, rows, cols, dataflow, timing))


@settings(max_examples=40, deadline=None)
@given(shapes, arrays, dataflows, timings, st.sampled_from([np.float32, np.float64]))
def test_floats_bit_equal_to_same_order_reference(mkn, rc, dataflow, timing, dtype):
    m, k, n = mkn
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    run = S.simulate(a, b, *rc, dataflow=dataflow, timing=timing)
    assert run.result.dtype == dtype
    np.testing.assert_array_equal(run.result, S.reference_matmul(a, b, rc[0], rc[1], dataflow))
    np.testing.assert_allclose(run.result, a @ b, rtol=1e-4, atol=1e-4)


def test_reference_order_matters_for_floats():
    # the same numbers summed in tiles of 2 or all at once give different float32 answers
    x = np.array([[1e8, 1.0, -1e8, 1.0]], np.float32)
    y = np.ones((4, 1), np.float32)
    assert S.simulate(x, y, 2, 1, "ws").result[0, 0] == 0.0
    assert S.simulate(x, y, 4, 1, "ws").result[0, 0] == 1.0


@settings(max_examples=80, deadline=None)
@given(shapes, arrays, dataflows)
def test_peak_utilisation_is_one_exactly_when_a_full_tile_fills_the_pipeline(mkn, rc, dataflow):
    m, k, n = mkn
    rows, cols = rc
    a, b = _ints(m, k, n)
    run = S.simulate(a, b, rows, cols, dataflow, "scalesim")
    d_r, d_c, t = S.DATAFLOW[dataflow].dims(m, k, n)
    full_tile = d_r >= rows and d_c >= cols
    pipeline_full = t >= rows + cols - 1
    assert (run.peak_utilization == 1.0) == (full_tile and pipeline_full)
    assert (run.padding_waste == 0.0) == (d_r % rows == 0 and d_c % cols == 0)


@settings(max_examples=60, deadline=None)
@given(shapes, arrays, dataflows)
def test_tpu_timing_never_slower_than_scalesim(mkn, rc, dataflow):
    m, k, n = mkn
    tpu = S.cycle_count(m, k, n, *rc, dataflow, "tpu")
    ss = S.cycle_count(m, k, n, *rc, dataflow, "scalesim")
    # SCALE-Sim reports one less than the count; with a single fold the two agree otherwise
    # (os adds the R cycles that shift results out of the bottom edge)
    extra = rc[0] if dataflow == "os" else 0
    assert tpu <= ss + 1 + extra
    if S.fold_count(m, k, n, *rc, dataflow) == 1:
        assert tpu == ss + 1 + extra


def test_padding_staircase_on_128_array():
    u = {n: S.utilization(n, n, n, 128, 128) for n in (100, 128, 129, 256, 10_000)}
    assert u[129] < u[128] / 1.5          # one extra row/column costs a whole extra fold
    assert u[100] < 0.2 and u[10_000] > 0.95
    run = S.simulate(np.ones((100, 100), np.int64), np.ones((100, 100), np.int64), 128, 128)
    assert run.padding_waste == pytest.approx(1 - (100 * 100) / (128 * 128))


def test_weight_stationary_schedule_in_trace():
    """a[i, k] is in cell (k, j) at cycle R + i + k + j; c[i, j] leaves at 2R - 1 + i + j."""
    rows = cols = 4
    a = np.arange(1, 21).reshape(5, 4)
    b = np.arange(1, 17).reshape(4, 4)
    run = S.simulate(a, b, rows, cols, "ws", "tpu", trace=True)
    assert len(run.trace) == run.cycles
    for i in range(5):
        for k in range(4):
            for j in range(4):
                assert run.trace[rows + i + k + j].horizontal[k, j] == a[i, k]
    out = a @ b
    for i in range(5):
        for j in range(4):
            t = 2 * rows - 1 + i + j
            assert np.isnan(run.trace[t - 1].output[i, j]) and run.trace[t].output[i, j] == out[i, j]
    np.testing.assert_array_equal(run.trace[-1].output, out)
    assert [f.phase for f in run.trace[:rows]] == ["preload"] * rows


@pytest.mark.parametrize("dataflow", S.DATAFLOWS)
@pytest.mark.parametrize("timing", S.TIMINGS)
def test_trace_ends_with_the_product(dataflow, timing):
    a, b = _ints(5, 6, 7)
    run = S.simulate(a, b, 3, 4, dataflow, timing, trace=True)
    assert len(run.trace) == run.cycles - run.count_offset
    np.testing.assert_array_equal(run.trace[-1].output, a @ b)
    assert run.trace[-1].held.shape == (3, 4)


def test_traffic_tpu_accumulates_in_place():
    a, b = _ints(10, 13, 6)
    ss = S.simulate(a, b, 4, 4, "ws", "scalesim")
    tpu = S.simulate(a, b, 4, 4, "ws", "tpu")
    assert ss.result_writes == 10 * 6 * math.ceil(13 / 4)
    assert tpu.result_writes == 10 * 6
    assert ss.stationary_reads == tpu.stationary_reads == 13 * 6
    assert ss.streamed_reads == tpu.streamed_reads == 10 * 13 * math.ceil(6 / 4)
    assert ss.operand_reads == ss.stationary_reads + ss.streamed_reads


def test_access_model_matches_simulated_traffic():
    n = 10
    a, b = _ints(n, n, n)
    run = S.simulate(a, b, 4, 4, "ws", "scalesim")
    model = S.memory_accesses_per_mac(n, "systolic", rows=4, cols=4)
    assert model.reads == run.operand_reads and model.writes == run.result_writes
    assert S.memory_accesses_per_mac(n, "cpu").per_mac == 4.0
    per = [S.memory_accesses_per_mac(x, "systolic").per_mac for x in (128, 1024, 8192)]
    assert per[0] > per[1] > per[2]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 24), st.integers(1, 9), st.integers(1, 9))
def test_accesses_formula_equals_the_simulators_counts(n, rows, cols):
    """The chapter's formula (1 + ceil(n/C) + ceil(n/R)) / n is what simulate() counts."""
    a, b = _ints(n, n, n, seed=n)
    run = S.simulate(a, b, rows, cols, "ws", "scalesim")
    model = S.memory_accesses_per_mac(n, "systolic", rows=rows, cols=cols)
    assert (model.reads, model.writes) == (run.operand_reads, run.result_writes)
    formula = (1 + math.ceil(n / cols) + math.ceil(n / rows)) / n
    assert model.per_mac == pytest.approx(formula, rel=1e-12)
    assert (run.operand_reads + run.result_writes) / n**3 == pytest.approx(formula, rel=1e-12)


@pytest.mark.parametrize("n", [128, 1024, 8192])
def test_systolic_accesses_are_2_over_128_plus_1_over_n(n):
    assert S.memory_accesses_per_mac(n, "systolic").per_mac == pytest.approx(2 / 128 + 1 / n)


def _tiled_gpu_matmul_counting(a, b, tile):
    """A register-tiled matmul, written out: each tile x tile block of c lives in
    registers; each k step loads a column piece of a and a row piece of b from shared
    memory (counted) and does tile^2 MACs. Returns (c, smem reads, c writes)."""
    n = a.shape[0]
    c = np.zeros((n, n), a.dtype)
    reads = writes = 0
    for i0 in range(0, n, tile):
        for j0 in range(0, n, tile):
            acc = np.zeros((min(tile, n - i0), min(tile, n - j0)), a.dtype)  # registers
            for k in range(n):
                a_col = a[i0:i0 + tile, k]      # loaded from shared memory
                b_row = b[k, j0:j0 + tile]
                reads += a_col.size + b_row.size
                acc += np.outer(a_col, b_row)   # tile^2 MACs on registers
            c[i0:i0 + tile, j0:j0 + tile] = acc
            writes += acc.size
    return c, reads, writes


@pytest.mark.parametrize("n,tile", [(12, 1), (12, 4), (13, 4), (16, 16), (20, 8)])
def test_gpu_accesses_formula_equals_a_tiled_loop(n, tile):
    a, b = _ints(n, n, n)
    c, reads, writes = _tiled_gpu_matmul_counting(a, b, tile)
    assert (c == a @ b).all()
    model = S.memory_accesses_per_mac(n, "gpu", tile=tile)
    assert (model.reads, model.writes) == (reads, writes)


def test_gpu_accesses_fall_with_the_tile():
    per = [S.memory_accesses_per_mac(1024, "gpu", tile=t).per_mac for t in (1, 8, 64, 128)]
    assert per == sorted(per, reverse=True)
    assert per[0] == pytest.approx(2 + 1 / 1024) and per[2] == pytest.approx(2 / 64 + 1 / 1024)


def _scalesim_cases():
    doc = json.loads(DATA.read_text())
    assert doc["provenance"]["tool"].startswith("scalesim==3.0.0")
    return doc["cases"]


@pytest.mark.parametrize("case", _scalesim_cases(),
                         ids=lambda c: f"{c['rows']}x{c['cols']}-{c['dataflow']}-{c['M']}x{c['K']}x{c['N']}")
def test_matches_scalesim(case):
    """Cycles, utilisation, mapping efficiency and SRAM traffic equal SCALE-Sim's reports."""
    m, k, n, rows, cols, df = (case[x] for x in ("M", "K", "N", "rows", "cols", "dataflow"))
    assert case["stall_cycles"] == 0
    assert S.cycle_count(m, k, n, rows, cols, df, "scalesim") == case["total_cycles"]
    a, b = _ints(m, k, n)
    run = S.simulate(a, b, rows, cols, df, "scalesim")
    np.testing.assert_array_equal(run.result, a @ b)
    assert run.cycles == case["total_cycles"]
    assert 100 * run.utilization == pytest.approx(case["overall_util_pct"], rel=1e-12)
    assert 100 * run.mapping_efficiency == pytest.approx(case["mapping_efficiency_pct"], rel=1e-12)
    assert sum(f.a_in for f in run.fold_stats) == case["sram_ifmap_reads"]
    assert sum(f.b_in for f in run.fold_stats) == case["sram_filter_reads"]
    if df != "os":  # SCALE-Sim double-counts os OFMAP writes (see the data's provenance)
        assert run.result_writes == case["sram_ofmap_writes"]


@pytest.mark.parametrize("bad, fragment", [
    (dict(a=np.ones((2, 3)), b=np.ones((4, 2))), "inner dimensions do not match"),
    (dict(a=np.ones(3), b=np.ones((3, 2))), "2-D matrix"),
    (dict(a=np.ones((2, 3)), b=np.ones((3, 2)), dataflow="rs"), "unknown dataflow 'rs'"),
    (dict(a=np.ones((2, 3)), b=np.ones((3, 2)), rows=0), "rows must be a positive integer"),
    (dict(a=np.ones((2, 3)), b=np.ones((3, 2)), cols=-2), "cols must be a positive integer"),
    (dict(a=np.ones((2, 3)), b=np.ones((3, 2)), timing="fast"), "unknown timing"),
])
def test_clear_errors(bad, fragment):
    with pytest.raises(ValueError, match=fragment) as err:
        S.simulate(**bad)
    assert "got" in str(err.value) or "expected" in str(err.value)


def test_error_names_the_shapes():
    with pytest.raises(ValueError, match=r"a is 2x3 and b is 4x2"):
        S.simulate(np.ones((2, 3)), np.ones((4, 2)))


def test_repr_and_summary():
    run = S.simulate(np.ones((3, 4)), np.ones((4, 2)), 4, 2)
    assert "cycles=11" in repr(run)
    assert "preload 4" in run.summary() and "<table>" in run._repr_html_()


def _observed(run):
    return (run.cycles, run.preload_cycles, run.fill_cycles, run.steady_cycles,
            run.drain_cycles, run.stall_cycles, run.fold_stats, run.stationary_reads,
            run.streamed_reads, run.result_writes, run.macs_per_cycle.tolist())


@settings(max_examples=60, deadline=None)
@given(shapes, arrays, dataflows, timings, st.sampled_from([0, 1, 7, 40]))
def test_batched_engine_equals_cycle_by_cycle_engine(mkn, rc, dataflow, timing, batch_cells):
    """trace=False simulates one fold's movement and computes the values row by row;
    trace=True moves every register of one array cycle by cycle. Same values (as numbers:
    the trace-off engine may write a zero's sign differently), same observed cycles,
    phases, traffic, MACs per cycle, whatever the batch size (0 keeps the module's)."""
    m, k, n = mkn
    rng = np.random.default_rng(m * 1000 + k * 100 + n * 10 + rc[0])
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        if batch_cells:
            mp.setattr(batched, "_BATCH_CELLS", batch_cells)
        fast = S.simulate(a, b, *rc, dataflow=dataflow, timing=timing)
    slow = S.simulate(a, b, *rc, dataflow=dataflow, timing=timing, trace=True)
    assert fast.trace is None
    np.testing.assert_array_equal(fast.result, slow.result)
    assert _observed(fast) == _observed(slow)


@pytest.mark.parametrize("dataflow, folds", [("ws", 5 * 4), ("os", 3 * 4)])
def test_batched_engine_on_a_many_fold_problem(dataflow, folds):
    """Several batches of an 8x8 array (monkeypatched batch size), partial tiles on both
    axes: equal to the cycle-by-cycle engine and to the same-order reference."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((21, 37)).astype(np.float32)
    b = rng.standard_normal((37, 29)).astype(np.float32)
    slow = S.simulate(a, b, 8, 8, dataflow, "tpu", trace=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batched, "_BATCH_CELLS", 3 * 64)      # 3 folds per batch: tiles split
        fast = S.simulate(a, b, 8, 8, dataflow, "tpu")
    np.testing.assert_array_equal(fast.result, S.reference_matmul(a, b, 8, dataflow=dataflow))
    np.testing.assert_array_equal(fast.result, slow.result)
    assert _observed(fast) == _observed(slow)
    assert fast.folds == folds


@pytest.mark.parametrize("dataflow", S.DATAFLOWS)
def test_the_dataflow_table_says_what_stays_in_the_cells(dataflow):
    """On an array exactly the size of one fold, the table's rows/cols extents give the
    fold grid (1 x 1), and what the trace shows held in the cells at the end is the
    operand the table says stays: b for "ws", a transposed for "is", the outputs for "os"."""
    m, k, n = 3, 4, 2
    a, b = _ints(m, k, n)
    df = S.DATAFLOW[dataflow]
    rows, cols, _ = df.dims(m, k, n)
    run = S.simulate(a, b, rows, cols, dataflow, trace=True)
    assert run.fold_grid == (1, 1) and run.stationary_reads == (rows * cols if df.preload else 0)
    held = {"ws": b, "is": a.T, "os": a @ b}[dataflow]
    np.testing.assert_array_equal(run.trace[-1].held, held)


@pytest.mark.parametrize("K, R, C", [(1, 1, 1), (5, 3, 4), (2, 6, 3), (40, 8, 5)])
def test_os_tags_follow_the_documented_schedule(K, R, C):
    """Output-stationary operands enter for K cycles; the corner cell's last MAC is at
    K - 1 + R - 1 + C - 1 (the module docstring's schedule)."""
    issue, done = os_tags(K, R, C)
    assert issue.nonzero()[0].tolist() == list(range(K))
    assert done == K - 1 + R - 1 + C - 1


@pytest.mark.parametrize("T, R, C", [(1, 1, 1), (5, 3, 4), (2, 6, 3), (40, 8, 5)])
def test_stream_tags_follow_the_documented_schedule(T, R, C):
    """The tags' observed events against the module docstring: vector i enters row k at
    i + k; result (i, j) leaves the bottom of column j at i + R - 1 + j."""
    tags = stream_tags(T, R, C)
    assert tags["issue"].nonzero()[0].tolist() == list(range(T))
    assert tags["first_out"] == R - 1 and tags["last_out"] == T - 1 + R - 1 + C - 1
    for j in range(C):
        assert tags["out"][:, j].nonzero()[0].tolist() == [i + R - 1 + j for i in range(T)]
    swapped = np.zeros((R, C), int)
    for u, sel in tags["swaps"]:
        kk, jj = np.divmod(sel, C)
        assert (kk + jj == u).all()                  # the first vector's wavefront
        swapped[kk, jj] += 1
    assert (swapped == 1).all()
