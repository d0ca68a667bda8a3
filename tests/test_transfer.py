"""``tpu_course.transfer``: host <-> device copy timings (chapter 2)."""

from __future__ import annotations

import pytest

from tpu_course import transfer


def test_a_sweep_times_each_size_both_ways():
    sweep = transfer.measure_transfers([4096, 65536], repeats=2)
    assert [p.n_bytes for p in sweep.points] == [4096, 65536]
    for p in sweep.points:
        assert p.h2d_s > 0 and p.d2h_s > 0
        assert p.h2d_bytes_per_s == pytest.approx(p.n_bytes / p.h2d_s)
    assert sweep.best("h2d") == max(p.h2d_bytes_per_s for p in sweep.points)
    assert sweep.best("d2h") == max(p.d2h_bytes_per_s for p in sweep.points)
    text = str(sweep)
    assert "4 KiB" in text and "64 KiB" in text and "GB/s" in text
    if sweep.platform == "cpu":
        assert "not a host-to-accelerator link" in text  # a CPU copy is never called PCIe


def test_default_sizes_span_4_kib_to_64_mib():
    assert transfer.DEFAULT_SIZES_BYTES[0] == 4 * 2**10
    assert transfer.DEFAULT_SIZES_BYTES[-1] == 64 * 2**20


@pytest.mark.parametrize("sizes, repeats, words", [
    ([4096], 0, "repeats must be at least 1"),
    ([6], 1, "multiples of 4 bytes"),
    ([0], 1, "multiples of 4 bytes"),
])
def test_bad_sweeps_say_what_is_wrong(sizes, repeats, words):
    with pytest.raises(ValueError, match=words):
        transfer.measure_transfers(sizes, repeats=repeats)
