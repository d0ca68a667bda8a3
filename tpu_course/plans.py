"""The collectives one training step needs under DP, FSDP or TP, and their bytes.

:func:`collective_bytes` predicts, per device, what ``tpu_course.hlo`` reads from the
compiled step (``CollectivePlan.by_kind() == HloReport.by_kind()``); :func:`layer_bytes`
counts as the scaling book does. Times come from :mod:`tpu_course.comms`' formulas
(:meth:`CollectivePlan.time_s`). ``tpu_course.comms`` re-exports every name here.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from typing import Any, Iterable, Mapping, Sequence

from tpu_course import errors, hardware, tables

STRATEGIES = ("dp", "fsdp", "tp")


@dataclasses.dataclass(frozen=True)
class PlannedCollective:
    """One kind of collective in a step: how many arrays, and their bytes per device.

    ``bytes`` is the sum over those arrays of the **operand** each device contributes
    (``tpu_course.hlo``'s convention): the ``1/N`` shard for an all-gather, the full
    array for a reduce-scatter or all-reduce. ``v_bytes`` is the ``V`` of the time
    formulas, the full array (for an all-gather, ``N x bytes``).
    """

    kind: str
    arrays: int
    bytes: int
    v_bytes: int
    why: str = ""

    def __str__(self) -> str:
        return f"{self.kind:<14} x{self.arrays}  {self.bytes:>10,} B/device  ({self.why})"


@dataclasses.dataclass(frozen=True)
class CollectivePlan:
    """The collectives one training step needs under a strategy, per device."""

    strategy: str
    devices: int
    collectives: tuple[PlannedCollective, ...]

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """``{kind: (arrays, bytes)}`` summed per kind."""
        out: dict[str, tuple[int, int]] = {}
        for c in self.collectives:
            a, b = out.get(c.kind, (0, 0))
            out[c.kind] = (a + c.arrays, b + c.bytes)
        return out

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.collectives)

    def time_s(self, chip: hardware.Chip | str, axes: int | Sequence[int] | None = None,
               **kwargs) -> float:
        """Predicted seconds of communication per step on ``chip`` (no overlap assumed)."""
        from tpu_course import comms  # the time formulas

        axes = self.devices if axes is None else axes
        time = {kind: formula for kind, (formula, _) in comms.COLLECTIVES.items() if formula}
        return sum(time[c.kind](c.v_bytes, axes, chip, **kwargs) for c in self.collectives)

    def __str__(self) -> str:
        lines = [f"{self.strategy.upper()} on {self.devices} devices:"]
        for c in self.collectives:  # a long reason continues under its "(", 88 wide
            row = str(c)
            lines += textwrap.wrap(row, 88, initial_indent="  ",
                                   subsequent_indent=" " * (3 + row.index("(")))
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = [(c.kind, c.arrays, f"{c.bytes:,}", c.why) for c in self.collectives]
        return (f"<b>{self.strategy.upper()} on {self.devices} devices</b>"
                + tables.html(rows, header=("kind", "arrays", "bytes/device", "why")))


def _shapes(params: Any) -> list[tuple[int, ...]]:
    """Parameter shapes from a mapping or a sequence of shapes, each checked."""
    if isinstance(params, Mapping):
        items = list(params.items())
    elif isinstance(params, Iterable) and not isinstance(params, str):
        items = list(enumerate(params))
    else:
        raise errors.CourseTypeError(f"params={params!r}: expected parameter shapes, a mapping "
                                     "name -> shape or a list of shapes such as [(256, 1024)].")
    if not items:
        raise errors.CourseValueError("params is empty: give at least one parameter shape.")
    shapes = []
    for key, shape in items:
        if not isinstance(shape, Sequence) or isinstance(shape, str) or not shape:
            raise errors.CourseTypeError(f"params[{key!r}]={shape!r}: expected a shape, a "
                                         "non-empty tuple of positive integers.")
        shapes.append(tuple(errors.check_int(f"params[{key!r}][{i}]", d, low=1)
                            for i, d in enumerate(shape)))
    return shapes


def collective_bytes(strategy: str, params: Mapping[str, Sequence[int]] | Iterable[Sequence[int]],
                     *, devices: int, batch: int | None = None, d_out: int | None = None,
                     bytes_per_elem: int = 4, loss_bytes: int = 4) -> CollectivePlan:
    """Predict the collectives of one training step of a stack of matmuls, per device.

    The step is ``tpu_course.parallel``'s: loss, gradients, SGD update, under

    * ``"dp"``: parameters replicated, batch sharded. Gradients are all-reduced:
      one all-reduce per parameter (XLA may fuse them into one tuple all-reduce: the
      bytes are the same), plus the scalar loss (``pmean``).
    * ``"fsdp"``: every parameter sharded along its first axis, batch sharded. Each
      parameter is all-gathered once for the forward pass (the gathered copy is kept
      for the backward pass) and its gradient reduce-scattered back to a shard; plus
      the scalar loss.
    * ``"tp"``: Megatron: the first matrix split by columns, the second by rows, batch
      replicated. The partial outputs ``[batch, d_out]`` are all-reduced once in the
      forward pass; the backward pass needs none (the input's gradient is not needed).

    Args:
        params: parameter shapes (a mapping name -> shape, or a list of shapes).
        devices: devices on the mesh axis.
        batch, d_out: batch rows and output width (TP only).
        bytes_per_elem: 4 for fp32, 2 for bf16.
        loss_bytes: bytes of the reduced loss (fp32 scalar: 4); 0 to leave it out.

    >>> shapes = {"w1": (256, 1024), "w2": (1024, 256)}
    >>> print(collective_bytes("fsdp", shapes, devices=8))
    FSDP on 8 devices:
      all-gather     x2     262,144 B/device  (each parameter gathered for the forward pass)
      reduce-scatter x2   2,097,152 B/device  (each gradient summed and scattered back to
                                               its shard)
      all-reduce     x1           4 B/device  (the mean loss)
    >>> collective_bytes("dp", shapes, devices=8).by_kind()
    {'all-reduce': (3, 2097156)}
    >>> collective_bytes("tp", shapes, devices=8, batch=64, d_out=256).by_kind()
    {'all-reduce': (1, 65536)}
    """
    errors.check_choice("strategy", strategy, STRATEGIES)
    devices = errors.check_int("devices", devices, low=1)
    bytes_per_elem = errors.check_int("bytes_per_elem", bytes_per_elem, low=1)
    loss_bytes = errors.check_int("loss_bytes", loss_bytes, low=0)
    shapes = _shapes(params)
    sizes = [math.prod(s) * bytes_per_elem for s in shapes]
    total = sum(sizes)
    loss = [PlannedCollective("all-reduce", 1, loss_bytes, loss_bytes, "the mean loss")] if loss_bytes else []
    if strategy == "dp":
        cs = [PlannedCollective("all-reduce", len(sizes), total, total, "the gradients, summed over the batch shards")]
        if loss_bytes:  # XLA fuses the loss into the same all-reduce: count it with them
            cs = [PlannedCollective("all-reduce", len(sizes) + 1, total + loss_bytes, total + loss_bytes,
                             "the gradients and the mean loss")]
        return CollectivePlan("dp", devices, tuple(cs))
    if strategy == "fsdp":
        for s in shapes:
            if s[0] % devices:
                raise errors.CourseValueError(f"FSDP shards each parameter's first axis over {devices} devices; "
                                              f"shape {tuple(s)} does not divide. Pick sizes that divide.")
        cs = [PlannedCollective("all-gather", len(sizes), total // devices, total,
                         "each parameter gathered for the forward pass"),
              PlannedCollective("reduce-scatter", len(sizes), total, total,
                         "each gradient summed and scattered back to its shard")]
        return CollectivePlan("fsdp", devices, tuple(cs + loss))
    if strategy == "tp":
        if batch is None or d_out is None:
            raise errors.CourseValueError("tensor parallelism moves activations: pass batch= and d_out=")
        batch = errors.check_int("batch", batch, low=1)
        d_out = errors.check_int("d_out", d_out, low=1)
        act = batch * d_out * bytes_per_elem
        return CollectivePlan("tp", devices, (PlannedCollective(
            "all-reduce", 1, act, act, "the row-parallel layer's partial outputs [batch, d_out]"),))
    raise errors.CourseValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")


def layer_bytes(strategy: str, d_model: int, d_ff: int, batch: int = 0,
                bytes_per_elem: int = 2) -> float:
    """Bytes one chip moves per transformer MLP layer per step, as the scaling book counts.

    DP: ``8DF`` (all-reduce of two ``DxF`` bf16 gradients, each counted twice: ``2x2x2DF``);
    FSDP: ``4DF + 8DF`` (forward all-gathers, then backward gather + reduce-scatter);
    TP: ``4BD + 4BD`` (activations gathered and scattered, forward and backward).

    >>> layer_bytes("dp", 1, 1), layer_bytes("fsdp", 1, 1), layer_bytes("tp", 1, 1, batch=1)
    (8.0, 12.0, 8.0)
    """
    errors.check_choice("strategy", strategy, STRATEGIES)
    d_model = errors.check_int("d_model", d_model, low=1)
    d_ff = errors.check_int("d_ff", d_ff, low=1)
    batch = errors.check_int("batch", batch, low=1 if strategy == "tp" else 0)
    bytes_per_elem = errors.check_int("bytes_per_elem", bytes_per_elem, low=1)
    b = bytes_per_elem / 2  # the book's formulas assume bf16 (2 bytes)
    if strategy == "dp":
        return 8.0 * d_model * d_ff * b
    if strategy == "fsdp":
        return 12.0 * d_model * d_ff * b
    if strategy == "tp":
        return 8.0 * batch * d_model * b
    raise errors.CourseValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
