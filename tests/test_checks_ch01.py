"""Lab 1 checkers accept the solution and name the plausible mistakes."""

from __future__ import annotations

import math

import numpy as np

from tpu_course import systolic
from tpu_course.checks import ch01


# -- Exercise 1 -------------------------------------------------------------------------

def arrives(i, k, j, rows, cols):
    return rows + i + k + j


def leaves(i, j, rows, cols):
    return 2 * rows - 1 + i + j


def test_schedule_accepts_solution():
    assert ch01.check_schedule(arrives, leaves)
    assert ch01.check_schedule(arrives, leaves, rows=3, cols=5, m=4)


def test_schedule_names_mistakes():
    r = ch01.check_schedule(lambda i, k, j, R, C: i + k + j, leaves)
    assert not r and "forgot the weight preload" in r.message
    r = ch01.check_schedule(lambda i, k, j, R, C: R + i + k + j + 1, leaves)
    assert not r and "off by one at the fill" in r.message
    r = ch01.check_schedule(lambda i, k, j, R, C: R + i + j, leaves)
    assert not r and "skew" in r.message
    r = ch01.check_schedule(arrives, lambda i, j, R, C: 2 * R + i + j)
    assert not r and "off by one" in r.message
    r = ch01.check_schedule(arrives, lambda i, j, R, C: R + i + j)
    assert not r and "travel down all R rows" in r.message


def test_schedule_not_written():
    def stub(*args):
        raise NotImplementedError("Exercise 1")
    assert "not written yet" in ch01.check_schedule(stub, stub).message


# -- Exercise 2 -------------------------------------------------------------------------

def tiled(a, b, rows, cols, sim):
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.int64)
    for n0 in range(0, n, cols):
        for k0 in range(0, k, rows):
            run = sim(a[:, k0:k0 + rows], b[k0:k0 + rows, n0:n0 + cols], rows, cols)
            out[:, n0:n0 + cols] += run.result
    return out


def test_tiling_accepts_solution():
    r = ch01.check_tiled_matmul(tiled)
    assert r and "matches a @ b" in r.message


def test_tiling_names_forgotten_accumulation():
    def overwrite(a, b, rows, cols, sim):
        out = np.zeros((a.shape[0], b.shape[1]), np.int64)
        for n0 in range(0, b.shape[1], cols):
            for k0 in range(0, a.shape[1], rows):
                out[:, n0:n0 + cols] = sim(a[:, k0:k0 + rows], b[k0:k0 + rows, n0:n0 + cols],
                                           rows, cols).result
        return out
    r = ch01.check_tiled_matmul(overwrite)
    assert not r and "forgot to accumulate" in r.message


def test_tiling_names_transposed_tile():
    def transposed(a, b, rows, cols, sim):
        out = np.zeros((a.shape[0], b.shape[1]), np.int64)
        for n0 in range(0, b.shape[1], cols):
            for k0 in range(0, a.shape[1], rows):
                w = b[k0:k0 + rows, n0:n0 + cols]
                w = w.T if w.shape[0] == w.shape[1] else w
                out[:, n0:n0 + cols] += sim(a[:, k0:k0 + rows], w, rows, cols).result
        return out
    r = ch01.check_tiled_matmul(transposed)
    assert not r and "transposed" in r.message


def test_tiling_refuses_tiles_too_big_and_shortcuts():
    r = ch01.check_tiled_matmul(lambda a, b, rows, cols, sim: sim(a, b, rows, cols).result)
    assert not r and "cut b into tiles that fit" in r.message
    r = ch01.check_tiled_matmul(lambda a, b, rows, cols, sim: a @ b)
    assert not r and "never called sim" in r.message
    r = ch01.check_tiled_matmul(lambda a, b, rows, cols, sim: (a @ b).T)
    assert not r and "transposed result" in r.message


# -- Exercise 3 -------------------------------------------------------------------------

def predict(M, K, N, rows, cols):
    folds = math.ceil(K / rows) * math.ceil(N / cols)
    cycles = rows + (folds - 1) * max(M, rows) + M + rows + cols - 2
    return cycles, M * K * N / (rows * cols * cycles)


def test_prediction_accepts_solution():
    assert ch01.check_prediction(predict)


def test_prediction_names_mistakes():
    def no_overlap(M, K, N, R, C):
        c = systolic.cycle_count(M, K, N, R, C, "ws", "scalesim") + 1
        return c, M * K * N / (R * C * c)
    r = ch01.check_prediction(no_overlap)
    assert not r and "SCALE-Sim's convention" in r.message

    def no_load(M, K, N, R, C):
        c, _ = predict(M, K, N, R, C)
        return c - R, M * K * N / (R * C * (c - R))
    r = ch01.check_prediction(no_load)
    assert not r and "first weight load" in r.message

    def off_by_one(M, K, N, R, C):
        c, u = predict(M, K, N, R, C)
        return c - 1, u
    r = ch01.check_prediction(off_by_one)
    assert not r and "off by one" in r.message

    def padded_util(M, K, N, R, C):
        c, _ = predict(M, K, N, R, C)
        return c, M * math.ceil(K / R) * R * math.ceil(N / C) * C / (R * C * c)
    r = ch01.check_prediction(padded_util)
    assert not r and "padded MACs" in r.message


# -- Exercise 4 -------------------------------------------------------------------------

def test_bf16_running_sum_matches_ml_dtypes():
    ml = __import__("pytest").importorskip("ml_dtypes")
    bf = ml.bfloat16
    total = bf(0)
    for _ in range(1000):
        total = bf(np.float32(total) + np.float32(1))
    assert ch01.bf16_running_sum(np.ones(1000, np.float32)) == float(total) == 256.0
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    np.testing.assert_array_equal(ch01._bf16(x), x.astype(bf).astype(np.float32))


def test_bf16_check():
    assert ch01.check_bf16(256.0, 2 ** -7)
    r = ch01.check_bf16(1000.0, 2 ** -7)
    assert not r and "fp32 accumulator" in r.message
    r = ch01.check_bf16(256.0, 2 ** -8)
    assert not r and "unit roundoff" in r.message
    r = ch01.check_bf16(256.0, 2 ** -10)
    assert not r and "fp16" in r.message
    assert not ch01.check_bf16(None, None)
