"""What a job costs: chips x hours x a price per chip-hour, and MFU.

A cost is a formula, ``chips x hours x USD per chip-hour``: pass today's price for your
region (``usd_per_chip_hour=``, read from :data:`PRICES_SOURCE`) and the total is yours.
Without it the course fills in an *example* price: the hardware rows' on-demand
``usd_per_chip_hour`` (source P1, dated, unverified) and spot prices derived from them by
an assumed fraction; every printed estimate says which it used.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from tpu_course import errors, hardware


#: Spot price as a fraction of on-demand: an ASSUMPTION, not a published figure. Spot
#: prices vary by region and over time; the course has no copy of them, so every spot
#: price below is on-demand x this, and printed estimates say so.
SPOT_FRACTION_ASSUMED = 0.4

#: USD per chip-hour by chip and pricing: the on-demand list prices held in the hardware
#: table (``Chip.usd_per_chip_hour``, source P1, unverified); the spot column is derived:
#: on-demand x :data:`SPOT_FRACTION_ASSUMED`.
PRICES_USD_PER_CHIP_HOUR: Mapping[str, Mapping[str, float]] = {
    chip: {"on_demand": usd, "spot": round(usd * SPOT_FRACTION_ASSUMED, 2)}
    for chip, usd in hardware.prices().items()
}


def pricing_note(pricing: str) -> str:
    """What a price of kind ``pricing`` rests on, printed beside every estimate.

    >>> pricing_note("spot")
    'spot = assumed 0.4 x on-demand'
    """
    if pricing == "spot":
        return f"spot = assumed {SPOT_FRACTION_ASSUMED:g} x on-demand"
    return pricing


PRICES_AS_OF = "2026-11-30"  # the date in source P1
PRICES_SOURCE = "https://cloud.google.com/tpu/pricing"  # the example prices: unverified (P1)


@dataclasses.dataclass(frozen=True)
class CostEstimate:
    """Chips x hours x price, and the model FLOP utilisation behind it."""

    chip: str
    chips: int
    hours: float
    usd_per_chip_hour: float
    pricing: str
    mfu: float | None = None
    example: bool = True  # the course's example price, not one the caller gave

    @property
    def usd(self) -> float:
        return self.chips * self.hours * self.usd_per_chip_hour

    def __str__(self) -> str:
        m = f", MFU {self.mfu:.1%}" if self.mfu is not None else ""
        if not self.example:
            where = f"your {self.pricing.replace('_', '-')} price"
        elif self.pricing == "spot":
            where = f"example: {pricing_note('spot')}, unverified"
        else:
            where = "example price, unverified"
        cost = (f"{self.chips} x {self.chip} x {self.hours:,.3g} h x "
                f"${self.usd_per_chip_hour:.2f}/chip-h = ${self.usd:,.2f}{m}")
        # One line when it leaves room for a label before it in an 88-character column.
        return f"{cost} ({where})" if len(cost) + len(where) < 70 else f"{cost}\n  ({where})"

    __repr__ = __str__


def mfu(model_flops_per_step: float, step_time_s: float, chips: int,
        chip: hardware.Chip | str) -> float:
    """Model FLOP utilisation: achieved model FLOP/s over ``chips x C`` (bf16 peak).

    ``chips`` counts chips, not JAX devices: on v2, v3 and 7x a chip is two devices, so a
    step on ``d`` devices uses ``d / 2`` chips. A chip without a bf16 peak (the T4)
    raises ``ValueError`` rather than borrowing another dtype's peak.

    >>> round(mfu(197e12, 1.0, 2, "v5e"), 2)
    0.5
    """
    model_flops_per_step = errors.check_number("model_flops_per_step", model_flops_per_step, low=0)
    step_time_s = errors.check_number("step_time_s", step_time_s, low=0, low_open=True)
    chips = errors.check_int("chips", chips, low=1)
    chip = hardware.as_chip(chip)
    return model_flops_per_step / step_time_s / (chips * hardware.peak_flops_per_s(chip))


def training_cost(chip: str, chips: int, *, tokens: float | None = None, params: float | None = None,
                  mfu: float | None = None, hours: float | None = None,
                  pricing: str = "on_demand",
                  usd_per_chip_hour: float | None = None) -> CostEstimate:
    """Dollars for a job: either ``hours`` given, or from ``6 x params x tokens`` FLOPs at ``mfu``.

    ``usd_per_chip_hour``: today's price for your region and ``pricing`` (from
    :data:`PRICES_SOURCE`); without it the course's dated example price is used, and the
    estimate says so.

    ``hours = 6 P T / (chips x C x MFU) / 3600`` (training FLOPs ~ 6 per parameter per
    token, PaLM appendix B via nanoGPT's ``estimate_mfu``).

    >>> est = training_cost("v5e", 256, params=1e9, tokens=20e9, mfu=0.4)
    >>> round(est.hours, 2), round(est.usd)
    (1.65, 508)
    >>> print(training_cost("v5e", 20, hours=3, pricing="spot"))
    20 x v5e x 3 h x $0.48/chip-h = $28.80
      (example: spot = assumed 0.4 x on-demand, unverified)
    >>> print(training_cost("v5e", 20, hours=3, pricing="spot", usd_per_chip_hour=0.5))
    20 x v5e x 3 h x $0.50/chip-h = $30.00 (your spot price)
    """
    if not isinstance(chip, str) or chip not in PRICES_USD_PER_CHIP_HOUR:
        raise errors.CourseValueError(f"chip={chip!r}: no price in the table; it has "
                                      f"{', '.join(map(repr, PRICES_USD_PER_CHIP_HOUR))}.")
    c = hardware.get(chip)
    chips = errors.check_int("chips", chips, low=1)
    errors.check_choice("pricing", pricing, PRICES_USD_PER_CHIP_HOUR[chip])
    if hours is not None:
        hours = errors.check_number("hours", hours, low=0)
    else:
        if tokens is None or params is None or mfu is None:
            raise errors.CourseValueError("give hours=, or all of tokens=, params= and mfu=")
        tokens = errors.check_number("tokens", tokens, low=0)
        params = errors.check_number("params", params, low=0, low_open=True)
        mfu = errors.check_number("mfu", mfu, low=0, high=1, low_open=True)
        hours = 6 * params * tokens / (chips * hardware.peak_flops_per_s(c) * mfu) / 3600
    if usd_per_chip_hour is None:
        return CostEstimate(chip, chips, hours, PRICES_USD_PER_CHIP_HOUR[chip][pricing], pricing, mfu)
    price = errors.check_number("usd_per_chip_hour", usd_per_chip_hour, low=0, low_open=True)
    return CostEstimate(chip, chips, hours, price, pricing, mfu, example=False)
