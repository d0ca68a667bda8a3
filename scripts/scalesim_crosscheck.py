"""Run SCALE-Sim 3.0.0 on a spread of GEMMs and record what it reports, for the tests.

SCALE-Sim is the published systolic-array simulator the course's ``timing="scalesim"``
convention reproduces. It is never a dependency of the course: install it in a throw-away
virtual environment outside the repository and run this script with that Python::

    python3 -m venv /tmp/scalesim-venv
    /tmp/scalesim-venv/bin/pip install scalesim==3.0.0 'numpy<2.4'
    /tmp/scalesim-venv/bin/python scripts/scalesim_crosscheck.py --out tests/data/scalesim_cases.json

For every (array size, dataflow) it writes one GEMM topology file (rows ``name, M, N, K,``
meaning C[M x N] = A[M x K] @ B[K x N]), runs SCALE-Sim with ideal memory
(``InterfaceBandwidth: CALC``: SCALE-Sim sizes the bandwidth so that nothing stalls) and
SRAMs large enough to hold every operand, and records per layer: 'Total Cycles',
'Stall Cycles', 'Overall Util %' and 'Mapping Efficiency %' (COMPUTE_REPORT.csv) and the
SRAM reads/writes (DETAILED_ACCESS_REPORT.csv). ``tests/test_systolic.py`` checks
``tpu_course.systolic`` against the file this script writes.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

CONFIG = """\
[general]
run_name = crosscheck

[architecture_presets]
ArrayHeight:    {rows}
ArrayWidth:     {cols}
IfmapSramSzkB:    65536
FilterSramSzkB:   65536
OfmapSramSzkB:    65536
IfmapOffset:    0
FilterOffset:   100000000
OfmapOffset:    200000000
Bandwidth : 10
Dataflow : {dataflow}
ReadRequestBuffer: 32
WriteRequestBuffer: 32

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: 10
IfmapSRAMBankNum: 10
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: 10
FilterSRAMBankNum: 10
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport : false
SparseRep : ellpack_block
OptimizedMapping : false
BlockSize : 8
RandomNumberGeneratorSeed : 40

[run_presets]
InterfaceBandwidth: CALC
UseRamulatorTrace: False
"""

# (rows, cols) -> list of (M, K, N): square and non-square arrays, exact multiples of the
# array size and ragged shapes, single elements, more folds than one along every axis.
CASES: dict[tuple[int, int], list[tuple[int, int, int]]] = {
    (4, 4): [(1, 1, 1), (4, 4, 4), (8, 8, 8), (5, 7, 3), (10, 13, 6), (2, 9, 11)],
    (8, 4): [(10, 13, 6), (16, 8, 4), (3, 17, 9)],
    (4, 8): [(10, 13, 6), (7, 16, 9), (20, 3, 5)],
    (3, 5): [(11, 5, 7), (6, 3, 10)],
    (1, 6): [(4, 3, 7)],
    (16, 16): [(32, 32, 32), (100, 50, 20)],
    (32, 8): [(64, 33, 40)],
    (128, 128): [(100, 100, 100), (256, 384, 128)],
}


def run_one(rows: int, cols: int, dataflow: str, shapes: list[tuple[int, int, int]],
            workdir: pathlib.Path) -> list[dict]:
    """Run SCALE-Sim once on ``shapes`` (one layer each); return one record per layer."""
    from scalesim.scale_sim import scalesim

    cfg = workdir / "scale.cfg"
    cfg.write_text(CONFIG.format(rows=rows, cols=cols, dataflow=dataflow))
    topo = workdir / "gemm.csv"
    topo.write_text("Layer, M, N, K,\n" + "".join(
        f"g{i}, {m}, {n}, {k},\n" for i, (m, k, n) in enumerate(shapes)))
    layout = workdir / "layout.csv"
    layout.write_text("Layer, a, b, c, d, e, f, g, h,\n" + "".join(
        f"g{i}, 1, 1, 1, 1, 1, 1, 1, 1,\n" for i in range(len(shapes))))
    out = workdir / "out"
    sim = scalesim(save_disk_space=True, verbose=False, config=str(cfg), topology=str(topo),
                   layout=str(layout), input_type_gemm=True)
    sim.run_scale(top_path=str(out))
    compute = list(csv.reader((out / "crosscheck" / "COMPUTE_REPORT.csv").open()))
    detail = list(csv.reader((out / "crosscheck" / "DETAILED_ACCESS_REPORT.csv").open()))
    head_c = [h.strip() for h in compute[0]]
    head_d = [h.strip() for h in detail[0]]
    records = []
    for i, (m, k, n) in enumerate(shapes):
        c = dict(zip(head_c, (v.strip() for v in compute[i + 1])))
        d = dict(zip(head_d, (v.strip() for v in detail[i + 1])))
        records.append({
            "rows": rows, "cols": cols, "dataflow": dataflow, "M": m, "K": k, "N": n,
            "total_cycles": int(float(c["Total Cycles"])),
            "stall_cycles": int(float(c["Stall Cycles"])),
            "overall_util_pct": float(c["Overall Util %"]),
            "mapping_efficiency_pct": float(c["Mapping Efficiency %"]),
            "sram_ifmap_reads": int(float(d["SRAM IFMAP Reads"])),
            "sram_filter_reads": int(float(d["SRAM Filter Reads"])),
            "sram_ofmap_writes": int(float(d["SRAM OFMAP Writes"])),
        })
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="tests/data/scalesim_cases.json")
    args = parser.parse_args(argv)
    import importlib.metadata

    version = importlib.metadata.version("scalesim")
    records = []
    start = time.perf_counter()
    for (rows, cols), shapes in CASES.items():
        for dataflow in ("ws", "os", "is"):
            with tempfile.TemporaryDirectory() as tmp:
                cwd = os.getcwd()
                os.chdir(tmp)  # SCALE-Sim writes next to the current directory too
                try:
                    records += run_one(rows, cols, dataflow, shapes, pathlib.Path(tmp))
                finally:
                    os.chdir(cwd)
            print(f"{rows}x{cols} {dataflow}: {len(shapes)} case(s)", flush=True)
    doc = {
        "provenance": {
            "tool": f"scalesim=={version} (PyPI), run by scripts/scalesim_crosscheck.py",
            "python": platform.python_version(),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "config": "GEMM topology rows 'name, M, N, K,' (C[MxN] = A[MxK] @ B[KxN]); "
                      "InterfaceBandwidth CALC (ideal memory, no stalls); SRAMs 65536 kB "
                      "each; no sparsity; default (non-custom) layout",
            "fields": "total_cycles = COMPUTE_REPORT 'Total Cycles'; overall_util_pct = "
                      "'Overall Util %'; mapping_efficiency_pct = 'Mapping Efficiency %'; "
                      "sram_* = DETAILED_ACCESS_REPORT SRAM reads/writes",
            "note": "SCALE-Sim's output-stationary OFMAP write count adds rows + cols of "
                    "each fold a second time (systolic_compute_os.py), so the tests do "
                    "not compare 'os' OFMAP writes.",
            "seconds": round(time.perf_counter() - start, 1),
        },
        "cases": records,
    }
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(records)} cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
