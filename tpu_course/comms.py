"""Collective and parallelism cost models, in the scaling book's notation (no JAX).

Notation (fixed once, used in every docstring; scaling book, training chapter [S2]):

* ``V``: bytes of the array a collective moves (for an all-gather the *gathered*
  array, for a reduce-scatter the *un-scattered* input, for an all-reduce the array).
* ``|X|``: devices along the mesh axis the collective runs over; ``N``: all chips.
* ``W_ici``: **bidirectional** ICI bandwidth *per axis* per chip, in bytes/s. The
  hardware table stores the one-way bandwidth of one link (``ici_link_bytes_per_s``);
  a wrapped axis gives a chip one link each way, so ``W_ici = 2 x ici_link_bytes_per_s``
  (v5p: 2 x 9e10 = 1.8e11, the book's figure). It is *not* ``ici_bytes_per_s`` (the
  Cloud docs' total over all four or six ports).
* ``C``: peak bf16 FLOP/s per chip; ``W_dcn``: data-centre network bytes/s per chip.
* ``B``: batch in tokens; ``D``: d_model; ``F``: d_ff.
* ``T_min``: per-hop ICI latency, ~1 us [S2-sharding].

Formulas (``shared/hardware_facts.md`` sections 4-5, which cite the scaling book):

* Ring all-gather / reduce-scatter on a wrapped axis: ``T = max(T_min |X|/2,
  V (|X|-1)/|X| / W_ici)``. The book drops ``(|X|-1)/|X|`` (``T = V / W_ici``); it is
  kept here so that small meshes come out exactly.
* Without wraparound (a mesh, not a torus) the ring runs one way only:
  ``T = max(T_min (|X|-1), V (|X|-1)/|X| / W_uni)`` with ``W_uni = W_ici / 2``:
  twice as slow ("typically doubles the time", scaling book, TPU chapter).
* Several axes at once (2D/3D torus): the bandwidth adds up,
  ``T = max(T_min sum|X_i|/2, V (N-1)/N / sum W_i)``.
* All-reduce = reduce-scatter + all-gather: twice the time. All-to-all on a
  bidirectional ring: ``V / (4 W_ici)`` (a quarter of an all-gather, the book's
  sharding chapter); without wraparound the course derives ``V / (2 W_ici)`` (half the
  links cross the middle of the line; the book does not treat that case).
* Switched (NVLink/NVSwitch) GPUs, NCCL's ring model with one-way per-GPU bandwidth
  ``B``: all-gather ``(V/B)(n-1)/n``, all-reduce twice that [S12]. All-to-all inside an
  NVSwitch node is a direct send: ``V (n-1) / (B n^2)`` (the book's GPU chapter).

Worked numbers from the fact sheet, reproduced:

>>> from tpu_course import hardware
>>> v5p = hardware.get("v5p")
>>> round(w_ici(v5p))
180000000000
>>> round(dp_min_tokens_per_chip(v5p))          # B/X > C/W_ici on one axis
2550
>>> round(dp_min_tokens_per_chip(v5p, axes=3))  # all three axes of a 3D torus
850
>>> dcn_bits_per_param(2), dcn_bits_per_param(1000)
(32.0, 63.936)
>>> round(dcn_book_min_tokens_per_slice("v5p", flops_per_s=BOOK_V5P_FLOPS_PER_S))
71360
>>> round(pipeline_bubble(4, 8), 3), round(pipeline_bubble(8, 63), 2)
(0.273, 0.1)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import textwrap
from typing import Callable, Sequence

from tpu_course import errors, hardware
#: Per-hop ICI latency in seconds, "~1 us" (scaling book, sharding chapter).
HOP_LATENCY_S = 1e-6


# ---------------------------------------------------------------------------------------
# bandwidths and topology


def w_ici(chip: hardware.Chip) -> float:
    """Bidirectional ICI bandwidth per axis per chip, bytes/s: ``2 x`` one link one way.

    This is the scaling book's ``W_ici`` (v5p: 1.8e11, v5e/v4: 9e10). For a switched
    GPU (NVLink) it is the per-GPU total both ways, ``ici_bytes_per_s``.

    >>> from tpu_course import hardware
    >>> w_ici(hardware.get("v5e"))
    90000000000.0
    """
    chip = hardware.as_chip(chip)
    if chip.kind == "gpu":
        if chip.ici_bytes_per_s is None:
            raise errors.CourseValueError(
                f"{chip.display_name} has no NVLink bandwidth in the table (PCIe only): its "
                "collectives are bound by PCIe, not modelled here")
        return float(chip.ici_bytes_per_s)
    if chip.ici_link_bytes_per_s is None:
        raise errors.CourseValueError(
            f"{chip.display_name} has no per-link ICI bandwidth in tpu_course.hardware "
            "(ici_link_bytes_per_s is None); pick a chip that has one, e.g. 'v5e' or 'v5p'")
    return 2.0 * chip.ici_link_bytes_per_s


def wraps(chip: hardware.Chip, axis_size: int) -> bool:
    """Whether an ICI axis of ``axis_size`` chips closes into a ring on ``chip``.

    The chip's typed rule (:class:`tpu_course.hardware.Wraparound`): v5e/v6e wrap only on
    axes of 16 chips (a full pod side); v4/v5p on axes that are a multiple of 4 (whole
    4x4x4 cubes joined by optical switches) [S2-tpus]. An axis of size 1 or 2 counts as
    wrapped (a 2-ring is its own wraparound).

    >>> from tpu_course import hardware
    >>> wraps(hardware.get("v5e"), 8), wraps(hardware.get("v5e"), 16), wraps(hardware.get("v5p"), 8)
    (False, True, True)
    """
    return hardware.as_chip(chip).wraps(axis_size)


def _axes(axes: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(axes, numbers.Integral):
        sizes: tuple = (axes,)
    elif isinstance(axes, Sequence) and not isinstance(axes, str):
        sizes = tuple(axes)
    else:
        sizes = ()
    if not sizes or any(isinstance(a, bool) or not isinstance(a, numbers.Integral) or a < 1
                        for a in sizes):
        raise errors.CourseValueError(f"axes must be a positive int or a sequence of them "
                                      f"(mesh axis sizes such as 8 or (4, 4)), got {axes!r}")
    return sizes


def _wrap_flags(chip: hardware.Chip | None, sizes: tuple[int, ...],
                wraparound: bool | Sequence[bool] | None) -> tuple[bool, ...]:
    if wraparound is None and chip is not None:
        return tuple(wraps(chip, a) for a in sizes)
    if isinstance(wraparound, bool):
        return (wraparound,) * len(sizes)
    if not isinstance(wraparound, Sequence) or isinstance(wraparound, str) or not all(
            isinstance(w, bool) for w in wraparound):
        raise errors.CourseTypeError(f"wraparound={wraparound!r}: expected True, False or one "
                                     "bool per mesh axis, e.g. (True, False).")
    flags = tuple(wraparound)
    if len(flags) != len(sizes):
        raise errors.CourseValueError(f"wraparound has {len(flags)} entries for {len(sizes)} axes")
    return flags


def ring_hops(axes: int | Sequence[int], wraparound: bool | Sequence[bool] = True) -> int:
    """Latency-bound hops of a ring collective: ``|X|/2`` per wrapped axis, ``|X|-1`` without.

    >>> ring_hops(16), ring_hops(16, wraparound=False), ring_hops((16, 16))
    (8, 15, 16)
    """
    sizes = _axes(axes)
    flags = _wrap_flags(None, sizes, wraparound)
    return sum((a // 2 if w else a - 1) for a, w in zip(sizes, flags))


# ---------------------------------------------------------------------------------------
# collective times


def all_gather_time(v_bytes: float, axes: int | Sequence[int], chip: hardware.Chip | str, *,
                    wraparound: bool | Sequence[bool] | None = None,
                    hop_latency_s: float = HOP_LATENCY_S) -> float:
    """Seconds for a ring all-gather that assembles a ``v_bytes`` array on every chip.

    TPU torus (scaling book, sharding chapter):
    ``T = max(T_min * hops, V (N-1)/N / sum_i W_i)``, with ``W_i = W_ici`` on a wrapped
    axis and ``W_ici / 2`` on an unwrapped one, ``hops = sum |X_i|/2`` (wrapped) or
    ``|X_i| - 1`` (not). ``wraparound=None`` asks the chip (:func:`wraps`).
    Switched GPUs (NCCL ring): ``T = V (n-1)/n / B`` with ``B = W / 2`` one way.

    Args:
        v_bytes: bytes of the gathered (full) array, ``V``.
        axes: size of the mesh axis, or sizes of several axes gathered over at once.
        chip: a :class:`hardware.Chip` or its table name.

    >>> from tpu_course import hardware
    >>> v5e = hardware.get("v5e")
    >>> all_gather_time(16 * 90e9, 16, v5e)     # V/W_ici x 15/16 on a wrapped 16-ring
    15.0
    >>> all_gather_time(16 * 90e9, 16, v5e, wraparound=False)   # a mesh: twice as slow
    30.0
    >>> all_gather_time(1e3, 16, v5e) * 1e6      # 1 kB: latency-bound, 8 hops x 1 us
    8.0
    """
    v_bytes = errors.check_number("v_bytes", v_bytes, low=0)
    hop_latency_s = errors.check_number("hop_latency_s", hop_latency_s, low=0)
    chip = hardware.as_chip(chip)
    sizes = _axes(axes)
    n = math.prod(sizes)
    if n == 1:
        return 0.0
    w = w_ici(chip)
    frac = (n - 1) / n
    if chip.kind == "gpu":  # switched: every GPU one hop from every other
        return max(hop_latency_s, v_bytes * frac / (w / 2))
    flags = _wrap_flags(chip, sizes, wraparound)
    bandwidth = sum(w if f else w / 2 for a, f in zip(sizes, flags) if a > 1)
    return max(hop_latency_s * ring_hops(sizes, flags), v_bytes * frac / bandwidth)


def reduce_scatter_time(v_bytes: float, axes: int | Sequence[int], chip: hardware.Chip | str,
                        **kwargs) -> float:
    """Seconds for a ring reduce-scatter of a ``v_bytes`` array (each chip keeps ``V/N``).

    The mirror image of an all-gather, same cost (scaling book, sharding chapter).

    >>> reduce_scatter_time(16 * 90e9, 16, "v5e") == all_gather_time(16 * 90e9, 16, "v5e")
    True
    """
    return all_gather_time(v_bytes, axes, chip, **kwargs)


def all_reduce_time(v_bytes: float, axes: int | Sequence[int], chip: hardware.Chip | str,
                    **kwargs) -> float:
    """Seconds for an all-reduce of ``v_bytes``: a reduce-scatter then an all-gather, ``2x``.

    ``T = 2 V (N-1)/N / W_ici`` on a wrapped axis (the book: ``2V/W_ici``).

    >>> all_reduce_time(16 * 90e9, 16, "v5e")
    30.0
    """
    return 2.0 * all_gather_time(v_bytes, axes, chip, **kwargs)


def all_to_all_time(v_bytes: float, axes: int | Sequence[int], chip: hardware.Chip | str, *,
                    wraparound: bool | Sequence[bool] | None = None,
                    hop_latency_s: float = HOP_LATENCY_S) -> float:
    """Seconds for an all-to-all of a ``v_bytes`` array (all shards together).

    * TPU, wrapped (bidirectional) ring: ``T = V / (4 W_ici)``, a quarter of an
      all-gather (scaling book, sharding chapter: "AllGather / 4 for a bidirectional
      ring"; each device sends ``N^2/4`` chunks of ``V/N^2``).
    * TPU, no wraparound: ``T = V / (2 W_ici)``. The book gives only the wrapped case;
      this is the course's own bisection count: ``N^2/4`` chunks of ``V/N^2`` must
      cross the middle of the line each way, over one link of ``W_ici / 2`` one way
      instead of the ring's two.
    * Switched GPUs (NVSwitch node): a direct send, ``T = V (n-1) / (B n^2)`` with ``B``
      the one-way NVLink bandwidth per GPU (``W / 2``) (scaling book, GPU chapter:
      ``B (N-1) / (W N^2)``, "a 2x theoretical speedup" over the ring at ``N = 8``).

    Several TPU axes add their bandwidths as for the all-gather.

    >>> all_to_all_time(4 * 90e9, 16, "v5e")
    1.0
    >>> all_to_all_time(4 * 90e9, 8, "v5e")      # v5e's 8-axis has no wraparound: 2x
    2.0
    >>> round(all_to_all_time(64 * 450e9, 8, "h100"), 3)   # 7/64 of V / 450 GB/s
    7.0
    """
    v_bytes = errors.check_number("v_bytes", v_bytes, low=0)
    hop_latency_s = errors.check_number("hop_latency_s", hop_latency_s, low=0)
    chip = hardware.as_chip(chip)
    sizes = _axes(axes)
    if math.prod(sizes) == 1:
        return 0.0
    w = w_ici(chip)
    if chip.kind == "gpu":  # direct sends through the switch, one-way bandwidth w / 2
        n = math.prod(sizes)
        return max(hop_latency_s, v_bytes * (n - 1) / (n * n * (w / 2)))
    flags = _wrap_flags(chip, sizes, wraparound)
    bandwidth = sum(w if f else w / 2 for a, f in zip(sizes, flags) if a > 1)
    return max(hop_latency_s * ring_hops(sizes, flags), v_bytes / (4 * bandwidth))


#: The one table of collectives, one row per kind XLA writes in HLO: its time formula
#: here (None: the course has none) and whether chapter 6 and its lab name it. What the
#: HLO parser finds (``tpu_course.hlo.text.COLLECTIVE_KINDS``, also its ``-start`` form),
#: what a lab answer may name (:data:`KINDS`) and what a plan can time
#: (``plans.CollectivePlan.time_s``) are read from it: a new collective is one row here.
COLLECTIVES: dict[str, tuple[Callable[..., float] | None, bool]] = {
    # kind:                 (time formula,        taught)
    "all-reduce":           (all_reduce_time,     True),
    "all-gather":           (all_gather_time,     True),
    "reduce-scatter":       (reduce_scatter_time, True),
    "all-to-all":           (all_to_all_time,     True),
    "ragged-all-to-all":    (None,                False),
    "collective-permute":   (None,                True),
    "collective-broadcast": (None,                False),
}

#: The collectives chapter 6 and its lab name, by their HLO names.
KINDS = tuple(kind for kind, (_, taught) in COLLECTIVES.items() if taught)


def latency_bound_bytes(chip: hardware.Chip | str, axis_size: int,
                        hop_latency_s: float = HOP_LATENCY_S) -> float:
    """The size ``V`` of the whole array below which a ring all-gather on one wrapped
    axis is latency-bound.

    Where ``T_min |X|/2 = V/W_ici``: ``V = T_min |X| W_ici / 2``, i.e. ``|X|`` shards of
    ``T_min W_ici / 2`` bytes each. That per-shard figure is one link's one-way bytes per
    microsecond, the book's "any buffer under 4.5e10 * 1e-6 = 45kB will be latency
    bound" on v5e (sharding chapter): the book's 45 kB is the buffer one hop sends, not
    the whole array. On two devices the array threshold is twice it:

    >>> latency_bound_bytes("v5e", 2), latency_bound_bytes("v5e", 2) / 2   # array, per shard
    (90000.0, 45000.0)
    """
    chip = hardware.as_chip(chip)
    axis_size = errors.check_int("axis_size", axis_size, low=1)
    hop_latency_s = errors.check_number("hop_latency_s", hop_latency_s, low=0)
    return hop_latency_s * axis_size * w_ici(chip) / 2


# ---------------------------------------------------------------------------------------
# when does training stay compute-bound?


def dp_min_tokens_per_chip(chip: hardware.Chip | str, axes: int = 1) -> float:
    """Tokens per chip above which data parallelism (or FSDP) is compute-bound: ``C / (W_ici M_X)``.

    From ``T_math = 8BDF/(XC) > T_comms = 8DF/(W_ici M_X)``, i.e. ``B/X > C/(W_ici M_X)``
    (scaling book, training chapter). ``axes`` is ``M_X``, the torus axes the batch
    is sharded over.

    >>> round(dp_min_tokens_per_chip("v5e")), round(dp_min_tokens_per_chip("v6e"))
    (2189, 5100)
    """
    chip = hardware.as_chip(chip)
    axes = errors.check_int("axes", axes, low=1)
    return hardware.peak_flops_per_s(chip) / (w_ici(chip) * axes)


def tp_max_shards(chip: hardware.Chip | str, d_ff: int, axes: int = 1) -> float:
    """Largest tensor-parallel degree ``Y`` that stays compute-bound: ``M_Y F W_ici / C``.

    The scaling book (training chapter) compares the forward pass alone: ``4BDF/Y``
    FLOPs (two matmuls) against an all-gather and a reduce-scatter of the ``[B, D]``
    bf16 activations, ``2 x 2BD = 4BD`` bytes, so ``4BDF/(Y C) > 4BD/(W_ici M_Y)`` gives
    ``Y < M_Y F W_ici / C = M_Y F / alpha``. (The backward pass has twice of both,
    ``8BDF/Y`` against ``4BD``, so it is not the binding one.) Independent of batch and
    precision.

    >>> round(tp_max_shards("v5p", 32768), 1)
    12.9
    """
    chip = hardware.as_chip(chip)
    d_ff = errors.check_int("d_ff", d_ff, low=1)
    axes = errors.check_int("axes", axes, low=1)
    return axes * d_ff * w_ici(chip) / hardware.peak_flops_per_s(chip)


def fsdp_tp_min_tokens_per_chip(chip: hardware.Chip | str, d_ff: int,
                                mesh_axes: int = 2) -> float:
    """Tokens per chip above which mixed FSDP + TP is compute-bound: ``alpha^2 / (M_X M_Y F)``.

    ``alpha = C / W_ici``; ``mesh_axes = M_X M_Y`` (scaling book, training chapter at
    commit dea4256; an older snapshot has an extra factor 4).

    >>> round(fsdp_tp_min_tokens_per_chip("v5p", 32768))
    99
    """
    chip = hardware.as_chip(chip)
    d_ff = errors.check_int("d_ff", d_ff, low=1)
    mesh_axes = errors.check_int("mesh_axes", mesh_axes, low=1)
    alpha = hardware.peak_flops_per_s(chip) / w_ici(chip)
    return alpha**2 / (mesh_axes * d_ff)


# ---------------------------------------------------------------------------------------
# across slices: the data-centre network


def dcn_bits_per_param(slices: int, grad_bits: int = 32) -> float:
    """Bits each slice sends per parameter per step for a ring all-reduce of the gradients.

    A ring all-reduce over ``S`` slices sends ``2 (S-1)/S`` times the array from every
    slice; with fp32 gradients that is 32 bits at two slices and approaches 64 bits
    as slices grow (derived in ``shared/hardware_facts.md`` section 5).

    >>> dcn_bits_per_param(2), dcn_bits_per_param(4), dcn_bits_per_param(2, grad_bits=16)
    (32.0, 48.0, 16.0)
    """
    slices = errors.check_int("slices", slices, low=1)
    grad_bits = errors.check_int("grad_bits", grad_bits, low=1)
    return 2 * (slices - 1) / slices * grad_bits


def dcn_intensity(chip: hardware.Chip | str) -> float:
    """``C / W_dcn`` per chip, FLOP per byte, with ``C`` the table's bf16 peak.

    >>> round(dcn_intensity("v5p")), round(dcn_intensity("v5e")), round(dcn_intensity("7x"))
    (73440, 63040, 184560)
    """
    chip = hardware.as_chip(chip)
    if chip.dcn_bytes_per_s is None:
        raise errors.CourseValueError(f"{chip.display_name} has no DCN bandwidth in tpu_course.hardware")
    return hardware.peak_flops_per_s(chip) / chip.dcn_bytes_per_s


#: The per-chip ``C`` the scaling book uses for v5p in its DCN rule ("4.46e14 / 6.25e9 =
#: 71,360", training chapter at commit dea4256). The hardware table holds Cloud's 4.59e14
#: (S4); the book's own ICI paragraphs use 4.6e14.
BOOK_V5P_FLOPS_PER_S = 4.46e14


def dcn_book_min_tokens_per_slice(chip: hardware.Chip | str,
                                  flops_per_s: float | None = None) -> float:
    """The scaling book's rule for data parallelism across slices: tokens per slice > ``C / W_dcn``.

    The book's derivation (training chapter, "Scaling Across Pods", commit dea4256): a
    ring all-reduce of the bf16 gradients over the slices, in the backward pass, with
    ``M`` chips per slice and ``N`` chips in all:

    ``T_math = 2*2*2 BDF / (N C)``  (per layer: the backward pass, 8BDF FLOPs),
    ``T_comms = 2*2*2 DF / (M W_dcn)``  (two DxF bf16 gradients, all-reduced: 2x bytes),

    and ``T_math > T_comms`` when ``B / (N/M) > C / W_dcn``: the tokens per slice must
    exceed the chip's DCN intensity. Assumptions: bf16 gradients (2 bytes), an
    all-reduce sending twice the array, only the backward pass's 4 FLOPs per parameter
    per token overlapping it. ``flops_per_s`` overrides ``C`` (default: the table's bf16
    peak). The book writes 71,360 with ``C = 4.46e14`` (:data:`BOOK_V5P_FLOPS_PER_S`);
    with the table's Cloud figure 4.59e14 the same rule gives 73,440. Its takeaway rounds
    to "roughly 75,000".

    >>> round(dcn_book_min_tokens_per_slice("v5p", flops_per_s=BOOK_V5P_FLOPS_PER_S))
    71360
    >>> round(dcn_book_min_tokens_per_slice("v5p"))
    73440
    """
    chip = hardware.as_chip(chip)
    if flops_per_s is None:
        return dcn_intensity(chip)
    if chip.dcn_bytes_per_s is None:
        raise errors.CourseValueError(f"{chip.display_name} has no DCN bandwidth in tpu_course.hardware")
    return flops_per_s / chip.dcn_bytes_per_s


#: FLOPs per parameter per token of the backward pass, the part of a step that can
#: overlap the gradient all-reduce (the forward pass is 2, the backward 4, of the usual
#: 6 per parameter per token; scaling book, training chapter: 4BDF + 8BDF per layer).
BACKWARD_FLOPS_PER_PARAM_TOKEN = 4


def dcn_min_tokens_per_slice(chip: hardware.Chip | str, slices: int,
                             grad_bits: int = 32) -> float:
    """The course's variant of the book's DCN rule: tokens per slice per step above which
    data parallelism across ``slices`` slices stays compute-bound.

    Assumptions (each different from :func:`dcn_book_min_tokens_per_slice` is marked ``*``):

    * a ring all-reduce of the gradients over the slices; each slice sends
      :func:`dcn_bits_per_param` ``= 2 (S-1)/S x grad_bits`` per parameter (``*`` the exact
      ring factor: 32 bits at two slices of fp32, approaching 64 with many; the book
      takes the many-slice limit);
    * gradients in fp32 (``grad_bits=32``, ``*`` the book assumes bf16);
    * a slice of ``M`` chips sends over ``M x W_dcn`` (per-chip DCN, as in the book);
    * only the backward pass, ``4`` of the ``6`` FLOPs per parameter per token
      (:data:`BACKWARD_FLOPS_PER_PARAM_TOKEN`), can overlap the all-reduce: a layer's
      gradient exists only after its backward pass, and the next step's forward pass
      needs the updated weights;
    * perfect overlap, bandwidth-bound (no latency), DCN the only bottleneck.

    Then ``T_math = 4 P T / (M C)`` for ``T`` tokens per slice and ``P`` parameters,
    ``T_comms = P (bits/8) / (M W_dcn)``, and compute wins when
    ``T > (bits/8) / 4 x C / W_dcn``. With ``grad_bits=16`` and many slices this is the
    book's ``C / W_dcn``; with fp32 at two slices it is the same number again (4 bytes
    either way), and twice it with many slices.

    >>> round(dcn_min_tokens_per_slice("v5p", 2)), round(dcn_min_tokens_per_slice("v5p", 1000))
    (73440, 146733)
    >>> round(dcn_min_tokens_per_slice("v5e", 2)), round(dcn_min_tokens_per_slice("7x", 2))
    (63040, 184560)

    The seed document's "theoretical minimum of 176k to 352k tokens" and "350k tokens per
    Pod for two Pods to 700k tokens for many Pods" fit this variant on a TPU7x (184,560
    and 369,120 here, within 5%) doubled as a practical margin; the C it used (about
    2.2e15 FLOP/s) and the margin are not found in any source read: unverified.
    """
    chip = hardware.as_chip(chip)
    bytes_per_param = dcn_bits_per_param(slices, grad_bits) / 8
    return bytes_per_param * dcn_intensity(chip) / BACKWARD_FLOPS_PER_PARAM_TOKEN


def pipeline_bubble(stages: int, microbatches: int) -> float:
    """Fraction of a GPipe step the pipeline sits idle: ``(p-1)/(m+p-1)``.

    ``p`` stages, ``m`` microbatches (GPipe, Huang et al. 2019, arXiv:1811.06965).
    Megatron-LM (arXiv:2104.04473) states it relative to the ideal time, ``(p-1)/m``.

    >>> round(pipeline_bubble(4, 8), 4), pipeline_bubble(1, 8)
    (0.2727, 0.0)
    """
    stages = errors.check_int("stages", stages, low=1)
    microbatches = errors.check_int("microbatches", microbatches, low=1)
    return (stages - 1) / (microbatches + stages - 1)


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """A parallelism plan for one job, with the numbers that decided it."""

    within_slice: str  # 'dp' or 'fsdp'
    across_slices: str  # 'none', 'dp' or 'pipeline'
    train_bytes_per_chip_dp: float
    hbm_bytes: float
    tokens_per_slice: float
    dcn_min_tokens_per_slice: float | None
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        lines = [f"within a slice: {self.within_slice}; across slices: {self.across_slices}"]
        for reason in self.reasons:  # wrapped to a notebook's 88-character column
            lines += textwrap.wrap(reason, 88, initial_indent="  ", subsequent_indent="    ")
        return "\n".join(lines)

    __repr__ = __str__


#: Training bytes per parameter with Adam in the scaling book's count (bf16 parameters
#: and gradients, fp32 moments and master copy would be more): "num_params = HBM / 10".
TRAIN_BYTES_PER_PARAM = 10


def recommend(chip: hardware.Chip | str, params: float, tokens_per_slice: float,
              slices: int = 1) -> Recommendation:
    """Choose DP or FSDP inside a slice, and DP or pipelining across slices.

    * Inside a slice: pure DP keeps a whole replica per chip, ``10 x params`` bytes with
      Adam (scaling book: "num_params = HBM per device / 10"); if that exceeds HBM, FSDP.
    * Across slices: DP over the data-centre network is compute-bound when the tokens
      per slice exceed :func:`dcn_min_tokens_per_slice`; below that the gradient
      all-reduce dominates, and a pipeline (which sends only activations between
      slices) is the better choice.

    >>> print(recommend("v5e", 7e9, 1e6, slices=4))
    within a slice: fsdp; across slices: dp
      10 x 7e+09 params = 70 GB per chip for a DP replica > 16 GB HBM: shard it (FSDP)
      1,000,000 tokens per slice >= 94,560 needed over DCN with 4 slices: DP across slices
        is compute-bound
    """
    chip = hardware.as_chip(chip)
    params = errors.check_number("params", params, low=0, low_open=True)
    tokens_per_slice = errors.check_number("tokens_per_slice", tokens_per_slice, low=0)
    slices = errors.check_int("slices", slices, low=1)
    need = TRAIN_BYTES_PER_PARAM * params
    reasons = []
    if need > chip.hbm_bytes:
        within = "fsdp"
        reasons.append(f"10 x {params:.3g} params = {need / 1e9:,.0f} GB per chip for a DP replica "
                       f"> {chip.hbm_bytes / 1e9:,.0f} GB HBM: shard it (FSDP)")
    else:
        within = "dp"
        reasons.append(f"10 x {params:.3g} params = {need / 1e9:,.1f} GB per chip fits in "
                       f"{chip.hbm_bytes / 1e9:,.0f} GB HBM: plain DP")
    threshold = None
    if slices == 1:
        across = "none"
    else:
        threshold = dcn_min_tokens_per_slice(chip, slices)
        if tokens_per_slice >= threshold:
            across = "dp"
            reasons.append(f"{tokens_per_slice:,.0f} tokens per slice >= {threshold:,.0f} needed over "
                           f"DCN with {slices} slices: DP across slices is compute-bound")
        else:
            across = "pipeline"
            reasons.append(f"{tokens_per_slice:,.0f} tokens per slice < {threshold:,.0f} needed over "
                           f"DCN with {slices} slices: DP would wait on the network; pipeline instead")
    return Recommendation(within, across, need, chip.hbm_bytes, tokens_per_slice, threshold,
                          tuple(reasons))
