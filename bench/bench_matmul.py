"""Matmul sweep: achieved TFLOP/s and fraction of peak, plus the harness's own overhead.

Run through ``python bench/run.py`` (``make bench``), or alone with
``python bench/bench_matmul.py``. On an accelerator the sweep covers square matmuls of
256 to 8192 in bf16 and fp32; on a CPU it stops at 2048 (a 2-core machine needs over a
second per 2048 matmul) and says so.

It also checks the harness against a second timing method: the largest bf16 matmul is
timed by hand, ``ITERATIONS`` calls dispatched back to back with one wait at the end
(which hides the per-call wait), and the harness's rate must be within 5 % of it.
"""

from __future__ import annotations

import time
from typing import Any

ACCELERATOR_SIZES = (256, 512, 1024, 2048, 4096, 8192)
CPU_SIZES = (256, 512, 1024, 2048)
ITERATIONS = 50  # calls in the hand-timed loop on an accelerator (5 on a CPU)
AGREEMENT = 0.95  # harness rate / hand-timed rate must be at least this


def hand_timed_rate(fn: Any, a: Any, b: Any, iterations: int, rounds: int = 3) -> float:
    """FLOP/s of ``fn(a, b)`` from ``iterations`` back-to-back calls and one final wait
    (best of ``rounds``). Calls run in order on one device stream, so when the last
    result is ready all are."""
    n, k = a.shape
    flops = 2 * n * k * b.shape[1]
    fn(a, b).block_until_ready()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        out = None
        for _ in range(iterations):
            out = fn(a, b)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - start) / iterations)
    return flops / best


def torch_reference_rate(n: int, iterations: int = 20) -> float | None:
    """FLOP/s of a bf16 ``n``-cubed matmul in PyTorch timed with CUDA events, when torch
    with CUDA is installed (a third method, outside JAX); else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iterations):
        a @ a
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / iterations
    del a
    torch.cuda.empty_cache()
    return 2 * n**3 / seconds


def main() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from tpu_course import bench, runtime

    rt = runtime.describe()
    on_cpu = rt.platform == "cpu"
    sizes = CPU_SIZES if on_cpu else ACCELERATOR_SIZES
    options = dict(repeats=3, min_time=0.0, warmup=1) if on_cpu else dict(repeats=10, min_time=0.2)
    notes = [rt.banner()]
    if on_cpu:
        notes.append(f"CPU run: sizes capped at {max(CPU_SIZES)}; these are CPU timings, "
                     "not TPU timings.")
    matmul = jax.jit(lambda a, b: a @ b)
    rows = []
    key = jax.random.key(0)
    for dtype_name, dtype in (("bf16", jnp.bfloat16), ("fp32", jnp.float32)):
        for n in sizes:
            ka, kb = jax.random.split(jax.random.fold_in(key, n))
            a = jax.random.normal(ka, (n, n), dtype)
            b = jax.random.normal(kb, (n, n), dtype)
            r = bench.benchmark(matmul, a, b, name=f"matmul {n} {dtype_name}",
                                flops=2 * n**3, warn=False, **options)
            rows.append({
                "name": r.name, "n": n, "dtype": dtype_name, "median_ms": r.median_s * 1e3,
                "tflops_per_s": r.flops_per_s / 1e12, "fraction_of_peak": r.fraction_of_peak,
                "spread": r.spread, "compile_s": r.compile_time_s, "result": r.to_dict(),
            })
            del a, b

    # the harness against a hand-timed loop, on the largest bf16 matmul: interleaved
    # rounds, so both methods see the same clocks (a GPU slows as it warms up)
    n = max(sizes)
    a = jax.random.normal(key, (n, n), jnp.bfloat16)
    harness_rates, hand_rates = [], []
    for _ in range(1 if on_cpu else 3):
        r = bench.benchmark(matmul, a, a, flops=2 * n**3, warn=False, **options)
        harness_rates.append(r.flops_per_s / 1e12)
        hand_rates.append(hand_timed_rate(matmul, a, a, 3 if on_cpu else ITERATIONS,
                                         rounds=1 if on_cpu else 3) / 1e12)
    harness, hand = max(harness_rates), max(hand_rates)
    ratio = harness / hand
    check = {"what": f"bf16 {n}^3 matmul: harness TFLOP/s (median) / hand-timed loop TFLOP/s",
             "harness_tflops_per_s": harness, "hand_timed_tflops_per_s": hand,
             "harness_rounds": harness_rates, "hand_rounds": hand_rates,
             "ratio": ratio, "target": AGREEMENT, "passed": ratio >= AGREEMENT}
    if on_cpu:
        check["note"] = "on a CPU the 5 % target is informative only (a shared, noisy host)"
    elif rt.platform == "gpu":
        torch_rate = torch_reference_rate(n)
        if torch_rate is not None:
            check["torch_cuda_events_tflops_per_s"] = torch_rate / 1e12
    # the harness's own overhead: a jitted function that does (almost) nothing
    tiny = jax.jit(lambda x: x + 1)
    x = jnp.zeros((), jnp.float32)
    one = bench.benchmark(tiny, x, number=1, repeats=50, min_time=0.0, name="empty, 1 call/sample",
                          warn=False)
    many = bench.benchmark(tiny, x, repeats=20, min_time=0.0, name="empty, batched", warn=False)
    overhead = {"per_call_waited_us": one.median_s * 1e6, "per_call_batched_us": many.median_s * 1e6,
                "batched_number": many.number}
    return {"topic": "matmul", "rows": rows, "checks": [check], "overhead": overhead,
            "notes": notes}


def table(result: dict[str, Any]) -> str:
    """The sweep as a text table."""
    lines = [f"{'size':>6} {'dtype':>5} {'median ms':>10} {'TFLOP/s':>9} {'of peak':>8} {'spread':>7}"]
    for r in result["rows"]:
        frac = "n/a" if r["fraction_of_peak"] is None else f"{r['fraction_of_peak']:.1%}"
        lines.append(f"{r['n']:>6} {r['dtype']:>5} {r['median_ms']:>10.3f} {r['tflops_per_s']:>9.3f} "
                     f"{frac:>8} {r['spread']:>7.1%}")
    for c in result["checks"]:
        lines.append(f"check: {c['what']} = {c['harness_tflops_per_s']:.3f} / "
                     f"{c['hand_timed_tflops_per_s']:.3f} = {c['ratio']:.3f} "
                     f"({'ok' if c['passed'] else 'BELOW'} target {c['target']})")
        if "torch_cuda_events_tflops_per_s" in c:
            lines.append(f"reference: PyTorch, CUDA events: {c['torch_cuda_events_tflops_per_s']:.1f} TFLOP/s")
    o = result["overhead"]
    lines.append(f"harness overhead (empty jitted fn): {o['per_call_waited_us']:.1f} us per call "
                 f"waited singly, {o['per_call_batched_us']:.1f} us per call in batches of "
                 f"{o['batched_number']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(main()))
