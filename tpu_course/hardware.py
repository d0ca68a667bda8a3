"""Accelerator facts: one frozen row per chip, every number with its source.

Conventions (stated once, used everywhere):

* **Per chip**, never per TensorCore. JAX's own table (``jax/_src/tpu_info.py``) stores
  per-core values; the rows here multiply by the cores per chip.
* **Dense** FLOP/s (NVIDIA's headline figures often assume 2:4 sparsity).
* **Bytes**, not GB or GiB: ``16e9`` for "16 GB", ``95 * 2**30`` for "95 GiB".
  ``hbm_unit`` records which unit the source printed, and tables print the capacity in
  that unit (``95 GiB``, not ``102 GB``).
* **Peaks per chip; devices per chip apart.** On v2, v3 and 7x each TensorCore is its own
  JAX device (``devices_per_chip = 2``); on v4 and v5p the two cores form one "megacore"
  device. A one-device benchmark compares with :func:`peak_flops_per_device`.
* **No borrowed peaks.** A chip without bf16 matrix support (the T4) has
  ``peak_bf16_flops_per_s = None``; its fp16 peak is kept in ``peak_fp16_flops_per_s``.
* ICI bandwidth is the **bidirectional per-chip total** over all ports, as the Cloud TPU
  documentation gives it; ``ici_link_bytes_per_s`` is the one-way bandwidth of a single
  link as the scaling book uses it.
* Where sources disagree, one canonical value (Cloud docs first, then JAX's table, then
  the scaling book) and the others in ``alt_values``.

Source tags (``S1`` ...) refer to the course's fact sheet (``shared/hardware_facts.md``)
and are spelled out in :data:`SOURCES`. Every figure a row states names its source in the
row's ``sources`` (``tests/test_hardware.py`` checks each one).

**Adding a generation** is one :class:`Chip` row in :data:`CHIPS`: its figures with their
sources, its typed :class:`Wraparound`, the ``device_kinds`` JAX reports, and, where they
apply, its verified compile-only topologies (``tpu_course.hlo.aot`` reads them; the aot tests
compile each one and map its devices back to the row) and its price (``tpu_course.costs``
reads it). Nothing else lists generations; the tests say what a new row still lacks.

>>> get("v5e").peak_bf16_flops_per_s
197000000000000.0
>>> round(get("v5e").critical_intensity())
241
>>> lookup("TPU v5 lite").name
'v5e'
>>> lookup("cpu") is None
True
>>> get("t4").peak_bf16_flops_per_s is None, get("t4").peak_fp16_flops_per_s
(True, 65000000000000.0)
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from typing import Mapping

from tpu_course import errors, tables

SOURCES: Mapping[str, str] = {
    "S1": "jax-ml/jax jax/_src/tpu_info.py (per-TensorCore table), "
    "https://docs.jax.dev/en/latest/pallas/tpu/hardware.html",
    "S2": "jax-ml/scaling-book, https://jax-ml.github.io/scaling-book/ (tpus, roofline, "
    "sharding, training chapters)",
    "S3": "https://cloud.google.com/tpu/docs/system-architecture-tpu-vm",
    "S4": "https://docs.cloud.google.com/tpu/docs/v5p-training",
    "S5": "https://docs.cloud.google.com/tpu/docs/v5e",
    "S6": "https://docs.cloud.google.com/tpu/docs/v6e",
    "S7": "https://docs.cloud.google.com/tpu/docs/tpu7x (spec table: BF16 2307 TFLOPs, HBM "
    "192 GiB at 7380 GB/s, ICI 1200 GB/s bidirectional, DCN 100 Gb/s per chip; its v5p and v6e "
    "columns: DCN 50 and 100 Gb/s per chip)",
    "S8": "https://cloud.google.com/tpu/docs/v3",
    "S9": "https://cloud.google.com/tpu/docs/v4",
    "S10": "https://docs.cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood (4 chips "
    "and 2 NICs per VM)",
    "S11": "jax-ml/scaling-book gpus.md (GPU spec tables, NVLink)",
    "S15": "https://github.com/jax-ml/jax/issues/21212 (T4 has no native bf16)",
    "S17": "NVIDIA T4 datasheet figures as quoted by third-party spec pages (secondary)",
    "S18": "https://github.com/datawhalechina/llm-algo-leetcode/issues/129 (Colab T4 nvidia-smi)",
    "S19": "NVIDIA A100/H100 datasheets as tabulated at glennklockwood.com (secondary)",
    "S20": "Ironwood summaries of Google's blog / Hot Chips 2025 (secondary)",
    "S21": "AI-Hypercomputer/xpk src/xpk/core/system_characteristics.py (tpu7x: AxBxC in 4x4x4 "
    "cubes, chips_per_vm=4)",
    "P1": "https://cloud.google.com/tpu/pricing, on-demand USD per chip-hour, us-central "
    "regions, as of 2026-11-30. UNVERIFIED: the course's search corpus holds no copy of the "
    "page with per-chip prices; these are the list prices last published there as remembered "
    "by the author. Check the page before quoting them.",
    "S22": "NVIDIA's CUDA tuning guides, section 'Unified Shared Memory/L1/Texture Cache': "
    "Hopper (docs.nvidia.com/cuda/hopper-tuning-guide: 256 KB of combined L1 and shared "
    "memory per SM, of which up to 228 KB shared), NVIDIA Ampere (ampere-tuning-guide: A100 "
    "192 KB combined, shared up to 164 KB), Turing (turing-tuning-guide: 96 KB unified, "
    "shared 64 KB). KB here is 1024 bytes: CUDA's sharedMemPerMultiprocessor reports them so",
    "NV": "NVIDIA datasheets (A100: 19.5 TFLOP/s FP32; H100/H200 SXM: 67 TFLOP/s FP32; "
    "T4: 8.1 TFLOP/s FP32)",
}


#: The rules by which an ICI axis closes into a ring (see :class:`Wraparound`).
WRAP_RULES = ("always", "exact", "multiple", "switched", "none")


@dataclasses.dataclass(frozen=True)
class Wraparound:
    """When an ICI axis of ``n`` chips closes into a ring (typed: no prose is parsed).

    ``rule``: ``'always'`` (a full torus), ``'exact'`` (only axes of exactly ``size``
    chips: a full pod side), ``'multiple'`` (axes that are multiples of ``size``: whole
    cubes joined by optical switches), ``'switched'`` (a switch: every device one hop
    from every other, behaves as wrapped) or ``'none'`` (no ring: PCIe only). An axis of
    1 or 2 chips always counts as wrapped (a 2-ring is its own wraparound).

    >>> Wraparound("exact", 16).wraps(8), Wraparound("exact", 16).wraps(16)
    (False, True)
    >>> str(Wraparound("multiple", 4))
    'on axes that are multiples of 4'
    """

    rule: str
    size: int | None = None
    note: str = ""

    def __post_init__(self) -> None:
        errors.check_choice("rule", self.rule, WRAP_RULES)
        if (self.rule in ("exact", "multiple")) != (self.size is not None):
            raise errors.CourseValueError(
                f"Wraparound({self.rule!r}, size={self.size!r}): 'exact' and 'multiple' need "
                "a size; the other rules take none")

    def wraps(self, axis_size: int) -> bool:
        """Whether an axis of ``axis_size`` chips closes into a ring."""
        axis_size = errors.check_int("axis_size", axis_size, low=1)
        if axis_size <= 2 or self.rule in ("always", "switched"):
            return True
        if self.rule == "exact":
            return axis_size == self.size
        if self.rule == "multiple":
            return axis_size % self.size == 0
        return False

    def __str__(self) -> str:
        text = {"always": "full torus", "exact": f"only on axes of size {self.size}",
                "multiple": f"on axes that are multiples of {self.size}",
                "switched": "switched: every device one hop from every other",
                "none": "no ring (no ICI)"}[self.rule]
        return f"{text} ({self.note})" if self.note else text


#: The matrix peaks the table records, by dtype name.
DTYPES = ("bf16", "fp16", "fp32")


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator, per chip. ``None`` means "not published / not applicable".

    ``sources`` maps a field name to the source tags its value comes from (see
    :data:`SOURCES`); ``alt_values`` records the values other sources give.
    """

    name: str  # the table key: 'v5e', 'h100', ...
    display_name: str
    kind: str  # 'tpu' or 'gpu'
    peak_bf16_flops_per_s: float | None  # dense bf16 matrix peak; None: no bf16 support
    peak_fp32_flops_per_s: float | None  # vector/CUDA-core fp32; None: not published
    hbm_bytes: float
    hbm_bytes_per_s: float
    tensorcores_per_chip: int  # TPU TensorCores; 1 for a GPU (one device)
    mxu_count: int | None  # matrix units per chip (all cores); None for GPUs
    mxu_size: int | None  # side of the square systolic array
    ici_bytes_per_s: float | None  # bidirectional, per chip, all ports (NVLink for GPUs)
    ici_link_bytes_per_s: float | None  # one-way, one link (scaling-book convention)
    ici_topology: str
    wraparound: Wraparound  # when an ICI axis closes into a ring
    dcn_bytes_per_s: float | None  # data-centre network, per chip
    chips_per_host: int | None
    vmem_bytes: float | None  # per core (GPU: the most shared memory one SM can have, not
    # the combined L1 + shared pool it is carved from)
    device_kinds: tuple[str, ...]  # what jax.devices()[0].device_kind reports
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    alt_values: Mapping[str, str] = dataclasses.field(default_factory=dict)
    peak_fp16_flops_per_s: float | None = None  # dense fp16 matrix peak; None: none published
    devices_per_chip: int = 1  # JAX devices one chip shows (2 on v2, v3, 7x: no megacore)
    hbm_unit: str = "GB"  # the unit the HBM source prints: 'GB' (1e9) or 'GiB' (2**30)
    # compile-only TPU topologies verified with libtpu (tpu_course.hlo.aot), e.g. ('2x2', '2x4')
    compile_only_topologies: tuple[str, ...] = ()
    usd_per_chip_hour: float | None = None  # on-demand list price; None: no price held

    def peak_flops(self, dtype: str = "bf16") -> float:
        """The chip's dense peak FLOP/s for ``dtype`` (``'bf16'``, ``'fp16'`` or ``'fp32'``).

        Raises ``CourseValueError`` when the table has none (the T4 has no bf16; TPUs
        publish no fp16), instead of lending another dtype's figure.

        >>> get("t4").peak_flops("fp16") / 1e12
        65.0
        """
        errors.check_choice("dtype", dtype, DTYPES)
        peak = getattr(self, f"peak_{dtype}_flops_per_s")
        if peak is None:
            others = [d for d in DTYPES if getattr(self, f"peak_{d}_flops_per_s") is not None]
            hint = (" (XLA computes bf16 in fp32 there)" if dtype == "bf16" and self.kind == "gpu"
                    else "")
            raise errors.CourseValueError(
                f"{self.display_name} has no published {dtype} peak in tpu_course.hardware"
                f"{hint}; it has: {', '.join(others) or 'none'}")
        return float(peak)

    def peak_flops_per_device(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s of one JAX device: the chip's peak / ``devices_per_chip``.

        On v2, v3 and 7x each TensorCore is its own JAX device, so a benchmark on one
        device can reach at most half the chip's peak.

        >>> get("7x").peak_flops_per_device() / 1e12, get("v5p").peak_flops_per_device() / 1e12
        (1153.5, 459.0)
        """
        return self.peak_flops(dtype) / self.devices_per_chip

    def critical_intensity(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s over HBM bytes/s, in FLOP per byte: the roofline's ridge point.

        A kernel whose arithmetic intensity is below this is memory-bound on the chip.
        For a bf16 matmul of a B-token batch against a large weight this is also the
        smallest B that keeps the MXU busy (scaling book, roofline chapter: "about 240"
        on v5e).

        >>> round(get("v6e").critical_intensity()), round(get("t4").critical_intensity("fp16"))
        (560, 203)
        """
        return self.peak_flops(dtype) / self.hbm_bytes_per_s

    def wraps(self, axis_size: int) -> bool:
        """Whether an ICI axis of ``axis_size`` chips closes into a ring on this chip."""
        return self.wraparound.wraps(axis_size)

    @property
    def hbm_gib(self) -> float:
        """HBM capacity in GiB (2**30 bytes)."""
        return self.hbm_bytes / 2**30

    @property
    def hbm_label(self) -> str:
        """HBM capacity in the unit its source prints: ``'16 GB'``, ``'95 GiB'``.

        >>> get("v5p").hbm_label, get("v5e").hbm_label
        ('95 GiB', '16 GB')
        """
        scale = {"GB": 1e9, "GiB": 2**30}[self.hbm_unit]
        return f"{self.hbm_bytes / scale:,.0f} {self.hbm_unit}"

    def peak_label(self) -> str:
        """The bf16 peak in TFLOP/s, or ``'no bf16'`` with the fp16 peak where published.

        >>> get("v5e").peak_label(), get("t4").peak_label()
        ('197 bf16 TFLOP/s', 'no bf16 (fp16: 65 TFLOP/s)')
        """
        if self.peak_bf16_flops_per_s is not None:
            return f"{self.peak_bf16_flops_per_s / 1e12:,.0f} bf16 TFLOP/s"
        if self.peak_fp16_flops_per_s is not None:
            return f"no bf16 (fp16: {self.peak_fp16_flops_per_s / 1e12:,.0f} TFLOP/s)"
        return "no bf16"

    def summary(self) -> str:
        """One line: name, peak bf16 (or "no bf16"), HBM size (source's unit) and bandwidth.

        >>> print(get("v5p").summary())
        TPU v5p: 459 bf16 TFLOP/s, 95 GiB HBM at 2,765 GB/s
        """
        per_device = (f" ({self.devices_per_chip} JAX devices per chip)"
                      if self.devices_per_chip > 1 else "")
        return (
            f"{self.display_name}: {self.peak_label()}, "
            f"{self.hbm_label} HBM at {self.hbm_bytes_per_s / 1e9:,.0f} GB/s{per_device}"
        )

    def _repr_html_(self) -> str:
        return tables.html([(f.name, getattr(self, f.name), self.sources.get(f.name, ""))
                            for f in dataclasses.fields(self)
                            if f.name not in ("sources", "alt_values")],
                           header=("field", "value", "source"))



CHIPS: Mapping[str, Chip] = {
    c.name: c
    for c in (
        Chip(
            name="v2", display_name="TPU v2", kind="tpu",
            peak_bf16_flops_per_s=46e12,  # S1 (2 cores x 23 TF)
            peak_fp32_flops_per_s=None,  # no fp32 matrix peak published
            hbm_bytes=16e9,  # S1
            hbm_bytes_per_s=716e9,  # S1
            tensorcores_per_chip=2,  # S1, not megacore
            mxu_count=2, mxu_size=128,  # 1 per core x 128x128, S1 S3
            ici_bytes_per_s=None, ici_link_bytes_per_s=None,  # not found
            ici_topology="2D torus, 4 neighbours",  # S2
            wraparound=Wraparound("always"),  # S2
            dcn_bytes_per_s=None,
            chips_per_host=4,  # "sets of 4 on a tray", S2
            vmem_bytes=16 * 2**20,  # S1
            device_kinds=("TPU v2",),
            sources={"peak_bf16_flops_per_s": "S1", "hbm_bytes": "S1", "hbm_bytes_per_s": "S1",
                     "mxu_count": "S1 S3", "ici_topology": "S2", "chips_per_host": "S2",
                     "devices_per_chip": "S1",
                     "tensorcores_per_chip": "S1", "mxu_size": "S1 S3", "wraparound": "S2", "vmem_bytes": "S1", "hbm_unit": "S1"},
            devices_per_chip=2,  # 2 TensorCores, not megacore: each is a JAX device, S1
            hbm_unit="GB",  # S1 stores 16e9 bytes
        ),
        Chip(
            name="v3", display_name="TPU v3", kind="tpu",
            peak_bf16_flops_per_s=123e12,  # S8 (Cloud); 140e12 in S1 and S2
            peak_fp32_flops_per_s=None,
            hbm_bytes=32 * 2**30,  # "32 GiB", S8
            hbm_bytes_per_s=900e9,  # S8, S2
            tensorcores_per_chip=2,  # S8
            mxu_count=4, mxu_size=128,  # 2 per core, S8 S1
            # the chip's total: 4 links (2D torus, 4 neighbours) x 2e11 bidi per link; the
            # per-link figure is S2's (1e11 one way, unverified upstream), the sum derived
            ici_bytes_per_s=4 * 2e11,
            ici_link_bytes_per_s=1e11,  # S2
            ici_topology="2D torus",  # S8
            wraparound=Wraparound("always"),  # 2D torus, S8
            dcn_bytes_per_s=None,
            chips_per_host=4,  # v3-8 = 1 host, 4 chips x 2 cores, S8
            vmem_bytes=16 * 2**20,  # S1
            device_kinds=("TPU v3",),
            sources={"peak_bf16_flops_per_s": "S8", "hbm_bytes": "S8", "hbm_bytes_per_s": "S8",
                     "mxu_count": "S8 S1", "ici_link_bytes_per_s": "S2",
                     "ici_bytes_per_s": "S2 (derived: 4 links x 2e11 bidi per link)",
                     "devices_per_chip": "S8 S1",
                     "tensorcores_per_chip": "S8", "mxu_size": "S8 S1", "ici_topology": "S8", "wraparound": "S8", "chips_per_host": "S8", "vmem_bytes": "S1", "hbm_unit": "S8"},
            alt_values={"peak_bf16_flops_per_s": "140e12 (S1, S2)",
                        "hbm_bytes_per_s": "825e9 (S1)", "hbm_bytes": "34.4e9 (S1)"},
            devices_per_chip=2,  # 2 TensorCores, not megacore, S8 S1
            hbm_unit="GiB",  # "32 GiB", S8
        ),
        Chip(
            name="v4", display_name="TPU v4", kind="tpu",
            peak_bf16_flops_per_s=275e12,  # S9
            peak_fp32_flops_per_s=None,
            hbm_bytes=32 * 2**30,  # "32 GiB", S9
            hbm_bytes_per_s=1200e9,  # S9 (S1: 1.23e12)
            tensorcores_per_chip=2,  # megacore, S9 S1
            mxu_count=8, mxu_size=128,  # 4 per core, S9 S1
            ici_bytes_per_s=6 * 9e10,  # 6 links x 9e10 bidi, S2
            ici_link_bytes_per_s=4.5e10,  # S2
            ici_topology="3D torus (3D mesh below 4x4x4), 6 neighbours",  # S9 S2
            wraparound=Wraparound("multiple", 4, "full 4x4x4 cubes"),  # S2
            dcn_bytes_per_s=None,
            chips_per_host=4,  # 2x2x1, S2
            vmem_bytes=16 * 2**20,  # S1
            device_kinds=("TPU v4",),
            sources={"peak_bf16_flops_per_s": "S9", "hbm_bytes": "S9", "hbm_bytes_per_s": "S9",
                     "ici_link_bytes_per_s": "S2", "ici_topology": "S9 S2",
                     "tensorcores_per_chip": "S9 S1", "mxu_count": "S9 S1", "mxu_size": "S9 S1", "ici_bytes_per_s": "S2", "wraparound": "S2", "chips_per_host": "S2", "vmem_bytes": "S1", "devices_per_chip": "S9 S1", "hbm_unit": "S9",
                     "compile_only_topologies": "verified: tests/test_hlo.py compiles each"},
            alt_values={"hbm_bytes_per_s": "1.23e12 (S1)"},
            devices_per_chip=1,  # megacore: the two cores are one JAX device, S9 S1
            hbm_unit="GiB",  # "32 GiB", S9
            compile_only_topologies=("2x2x1", "2x2x2"),  # aot: compiled with libtpu
        ),
        Chip(
            name="v5e", display_name="TPU v5e", kind="tpu",
            peak_bf16_flops_per_s=197e12,  # S5
            peak_fp32_flops_per_s=None,
            hbm_bytes=16e9,  # "16 GB", S5 (S1: 17.2e9)
            hbm_bytes_per_s=819e9,  # S5
            tensorcores_per_chip=1,  # S5
            mxu_count=4, mxu_size=128,  # S5 S1
            ici_bytes_per_s=400e9,  # bidi per chip, 4 ports, S5
            ici_link_bytes_per_s=4.5e10,  # S2
            ici_topology="2D torus, 4 ICI ports",  # S5
            wraparound=Wraparound("exact", 16, "a full pod side"),  # S2
            dcn_bytes_per_s=3.125e9,  # S2 (2 x 100 Gbps NIC per 8-chip host, S5)
            chips_per_host=8,  # S5
            vmem_bytes=128 * 2**20,  # S1 S2
            device_kinds=("TPU v5 lite", "TPU v5e", "TPU v5litepod"),
            sources={"peak_bf16_flops_per_s": "S5", "hbm_bytes": "S5", "hbm_bytes_per_s": "S5",
                     "ici_bytes_per_s": "S5", "ici_link_bytes_per_s": "S2",
                     "dcn_bytes_per_s": "S2", "chips_per_host": "S5",
                     "tensorcores_per_chip": "S5", "mxu_count": "S5 S1", "mxu_size": "S5 S1", "ici_topology": "S5", "wraparound": "S2", "vmem_bytes": "S1 S2", "hbm_unit": "S5",
                     "devices_per_chip": "S5",
                     "compile_only_topologies": "verified: tests/test_hlo.py compiles each", "usd_per_chip_hour": "P1"},
            alt_values={"hbm_bytes_per_s": "800 GiB/s (S5, other revision); 8.1e11 / 8.2e11 (S2, S1)",
                        "hbm_bytes": "17.2e9 (S1)",
                        "hbm_unit": "Cloud pages have printed both 16 GB and 16 GiB; JAX stores "
                                    "17.2e9 B (S1); this table keeps 16 GB (S5)"},
            hbm_unit="GB",  # "16 GB", S5 (other revisions: "16 GiB")
            compile_only_topologies=("1x1", "2x2", "2x4", "4x4", "16x16"),  # aot: compiled with libtpu
            usd_per_chip_hour=1.20,  # P1
        ),
        Chip(
            name="v5p", display_name="TPU v5p", kind="tpu",
            peak_bf16_flops_per_s=459e12,  # S4
            peak_fp32_flops_per_s=None,
            hbm_bytes=95 * 2**30,  # "95 GiB", S4 (S1: 103e9)
            hbm_bytes_per_s=2765e9,  # S4
            tensorcores_per_chip=2,  # megacore, S4
            mxu_count=8, mxu_size=128,  # 4 per core, S4 S1
            ici_bytes_per_s=1200e9,  # bidi per chip, S4
            ici_link_bytes_per_s=9e10,  # S2
            ici_topology="3D torus, 6 neighbours",  # S4 S2
            wraparound=Wraparound("multiple", 4, "full 4x4x4 cubes"),  # S2
            dcn_bytes_per_s=6.25e9,  # 50 Gbps per chip, S4
            chips_per_host=4,  # 4-chip VM, S4
            vmem_bytes=64 * 2**20,  # S1
            device_kinds=("TPU v5", "TPU v5p"),
            sources={"peak_bf16_flops_per_s": "S4", "hbm_bytes": "S4", "hbm_bytes_per_s": "S4",
                     "ici_bytes_per_s": "S4", "ici_link_bytes_per_s": "S2",
                     "dcn_bytes_per_s": "S4", "chips_per_host": "S4",
                     "tensorcores_per_chip": "S4", "mxu_count": "S4 S1", "mxu_size": "S4 S1", "ici_topology": "S4 S2", "wraparound": "S2", "vmem_bytes": "S1", "devices_per_chip": "S4 S1", "hbm_unit": "S4",
                     "compile_only_topologies": "verified: tests/test_hlo.py compiles each", "usd_per_chip_hour": "P1"},
            alt_values={"hbm_bytes_per_s": "2575 GiB/s (S4 other revision); 2.8e12 (S2); 2.46e12 (S1)",
                        "hbm_bytes": "96 GB (S2); 103e9 (S1)"},
            devices_per_chip=1,  # megacore, S4 S1
            hbm_unit="GiB",  # "95 GiB", S4
            compile_only_topologies=("2x2x1", "2x2x2"),  # aot: compiled with libtpu
            usd_per_chip_hour=4.20,  # P1
        ),
        Chip(
            name="v6e", display_name="TPU v6e (Trillium)", kind="tpu",
            peak_bf16_flops_per_s=918e12,  # S6
            peak_fp32_flops_per_s=None,
            hbm_bytes=32e9,  # "32 GB", S6 (S1: 34.4e9)
            hbm_bytes_per_s=1638e9,  # S6
            tensorcores_per_chip=1,  # S6
            mxu_count=2, mxu_size=256,  # S6 S1
            ici_bytes_per_s=800e9,  # bidi per chip, S6
            ici_link_bytes_per_s=9e10,  # S2
            ici_topology="2D torus, 4 ICI ports",  # S6
            wraparound=Wraparound("exact", 16, "a full pod side"),  # S2
            dcn_bytes_per_s=12.5e9,  # S2; "100 Gb/s per chip" in S7's table
            chips_per_host=8,  # S6
            vmem_bytes=128 * 2**20,  # S1
            device_kinds=("TPU v6 lite", "TPU v6e"),
            sources={"peak_bf16_flops_per_s": "S6", "hbm_bytes": "S6", "hbm_bytes_per_s": "S6",
                     "ici_bytes_per_s": "S6", "ici_link_bytes_per_s": "S2",
                     "dcn_bytes_per_s": "S2 S7", "chips_per_host": "S6", "mxu_size": "S6 S1 S2",
                     "tensorcores_per_chip": "S6", "mxu_count": "S6 S1", "ici_topology": "S6", "wraparound": "S2", "vmem_bytes": "S1", "hbm_unit": "S6",
                     "devices_per_chip": "S6",
                     "compile_only_topologies": "verified: tests/test_hlo.py compiles each", "usd_per_chip_hour": "P1"},
            alt_values={"hbm_bytes": "34.4e9 (S1)"},
            hbm_unit="GB",  # "32 GB", S6
            compile_only_topologies=("1x1", "2x2", "2x4", "4x4"),  # aot: compiled with libtpu
            usd_per_chip_hour=2.70,  # P1
        ),
        Chip(
            name="7x", display_name="TPU7x (Ironwood)", kind="tpu",
            peak_bf16_flops_per_s=2307e12,  # S7
            peak_fp32_flops_per_s=None,
            hbm_bytes=192 * 2**30,  # "192 GiB", S7 (S1: 206e9)
            hbm_bytes_per_s=7380e9,  # "7380 GB/s", S7 (S1: 7.4e12; blog, secondary: 7.37e12)
            tensorcores_per_chip=2,  # not megacore: each core is its own JAX device, S7 S1
            mxu_count=4, mxu_size=256,  # 2 per core, 256 wide, S1
            ici_bytes_per_s=1200e9,  # bidi per chip, S7
            ici_link_bytes_per_s=None,
            ici_topology="3D torus in 4x4x4 cubes",  # S21
            wraparound=Wraparound("multiple", 4, "4x4x4 cubes as v4/v5p: assumed, not verified"),  # S21
            dcn_bytes_per_s=100e9 / 8,  # "100 Gb/s" per chip, S7
            chips_per_host=4,  # 4 chips per VM, S10 S21
            vmem_bytes=64 * 2**20,  # S1
            device_kinds=("TPU7x", "TPU 7x", "TPU v7x", "TPU v7"),
            sources={"peak_bf16_flops_per_s": "S7", "hbm_bytes": "S7", "hbm_bytes_per_s": "S7",
                     "ici_bytes_per_s": "S7", "dcn_bytes_per_s": "S7", "mxu_count": "S1",
                     "devices_per_chip": "S7 S1",
                     "tensorcores_per_chip": "S7 S1", "mxu_size": "S1", "ici_topology": "S21", "wraparound": "S21", "vmem_bytes": "S1", "hbm_unit": "S7",
                     "chips_per_host": "S10 S21"},
            alt_values={"hbm_bytes_per_s": "7.4e12 (S1); 7.37e12 (S20, secondary)",
                        "hbm_bytes": "206e9 (S1)", "ici_bytes_per_s": "1.2 TB/s (S20, secondary)"},
            devices_per_chip=2,  # 2 TensorCores, each its own JAX device (no megacore), S7 S1
            hbm_unit="GiB",  # "192 GiB", S7
        ),
        Chip(
            name="t4", display_name="NVIDIA T4", kind="gpu",
            # No bf16 matrix support (S15): XLA computes bf16 in fp32. No bf16 peak is given;
            # the fp16 tensor-core peak has its own field.
            peak_bf16_flops_per_s=None,  # S15
            peak_fp32_flops_per_s=8.1e12,  # NV
            hbm_bytes=16e9,  # GDDR6, S17
            hbm_bytes_per_s=320e9,  # S17 (secondary)
            tensorcores_per_chip=1,
            mxu_count=None, mxu_size=None,
            ici_bytes_per_s=None, ici_link_bytes_per_s=None,  # PCIe only, no NVLink
            ici_topology="PCIe 3.0 x16, no NVLink",  # S17
            wraparound=Wraparound("none", note="PCIe only"),  # S17
            dcn_bytes_per_s=None,
            chips_per_host=1,
            vmem_bytes=64 * 2**10,  # shared memory per SM, of a 96 KB L1 + shared pool, S22
            device_kinds=("Tesla T4", "NVIDIA T4"),
            sources={"peak_bf16_flops_per_s": "S15 (none: no bf16 support)",
                     "peak_fp16_flops_per_s": "S17 (secondary)", "hbm_bytes_per_s": "S17",
                     "peak_fp32_flops_per_s": "NV",
                     "hbm_bytes": "S17", "ici_topology": "S17", "wraparound": "S17", "vmem_bytes": "S22", "hbm_unit": "S17",
                     "tensorcores_per_chip": "definition: a GPU is one device", "devices_per_chip": "definition: a GPU is one device",
                     "chips_per_host": "S18 (Colab: one T4 per VM)"},
            peak_fp16_flops_per_s=65e12,  # fp16 tensor-core peak, S17 (secondary)
            hbm_unit="GB",  # "16 GB" GDDR6, S17
        ),
        Chip(
            name="a100", display_name="NVIDIA A100 80GB SXM", kind="gpu",
            peak_bf16_flops_per_s=312e12,  # dense, S11 S19
            peak_fp32_flops_per_s=19.5e12,  # NV
            hbm_bytes=80e9,  # S11
            hbm_bytes_per_s=2039e9,  # S19 (S11: 2.0e12)
            tensorcores_per_chip=1,
            mxu_count=None, mxu_size=None,
            ici_bytes_per_s=600e9,  # NVLink 3, 300 GB/s each way, S11
            ici_link_bytes_per_s=25e9,  # 12 ports x 25 GB/s, S11
            ici_topology="NVLink 3 through 6 NVSwitches (8 GPUs per node)",  # S11
            wraparound=Wraparound("switched"),  # NVSwitch, S11
            dcn_bytes_per_s=None,
            chips_per_host=8,  # S11
            vmem_bytes=164 * 2**10,  # shared memory per SM, of the 192 KB L1 + shared pool, S22
            device_kinds=("NVIDIA A100-SXM4-80GB",),  # the PCIe card is not this row
            sources={"peak_bf16_flops_per_s": "S11 S19", "hbm_bytes_per_s": "S19",
                     "ici_bytes_per_s": "S11", "peak_fp32_flops_per_s": "NV",
                     "peak_fp16_flops_per_s": "S11 (bf16/fp16 column)",
                     "hbm_bytes": "S11", "ici_link_bytes_per_s": "S11", "ici_topology": "S11", "wraparound": "S11", "chips_per_host": "S11", "vmem_bytes": "S22", "hbm_unit": "S11",
                     "tensorcores_per_chip": "definition: a GPU is one device", "devices_per_chip": "definition: a GPU is one device"},
            alt_values={"hbm_bytes_per_s": "2.0e12 (S11)",
                        "vmem_bytes": "192 kB SMEM/SM (S11): the combined L1 + shared pool (S22)"},
            peak_fp16_flops_per_s=312e12,  # dense, same as bf16, S11
            hbm_unit="GB",  # "80GB", S11
        ),
        Chip(
            name="h100", display_name="NVIDIA H100 SXM", kind="gpu",
            peak_bf16_flops_per_s=989e12,  # dense, S19 (S11: 990e12)
            peak_fp32_flops_per_s=67e12,  # NV
            hbm_bytes=80e9,  # S11
            hbm_bytes_per_s=3.35e12,  # S11
            tensorcores_per_chip=1,
            mxu_count=None, mxu_size=None,
            ici_bytes_per_s=900e9,  # NVLink 4, 450 GB/s each way, S11
            ici_link_bytes_per_s=25e9,  # 18 ports x 25 GB/s, S11
            ici_topology="NVLink 4 through 4 NVSwitches (8 GPUs per node)",  # S11
            wraparound=Wraparound("switched"),  # NVSwitch, S11
            dcn_bytes_per_s=50e9,  # ~400 GB/s node egress / 8 GPUs, S11
            chips_per_host=8,  # S11
            vmem_bytes=228 * 2**10,  # shared memory per SM, of the 256 KB L1 + shared pool, S22
            device_kinds=("NVIDIA H100 80GB HBM3", "NVIDIA H100", "NVIDIA H100 SXM"),
            sources={"peak_bf16_flops_per_s": "S19 S11", "hbm_bytes_per_s": "S11",
                     "ici_bytes_per_s": "S11", "peak_fp32_flops_per_s": "NV",
                     "peak_fp16_flops_per_s": "S11 (bf16/fp16 column)",
                     "hbm_bytes": "S11", "ici_link_bytes_per_s": "S11", "ici_topology": "S11", "wraparound": "S11", "dcn_bytes_per_s": "S11", "chips_per_host": "S11", "vmem_bytes": "S22", "hbm_unit": "S11",
                     "tensorcores_per_chip": "definition: a GPU is one device", "devices_per_chip": "definition: a GPU is one device"},
            alt_values={"peak_bf16_flops_per_s": "990e12 (S11)",
                        "vmem_bytes": "256 kB SMEM/SM (S11): the combined L1 + shared pool (S22)"},
            peak_fp16_flops_per_s=989e12,  # dense, same as bf16, S11 S19
            hbm_unit="GB",  # "80GB", S11
        ),
        Chip(
            name="h200", display_name="NVIDIA H200 (SXM)", kind="gpu",
            peak_bf16_flops_per_s=989e12,  # same die as H100, S11
            peak_fp32_flops_per_s=67e12,  # NV
            hbm_bytes=141e9,  # HBM3e, S11
            hbm_bytes_per_s=4.8e12,  # S11
            tensorcores_per_chip=1,
            mxu_count=None, mxu_size=None,
            ici_bytes_per_s=900e9,  # NVLink 4, S11
            ici_link_bytes_per_s=25e9,
            ici_topology="NVLink 4 through NVSwitches (8 GPUs per node)",  # S11
            wraparound=Wraparound("switched"),  # NVSwitch, S11
            dcn_bytes_per_s=50e9,  # as H100, S11
            chips_per_host=8,  # S11
            vmem_bytes=228 * 2**10,  # the H100's SM: 228 KB shared of a 256 KB pool, S22 S11
            device_kinds=("NVIDIA H200",),  # the SXM module; the NVL card is not this row
            sources={"peak_bf16_flops_per_s": "S11", "hbm_bytes": "S11", "hbm_bytes_per_s": "S11",
                     "peak_fp32_flops_per_s": "NV", "peak_fp16_flops_per_s": "S11 (bf16/fp16 column)",
                     "ici_bytes_per_s": "S11", "ici_topology": "S11", "wraparound": "S11", "dcn_bytes_per_s": "S11", "chips_per_host": "S11", "vmem_bytes": "S22 S11 (same SM as the H100)", "hbm_unit": "S11",
                     "ici_link_bytes_per_s": "S11",
                     "tensorcores_per_chip": "definition: a GPU is one device", "devices_per_chip": "definition: a GPU is one device"},
            peak_fp16_flops_per_s=989e12,  # dense, same as bf16, S11
            hbm_unit="GB",  # "141GB", S11
        ),
    )
}

_ALIASES = {
    "tpu v5 lite": "v5e", "v5litepod": "v5e", "v5lite": "v5e", "trillium": "v6e",
    "v6": "v6e", "ironwood": "7x", "tpu7x": "7x", "v7x": "7x", "v7": "7x",
    "a100_80gb": "a100", "a100-80gb": "a100", "h100_sxm": "h100", "h100-sxm": "h100",
}


def names() -> list[str]:
    """The table's keys, TPUs first in generation order."""
    return list(CHIPS)


def get(name: str) -> Chip:
    """The row for a table key such as ``'v5e'``, ``'v6e'``, ``'h100'`` (case-insensitive).

    >>> get("V6E").mxu_size
    256
    """
    if not isinstance(name, str):
        raise errors.CourseTypeError(f"chip name {name!r}: expected a string, one of "
                                     f"{', '.join(CHIPS)}.")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in CHIPS:
        raise errors.CourseValueError(
            f"unknown chip {name!r}; the hardware table holds {', '.join(CHIPS)}. "
            "To map what JAX reports (jax.devices()[0].device_kind), use hardware.lookup()."
        )
    return CHIPS[key]


def as_chip(chip: "Chip | str", name: str = "chip") -> Chip:
    """``chip`` itself when it is a :class:`Chip`, its row when it is a table name.

    The one place functions that take ``chip`` turn it into a row, so that a wrong kind
    of value is refused with a message naming the argument.

    >>> as_chip("v5e") is get("v5e") is as_chip(get("v5e"))
    True
    """
    if isinstance(chip, Chip):
        return chip
    if isinstance(chip, str):
        return get(chip)
    raise errors.CourseTypeError(f"{name}={chip!r}: expected a hardware.Chip or a chip name "
                                 f"({', '.join(CHIPS)}).")


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()


_PCIE = ("a PCIe card with a lower power limit and no NVSwitch: its peak FLOP/s and its "
         "interconnect differ from the {row} row, whose numbers the table does not lend it")

#: Device kinds that look like a row but are a different product. ``lookup`` returns
#: ``None`` for them (never the look-alike's numbers) and :func:`missing_reason` says why.
NOT_IN_TABLE: Mapping[str, str] = {
    "NVIDIA H200 NVL": _PCIE.format(row="H200 SXM"),
    "NVIDIA H100 NVL": _PCIE.format(row="H100 SXM"),
    "NVIDIA H100 PCIe": _PCIE.format(row="H100 SXM"),
    "NVIDIA A100 80GB PCIe": _PCIE.format(row="A100 80GB SXM"),
    "NVIDIA A100-PCIE-80GB": _PCIE.format(row="A100 80GB SXM"),
    "NVIDIA A100-PCIE-40GB": "a 40 GB PCIe card; the table holds only the A100 80GB SXM",
    "NVIDIA A100-SXM4-40GB": "the 40 GB A100 (1,555 GB/s HBM, not the 80 GB's 2,039); the "
                             "table holds only the 80 GB SXM",
}


def lookup(device_kind: str) -> Chip | None:
    """Map a JAX ``device_kind`` string to its row, or ``None`` when it is not in the table.

    ``None`` is the honest answer for a CPU, an A100 40GB, an H200 NVL (a PCIe card, not
    the SXM module of the ``h200`` row) or a chip newer than this table: callers print
    "unknown" (and :func:`missing_reason`) instead of borrowing another chip's numbers.

    >>> lookup("TPU v6 lite").name, lookup("NVIDIA H200").name, lookup("Tesla T4").name
    ('v6e', 'h200', 't4')
    >>> lookup("NVIDIA A100-SXM4-40GB") is None, lookup("NVIDIA H200 NVL") is None
    (True, True)
    """
    if not isinstance(device_kind, str):
        return None
    want = _norm(device_kind)
    for chip in CHIPS.values():
        if any(_norm(k) == want for k in chip.device_kinds):
            return chip
    return None


def missing_reason(device_kind: str) -> str | None:
    """Why ``device_kind`` has no row although a similar chip has one (else ``None``).

    >>> print(missing_reason("NVIDIA H200 NVL"))  # doctest: +NORMALIZE_WHITESPACE
    a PCIe card with a lower power limit and no NVSwitch: its peak FLOP/s and its
    interconnect differ from the H200 SXM row, whose numbers the table does not lend it
    """
    want = _norm(device_kind)
    return next((why for kind, why in NOT_IN_TABLE.items() if _norm(kind) == want), None)


def peak_flops_per_s(chip: Chip | str, dtype: str = "bf16") -> float:
    """The chip's dense peak FLOP/s for ``dtype``: :meth:`Chip.peak_flops`."""
    return as_chip(chip).peak_flops(dtype)


def peak_flops_per_device(chip: Chip | str, dtype: str = "bf16") -> float:
    """Peak FLOP/s of one JAX device: :meth:`Chip.peak_flops_per_device`."""
    return as_chip(chip).peak_flops_per_device(dtype)


def bf16_matrix_peak(chip: Chip | None) -> float | None:
    """The chip's dense bf16 peak in FLOP/s, or None: no chip in the table (a CPU, an
    unknown accelerator), or a chip with no bf16 matrix units (a T4: its row has no bf16
    peak, XLA computes bf16 in fp32 there). Chapter 2 and its lab's checker use it.

    >>> bf16_matrix_peak(get("v5e")) / 1e12, bf16_matrix_peak(get("t4")), bf16_matrix_peak(None)
    (197.0, None, None)
    """
    return None if chip is None else chip.peak_bf16_flops_per_s


def prices() -> dict[str, float]:
    """``{chip name: on-demand USD per chip-hour}`` for the rows that hold a price (P1)."""
    return {c.name: c.usd_per_chip_hour for c in CHIPS.values() if c.usd_per_chip_hour is not None}


def table(chip_names: list[str] | None = None) -> str:
    """A plain-text table of the main figures for ``chip_names`` (default: all rows).

    HBM is printed in the unit its source uses; a chip without bf16 says so, and its
    FLOP/byte is then the fp16 one, labelled. Notes on disputed figures follow the table.

    >>> print(table(["v5e", "v5p", "t4"]))
    chip  bf16 TFLOP/s     HBM  HBM GB/s     MXUs        FLOP/byte
    ----  ------------     ---  --------     ----        ---------
    v5e            197   16 GB       819  4 x 128              241
    v5p            459  95 GiB     2,765  8 x 128              166
    t4         no bf16   16 GB       320        -  203 (fp16 peak)
    note: v5e HBM: Cloud pages have printed both 16 GB and 16 GiB; JAX stores 17.2e9 B (S1);
      this table keeps 16 GB (S5)
    """
    rows = [("----", "------------", "---", "--------", "----", "---------")]
    notes = []
    if chip_names is not None and (not isinstance(chip_names, (list, tuple)) or not all(
            isinstance(n, str) for n in chip_names)):
        raise errors.CourseTypeError(f"chip_names={chip_names!r}: expected a list of chip names "
                                     "such as ['v5e', 'h100'].")
    for name in chip_names or names():
        c = get(name)
        mxu = f"{c.mxu_count} x {c.mxu_size}" if c.mxu_count else "-"
        if c.peak_bf16_flops_per_s is not None:
            peak, ridge = f"{c.peak_bf16_flops_per_s / 1e12:,.0f}", f"{c.critical_intensity():,.0f}"
        else:
            peak = "no bf16"
            ridge = (f"{c.critical_intensity('fp16'):,.0f} (fp16 peak)"
                     if c.peak_fp16_flops_per_s is not None else "-")
        rows.append((c.name, peak, c.hbm_label, f"{c.hbm_bytes_per_s / 1e9:,.0f}", mxu, ridge))
        if "hbm_unit" in c.alt_values:
            notes += textwrap.wrap(f"note: {c.name} HBM: {c.alt_values['hbm_unit']}", 88,
                                   subsequent_indent="  ")  # a notebook's code column
    header = ("chip", "bf16 TFLOP/s", "HBM", "HBM GB/s", "MXUs", "FLOP/byte")
    return "\n".join([tables.text(rows, header, right=True), *notes])
