"""The engines with the trace off: a batch of folds per numpy step.

Each register array gets a leading *fold* axis: slot ``b`` of a batch holds the array as
it runs fold ``b``, and one numpy step advances every fold of the batch by one cycle of
its own timeline. A fold's values never meet another fold's (in any cycle a cell holds
one fold's operands), so they are the values the shared array computes; only the clock
differs. Each fold's timeline is observed in cycles since its own start, and a controller
then places the folds on one clock by the ``timing`` rule. ``tests/test_systolic.py``
holds these engines equal to the cycle-by-cycle ones in :mod:`.engines`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from tpu_course.systolic.dataflows import Dataflow, FoldGrid
from tpu_course.systolic.engines import (assemble_os, fold_accounting, load_feed, os_segments,
                                         skewed_feed, stationary_tiles)
from tpu_course.systolic.results import EngineRun

# Cells (folds x rows x cols) one batched step may cover: 16 folds of a 128 x 128 array.
# Bigger batches mean fewer Python-level steps; on a 2-core EPYC 8-16 folds of 128 x 128
# were equally fast (bench/bench_systolic.py) and 1-2 folds clearly slower.
_BATCH_CELLS = 1 << 18


def batches(n_rows: int, n_cols: int, R: int, C: int) -> Iterator[tuple[range, range]]:
    """Batches of at most ``_BATCH_CELLS`` cells of an ``n_rows x n_cols`` grid of R x C
    folds, as (row tiles, column tiles): row tiles outer, as many of them as fit (folds
    of one row tile receive the same stream), then the column tiles that still fit."""
    r_per = min(n_rows, max(1, _BATCH_CELLS // (R * C)))
    c_per = max(1, _BATCH_CELLS // (r_per * R * C))
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


def run_stationary(df: Dataflow, x: np.ndarray, s: np.ndarray, R: int, C: int,
                   timing: str) -> EngineRun:
    """The weight-stationary engine with the trace off: many folds per numpy step.

    The machine is the one :func:`.engines.run_stationary` runs (same registers, same moves, same
    additions in the same order), but each register array gets a leading *fold* axis:
    slot ``b`` of a batch holds the array as it runs fold ``b`` (folds of one K tile
    share their activation registers, which hold the same values), and one numpy step
    advances every fold of the batch by one cycle of its own timeline. A fold's values never meet
    another fold's (in any cycle a cell holds one fold's vector), so they are the values
    the shared array computes; only the clock differs. Each fold's timeline is observed
    in cycles since its own start -- when its first column of weights latches, when its
    edge buffer issues vectors and when tagged results leave the bottom edge
    (:func:`stream_tags`) -- and the controller then places the folds on one clock by
    the ``timing`` rule, from those observed times: one after another for
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
    feed = skewed_feed(x, R)    # one per K tile: row k sends x[i, kb*R + k] at cycle i + k
    # The n-th tagged value out of the bottom of column j is result n of that column.
    jj, uu = np.divmod(np.flatnonzero(tags["out"].T.ravel()), U)
    if len(uu) != T * C:
        raise RuntimeError("systolic: results lost in the array (simulator bug)")

    # -- load path, every fold at once: column j pushes its weight rows (bottom row
    #    first) down from the top edge, starting j cycles late, and latches them into
    #    the shadow registers after R shifts
    lfeed = load_feed(stationary_tiles(s, grid, R, C))   # (load cycle, fold, column)
    chains = [np.zeros((F, R, C), dt) for _ in range(2)]
    shadow = np.zeros((F, R, C), dt)
    latch = np.full(C, -1)
    for v in range(R + C - 1):                  # cycles since the load started
        old, chain = chains[v & 1], chains[1 - (v & 1)]
        lo, hi = max(0, v - R + 1), min(C, v + 1)
        chain[:, 1:, lo:hi] = old[:, :-1, lo:hi]
        chain[:, 0, lo:hi] = lfeed[v, :, lo:hi]
        j = v - (R - 1)
        if 0 <= j < C:
            shadow[:, :, j] = chain[:, :, j]
            latch[j] = v
    del lfeed, chains

    # -- streams, a batch of folds at a time. Folds that share a K tile receive the same
    #    activation stream, so in every cycle of their timelines their activation
    #    registers hold the same values: a batch keeps one copy of them per K tile.
    out = np.zeros((T, nd), dt)
    bfeed = feed.transpose(1, 0, 2).copy()      # (cycle, K tile, row)
    for kbs, nbs in batches(nkb, nnb, R, C):
        fidx = np.array(nbs)[:, None] * nkb + np.array(kbs)[None, :]
        res = stream_batch(bfeed[:, kbs.start:kbs.stop], shadow[fidx], tags, uu, jj, T, R, C)
        for b_nb, nb in enumerate(nbs):          # K tiles in order: the
            sl = slice(nb * C, min(nd, nb * C + C))   # same order as accumulating
            for b_kb in range(len(kbs)):
                out[:, sl] = out[:, sl] + res[b_nb, b_kb, :, :sl.stop - sl.start]
    # -- controller: place the folds' observed timelines on one clock
    load_start, stream_start = [0] * F, [0] * F
    for f in range(F):
        if f > 0 and timing == "scalesim":  # the next load starts once the last result left
            load_start[f] = stream_start[f - 1] + tags["last_out"] + 1
        elif f > 0:                          # double buffering: load while the previous streams
            load_start[f] = stream_start[f - 1]
            if np.any(load_start[f] + latch < stream_start[f - 1] + tags["last_swap"]):
                raise RuntimeError("systolic: shadow weights overwritten before their swap")
        stream_start[f] = load_start[f] + int(latch[0]) + 1      # column 0 has latched
        if f > 0 and timing == "tpu":        # ... and the previous fold has issued its vectors
            stream_start[f] = max(stream_start[f], stream_start[f - 1] + tags["last_issue"] + 1)
        if np.any(load_start[f] + latch >= stream_start[f] + tags["first_arrival"]):
            raise RuntimeError("systolic: a column's weights latched after its first vector")
    ncyc = stream_start[-1] + tags["last_out"] + 1
    issue = np.zeros(ncyc, bool)
    for f in range(F):
        issue[stream_start[f]:stream_start[f] + U] |= tags["issue"][:ncyc - stream_start[f]]
    stats, macs = fold_accounting(df, grid, stream_start, T, timing, ncyc + T + R + C)
    segs = []
    for f in range(F):
        s0 = stream_start[f]
        last_in = int(np.flatnonzero(slot[:, :grid.rows_used[f]].any(axis=1))[-1])  # last real operand
        segs.append((load_start[f], s0, s0 + tags["first_out"], s0 + last_in,
                     s0 + tags["last_out"]))
    return EngineRun(out.T.copy() if df.key == "is" else out, ncyc, tuple(segs), issue, stats,
                     (nkb, nnb), macs[:ncyc])


def stream_batch(bfeed: np.ndarray, w_shadow: np.ndarray, tags: dict[str, Any], uu: np.ndarray,
                  jj: np.ndarray, T: int, R: int, C: int) -> np.ndarray:
    """Stream a batch of folds (``NB`` column tiles x ``KB`` K tiles) through the array.

    ``bfeed[u, b]`` is what K tile ``b``'s skewed edge buffer sends into the left edge at
    stream cycle ``u``; ``w_shadow`` (NB x KB x R x C) the latched weights. Each cycle:
    where the first vector arrives (``tags["swaps"]``) the shadow weights go live; the
    edge buffer feeds column 0 and every other activation moves one cell right; each
    cell multiplies its activation by its weight and adds the partial sum arriving from
    the cell above; the bottom row leaves the array. Returns the tagged results,
    NB x KB x T x C (result ``i`` of column ``j`` is the ``i``-th tagged value that left
    the bottom of column ``j``).
    """
    NB, KB = w_shadow.shape[:2]
    dt = w_shadow.dtype
    U, n_feed = tags["cycles"], T + R - 1
    acts = [np.zeros((KB, R, C), dt) for _ in range(2)]
    psums = [np.zeros((NB, KB, R, C), dt) for _ in range(2)]
    w_active = np.zeros((NB, KB, R, C), dt)
    bottom = np.zeros((U, NB, KB, C), dt)
    wa_flat, ws_flat = w_active.reshape(NB * KB, R * C), w_shadow.reshape(NB * KB, R * C)
    swaps = iter(tags["swaps"])
    next_swap = next(swaps, (-1, None))
    views: dict[tuple[int, int, int, int, int], tuple[Any, ...]] = {}
    for u in range(U):
        if u == next_swap[0]:                   # the first vector reaches these cells now
            wa_flat[:, next_swap[1]] = ws_flat[:, next_swap[1]]
            next_swap = next(swaps, (-1, None))
        # the rectangle of cells that can hold a vector this cycle (the rest are idle)
        r0, r1 = max(0, u - (T - 1) - (C - 1)), min(R, u + 1)
        lo, hi = max(0, u - (T - 1) - (R - 1)), min(C, u + 1)
        if r0 >= r1 or lo >= hi:
            continue
        key = (u & 1, r0, r1, lo, hi)
        v = views.get(key)
        if v is None:
            a_old, a_new = acts[u & 1], acts[1 - (u & 1)]
            p_old, p_new = psums[u & 1], psums[1 - (u & 1)]
            a0, k0 = max(lo, 1), max(r0, 1)
            v = views[key] = (
                a_new[:, r0:r1, 0] if lo == 0 else None,
                a_new[:, r0:r1, a0:hi], a_old[:, r0:r1, a0 - 1:hi - 1],
                a_new[:, r0:r1, lo:hi], w_active[..., r0:r1, lo:hi], p_new[..., r0:r1, lo:hi],
                p_new[..., k0:r1, lo:hi], p_old[..., k0 - 1:r1 - 1, lo:hi],
                p_new[..., R - 1, lo:hi] if r1 == R else None)
        edge, a_dst, a_src, a_cur, w_cur, p_cur, p_acc, p_above, p_bottom = v
        if edge is not None:                    # activations: the edge buffer feeds column 0
            edge[...] = bfeed[u, :, r0:r1] if u < n_feed else 0
        a_dst[...] = a_src                      # ... and every other one moves one cell right
        np.multiply(a_cur, w_cur, out=p_cur)    # each cell's product (every column tile);
        if p_acc.size:                          # then add the partial sum from above
            np.add(p_acc, p_above, out=p_acc)
        if p_bottom is not None:
            bottom[u, ..., lo:hi] = p_bottom
    return bottom[uu, :, :, jj].reshape(C, T, NB, KB).transpose(2, 3, 1, 0)


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
    """The output-stationary engine with the trace off: many folds per numpy step.

    The machine :func:`.engines.run_os` runs: ``a[i, k]`` enters row ``i`` at stream
    cycle ``k + i`` and moves right, ``b[k, j]`` enters column ``j`` at ``k + j`` and moves
    down, every cell multiplies the two operands it holds and adds the product to its
    accumulator. Folds that share a row tile receive the same ``a`` stream (and those
    that share a column tile the same ``b`` stream), so a batch keeps one copy of each
    stream's registers and multiplies them by broadcasting. The controller places the
    folds on one clock from one fold's observed timeline (:func:`os_tags`): one after
    another for ``"scalesim"``; for ``"tpu"`` the next fold starts once the current one
    has issued its operands and its results have room to shift out (``R`` cycles), and
    the last results shift out of the bottom edge in ``R`` cycles.
    """
    M, K = a.shape
    N = b.shape[1]
    grid = df.grid(M, K, N, R, C)
    nmb, nnb, F = grid.row_tiles, grid.col_tiles, len(grid)
    dt = a.dtype
    issue_tag, done = os_tags(K, R, C)
    U = done + 1                                 # stream cycles until the last MAC
    afeed = np.zeros((U, nmb, R), dt)            # (cycle, row tile, row)
    afeed[:K + R - 1] = skewed_feed(a.T, R).transpose(1, 0, 2)
    bfeed = np.zeros((U, nnb, C), dt)            # (cycle, column tile, column)
    bfeed[:K + C - 1] = skewed_feed(b, C).transpose(1, 0, 2)
    y = np.zeros((nnb, nmb, R, C), dt)           # folds in order: column tile outer
    for mbs, nbs in batches(nmb, nnb, R, C):
        y[nbs.start:nbs.stop, mbs.start:mbs.stop] = os_batch(
            afeed[:, mbs.start:mbs.stop], bfeed[:, nbs.start:nbs.stop], K, R, C)
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


def os_batch(afeed: np.ndarray, bfeed: np.ndarray, K: int, R: int, C: int) -> np.ndarray:
    """Stream a batch of output-stationary folds (``NB`` column tiles x ``MB`` row tiles).

    ``afeed[u, m]``/``bfeed[u, n]`` are what row tile ``m``'s left edge and column tile
    ``n``'s top edge receive at stream cycle ``u``. Each cycle every ``a`` moves one cell
    right and every ``b`` one cell down, and each cell adds the product of the two into
    its accumulator; only the band of cells that can hold an operand pair is updated.
    Returns the accumulators, NB x MB x R x C.
    """
    U, MB = afeed.shape[:2]
    NB = bfeed.shape[1]
    dt = afeed.dtype
    ah = [np.zeros((MB, R, C), dt) for _ in range(2)]
    bv = [np.zeros((NB, R, C), dt) for _ in range(2)]
    acc = np.zeros((NB, MB, R, C), dt)
    prod = np.zeros((NB, MB, R, C), dt)
    for u in range(U):
        a_old, a_new = ah[u & 1], ah[1 - (u & 1)]
        b_old, b_new = bv[u & 1], bv[1 - (u & 1)]
        a_new[:, :, 1:] = a_old[:, :, :-1]
        a_new[:, :, 0] = afeed[u]
        b_new[:, 1:] = b_old[:, :-1]
        b_new[:, 0] = bfeed[u]
        # cells (i, j) with 0 <= u - i - j < K hold a pair: a box around that band
        r0, r1 = max(0, u - (K - 1) - (C - 1)), min(R, u + 1)
        c0, c1 = max(0, u - (K - 1) - (R - 1)), min(C, u + 1)
        p = prod[..., r0:r1, c0:c1]
        np.multiply(a_new[None, :, r0:r1, c0:c1], b_new[:, None, r0:r1, c0:c1], out=p)
        np.add(acc[..., r0:r1, c0:c1], p, out=acc[..., r0:r1, c0:c1])
    return acc

