"""Run the benchmark suite: every ``bench/bench_*.py``, results into ``bench/results/``.

Usage (from the repository root; ``make bench`` does this)::

    python bench/run.py                 # every benchmark
    python bench/run.py matmul          # only bench_matmul.py

The contract for a ``bench/bench_<topic>.py`` file: a ``main()`` that returns a dict
with ``"topic"`` (a short name; default: the file name after ``bench_``) and
``"rows"`` (a list of flat dicts, one per measurement; a flat dict without ``"rows"`` is
printed as one measurement); optional ``"checks"`` (dicts with ``"what"`` and ``"passed"``) and
``"notes"`` (strings). A module may also define ``table(result) -> str`` for its own
printout; otherwise the rows are printed as a generic table. Each result is written to
``bench/results/<topic>-<device>.json`` with the runtime it was measured on, e.g.
``matmul-h200.json`` or ``matmul-cpu.json``. Benchmarks measure; they never assert.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import pathlib
import re
import sys
import time
import traceback
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))  # the tpu_course package of this checkout


def device_slug() -> str:
    """A file-name-safe name of the device: the hardware-table key when the chip is
    known ('h200', 'v5e'), else the platform and device kind ('cpu', 'gpu-nvidia-l4')."""
    from tpu_course import runtime

    rt = runtime.describe()
    if rt.generation:
        return rt.generation
    if rt.platform == "cpu":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", f"{rt.platform}-{rt.device_kind}".lower()).strip("-")


def generic_table(rows: list[dict[str, Any]]) -> str:
    """Rows of scalars as an aligned text table (nested values are left out)."""
    if not rows:
        return "(no rows)"
    cols = [k for k, v in rows[0].items() if not isinstance(v, (dict, list))]

    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    out = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    out += ["  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def run_one(path: pathlib.Path, slug: str) -> dict[str, Any] | None:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    start = time.perf_counter()
    result = module.main()
    elapsed = time.perf_counter() - start
    if result is None:
        print(f"{path.name}: main() returned nothing ({elapsed:.1f} s)")
        return None
    from tpu_course import runtime

    import jax

    result = dict(result)
    topic = result.setdefault("topic", path.stem.removeprefix("bench_"))
    result["device"] = slug
    result["runtime"] = runtime.describe().banner()
    result["jax_version"] = jax.__version__
    result["date_utc"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    result["wall_s"] = elapsed
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{topic}-{slug}.json"
    out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    printer = getattr(module, "table", None)
    print(f"\n== {topic} on {result['runtime']} ({elapsed:.1f} s) -> {out.relative_to(HERE.parent)}")
    if printer:
        print(printer(result))
    elif "rows" in result:
        print(generic_table(result["rows"]))
    else:  # a flat result: one measurement, printed as key: value
        skip = {"device", "runtime", "jax_version", "date_utc", "wall_s", "topic"}
        print("\n".join(f"  {k}: {v}" for k, v in result.items()
                        if k not in skip and not isinstance(v, (dict, list))))
    for check in result.get("checks", []):
        if not printer:
            print(f"check: {check.get('what')}: {'ok' if check.get('passed') else 'NOT MET'}")
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = sorted(HERE.glob("bench_*.py"))
    if argv:
        paths = [p for p in paths if p.stem.removeprefix("bench_") in argv]
    slug = device_slug()
    failed = []
    for path in paths:
        try:
            run_one(path, slug)
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others
            traceback.print_exc()
            failed.append(path.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
