"""Tests for tpu_course.roofline: closed forms, worked numbers, and roofline properties."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_course import hardware, roofline

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)

CHIPS = [hardware.get(n) for n in hardware.names()]  # rows with a bf16 peak
CHIPS = [c for c in CHIPS if c.peak_bf16_flops_per_s is not None]


def test_worked_numbers_v5e_and_h100():
    v5e, h100 = hardware.get("v5e"), hardware.get("h100")
    assert roofline.ridge_point(v5e) == pytest.approx(197e12 / 819e9)
    assert roofline.ridge_point(v5e) == pytest.approx(v5e.critical_intensity())
    # scaling book: a bf16 matmul with a B-token batch against big weights has intensity
    # about B, so B ~ 240 is the smallest batch that is compute-bound on v5e
    assert roofline.bound(roofline.matmul_intensity(200, 8192, 8192), v5e) == "memory"
    assert roofline.bound(roofline.matmul_intensity(300, 8192, 8192), v5e) == "compute"
    assert roofline.ridge_point(h100) == pytest.approx(989e12 / 3.35e12)
    assert roofline.ridge_point(h100, "fp32") == pytest.approx(67e12 / 3.35e12)
    with pytest.raises(ValueError, match="no published fp32"):
        roofline.ridge_point(v5e, "fp32")


@given(st.integers(1, 10_000), st.integers(1, 10_000), st.integers(1, 10_000),
       st.sampled_from([1, 2, 4]))
def test_matmul_counts_closed_forms(m, k, n, b):
    assert roofline.matmul_flops(m, k, n) == 2 * m * k * n
    assert roofline.matmul_bytes(m, k, n, b) == b * (m * k + k * n + m * n)
    if m == k == n:  # square: 2n^3 / (3 n^2 b) = 2n / (3b)
        assert roofline.matmul_intensity(m, m, m, b) == pytest.approx(2 * m / (3 * b))


@given(st.floats(1e-3, 1e5), st.sampled_from(CHIPS))
@settings(max_examples=200)
def test_attainable_is_the_lower_roof(intensity, chip):
    got = roofline.attainable_flops_per_s(intensity, chip)
    peak, bw = chip.peak_bf16_flops_per_s, chip.hbm_bytes_per_s
    assert got <= peak * (1 + 1e-12)
    assert got <= intensity * bw * (1 + 1e-12)
    assert got == pytest.approx(min(peak, intensity * bw))
    ridge = roofline.ridge_point(chip)
    assert roofline.bound(intensity, chip) == ("memory" if intensity < ridge else "compute")
    # monotone: more intensity never lowers the roof
    assert roofline.attainable_flops_per_s(intensity * 1.5, chip) >= got


@given(st.floats(1e3, 1e15), st.floats(1e3, 1e12), st.sampled_from(CHIPS))
def test_estimate_time_is_the_slower_of_the_two(flops, nbytes, chip):
    e = roofline.estimate(flops, nbytes, chip)
    assert e.time_s == pytest.approx(max(flops / chip.peak_bf16_flops_per_s,
                                         nbytes / chip.hbm_bytes_per_s))
    assert e.attainable_flops_per_s == pytest.approx(flops / e.time_s)
    assert e.bound == roofline.bound(e.intensity, chip)


def test_elementwise_add_is_deeply_memory_bound():
    ai = roofline.elementwise_intensity(1, inputs=2, outputs=1, bytes_per_element=4)
    assert ai == pytest.approx(1 / 12)
    for chip in CHIPS:
        assert roofline.bound(ai, chip) == "memory"
    with pytest.raises(ValueError):
        roofline.arithmetic_intensity(1.0, 0)


def test_t4_roofline_needs_a_dtype_it_has():
    t4 = hardware.get("t4")
    with pytest.raises(ValueError, match="no published bf16 peak"):
        roofline.ridge_point(t4)
    assert roofline.ridge_point(t4, "fp16") == pytest.approx(65e12 / 320e9)
    assert roofline.ridge_point(t4, "fp32") == pytest.approx(8.1e12 / 320e9)


def test_plot_labels_roofs_with_numbers_and_sources():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    chip = hardware.get("v5e")
    ax = roofline.plot(chip, [("matmul 4096", 1365.3, 150e12),
                              roofline.Point("add", 1 / 12, 60e9, measured=False)])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("819 GB/s" in l and "S5" in l for l in labels)
    assert any("197 TFLOP/s" in l and "S5" in l for l in labels)
    assert any("ridge point: 241" in l for l in labels)
    assert {t.get_text() for t in ax.texts} == {"matmul 4096", "add"}


def test_pure_module_does_not_import_jax():
    code = "import sys, tpu_course.roofline; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_plot_labels_of_neighbouring_matmuls_do_not_overlap():
    """Chapter 4's points matmul 1024 ... 8192 sit a factor of 2 apart on the flat roof."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    v5e = hardware.get("v5e")
    pts = []
    for n in (128, 256, 512, 1024, 2048, 4096, 8192):
        e = roofline.estimate(roofline.matmul_flops(n, n, n), roofline.matmul_bytes(n, n, n, 2), v5e)
        pts.append(roofline.Point(f"matmul {n}", e.intensity, e.attainable_flops_per_s, False))
    ax = roofline.plot(v5e, pts)
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == len(pts)
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (ax.texts[i].get_text(), ax.texts[j].get_text())
    axes_box = ax.get_window_extent(renderer)
    assert all(axes_box.y0 <= b.y0 for b in boxes)  # no label falls off the bottom
    plt.close(ax.figure)
