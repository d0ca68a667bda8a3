"""``tpu_course.plans``: the collectives a sharding strategy implies, and their bytes."""

from __future__ import annotations

import pytest

from tpu_course import plans

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)


def test_collective_bytes_fsdp_vs_dp_total_traffic():
    shapes = [(256, 1024), (1024, 256)]
    dp = plans.collective_bytes("dp", shapes, devices=8, loss_bytes=0)
    fsdp = plans.collective_bytes("fsdp", shapes, devices=8, loss_bytes=0)
    # an all-reduce is a reduce-scatter plus an all-gather: same V, same time
    assert dp.time_s("v5e", 8) == pytest.approx(fsdp.time_s("v5e", 8))
    assert fsdp.by_kind()["all-gather"][1] * 8 == dp.total_bytes == fsdp.by_kind()["reduce-scatter"][1]


def test_collective_bytes_errors():
    with pytest.raises(ValueError, match="strategy"):
        plans.collective_bytes("zero", [(8, 8)], devices=8)
    with pytest.raises(ValueError, match="divide"):
        plans.collective_bytes("fsdp", [(6, 8)], devices=8)
    with pytest.raises(ValueError, match="batch"):
        plans.collective_bytes("tp", [(8, 8)], devices=8)


def test_layer_bytes_scaling_book():
    d, f, b = 8192, 32768, 1024
    assert plans.layer_bytes("dp", d, f) == 8 * d * f
    assert plans.layer_bytes("fsdp", d, f) == 12 * d * f
    assert plans.layer_bytes("tp", d, f, batch=b) == 8 * b * d
