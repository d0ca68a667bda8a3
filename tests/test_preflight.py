"""``tpu-course preflight``: a full run writes its record; a broken data folder fails it.

The full run and the bad ``XLA_FLAGS`` cases run the command line in a fresh process, as
an instructor would (it simulates the 8 devices of chapter 6 before JAX starts); the
argument and ``--json`` path cases call ``main()`` here.
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
    """Every chapter, from the command line, into ``--json``. Its cache is empty, so
    chapter 5 trains on Fashion-MNIST read offline from disk (``TPU_COURSE_DATA`` or
    Debian's copy), not on a copy the cache kept: the chapter's own run, in this one."""
    if not os.environ.get("TPU_COURSE_DATA"):
        pytest.skip("needs the offline data (TPU_COURSE_DATA), so that nothing is downloaded")
    path = tmp_path / "record.json"
    proc = _preflight("--json", str(path), TPU_COURSE_CACHE=str(tmp_path / "cache"))
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
    # chapter 5 trained on Fashion-MNIST offline, with an empty cache
    row = next(line for line in proc.stdout.splitlines() if line.split()[:2] == ["5", "ok"])
    assert "fashion_mnist" in row and "test accuracy" in row


def test_missing_data_fails_chapter_5_with_what_it_needs(tmp_path, monkeypatch):
    from tpu_course import data

    monkeypatch.setenv("TPU_COURSE_DATA", str(tmp_path))  # an empty folder: no download
    monkeypatch.setenv("TPU_COURSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(data.SYSTEM_DIRS, "fashion_mnist", (str(tmp_path / "none"),))
    with pytest.raises(preflight.Failure) as failed:
        preflight._ch5()
    said, fix = str(failed.value), failed.value.fix
    assert "Fashion-MNIST" in said and str(tmp_path) in said and "no folder" in said
    assert "set TPU_COURSE_DATA to that folder" in fix and "t10k-labels-idx1-ubyte.gz" in fix
    assert "dataset-fashion-mnist" in fix


def test_chapter_6_runs_apart_when_this_process_cannot_simulate(subprocess_runner):
    # A kernel whose JAX started with one CPU device (Colab): the mesh runs in a CPU-only
    # subprocess, and the row says so. This test process is such a kernel: its JAX has
    # one CPU device; where it has the mesh's devices, a fresh one-device Python is.
    from tpu_course import runtime

    if len(runtime.cpu_devices()) < preflight.MESH_DEVICES:
        out = preflight.run(chapters=[6]).to_dict()
    else:
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


@pytest.mark.parametrize("bad", ["0", "9", "1,x", ""])
def test_bad_chapter_lists_are_refused(bad):
    with pytest.raises(errors.CourseValueError, match="chapter"):
        preflight.parse_chapters(bad)


# --------------------------------------------------------------------------------------
# --json PATH: checked before anything runs; only earlier records are replaced; the
# table is printed before the record is written (issue 25 §2)
# --------------------------------------------------------------------------------------


@pytest.fixture
def no_chapters(monkeypatch):
    """A bad path must be refused before any chapter runs: running one fails the test."""
    def ran(chapter, multihost):
        raise AssertionError(f"chapter {chapter} ran although the path is bad")

    monkeypatch.setattr(preflight, "_run_one", ran)


def _bad_paths(tmp_path):
    (tmp_path / "a-file").write_text("mine\n")
    return {
        "empty": ("", "path is empty"),
        "a folder": (str(tmp_path), "is a folder, not a file"),
        "parent is a file": (str(tmp_path / "a-file" / "record.json"),
                             "a-file is a file, not a folder"),
        "cannot be created": (str(tmp_path / ("x" * 300 + ".json")), "cannot be written"),
    }


@pytest.mark.parametrize("case", ["empty", "a folder", "parent is a file", "cannot be created"])
def test_a_bad_json_path_is_refused_before_anything_runs(tmp_path, capsys, no_chapters, case):
    path, message = _bad_paths(tmp_path)[case]
    with pytest.raises(SystemExit) as stop:
        preflight.main(["--chapters", "1", "--json", path])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    with pytest.raises(preflight.RecordPathError, match=message.split(",")[0]):
        preflight.run(path, chapters=[1])  # the notebook entry point refuses it too
    assert (tmp_path / "a-file").read_text() == "mine\n"


def test_a_file_that_is_not_a_record_is_never_overwritten(tmp_path, capsys, no_chapters):
    readme = tmp_path / "README.md"
    readme.write_text("# my project\n")
    with pytest.raises(SystemExit):
        preflight.main(["--chapters", "1", "--json", str(readme)])
    assert "is not an earlier preflight record" in capsys.readouterr().err
    assert readme.read_text() == "# my project\n"
    with pytest.raises(preflight.RecordPathError, match="not an earlier preflight record"):
        preflight.run(readme, chapters=[1])
    assert readme.read_text() == "# my project\n"


def test_an_earlier_record_is_replaced_and_missing_folders_are_made(tmp_path, capsys):
    path = tmp_path / "results" / "colab" / "preflight.json"
    assert preflight.main(["--chapters", "1", "--json", str(path)]) == 0
    first = json.loads(path.read_text())
    assert first["tool"] == "tpu-course preflight" and first["chapters"][0]["status"] == "ok"
    out = capsys.readouterr().out
    assert out.index("equals numpy") < out.index("record written to")  # table first
    path.write_text(json.dumps({**first, "date": "an earlier run"}))
    assert preflight.main(["--chapters", "1", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["date"] != "an earlier run"
    assert [p.name for p in path.parent.iterdir()] == ["preflight.json"]  # no temporary left


def test_a_write_that_fails_at_the_end_keeps_the_table(tmp_path, capsys, monkeypatch):
    def disk_full(report, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(preflight, "write_record", disk_full)
    path = tmp_path / "record.json"
    assert preflight.main(["--chapters", "1", "--json", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "equals numpy" in out and "OK" in out  # the whole table was printed first
    assert "record was not written" in err and "No space left on device" in err
    with pytest.raises(preflight.RecordPathError, match="No space left") as info:
        preflight.run(path, chapters=[1])
    assert info.value.report.rows[0].status == "ok"  # the result is in the error
    assert "equals numpy" in capsys.readouterr().out
    assert not path.exists()


# --------------------------------------------------------------------------------------
# XLA_FLAGS that XLA would die on: the first row, exit 1, the table intact (§3)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags, said", [
    ("--xla_force_host_platform_device_count=abc", "--xla_force_host_platform_device_count=abc"),
    ("--not_a_flag=1", "Unknown flag in XLA_FLAGS: --not_a_flag=1"),
])
def test_a_bad_xla_flag_is_the_first_row(flags, said):
    proc = _preflight("--chapters", "1,2,6", XLA_FLAGS=flags)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert rows[0][:2] == ["XLA_FLAGS", "failed"] and said in proc.stdout, proc.stdout
    assert "fix:" in proc.stdout and "unset XLA_FLAGS" in proc.stdout
    statuses = {r[0]: r[1] for r in rows if r and r[0] in ("1", "2", "6")}
    assert statuses == {"1": "ok", "2": "skipped", "6": "skipped"}, proc.stdout  # 1 needs no JAX
    assert "FAILED: chapter(s) XLA_FLAGS" in proc.stdout
    assert "Flags:" not in proc.stdout + proc.stderr  # not XLA's 90 lines of flag help
