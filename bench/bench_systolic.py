"""Benchmark: the systolic simulator against SCALE-Sim 3.0.0 on the same problem.

The case: a 128 x 128 weight-stationary array multiplying 512 x 512 by 512 x 512
(float32 operands; SCALE-Sim tracks addresses and computes no values, ours computes every
value). Both use SCALE-Sim's timing conventions (``timing="scalesim"``); our default
``timing="tpu"`` is timed too.

SCALE-Sim is never a course dependency. When it is importable here, or when
``SCALESIM_PYTHON`` names the Python of a virtual environment that has it (see
``scripts/scalesim_crosscheck.py``), both run in this one invocation and the ratio is
reported; otherwise only our absolute time is. ``bench/run.py`` writes the result to
``bench/results/systolic-<device>.json``.

    python bench/bench_systolic.py
    SCALESIM_PYTHON=/tmp/scalesim-venv/bin/python python bench/bench_systolic.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROWS = COLS = 128
M = K = N = 512

_SCALESIM_SNIPPET = """
import json, pathlib, sys, tempfile, time, os
sys.path.insert(0, {scripts!r})
from scalesim_crosscheck import run_one
with tempfile.TemporaryDirectory() as tmp:
    os.chdir(tmp)
    t0 = time.perf_counter()
    rec = run_one({rows}, {cols}, "ws", [({m}, {k}, {n})], pathlib.Path(tmp))[0]
    rec["seconds"] = time.perf_counter() - t0
print(json.dumps(rec))
"""


def time_ours(timing: str, repeats: int = 5) -> tuple[float, int]:
    """Best wall time of ``simulate`` (trace off) over ``repeats`` runs, and its cycles."""
    import numpy as np

    from tpu_course import systolic

    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    best, cycles = float("inf"), -1
    for _ in range(repeats):
        t0 = time.perf_counter()
        run = systolic.simulate(a, b, ROWS, COLS, "ws", timing)
        best = min(best, time.perf_counter() - t0)
        cycles = run.cycles
    ref = systolic.reference_matmul(a, b, ROWS)
    assert (run.result == ref).all(), "simulator result differs from the same-order reference"
    return best, cycles


def time_scalesim() -> dict | None:
    """Run SCALE-Sim on the case here or through $SCALESIM_PYTHON; None if unavailable."""
    code = _SCALESIM_SNIPPET.format(scripts=str(ROOT / "scripts"), rows=ROWS, cols=COLS,
                                    m=M, k=K, n=N)
    python = os.environ.get("SCALESIM_PYTHON")
    if python is None and importlib.util.find_spec("scalesim") is not None:
        python = sys.executable
    if python is None:
        return None
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        print(f"SCALE-Sim failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> dict:
    ours_ss, cycles_ss = time_ours("scalesim")
    ours_tpu, cycles_tpu = time_ours("tpu")
    ref = time_scalesim()
    result = {
        "topic": "systolic",
        "case": f"{ROWS}x{COLS} ws array, {M}x{K} @ {K}x{N}, float32, trace off",
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "ours_scalesim_timing_s": round(ours_ss, 4), "ours_scalesim_timing_cycles": cycles_ss,
        "ours_tpu_timing_s": round(ours_tpu, 4), "ours_tpu_timing_cycles": cycles_tpu,
        "scalesim_s": None, "scalesim_cycles": None, "speedup_vs_scalesim": None,
    }
    if ref is not None:
        result.update(scalesim_s=round(ref["seconds"], 4), scalesim_cycles=ref["total_cycles"],
                      speedup_vs_scalesim=round(ref["seconds"] / ours_ss, 2))
        result["checks"] = [{"what": "cycle count equals SCALE-Sim's Total Cycles",
                             "passed": ref["total_cycles"] == cycles_ss},
                            {"what": "at least 10x faster than SCALE-Sim (goal)",
                             "passed": ref["seconds"] / ours_ss >= 10}]
    print(f"{'what':44s} {'seconds':>9s} {'cycles':>8s}")
    print(f"{'ours, timing=scalesim':44s} {ours_ss:9.3f} {cycles_ss:8d}")
    print(f"{'ours, timing=tpu':44s} {ours_tpu:9.3f} {cycles_tpu:8d}")
    if ref is not None:
        print(f"{'SCALE-Sim 3.0.0 (addresses only)':44s} {ref['seconds']:9.3f} "
              f"{ref['total_cycles']:8d}")
        print(f"speed-up over SCALE-Sim, measured in this run: "
              f"{result['speedup_vs_scalesim']:.1f}x (goal: 10x)")
    else:
        print("SCALE-Sim not found (set SCALESIM_PYTHON to compare): absolute time only")
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    import run

    sys.exit(run.main(["systolic"]))
