"""The hardware table: fact-sheet numbers, derived quantities, and device-kind lookup."""

import dataclasses
import re

import pytest

from tpu_course import hardware

# Critical intensities from shared/hardware_facts.md section 4 (FLOP/byte), recomputed
# from the table's canonical values; 10% tolerance as the fact sheet suggests.
FACT_SHEET_CRITICAL = {"v2": 64, "v4": 229, "v5e": 240, "v5p": 166, "v6e": 560, "7x": 312,
                       "a100": 153, "h100": 295, "h200": 206}


@pytest.mark.parametrize("name,value", FACT_SHEET_CRITICAL.items())
def test_critical_intensity_matches_fact_sheet(name, value):
    assert hardware.critical_intensity(hardware.get(name)) == pytest.approx(value, rel=0.1)


def test_v5e_critical_intensity_is_about_240():
    assert hardware.critical_intensity(hardware.get("v5e")) == pytest.approx(240, abs=3)


def test_every_row_is_complete_and_sourced():
    expected = {"v2", "v3", "v4", "v5e", "v5p", "v6e", "7x", "t4", "a100", "h100", "h200"}
    assert set(hardware.names()) == expected
    for chip in hardware.CHIPS.values():
        assert chip.sources.get("peak_bf16_flops_per_s"), chip.name
        assert chip.sources.get("hbm_bytes_per_s") or chip.sources.get("hbm_bytes"), chip.name
        assert chip.peak_bf16_flops_per_s > 1e13 and chip.hbm_bytes > 1e9
        for tag in re.findall(r"\b(S\d+|NV)\b", " ".join(chip.sources.values())):
            assert tag in hardware.SOURCES, f"{chip.name}: unknown source tag {tag}"


def test_implied_mxu_clock_is_plausible_for_v2_to_v5p():
    """peak / (MXUs x size^2 x 2 FLOP) gives the clock; the fact sheet derives 0.7-1.75 GHz."""
    clocks = {"v2": 0.70e9, "v3": 0.94e9, "v4": 1.05e9, "v5e": 1.50e9, "v5p": 1.75e9}
    for name, ghz in clocks.items():
        c = hardware.get(name)
        implied = c.peak_bf16_flops_per_s / (c.mxu_count * c.mxu_size**2 * 2)
        assert implied == pytest.approx(ghz, rel=0.02), name


def test_rows_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        hardware.get("v5e").hbm_bytes = 1  # type: ignore[misc]


@pytest.mark.parametrize("kind,name", [
    ("TPU v2", "v2"), ("TPU v3", "v3"), ("TPU v4", "v4"), ("TPU v5 lite", "v5e"),
    ("TPU v5e", "v5e"), ("TPU v5", "v5p"), ("TPU v5p", "v5p"), ("TPU v6 lite", "v6e"),
    ("TPU7x", "7x"), ("Tesla T4", "t4"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
])
def test_lookup_maps_device_kinds(kind, name):
    assert hardware.lookup(kind).name == name


@pytest.mark.parametrize("kind", ["cpu", "NVIDIA A100-SXM4-40GB", "TPU v9 ultra", "", "NVIDIA GeForce RTX 4090"])
def test_lookup_says_unknown_instead_of_guessing(kind):
    assert hardware.lookup(kind) is None


def test_get_unknown_lists_the_table():
    with pytest.raises(ValueError, match="v5e"):
        hardware.get("v99")
    assert hardware.get("Trillium").name == "v6e"


def test_units_conventions():
    assert hardware.get("v5p").hbm_bytes == 95 * 2**30  # "95 GiB"
    assert hardware.get("v5e").hbm_bytes == 16e9  # "16 GB"
    assert hardware.get("v6e").mxu_size == 256 and hardware.get("v5e").mxu_size == 128
