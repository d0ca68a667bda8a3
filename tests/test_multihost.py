"""Two processes on 127.0.0.1 with jax.distributed and gloo: same result as one device."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tpu_course import multihost, parallel


def test_two_processes_match_single_device():
    results = multihost.launch_local(num_processes=2, local_devices=2, steps=4, timeout_s=120)
    assert [r["process_index"] for r in results] == [0, 1]
    assert all(r["global_devices"] == 4 and r["local_devices"] == 2 for r in results)
    import jax
    single = multihost.train_data_parallel(parallel.make_mesh((1,), ("data",), jax.devices()[:1]), steps=4)
    for r in results:
        np.testing.assert_allclose(r["losses"], single["losses"], rtol=1e-5)
        assert abs(r["w1_sum"] - float(np.sum(single["params"]["w1"], dtype=np.float64))) < 1e-3


def test_a_run_that_overruns_is_killed_not_hung():
    with pytest.raises(RuntimeError, match="killed"):
        multihost.launch_local(num_processes=2, local_devices=1, steps=2, timeout_s=0.5)


# ------------------------------------------------------------------ fault injection
# A sitecustomize on PYTHONPATH runs in every rank before the worker: it makes one rank
# crash at start-up, crash after joining the run, or hang. That it runs at all also
# shows that the ranks inherit the caller's PYTHONPATH.
FAULTS = '''
import os, sys, threading, time
rank, _, mode = os.environ.get("TPU_COURSE_TEST_FAULT", "::").partition(":")
me = sys.argv[sys.argv.index("--process-id") + 1] if "--process-id" in sys.argv else None
if me is not None and me == rank:
    if mode == "start":
        print("injected: rank", rank, "refuses to start", file=sys.stderr, flush=True)
        os._exit(7)
    if mode == "hang":
        time.sleep(3600)
    if mode == "mid":
        import jax
        init = jax.distributed.initialize
        def crash_later(*args, **kwargs):
            init(*args, **kwargs)
            def crash():
                print("injected: rank", rank, "crashes mid-run", file=sys.stderr, flush=True)
                os._exit(7)
            threading.Timer(1.0, crash).start()
        jax.distributed.initialize = crash_later
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers: check its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(FAULTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))

    def inject(rank: int, mode: str) -> None:
        monkeypatch.setenv("TPU_COURSE_TEST_FAULT", f"{rank}:{mode}")
    return inject


@pytest.mark.parametrize("rank, mode, says", [
    (1, "start", "refuses to start"),
    (0, "start", "refuses to start"),
    (1, "mid", "crashes mid-run"),
])
def test_a_crashed_rank_is_reported_at_once_with_its_exit_code_and_stderr(faulty, rank, mode, says):
    faulty(rank, mode)
    start = time.monotonic()
    with pytest.raises(multihost.LaunchError) as info:
        multihost.launch_local(num_processes=2, local_devices=1, steps=50, timeout_s=120)
    took = time.monotonic() - start
    err = info.value
    assert err.rank == rank and err.exit_code == 7
    assert f"rank {rank} of 2 failed with exit code 7" in str(err)
    assert says in str(err) and says in err.stderr_tail
    assert took < 30, f"reported after {took:.0f} s: the crash waited for the timeout"
    assert not any(_alive(pid) for pid in err.pids)
    assert isinstance(err, RuntimeError)


def test_a_hung_rank_ends_at_the_timeout_with_nothing_left_running(faulty):
    faulty(1, "hang")
    start = time.monotonic()
    with pytest.raises(multihost.LaunchError, match=r"exceeded 20 s: rank\(s\) \[.*1\] still running") as info:
        multihost.launch_local(num_processes=2, local_devices=1, steps=2, timeout_s=20)
    assert 20 <= time.monotonic() - start < 30
    assert len(info.value.pids) == 2 and not any(_alive(pid) for pid in info.value.pids)
