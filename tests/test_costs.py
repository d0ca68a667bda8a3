"""``tpu_course.costs``: a job's cost as chips x hours x price, and MFU."""

from __future__ import annotations

import pytest

from tpu_course import costs

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)


def test_training_cost_arithmetic():
    est = costs.training_cost("v5e", 8, hours=2.0)
    assert est.usd == pytest.approx(8 * 2 * costs.PRICES_USD_PER_CHIP_HOUR["v5e"]["on_demand"])
    assert "unverified" in str(est)
    assert costs.mfu(6e12, 1.0, 1, "v5e") == pytest.approx(6e12 / 197e12)
    with pytest.raises(ValueError, match="no published bf16"):
        costs.mfu(6e12, 1.0, 1, "t4")


def test_spot_prices_are_an_assumption_printed_beside_the_number():
    for row in costs.PRICES_USD_PER_CHIP_HOUR.values():
        assert row["spot"] == pytest.approx(row["on_demand"] * costs.SPOT_FRACTION_ASSUMED, abs=0.005)
    spot = str(costs.training_cost("v6e", 1, hours=1, pricing="spot"))
    assert "assumed 0.4 x on-demand" in spot
    assert "assumed" not in str(costs.training_cost("v6e", 1, hours=1))


def test_a_cost_is_a_formula_filled_with_the_learners_price():
    """The course's prices are dated examples; a price the caller gives replaces them (and
    the estimate stops calling itself an example)."""
    mine = costs.training_cost("v5e", 20, hours=3, pricing="spot", usd_per_chip_hour=0.55)
    assert mine.usd == pytest.approx(20 * 3 * 0.55) and not mine.example
    assert "your spot price" in str(mine) and "example" not in str(mine)
    example = costs.training_cost("v5e", 20, hours=3, pricing="spot")
    assert example.example and "example" in str(example) and "unverified" in str(example)
    fitted = costs.training_cost("v6e", 256, params=1e9, tokens=20e9, mfu=0.4, usd_per_chip_hour=2.0)
    assert fitted.usd == pytest.approx(fitted.hours * 256 * 2.0)
    for bad in (0, -1.0, "1.20", float("nan")):
        with pytest.raises((ValueError, TypeError), match="usd_per_chip_hour"):
            costs.training_cost("v5e", 8, hours=1.0, usd_per_chip_hour=bad)
