"""The hardware table: fact-sheet numbers, derived quantities, and device-kind lookup."""

import dataclasses
import re

import pytest

from tpu_course import hardware

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)

# Critical intensities from shared/hardware_facts.md section 4 (FLOP/byte), recomputed
# from the table's canonical values; 10% tolerance as the fact sheet suggests.
FACT_SHEET_CRITICAL = {"v2": 64, "v4": 229, "v5e": 240, "v5p": 166, "v6e": 560, "7x": 312,
                       "a100": 153, "h100": 295, "h200": 206}


@pytest.mark.parametrize("name,value", FACT_SHEET_CRITICAL.items())
def test_critical_intensity_matches_fact_sheet(name, value):
    assert hardware.get(name).critical_intensity() == pytest.approx(value, rel=0.1)


def test_v5e_critical_intensity_is_about_240():
    assert hardware.get("v5e").critical_intensity() == pytest.approx(240, abs=3)


#: Fields that describe a row rather than state a figure about the chip.
NOT_FIGURES = {"name", "display_name", "kind", "device_kinds", "sources", "alt_values"}


def _figures(chip):
    """The row's stated figures: every other field that holds a value."""
    return {f.name: getattr(chip, f.name) for f in dataclasses.fields(chip)
            if f.name not in NOT_FIGURES and getattr(chip, f.name) not in (None, ())}


def test_every_figure_of_every_row_is_sourced():
    """A new row (or a new field) fails here until each figure it states names its source:
    a tag of SOURCES, or 'definition' / 'verified' with what makes it so."""
    for chip in hardware.CHIPS.values():
        for field in _figures(chip):
            source = chip.sources.get(field, "")
            tags = re.findall(r"\b(S\d+|NV|P\d+)\b", source)
            assert tags or source.startswith(("definition", "verified")), (
                f"{chip.name}.{field} = {getattr(chip, field)!r} has no source in its row")
            for tag in tags:
                assert tag in hardware.SOURCES, f"{chip.name}: unknown source tag {tag}"
        assert set(chip.sources) <= {f.name for f in dataclasses.fields(chip)}, chip.name
        peak = chip.peak_bf16_flops_per_s or chip.peak_fp16_flops_per_s
        assert peak > 1e13 and chip.hbm_bytes > 1e9
        assert chip.hbm_unit in ("GB", "GiB") and chip.devices_per_chip in (1, 2)


def test_every_tpu_row_states_its_wraparound_and_device_kinds():
    """What a new generation must state for the cost models and the runtime to use it."""
    for chip in hardware.CHIPS.values():
        assert isinstance(chip.wraparound, hardware.Wraparound), chip.name
        assert chip.device_kinds and all(hardware.lookup(k) is chip for k in chip.device_kinds)
        if chip.kind == "tpu":
            assert chip.mxu_count and chip.mxu_size and chip.tensorcores_per_chip, chip.name
            assert chip.wraparound.rule in ("always", "exact", "multiple"), chip.name


def test_wraparound_is_typed_and_refuses_unknown_rules():
    assert [hardware.get("v5e").wraps(n) for n in (2, 8, 16)] == [True, False, True]
    assert [hardware.get("v5p").wraps(n) for n in (4, 6, 8)] == [True, False, True]
    assert hardware.get("h100").wraps(8) and not hardware.get("t4").wraps(4)
    with pytest.raises(ValueError, match="rule"):
        hardware.Wraparound("full 4x4x4 cubes")  # prose is not a rule
    with pytest.raises(ValueError, match="need"):
        hardware.Wraparound("exact")


def test_chip_answers_its_own_peak_questions():
    v3, t4 = hardware.get("v3"), hardware.get("t4")
    assert v3.peak_flops() == 123e12 and v3.peak_flops_per_device() == 123e12 / 2
    assert hardware.peak_flops_per_s("v3") == v3.peak_flops()
    assert t4.peak_flops("fp16") == 65e12
    with pytest.raises(ValueError, match="no published bf16"):
        t4.peak_flops()
    assert not hasattr(hardware, "critical_intensity")  # one formula: the row's method
    assert hardware.bf16_matrix_peak(v3) == 123e12 and hardware.bf16_matrix_peak(t4) is None
    assert hardware.bf16_matrix_peak(None) is None


def test_prices_live_in_the_rows():
    assert hardware.prices() == {"v5e": 1.20, "v5p": 4.20, "v6e": 2.70}
    for name in hardware.prices():
        assert hardware.get(name).sources["usd_per_chip_hour"] == "P1"
    assert "UNVERIFIED" in hardware.SOURCES["P1"]


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


@pytest.mark.parametrize("kind", ["NVIDIA H200 NVL", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB",
                                  "NVIDIA H100 PCIe"])
def test_pcie_cards_never_get_the_sxm_row(kind):
    """The NVL / PCIe cards have a lower power limit and no NVSwitch: not the SXM numbers."""
    assert hardware.lookup(kind) is None
    assert "PCIe" in hardware.missing_reason(kind)
    assert hardware.missing_reason("NVIDIA H200") is None


def test_t4_has_no_bf16_peak_and_keeps_fp16():
    t4 = hardware.get("t4")
    assert t4.peak_bf16_flops_per_s is None
    assert t4.peak_fp16_flops_per_s == 65e12
    with pytest.raises(ValueError, match="no published bf16 peak"):
        t4.critical_intensity()
    assert t4.critical_intensity("fp16") == pytest.approx(203, rel=0.01)
    assert "no bf16" in t4.summary() and "no bf16" in hardware.table(["t4"])
    assert "fp16" in hardware.table(["t4"])


def test_fp16_peaks_where_published():
    # the scaling book's GPU table gives one "bf16/fp16" column (gpus.md)
    for name in ("a100", "h100", "h200"):
        c = hardware.get(name)
        assert c.peak_fp16_flops_per_s == c.peak_bf16_flops_per_s
    assert all(hardware.get(n).peak_fp16_flops_per_s is None
               for n in hardware.names() if hardware.get(n).kind == "tpu")


def test_devices_per_chip_and_per_device_peak():
    # v2, v3, 7x: each TensorCore is a JAX device; v4, v5p: megacore, one device
    two = {n for n in hardware.names() if hardware.get(n).devices_per_chip == 2}
    assert two == {"v2", "v3", "7x"}
    assert hardware.peak_flops_per_device(hardware.get("v3")) == 123e12 / 2
    assert hardware.peak_flops_per_device(hardware.get("v5p")) == 459e12


def test_hbm_printed_in_the_sources_unit():
    labels = {n: hardware.get(n).hbm_label for n in ("v3", "v4", "v5p", "7x", "v5e", "v6e")}
    assert labels == {"v3": "32 GiB", "v4": "32 GiB", "v5p": "95 GiB", "7x": "192 GiB",
                      "v5e": "16 GB", "v6e": "32 GB"}
    # v5e: the disagreement is printed, not picked silently
    assert "16 GiB" in hardware.table(["v5e"]) and "17.2e9" in hardware.table(["v5e"])


def test_7x_from_the_cloud_tpu7x_page():
    c = hardware.get("7x")
    assert c.hbm_bytes_per_s == 7380e9  # "7380 GB/s"
    assert c.dcn_bytes_per_s == 100e9 / 8  # "100 Gb/s" per chip
    assert c.ici_bytes_per_s == 1200e9
    assert c.sources["hbm_bytes_per_s"] == c.sources["dcn_bytes_per_s"] == "S7"


def test_v3_ici_is_the_chip_total_not_one_link():
    c = hardware.get("v3")
    assert c.ici_bytes_per_s == 4 * 2 * c.ici_link_bytes_per_s  # 4 links, both ways


def test_get_unknown_lists_the_table():
    with pytest.raises(ValueError, match="v5e"):
        hardware.get("v99")
    assert hardware.get("Trillium").name == "v6e"


def test_units_conventions():
    assert hardware.get("v5p").hbm_bytes == 95 * 2**30  # "95 GiB"
    assert hardware.get("v5e").hbm_bytes == 16e9  # "16 GB"
    assert hardware.get("v6e").mxu_size == 256 and hardware.get("v5e").mxu_size == 128
