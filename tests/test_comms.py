"""tpu_course.comms against the fact sheet's worked numbers and closed-form ring counts."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings, strategies as st

from tpu_course import comms, hardware

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)


def test_pure_layer_does_not_import_jax():
    import subprocess
    code = "import sys, tpu_course.comms; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("chip, want", [("v5p", 2550), ("v5e", 2189), ("v6e", 5100), ("v4", 3056)])
def test_dp_threshold_matches_fact_sheet(chip, want):
    # hardware_facts.md section 4: alpha = C / W_ici (v6e listed as 5111 from 9.2e14)
    assert comms.dp_min_tokens_per_chip(chip) == pytest.approx(want, rel=0.01)


def test_dp_threshold_three_axes_is_a_third():
    assert comms.dp_min_tokens_per_chip("v5p", axes=3) == pytest.approx(850, rel=1e-3)


def test_fsdp_tp_threshold_v5p():
    # training.md@dea4256: about 100 tokens per chip with F = 32768, M_X M_Y = 2
    assert comms.fsdp_tp_min_tokens_per_chip("v5p", 32768, 2) == pytest.approx(100, rel=0.02)


def test_dcn_bits_32_and_approaching_64():
    assert comms.dcn_bits_per_param(2) == 32
    assert comms.dcn_bits_per_param(1) == 0
    assert 63 < comms.dcn_bits_per_param(256) < 64


def test_book_dcn_rule_reproduces_71k_on_v5p():
    # training.md@dea4256, "Scaling Across Pods": C / W_dcn = 4.46e14 / 6.25e9 = 71,360
    assert hardware.get("v5p").dcn_bytes_per_s == 6.25e9
    assert comms.dcn_book_min_tokens_per_slice(
        "v5p", flops_per_s=comms.BOOK_V5P_FLOPS_PER_S) == pytest.approx(71_360)
    # the same rule with the table's Cloud peak (4.59e14)
    assert comms.dcn_book_min_tokens_per_slice("v5p") == pytest.approx(73_440)


def test_course_dcn_variant_overlaps_only_the_backward_pass():
    # fp32 gradients, ring factor 2(S-1)/S, 4 backward FLOPs per parameter per token
    c_over_w = comms.dcn_intensity("v5p")
    assert comms.BACKWARD_FLOPS_PER_PARAM_TOKEN == 4
    assert comms.dcn_min_tokens_per_slice("v5p", 2) == pytest.approx(4 / 4 * c_over_w)
    assert comms.dcn_min_tokens_per_slice("v5e", 10**6) == pytest.approx(2 * 63_040, rel=1e-5)
    # bf16 gradients over many slices: exactly the book's rule
    assert comms.dcn_min_tokens_per_slice("v5p", 10**6, grad_bits=16) == pytest.approx(
        comms.dcn_book_min_tokens_per_slice("v5p"), rel=1e-5)


def test_tp_limit_is_the_books_forward_pass_comparison():
    # 4BDF/(Y C) > 4BD/W_ici  <=>  Y < F W_ici / C  (training chapter); not 12BDF vs 8BD
    chip = hardware.get("v5p")
    f = 32768
    assert comms.tp_max_shards(chip, f) == pytest.approx(f * comms.w_ici(chip) / 4.59e14)
    assert comms.tp_max_shards(chip, f) == pytest.approx(f / 2550, rel=0.001)


def test_pipeline_bubble_values():
    assert comms.pipeline_bubble(4, 8) == pytest.approx(0.2727, abs=1e-4)
    assert comms.pipeline_bubble(8, 63) == pytest.approx(0.10, abs=1e-9)
    with pytest.raises(ValueError):
        comms.pipeline_bubble(0, 4)


def _ring_steps_all_gather(n: int, wrapped: bool) -> int:
    """Step a ring all-gather chunk by chunk: every step each chip passes what it has to its
    neighbours (both ways); count the steps until every chip holds every chunk."""
    have = [{i} for i in range(n)]
    steps = 0
    while any(len(h) < n for h in have):
        new = [set(h) for h in have]
        for i in range(n):
            for j in (i - 1, i + 1):
                if wrapped or 0 <= j < n:
                    new[j % n] |= have[i]
        have, steps = new, steps + 1
    return steps


@given(st.integers(2, 64), st.floats(1e6, 1e12))
@settings(max_examples=50, deadline=None)
def test_all_gather_bandwidth_term(n, v):
    chip = hardware.get("v5p")
    w = comms.w_ici(chip)
    t = comms.all_gather_time(v, n, chip, wraparound=True, hop_latency_s=0.0)
    assert t == pytest.approx(v * (n - 1) / n / w)
    t_mesh = comms.all_gather_time(v, n, chip, wraparound=False, hop_latency_s=0.0)
    assert t_mesh == pytest.approx(2 * t)
    assert comms.all_reduce_time(v, n, chip, wraparound=True, hop_latency_s=0.0) == pytest.approx(2 * t)


@given(st.integers(3, 64))
def test_ring_hops_match_a_counted_ring(n):
    # farthest chunk on a bidirectional ring travels floor(n/2) hops; on a line n-1
    assert comms.ring_hops(n, True) == _ring_steps_all_gather(n, True)
    assert comms.ring_hops(n, False) == _ring_steps_all_gather(n, False)


def test_two_axes_double_the_bandwidth():
    chip = hardware.get("v5e")
    one = comms.all_gather_time(1e9, 256, chip, wraparound=True, hop_latency_s=0)
    two = comms.all_gather_time(1e9, (16, 16), chip, hop_latency_s=0)
    assert two == pytest.approx(one / 2)


def test_latency_floor():
    t = comms.all_gather_time(1.0, 16, "v5e")
    assert t == pytest.approx(8e-6)
    # the whole array on 2 devices; the book's "45kB" is the per-hop buffer (one shard)
    assert comms.latency_bound_bytes("v5e", 2) == pytest.approx(90e3)
    assert comms.latency_bound_bytes("v5e", 2) / 2 == pytest.approx(4.5e10 * 1e-6)


def test_wraparound_rules():
    v5e, v5p = hardware.get("v5e"), hardware.get("v5p")
    assert [comms.wraps(v5e, n) for n in (2, 4, 8, 16)] == [True, False, False, True]
    assert [comms.wraps(v5p, n) for n in (4, 6, 8)] == [True, False, True]


def test_all_to_all_quarter_of_all_gather():
    chip = hardware.get("v5p")
    v = 1e10
    assert comms.all_to_all_time(v, 16, chip, hop_latency_s=0) == pytest.approx(v / (4 * comms.w_ici(chip)))


def test_all_to_all_without_wraparound_is_twice():
    v5e = hardware.get("v5e")
    wrapped = comms.all_to_all_time(1e10, 16, v5e, hop_latency_s=0)
    assert comms.all_to_all_time(1e10, 16, v5e, wraparound=False, hop_latency_s=0) == \
        pytest.approx(2 * wrapped)


def test_gpu_all_to_all_is_a_direct_send():
    # gpus.md: T = B (N-1) / (W N^2) with W the one-way egress per GPU (450e9 on H100)
    h100 = hardware.get("h100")
    v, n = 1e10, 8
    assert comms.all_to_all_time(v, n, h100) == pytest.approx(v * (n - 1) / (450e9 * n * n))
    # "a 2x theoretical speedup" over the TPU ring formula V / (4 W) at N = 8 (about)
    assert comms.all_to_all_time(v, n, h100) < v / (4 * 450e9) / 1.7


def test_gpu_switch_uses_nccl_ring():
    h100 = hardware.get("h100")
    v, n = 1e10, 8
    # NCCL: t = (S/B)(n-1)/n with B one-way per GPU (450 GB/s)
    assert comms.all_gather_time(v, n, h100) == pytest.approx(v / 450e9 * (n - 1) / n)
