"""Two processes on 127.0.0.1 with jax.distributed and gloo: same result as one device."""

from __future__ import annotations

import numpy as np
import pytest

from tpu_course import parallel


def test_two_processes_match_single_device():
    results = parallel.launch_local(num_processes=2, local_devices=2, steps=4, timeout_s=120)
    assert [r["process_index"] for r in results] == [0, 1]
    assert all(r["global_devices"] == 4 and r["local_devices"] == 2 for r in results)
    import jax
    single = parallel.train_data_parallel(parallel.make_mesh((1,), ("data",), jax.devices()[:1]), steps=4)
    for r in results:
        np.testing.assert_allclose(r["losses"], single["losses"], rtol=1e-5)
        assert abs(r["w1_sum"] - single["w1_sum"]) < 1e-3


def test_a_run_that_overruns_is_killed_not_hung():
    with pytest.raises(RuntimeError, match="killed"):
        parallel.launch_local(num_processes=2, local_devices=1, steps=2, timeout_s=0.5)
