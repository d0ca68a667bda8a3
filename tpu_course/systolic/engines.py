"""The engines' shared parts, and the cycle-by-cycle engines that record a trace.

Each engine runs a small controller (Python integers: when a fold's stationary values
start down the load path, when its stream starts) and a datapath (numpy over the whole
grid) that moves every register one step per cycle. The pieces every engine needs are
here once: the skewed edge feed, the load path's feed, the per-fold traffic and MACs, and
the phases. :func:`run_stationary` and :func:`run_os` run one array cycle by cycle and
can record every register (``trace=True``, for the animation); :mod:`.batched` runs the
same machines with the trace off (one fold's movement simulated, the values computed row
by row of the array for many folds at once), and a test holds the two equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tpu_course.systolic.dataflows import Dataflow, FoldGrid
from tpu_course.systolic.results import EngineRun, Fold, Frame

Segment = tuple[int, int, int, int, int]


def skewed_feed(x: np.ndarray, width: int) -> np.ndarray:
    """The edge buffers that feed ``x`` (T x D) into an array edge ``width`` cells wide.

    Block ``b`` holds columns ``b*width ...`` of ``x``; lane ``k`` of a block sends
    ``x[i, b*width + k]`` at relative cycle ``i + k`` (the skew that makes vector ``i``
    meet cell ``(k, j)`` at ``i + k + j``). Returns (blocks, T + width - 1, width).
    """
    T, D = x.shape
    feed = np.zeros((-(-D // width), T + width - 1, width), x.dtype)
    k = np.arange(D)
    feed[k // width, k % width + np.arange(T)[:, None], k % width] = x
    return feed


def stationary_tiles(s: np.ndarray, grid: FoldGrid, R: int, C: int) -> np.ndarray:
    """The stationary operand ``s`` cut into one zero-padded R x C tile per fold."""
    tiles = np.zeros((len(grid), R, C), s.dtype)
    for f, (rb, cb) in enumerate(grid.folds):
        tiles[f, :grid.rows_used[f], :grid.cols_used[f]] = \
            s[rb * R:rb * R + grid.rows_used[f], cb * C:cb * C + grid.cols_used[f]]
    return tiles


def load_feed(tiles: np.ndarray) -> np.ndarray:
    """The top-edge load path's feed: (load cycle, fold, column). Column ``j`` pushes its
    weight rows down, bottom row first, starting ``j`` cycles late."""
    F, R, C = tiles.shape
    lfeed = np.zeros((R + C - 1, C, F), tiles.dtype)
    rr, jc = np.indices((R, C))
    lfeed[rr + jc, jc] = tiles[:, ::-1].transpose(1, 2, 0)
    return lfeed.transpose(0, 2, 1).copy()


def diagonals(R: int, C: int) -> list[np.ndarray]:
    """Flat indices of the cells on each anti-diagonal ``k + j = d``."""
    kk, jj = np.indices((R, C))
    d = (kk + jj).ravel()
    order = np.argsort(d, kind="stable")
    starts = np.searchsorted(d[order], np.arange(R + C))
    return [order[starts[x]:starts[x + 1]] for x in range(R + C - 1)]


def ones_conv(*lengths: int) -> np.ndarray:
    """``out[u]`` = how many index tuples (each ``idx_n < lengths[n]``) sum to ``u``."""
    out = np.ones(1, np.int64)
    for n in lengths:
        out = np.convolve(out, np.ones(n, np.int64))
    return out


def fold_accounting(df: Dataflow, grid: FoldGrid, stream_start: Any, T: int, timing: str,
                    size: int) -> tuple[tuple[Fold, ...], np.ndarray]:
    """Per-fold traffic records and useful MACs per cycle, from each fold's stream start.

    A real operand pair meets in cell (k < rows used, j < cols used) at cycle
    ``s0 + i + k + j`` for vector ``i < T``. With a stationary operand (``"ws"``,
    ``"is"``), partial sums leave the array only in the SCALE-Sim convention or on the
    last row tile (the TPU convention accumulates in place); ``"os"`` streams both
    operands and writes each output once.
    """
    stats, macs = [], np.zeros(size, np.int64)
    convs: dict[tuple[int, int], np.ndarray] = {}    # a few distinct tile shapes
    for f, (rb, cb) in enumerate(grid.folds):
        s0, ru, cu = stream_start[f], grid.rows_used[f], grid.cols_used[f]
        if not df.preload:      # output-stationary: a rows from the left, b from the top
            stats.append(Fold(f, rb, cb, ru, cu, 0, T * (ru + cu), ru * cu, s0,
                              a_in=T * ru, b_in=T * cu))
        else:
            writes = T * cu if (timing == "scalesim" or rb == grid.row_tiles - 1) else 0
            held, streamed = ru * cu, T * ru
            a_in, b_in = (streamed, held) if df.key == "ws" else (held, streamed)
            stats.append(Fold(f, rb, cb, ru, cu, held, streamed, writes, s0, a_in=a_in, b_in=b_in))
        conv = convs.get((ru, cu))
        if conv is None:
            conv = convs[(ru, cu)] = ones_conv(T, ru, cu)
        macs[s0:s0 + len(conv)] += conv
    return tuple(stats), macs


def os_segments(grid: FoldGrid, stream_start: Any, K: int, R: int, C: int,
                timing: str) -> list[Segment]:
    """Output-stationary phases per fold: nothing to preload; the last operand enters
    row or column ``max(used) - 1`` at ``K - 1`` plus its skew; results are read where
    they finish (``"scalesim"``) or shift out of the bottom edge in ``R`` cycles."""
    segs = []
    for f, s0 in enumerate(stream_start):
        last_in = s0 + K - 1 + max(grid.rows_used[f], grid.cols_used[f]) - 1
        done = s0 + K - 1 + R - 1 + C - 1
        if timing == "scalesim":
            segs.append((s0, s0, s0 + K - 1, last_in, done))
        else:
            segs.append((s0, s0, s0 + K - 1 + R, last_in, done + R))
    return segs


def assemble_os(grid: FoldGrid, y: np.ndarray, M: int, N: int, R: int, C: int) -> np.ndarray:
    """The M x N output from each output-stationary fold's R x C block ``y[f]``."""
    out = np.zeros((M, N), y.dtype)
    for f, (mb, nb) in enumerate(grid.folds):
        ru, cu = grid.rows_used[f], grid.cols_used[f]
        out[mb * R:mb * R + ru, nb * C:nb * C + cu] = y[f, :ru, :cu]
    return out


def phase_parts(segments: list[Segment], issue: np.ndarray, merge: bool
                ) -> tuple[tuple[int, int, int, int, int], np.ndarray]:
    """Preload/fill/steady/drain/stall cycle counts and a per-cycle label array.

    A segment is (load start, stream start, first result out, last operand in, last
    result out), observed cycle numbers. ``issue[t]`` is True when a vector entered.
    ``merge``: the folds overlap (``timing="tpu"``), so the run is one segment from the
    first fold's start to the last fold's last result.
    """
    if merge:
        segments = [(0, segments[0][1], segments[0][2], max(sg[3] for sg in segments),
                     segments[-1][4])]
    n = len(issue)
    labels = np.full(n, "", dtype=object)
    pre = fill = steady = drain = stall = 0
    for load0, s0, first_out, last_in, last_out in segments:
        first_out = min(first_out, last_in + 1)
        pre += s0 - load0
        fill += first_out - s0
        steady += last_in + 1 - first_out
        stall += int(np.count_nonzero(~issue[first_out:last_in + 1]))
        drain += last_out - last_in
        labels[load0:s0] = "preload"
        labels[s0:first_out] = "fill"
        labels[first_out:last_in + 1] = "steady"
        labels[last_in + 1:last_out + 1] = "drain"
    return (pre, fill, steady, drain, stall), labels


# --------------------------------------------------------------------------------------
# Cycle by cycle (trace=True)
# --------------------------------------------------------------------------------------


def run_stationary(df: Dataflow, x: np.ndarray, s: np.ndarray, R: int, C: int,
                   timing: str) -> EngineRun:
    """Weight-stationary engine: rows of ``x`` (T x Kd) stream past cells holding ``s`` (Kd x Nd).

    One array, cycle by cycle, with overlapping folds sharing it (``"tpu"``), recording
    every register in every cycle. Returns ``x @ s`` (transposed for ``"is"``) and what
    the run observed.
    """
    transpose_out = df.key == "is"
    T, kd = x.shape
    nd = s.shape[1]
    grid = FoldGrid.of(kd, nd, R, C)
    nkb, folds, ru, cu = grid.row_tiles, grid.folds, grid.rows_used, grid.cols_used
    F = len(folds)
    dt = x.dtype
    feed = skewed_feed(x, R)          # row k of K tile kb: x[i, kb*R + k] at cycle i + k
    lfeed = load_feed(stationary_tiles(s, grid, R, C))
    diag = diagonals(R, C)

    act, act_nxt = np.zeros((R, C), dt), np.zeros((R, C), dt)
    psum, psum_nxt = np.zeros((R, C), dt), np.zeros((R, C), dt)
    prod = np.zeros((R, C), dt)
    w_active, w_shadow, chain = np.zeros((R, C), dt), np.zeros((R, C), dt), np.zeros((R, C), dt)
    zero_col = np.zeros(R, dt)
    bound = F * (T + 2 * R + C) + 4
    bottom = np.zeros((bound, C), dt)
    issue = np.zeros(bound, bool)
    load_start, stream_start = [-1] * F, [-1] * F
    latched = [False] * F
    loads: list[int] = [0]
    load_start[0] = 0
    streams: list[int] = []   # folds whose skewed feed is still entering
    swaps: list[int] = []     # folds whose first activation is still crossing the array
    inflight: list[int] = []  # folds with a vector somewhere in the array
    nxt = 0                   # next fold to stream
    prev_done = True          # (scalesim) the previous fold's last result has left
    corner = R - 1 + C - 1    # cycles from a vector's entry to its result leaving column C-1
    frames: list[Frame] = []
    slot_ok = np.zeros((R, C), bool)
    live = np.zeros((R, C), bool)   # cells whose active weight is in use
    loaded = np.zeros((R, C), bool)  # cells that have latched a weight at all
    out_trace = np.zeros((T, nd), dt)
    out_seen = np.zeros((T, nd), bool)
    t = 0
    while True:
        # -- controller
        if timing == "scalesim" and prev_done and nxt < F and load_start[nxt] < 0:
            load_start[nxt] = t
            loads.append(nxt)
        issuing = bool(streams) and t - stream_start[streams[-1]] < T
        if nxt < F and latched[nxt] and not issuing and (timing == "tpu" or prev_done):
            f = nxt
            stream_start[f] = t
            streams.append(f)
            swaps.append(f)
            inflight.append(f)
            nxt += 1
            prev_done = False
            if timing == "tpu" and f + 1 < F:      # double buffering: next weights start now
                load_start[f + 1] = t
                loads.append(f + 1)
        # -- swap: where a fold's first activation arrives, the shadow weights go live
        if swaps:
            for f in swaps:
                sel = diag[t - stream_start[f]]
                w_active.flat[sel] = w_shadow.flat[sel]
                live.flat[sel] = True
            if t - stream_start[swaps[0]] >= R + C - 2:
                swaps.pop(0)
        # -- the band of columns that hold a vector of some fold (others are idle)
        lo, hi = C, 0
        while inflight and t - stream_start[inflight[0]] > T - 1 + corner:
            inflight.pop(0)                   # its last result has left
        for f in inflight:                    # vector u - k - j of fold f is in cell (k, j)
            u = t - stream_start[f]
            lo = min(lo, max(0, u - (T - 1) - (R - 1)))
            hi = max(hi, min(C, u + 1))
        if lo < hi:
            # -- left edge: the skewed feeds of the folds still entering
            if lo == 0:
                xin = zero_col
                for f in streams:
                    u = t - stream_start[f]
                    xin = feed[folds[f][0], u] if xin is zero_col else xin + feed[folds[f][0], u]
                    if u < T:
                        issue[t] = True
                if streams and t - stream_start[streams[0]] >= T + R - 2:
                    streams.pop(0)
                act_nxt[:, 0] = xin
                a0 = 1
            else:
                a0 = lo
            # -- datapath: activations one cell right, MAC, partial sums one cell down
            act_nxt[:, a0:hi] = act[:, a0 - 1:hi - 1]
            act, act_nxt = act_nxt, act
            np.multiply(act[:, lo:hi], w_active[:, lo:hi], out=prod[:, lo:hi])
            psum_nxt[0, lo:hi] = prod[0, lo:hi]
            np.add(psum[:-1, lo:hi], prod[1:, lo:hi], out=psum_nxt[1:, lo:hi])
            psum, psum_nxt = psum_nxt, psum
            bottom[t, lo:hi] = psum[R - 1, lo:hi]
        # -- load path: column j shifts down during steps 0..R-1, latches at step R-1
        for f in loads:
            u = t - load_start[f]
            lo, hi = max(0, u - R + 1), min(C, u + 1)
            if lo < hi:
                chain[1:, lo:hi] = chain[:-1, lo:hi].copy()
                chain[0, lo:hi] = lfeed[u, f, lo:hi]
            j = u - (R - 1)
            if 0 <= j < C:
                w_shadow[:, j] = chain[:, j]
                latched[f] = latched[f] or j == 0
                loaded[:, j] = True
        if loads and t - load_start[loads[0]] >= R + C - 2:
            loads.pop(0)
        slot_ok[:, 1:] = slot_ok[:, :-1]
        slot_ok[:, 0] = False
        for f in range(F):
            if stream_start[f] >= 0:
                u = t - stream_start[f] - np.arange(R)
                slot_ok[:, 0] |= (u >= 0) & (u < T)
        shown = np.where(live, w_active, np.where(loaded, w_shadow, np.nan))  # nan: empty
        _ws_trace_step(frames, t, act, psum, shown, slot_ok, bottom[t], stream_start,
                       folds, cu, T, R, C, timing, nkb, out_trace, out_seen, transpose_out)
        # -- observe the last result of the newest fold leaving the bottom-right cell
        last = nxt - 1
        if last >= 0 and t - stream_start[last] == T - 1 + corner:
            prev_done = True
            if last == F - 1:
                t += 1
                break
        t += 1
    ncyc = t
    issue = issue[:ncyc]

    # -- collect: result (t, j) belongs to the vector that entered R-1+j cycles earlier
    y = np.zeros((F, T, C), dt)
    cols = np.arange(C)
    for f in range(F):
        tt = stream_start[f] + np.arange(T)[:, None] + (R - 1) + cols[None, :]
        y[f] = bottom[tt, cols[None, :]]
    out = np.zeros((T, nd), dt)
    for f, (_, nb) in enumerate(folds):             # K tiles in order: same as accumulating
        sl = slice(nb * C, nb * C + cu[f])
        out[:, sl] = out[:, sl] + y[f, :, :cu[f]]
    stats, macs = fold_accounting(df, grid, stream_start, T, timing, ncyc + T + R + C)
    segs = [(load_start[f], s0, s0 + R - 1, s0 + T - 1 + ru[f] - 1, s0 + T - 1 + corner)
            for f, s0 in enumerate(stream_start[:len(folds)])]
    return EngineRun(out.T.copy() if transpose_out else out, ncyc, tuple(segs), issue, stats,
                     (grid.row_tiles, grid.col_tiles), macs[:ncyc], tuple(frames))


def _ws_trace_step(frames, t, act, psum, w_active, slot_ok, bottom_row, stream_start, folds,
                   cu, T, R, C, timing, nkb, out_trace, out_seen, transpose_out) -> None:
    """Append one :class:`Frame` for the weight-stationary engine (trace mode only)."""
    note = ""
    for f, (kb, nb) in enumerate(folds):
        s0 = stream_start[f]
        if s0 < 0:
            continue
        for j in range(cu[f]):
            i = t - s0 - (R - 1) - j
            if 0 <= i < T:
                out_trace[i, nb * C + j] += bottom_row[j]
                out_seen[i, nb * C + j] = True
                if timing == "tpu" and kb < nkb - 1:
                    note = "partial sums added into the accumulators"
    horizontal = np.where(slot_ok, act, np.nan)
    vertical = np.where(slot_ok, psum, np.nan)
    shown = np.where(out_seen, out_trace, np.nan)
    frames.append(Frame(t, "", w_active.astype(float), horizontal.astype(float),
                        vertical.astype(float), (shown.T if transpose_out else shown).astype(float),
                        note))


def run_os(df: Dataflow, a: np.ndarray, b: np.ndarray, R: int, C: int, timing: str) -> EngineRun:
    """Output-stationary engine, cycle by cycle on one array, recording every register:
    ``a`` rows enter at the left, ``b`` columns at the top."""
    M, K = a.shape
    N = b.shape[1]
    grid = df.grid(M, K, N, R, C)
    folds, ru, cu = grid.folds, grid.rows_used, grid.cols_used
    F = len(folds)
    dt = a.dtype
    afeed = skewed_feed(a.T, R)   # row i gets a[i, k] at relative cycle k + i
    bfeed = skewed_feed(b, C)     # column j gets b[k, j] at relative cycle k + j
    diag = diagonals(R, C)
    ah, ah_nxt = np.zeros((R, C), dt), np.zeros((R, C), dt)   # moving right
    bv, bv_nxt = np.zeros((R, C), dt), np.zeros((R, C), dt)   # moving down
    acc, prod, outreg = np.zeros((R, C), dt), np.zeros((R, C), dt), np.zeros((R, C), dt)
    chain = np.zeros((R, C), dt)
    zr, zc = np.zeros(R, dt), np.zeros(C, dt)
    bound = F * (max(K, R) + K + 2 * R + C) + 4
    bottom = np.zeros((bound, C), dt)
    issue = np.zeros(bound, bool)
    stream_start = [-1] * F
    y = np.zeros((F, R, C), dt)
    chain_load: dict[tuple[int, int], int] = {}
    active: list[int] = []   # folds with operands still entering or cells still finishing
    nxt = 0
    prev_done = True
    frames: list[Frame] = []
    out_trace = np.full((M, N), np.nan)
    a_ok = np.zeros((R, C), bool)
    b_ok = np.zeros((R, C), bool)
    t = 0
    end_t = -1
    while True:
        # -- controller
        if nxt < F:
            cur = nxt - 1
            if timing == "scalesim":
                go = prev_done
            else:
                go = cur < 0 or (t - stream_start[cur] >= K and t - stream_start[cur] >= R)
            if go:
                stream_start[nxt] = t
                active.append(nxt)
                nxt += 1
                prev_done = False
        xin, yin = zr, zc
        for f in active:
            u = t - stream_start[f]
            if u < K + R - 1:
                xin = afeed[folds[f][0], u] if xin is zr else xin + afeed[folds[f][0], u]
            if u < K + C - 1:
                yin = bfeed[folds[f][1], u] if yin is zc else yin + bfeed[folds[f][1], u]
            issue[t] |= u < K
            if u < R + C - 1:                       # a fold's first operands: start from 0
                acc.flat[diag[u]] = 0
        ah_nxt[:, 1:] = ah[:, :-1]
        ah_nxt[:, 0] = xin
        ah, ah_nxt = ah_nxt, ah
        bv_nxt[1:] = bv[:-1]
        bv_nxt[0] = yin
        bv, bv_nxt = bv_nxt, bv
        np.multiply(ah, bv, out=prod)
        np.add(acc, prod, out=acc)
        if timing == "tpu":                         # finished columns shift out of the bottom
            bottom[t] = chain[R - 1]
            chain[1:] = chain[:-1].copy()
            chain[0] = 0
        still = []
        for f in active:
            d = t - stream_start[f] - (K - 1)
            if 0 <= d < R + C - 1:                  # cells that just did their last MAC
                sel = diag[d]
                outreg.flat[sel] = acc.flat[sel]
                if timing == "scalesim":            # read out where they are (no drain)
                    y[f].flat[sel] = acc.flat[sel]
                else:
                    j = d - (R - 1)                 # column j's bottom cell is done
                    if 0 <= j < C:
                        chain[:, j] = outreg[:, j]
                        chain_load[(f, j)] = t
            if d < R + C - 2:
                still.append(f)
            elif f == nxt - 1 or timing == "scalesim":
                prev_done = True
        active = still
        a_ok[:, 1:] = a_ok[:, :-1]
        b_ok[1:] = b_ok[:-1]
        a_ok[:, 0] = False
        b_ok[0] = False
        for f in range(F):
            if stream_start[f] >= 0:
                u = t - stream_start[f]
                a_ok[:, 0] |= (u - np.arange(R) >= 0) & (u - np.arange(R) < K)
                b_ok[0] |= (u - np.arange(C) >= 0) & (u - np.arange(C) < K)
        _os_trace_step(frames, t, ah, bv, acc, a_ok, b_ok, timing, folds, stream_start,
                       K, R, C, ru, cu, y, bottom[t], chain_load, out_trace)
        if nxt == F and not active and end_t < 0:
            end_t = t if timing == "scalesim" else t + R  # tpu: the last column shifts out
        if end_t >= 0 and t >= end_t:
            t += 1
            break
        t += 1
    ncyc = t
    issue = issue[:ncyc]
    if timing == "tpu":
        for (f, j), c0 in chain_load.items():
            y[f][::-1, j] = bottom[c0 + 1:c0 + 1 + R, j]
    stats, macs = fold_accounting(df, grid, stream_start, K, timing, ncyc + K + R + C)
    return EngineRun(assemble_os(grid, y, M, N, R, C), ncyc,
                     tuple(os_segments(grid, stream_start, K, R, C, timing)), issue, stats,
                     (grid.row_tiles, grid.col_tiles), macs[:ncyc], tuple(frames))


def _os_trace_step(frames, t, ah, bv, acc, a_ok, b_ok, timing, folds, stream_start, K, R, C,
                   ru, cu, y, bottom_row, chain_load, out_trace) -> None:
    """Append one :class:`Frame` for the output-stationary engine (trace mode only)."""
    for f, (mb, nb) in enumerate(folds):
        s0 = stream_start[f]
        if s0 < 0:
            continue
        if timing == "scalesim":
            for i in range(ru[f]):
                for j in range(cu[f]):
                    if t == s0 + K - 1 + i + j:
                        out_trace[mb * R + i, nb * C + j] = y[f][i, j]
        else:
            for j in range(cu[f]):
                c0 = chain_load.get((f, j))
                if c0 is not None and c0 < t <= c0 + R:
                    i = R - 1 - (t - c0 - 1)
                    if i < ru[f]:
                        out_trace[mb * R + i, nb * C + j] = bottom_row[j]
    frames.append(Frame(t, "", acc.astype(float), np.where(a_ok, ah, np.nan).astype(float),
                        np.where(b_ok, bv, np.nan).astype(float), out_trace.copy()))

