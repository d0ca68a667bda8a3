"""``tpu-course preflight``: a full run writes its record; a broken data folder fails it.

Both run the command line in a fresh process, as an instructor would (it simulates the
8 devices of chapter 6 before JAX starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tpu_course import errors, preflight


def _preflight(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    full["JAX_PLATFORMS"] = "cpu"
    full.update(env)
    return subprocess.run([sys.executable, "-m", "tpu_course", "preflight", *args], env=full,
                          capture_output=True, text=True, timeout=300)


def test_full_run_writes_the_record(tmp_path):
    if not os.environ.get("TPU_COURSE_DATA"):
        pytest.skip("needs the offline data (TPU_COURSE_DATA), so that nothing is downloaded")
    path = tmp_path / "record.json"
    proc = _preflight("--json", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(path.read_text())
    assert set(record) >= {"date", "versions", "runtime", "device_kind", "device_count",
                           "chapters"}
    assert record["versions"]["jax"] and record["runtime"].startswith("Runtime: CPU")
    assert record["device_count"] >= 1 and record["ok"] is True
    assert [c["chapter"] for c in record["chapters"]] == list(preflight.CHAPTERS)
    for c in record["chapters"]:
        assert c["status"] in ("ok", "skipped"), c
        assert isinstance(c["seconds"], float) and c["seconds"] >= 0 and c["detail"], c
    by = {c["chapter"]: c["detail"] for c in record["chapters"]}
    assert "equals numpy" in by[1] and "CPU timing" in by[2]
    assert f"{preflight.MESH_DEVICES} simulated devices matches 1 device" in by[6]
    assert "all-gather" in by[6]  # FSDP's collectives, read from the compiled program
    if record["chapters"][6]["status"] == "ok":
        assert "Pallas kernel in TPU interpret mode equals jnp" in by[7]
    for n in range(1, 8):  # the printed table has one row per chapter
        assert any(line.split()[:2] == [str(n), record["chapters"][n - 1]["status"]]
                   for line in proc.stdout.splitlines()), proc.stdout


def test_missing_data_fails_chapter_5_with_the_fix(tmp_path):
    proc = _preflight("--chapters", "5,1", TPU_COURSE_DATA=str(tmp_path))  # an empty folder
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.split()[:2] == ["5", "failed"])
    assert str(tmp_path) in row and "no folder" in row
    assert "fix: set TPU_COURSE_DATA to a folder holding the MNIST IDX files" in proc.stdout
    assert "FAILED: chapter(s) 5" in proc.stdout


def test_chapter_6_runs_apart_when_this_process_cannot_simulate(subprocess_runner):
    # A kernel whose JAX started with one CPU device (Colab): the mesh runs in a CPU-only
    # subprocess, and the row says so.
    out = subprocess_runner("""
        import json, jax
        jax.devices()
        from tpu_course import preflight
        r = preflight.run(chapters=[6])
        print(json.dumps(r.to_dict()))
    """, devices=1)
    (row,) = out["chapters"]
    assert row["status"] == "ok", row
    assert "in a separate CPU-only process" in row["detail"]


@pytest.mark.parametrize("bad", ["0", "8", "1,x", ""])
def test_bad_chapter_lists_are_refused(bad):
    with pytest.raises(errors.CourseValueError, match="chapter"):
        preflight.parse_chapters(bad)
