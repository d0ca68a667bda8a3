"""The engines with the trace off: the movement simulated once, the values row by row.

Every fold of a run streams the same number of vectors through the same cells, so the
*movement* -- which vector sits in which register in which cycle, when a column's
weights latch, when results leave the bottom edge -- is the same for every fold. It is
simulated once, cycle by cycle, on tags (valid bits) and labels (:func:`stream_tags`,
:func:`load_path`, :func:`os_tags`), the way SCALE-Sim simulates operand addresses. What
the movement shows (``tests/test_systolic.py`` checks it against the documented
schedule) is that cell ``(k, j)`` meets vector ``i`` at stream cycle ``i + k + j``,
holding vector ``i``'s activation and the partial sum of vector ``i`` from the cell
above. The *values* then follow in the order the cells compute them, one array row at a
time for every fold and vector at once: row 0's products, then row 1 adds its products to
them, and so on (:func:`row_sweep`; :func:`os_sweep` adds output-stationary products in
the order the operands arrive). Same multiplications, same additions, same order as the
cycle-by-cycle engines of :mod:`.engines`, which ``trace=True`` runs; the same test holds
the two equal in every value (a zero's sign aside: :func:`row_sweep` writes a product of
-0 as +0), cycle count, phase, traffic record and MAC count. A controller places the
folds' timelines on one clock by the ``timing`` rule and checks the hazards the shared
array would have.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from tpu_course.systolic.dataflows import Dataflow, FoldGrid
from tpu_course.systolic.engines import (assemble_os, fold_accounting, load_feed, os_segments,
                                         stationary_tiles)
from tpu_course.systolic.results import EngineRun

# Values one batched numpy step may hold (folds x partial sums per fold): 256K, 1 MiB of
# float32 (four folds of the 128 x 128, 512^3 case), about a core's L2 cache on the
# 2-core EPYC CI runs on; there 64K made both benchmark cases ~10% slower, 1M no faster.
_BATCH_CELLS = 1 << 18


def batches(n_rows: int, n_cols: int, per_fold: int) -> Iterator[tuple[range, range]]:
    """Batches of folds of an ``n_rows x n_cols`` fold grid holding at most
    ``_BATCH_CELLS`` values (``per_fold`` each), as (row tiles, column tiles): row tiles
    outer, as many of them as fit (folds of one row tile receive the same stream), then
    the column tiles that still fit."""
    r_per = min(n_rows, max(1, _BATCH_CELLS // per_fold))
    c_per = max(1, _BATCH_CELLS // (r_per * per_fold))
    for r0 in range(0, n_rows, r_per):
        for c0 in range(0, n_cols, c_per):
            yield range(r0, min(n_rows, r0 + r_per)), range(c0, min(n_cols, c0 + c_per))


def stream_tags(T: int, R: int, C: int) -> dict[str, Any]:
    """Simulate the valid bits (*tags*) of one fold's stream of ``T`` vector slots.

    A tag enters each row at the left edge when the skewed edge buffer issues a slot
    (row ``k`` from stream cycle ``k`` to ``k + T - 1``), moves one cell right per cycle
    with its activation, and a partial sum's tag moves one row down per cycle (valid when
    the partial sum above was and the activation here is). Every fold streams ``T``
    slots through the same ``R x C`` cells, so the tags move the same way for every fold
    and are simulated once. What they show, in cycles since the stream started: when a
    vector entered (``issue``), which cells the first vector reaches in each cycle (they
    swap in the fold's weights: ``swaps``), when it first reaches the top of each column
    and when the last cell of each column swaps, and which values leaving the bottom
    edge are results (``out``).
    """
    n_feed = T + R - 1
    slot = np.zeros((n_feed, R), bool)
    for k in range(R):
        slot[k:k + T, k] = True
    bound = T + R + C + 1                       # more stream cycles than a fold may take
    tag_act, tag_nxt = np.zeros((R, C), bool), np.zeros((R, C), bool)
    tag_ps, tag_ps_nxt = np.zeros((R, C), bool), np.zeros((R, C), bool)
    live = np.zeros((R, C), bool)
    out = np.zeros((bound, C), bool)
    issue = np.zeros(bound, bool)
    swaps: list[tuple[int, np.ndarray]] = []
    first_arrival, last_swap = np.full(C, -1), np.full(C, -1)
    swapping = True
    u = 0
    while True:
        if u >= bound:
            raise RuntimeError("systolic: a fold's stream did not drain (simulator bug)")
        tag_nxt[:, 1:] = tag_act[:, :-1]
        tag_nxt[:, 0] = slot[u] if u < n_feed else False
        tag_act, tag_nxt = tag_nxt, tag_act
        tag_ps_nxt[0] = tag_act[0]
        np.logical_and(tag_ps[:-1], tag_act[1:], out=tag_ps_nxt[1:])
        tag_ps, tag_ps_nxt = tag_ps_nxt, tag_ps
        issue[u] = bool(tag_act[0, 0])
        if swapping:
            arrive = tag_act & ~live
            sel = np.flatnonzero(arrive)
            if len(sel):
                swaps.append((u, sel))
                live |= arrive
                last_swap[sel % C] = u
                first_arrival[arrive[0]] = u
                swapping = not live.all()
        out[u] = tag_ps[R - 1]
        u += 1
        if u >= n_feed and not tag_act.any():
            break
    out_cycles = np.flatnonzero(out.any(axis=1))
    return {"slot": slot, "issue": issue[:u], "swaps": swaps, "out": out[:u],
            "first_arrival": first_arrival, "last_swap": last_swap,
            "first_out": int(out_cycles[0]), "last_out": int(out_cycles[-1]),
            "last_issue": int(np.flatnonzero(issue)[-1]), "cycles": u}


def load_path(R: int, C: int) -> np.ndarray:
    """Simulate the load path of one fold on labels; return the cycle (since the load
    started) in which each column latches its weights into the shadow registers.

    Column ``j`` pushes its weight rows down from the top edge, bottom row first,
    starting ``j`` cycles late, and latches the chain into the shadow registers after
    ``R`` shifts. Every fold's weights take the same path, so one fold of labels (cell
    ``(k, j)``'s label is ``k * C + j + 1``) shows where every weight lands: the check
    that each label reaches its own cell is the check that every fold's shadow registers
    hold its tile.
    """
    labels = (np.arange(R * C) + 1).reshape(1, R, C)
    lfeed = load_feed(labels)                   # (load cycle, fold, column)
    old, chain = np.zeros((R, C), np.int64), np.zeros((R, C), np.int64)
    shadow = np.zeros((R, C), np.int64)
    latch = np.full(C, -1)
    for v in range(R + C - 1):                  # cycles since the load started
        old, chain = chain, old
        lo, hi = max(0, v - R + 1), min(C, v + 1)
        chain[1:, lo:hi] = old[:-1, lo:hi]
        chain[0, lo:hi] = lfeed[v, 0, lo:hi]
        j = v - (R - 1)
        if 0 <= j < C:
            shadow[:, j] = chain[:, j]
            latch[j] = v
    if not (shadow == labels[0]).all():
        raise RuntimeError("systolic: the load path put a weight in the wrong cell (simulator bug)")
    return latch


def run_stationary(df: Dataflow, x: np.ndarray, s: np.ndarray, R: int, C: int,
                   timing: str) -> EngineRun:
    """The weight-stationary engine with the trace off.

    The machine :func:`.engines.run_stationary` runs, observed through one fold's
    movement: when each column's weights latch (:func:`load_path`), when the edge buffer
    issues vectors, when the first vector reaches each cell (the fold's weights go live
    there) and when tagged results leave the bottom edge (:func:`stream_tags`). The
    values are the cells' multiply-adds in the order the cells do them
    (:func:`row_sweep`), a batch of folds at a time; the K tiles' partial sums are added
    in order, as they leave the array. The controller then places the folds on one clock
    by the ``timing`` rule, from those observed times: one after another for
    ``"scalesim"``, double-buffered for ``"tpu"``. It checks the hazards the shared
    array would have: a column's weights must latch before its first vector arrives,
    and (``"tpu"``) the next fold's weights must not overwrite a shadow register before
    the current fold has swapped it in.
    """
    T, kd = x.shape
    nd = s.shape[1]
    grid = FoldGrid.of(kd, nd, R, C)
    nkb, nnb, F = grid.row_tiles, grid.col_tiles, len(grid)
    dt = x.dtype
    tags = stream_tags(T, R, C)
    slot, U = tags["slot"], tags["cycles"]
    # Each column's bottom edge must send one tagged result per vector.
    if int(tags["out"].sum()) != T * C:
        raise RuntimeError("systolic: results lost in the array (simulator bug)")
    latch = load_path(R, C)
    shadow = stationary_tiles(s, grid, R, C)    # (fold, row, column): what the load path latched
    # Row k of K tile b's edge buffer sends x[i, b*R + k] (zero beyond K): (tile, row, vector)
    xs = np.zeros((T, nkb * R), dt)
    xs[:, :kd] = x
    xs = xs.reshape(T, nkb, R).transpose(1, 2, 0).copy()

    acc = np.zeros((nnb, C, T), dt)             # column tile, column, vector
    for kbs, nbs in batches(nkb, nnb, T * C):
        fidx = np.array(nbs)[:, None] * nkb + np.array(kbs)[None, :]
        res = row_sweep(xs[kbs.start:kbs.stop], shadow[fidx])
        for b_kb in range(len(kbs)):            # K tiles in order, as they accumulate
            acc[nbs.start:nbs.stop] = acc[nbs.start:nbs.stop] + res[:, b_kb]
    out = acc.transpose(2, 0, 1).reshape(T, nnb * C)[:, :nd]
    # -- controller: place the folds' observed timelines on one clock
    # The hazards, per column j: load_start + latch[j] < previous stream_start +
    # last_swap[j] (a shadow register overwritten before its swap) and load_start +
    # latch[j] >= stream_start + first_arrival[j] (weights late); the worst column decides.
    overwrite_margin = int(np.min(latch - tags["last_swap"]))
    late_margin = int(np.max(latch - tags["first_arrival"]))
    load_start, stream_start = [0] * F, [0] * F
    for f in range(F):
        if f > 0 and timing == "scalesim":  # the next load starts once the last result left
            load_start[f] = stream_start[f - 1] + tags["last_out"] + 1
        elif f > 0:                          # double buffering: load while the previous streams
            load_start[f] = stream_start[f - 1]
            if overwrite_margin < stream_start[f - 1] - load_start[f]:
                raise RuntimeError("systolic: shadow weights overwritten before their swap")
        stream_start[f] = load_start[f] + int(latch[0]) + 1      # column 0 has latched
        if f > 0 and timing == "tpu":        # ... and the previous fold has issued its vectors
            stream_start[f] = max(stream_start[f], stream_start[f - 1] + tags["last_issue"] + 1)
        if late_margin >= stream_start[f] - load_start[f]:
            raise RuntimeError("systolic: a column's weights latched after its first vector")
    ncyc = stream_start[-1] + tags["last_out"] + 1
    issue = np.zeros(ncyc, bool)
    for f in range(F):
        issue[stream_start[f]:stream_start[f] + U] |= tags["issue"][:ncyc - stream_start[f]]
    stats, macs = fold_accounting(df, grid, stream_start, T, timing, ncyc + T + R + C)
    segs = []
    last_in = {ru: int(np.flatnonzero(slot[:, :ru].any(axis=1))[-1])  # last real operand
               for ru in set(grid.rows_used)}
    for f in range(F):
        s0 = stream_start[f]
        segs.append((load_start[f], s0, s0 + tags["first_out"], s0 + last_in[grid.rows_used[f]],
                     s0 + tags["last_out"]))
    return EngineRun(out.T.copy() if df.key == "is" else out, ncyc, tuple(segs), issue, stats,
                     (nkb, nnb), macs[:ncyc])


def row_sweep(xs: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The values a batch of weight-stationary folds (``NB`` column tiles x ``KB`` K
    tiles) sends out of the bottom edge, computed one array row at a time.

    ``xs[b, k]`` holds the vectors' values that K tile ``b``'s row ``k`` receives
    (vector ``i`` at position ``i``), ``w`` (NB x KB x R x C) the folds' weights. Cell
    ``(k, j)`` multiplies vector ``i``'s activation by its weight and adds the product
    to vector ``i``'s partial sum arriving from cell ``(k - 1, j)``; row 0 has none above
    and sends its products. Every cell does that for every vector of the stream, so row
    ``k`` of every fold is one multiply (every cell's product) and one add over all
    columns and vectors. Returns NB x KB x C x T: column ``j``'s result ``i``.
    """
    R = w.shape[2]
    # Every cell's product of row k as an einsum that contracts nothing: each output is
    # one product, rounded once, added to a zero (so -0 becomes +0); a quarter faster
    # than broadcasting np.multiply here.
    products = "nbc,bt->nbct"
    psum = np.einsum(products, w[:, :, 0], xs[:, 0])
    product = np.empty_like(psum)
    for k in range(1, R):
        np.einsum(products, w[:, :, k], xs[:, k], out=product)
        np.add(product, psum, out=psum)      # the cell's product + the partial sum from above
    return psum


def os_tags(K: int, R: int, C: int) -> tuple[np.ndarray, int]:
    """Simulate the valid bits of one output-stationary fold's operands.

    A tag enters row ``i`` at the left edge at stream cycles ``i .. i + K - 1`` (with
    ``a[i, k]``) and column ``j`` at the top at ``j .. j + K - 1`` (with ``b[k, j]``), and
    moves with its operand. Returns, in cycles since the stream started, when an operand
    entered the corner cell (0, 0) (``issue``) and the last cycle in which two valid
    operands met in the bottom-right cell (its last MAC: the fold is done).
    """
    ta, tb = np.zeros((R, C), bool), np.zeros((R, C), bool)
    ri, ci = np.arange(R), np.arange(C)
    issue: list[bool] = []
    done, u = -1, 0
    while u < K or ta.any() or tb.any():
        ta[:, 1:] = ta[:, :-1].copy()
        ta[:, 0] = (u >= ri) & (u - ri < K)
        tb[1:] = tb[:-1].copy()
        tb[0] = (u >= ci) & (u - ci < K)
        issue.append(bool(ta[0, 0]))
        if ta[R - 1, C - 1] and tb[R - 1, C - 1]:
            done = u
        u += 1
    return np.array(issue), done


def run_os(df: Dataflow, a: np.ndarray, b: np.ndarray, R: int, C: int, timing: str) -> EngineRun:
    """The output-stationary engine with the trace off.

    The machine :func:`.engines.run_os` runs: ``a[i, k]`` enters row ``i`` at stream
    cycle ``k + i`` and moves right, ``b[k, j]`` enters column ``j`` at ``k + j`` and moves
    down, so the pair of step ``k`` meets in cell ``(i, j)`` at ``k + i + j`` and every
    cell adds its products in the order of ``k``. One fold's operands are simulated on
    tags (:func:`os_tags`: when operands enter, when the last cell's last MAC is); the
    values are every cell's products added in that order, a batch of folds at a time
    (:func:`os_sweep`). The controller places the folds on one clock: one after another
    for ``"scalesim"``; for ``"tpu"`` the next fold starts once the current one has
    issued its operands and its results have room to shift out (``R`` cycles), and the
    last results shift out of the bottom edge in ``R`` cycles.
    """
    M, K = a.shape
    N = b.shape[1]
    grid = df.grid(M, K, N, R, C)
    nmb, nnb, F = grid.row_tiles, grid.col_tiles, len(grid)
    dt = a.dtype
    issue_tag, done = os_tags(K, R, C)
    U = done + 1                                 # stream cycles until the last MAC
    ap = np.zeros((nmb * R, K), dt)              # rows beyond M and columns beyond N
    ap[:M] = a                                   # stream zeros, as the edge buffers do
    bp = np.zeros((K, nnb * C), dt)
    bp[:, :N] = b
    a_cols = ap.T.copy()                         # a_cols[k]: what the left edge sends at step k
    y = np.zeros((nnb, nmb, R, C), dt)           # folds in order: column tile outer
    for mbs, nbs in batches(nmb, nnb, R * C):
        acc = os_sweep(a_cols[:, mbs.start * R:mbs.stop * R], bp[:, nbs.start * C:nbs.stop * C])
        y[nbs.start:nbs.stop, mbs.start:mbs.stop] = \
            acc.reshape(len(nbs), C, len(mbs), R).transpose(0, 2, 3, 1)
    # -- controller: place the folds' timelines on one clock
    last_issue = int(np.flatnonzero(issue_tag)[-1])
    stream_start = [0] * F
    for f in range(1, F):
        gap = U if timing == "scalesim" else max(last_issue + 1, R)
        stream_start[f] = stream_start[f - 1] + gap
    ncyc = stream_start[-1] + U + (R if timing == "tpu" else 0)
    issue = np.zeros(ncyc, bool)
    for s0 in stream_start:
        issue[s0:s0 + len(issue_tag)] |= issue_tag[:ncyc - s0]
    stats, macs = fold_accounting(df, grid, stream_start, K, timing, ncyc + K + R + C)
    return EngineRun(assemble_os(grid, y.reshape(F, R, C), M, N, R, C), ncyc,
                     tuple(os_segments(grid, stream_start, K, R, C, timing)), issue, stats,
                     (nmb, nnb), macs[:ncyc])


def os_sweep(a_cols: np.ndarray, b_rows: np.ndarray) -> np.ndarray:
    """The accumulators of a batch of output-stationary folds once every operand pair
    has met.

    ``a_cols[k]`` is what the rows of the batch's row tiles receive at step ``k`` (the
    column ``k`` of ``a``), ``b_rows[k]`` what the columns of its column tiles receive
    (row ``k`` of ``b``). Cell ``(i, j)`` adds ``a[i, k] * b[k, j]`` to its accumulator
    (which starts at zero) for ``k = 0, 1, ...`` in turn: one outer product and one add
    per step for every cell of every fold. Returns the accumulators as (column, row).
    """
    K = a_cols.shape[0]
    acc = np.zeros((b_rows.shape[1], a_cols.shape[1]), a_cols.dtype)
    product = np.empty_like(acc)
    for k in range(K):
        np.multiply(b_rows[k, :, None], a_cols[k, None, :], out=product)
        np.add(acc, product, out=acc)
    return acc
