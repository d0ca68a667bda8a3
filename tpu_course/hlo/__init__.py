"""Look inside what ``jit`` produces: jaxpr, StableHLO, optimised HLO, cost and memory.

``inspect(fn, *args)`` traces, lowers and compiles ``fn`` at those arguments (it never
runs it) and returns an :class:`HloReport`: the three program texts, an op histogram,
the fusions and which ops each one swallowed, the collectives (kind, operand shape,
dtype, bytes per device, replica groups; :meth:`HloReport.by_kind` sums them per kind),
XLA's FLOP and byte counts, the memory analysis (argument, output and temporary bytes)
and the compile time.

``target`` picks what to compile for: ``None`` is the local backend (or whatever
devices the arguments' shardings name), a compile-only TPU topology (a name such as
``"v5e:2x2"`` or a :class:`tpu_course.hlo.aot.Topology`). Compile-only targets need the TPU
extra (``pip install "tpu-course[aot]"``, which brings ``libtpu``): the real TPU compiler
then runs on this machine and produces the program a TPU would run, with its tiled
layouts (``T(8,128)``), padding, fusions and collectives, without any TPU present.
Reports say so (``compile_only``).

The package is the concept's one public face: the report is here, its parts live in
submodules and their public names are exposed here (``hlo.tpu_topology``,
``hlo.parse_collectives`` ...): :mod:`tpu_course.hlo.aot` (the compile-only topologies)
and :mod:`tpu_course.hlo.text` (the HLO text parser and XLA's analyses normalised; pure,
no JAX).

Conventions:

* ``flops`` and ``bytes_accessed`` come from XLA's cost analysis of the compiled
  program; for an SPMD program they are **per device** (the module every device runs).
* ``bytes`` of a collective is the size of its **operand on one device** (see
  :mod:`tpu_course.hlo.text`).
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import html
import re
import time
from typing import Any, Callable, Iterable, Mapping

from tpu_course import errors, tables
from tpu_course.hlo import aot
from tpu_course.hlo.aot import (  # noqa: F401  (the package's public face: hlo.tpu_topology ...)
    VERIFIED_TOPOLOGIES, Topology, TpuCompilerMissing, compile_only_available, tpu_compiler_available,
    tpu_compiler_problem, tpu_topology, valid_topologies,
)
from tpu_course.hlo.text import (  # noqa: F401  (the package's public face: hlo.parse_module ...)
    COLLECTIVE_KINDS, COMPUTATION_RE, DTYPE_BYTES, INSTRUCTION_RE, NUMPY_DTYPE, Collective,
    Fusion, HloModule, Instruction, clean_line, normalise_cost, normalise_memory,
    parse_collectives, parse_fusions, parse_module, parse_replica_groups, wrap_lines,
)


class HloTraceError(errors.CourseTypeError):
    """``fn`` could not be traced: a Python decision depended on an array's value."""


# --------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------

_BOOKKEEPING = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                          "copy-start", "copy-done", "after-all", "partition-id", "replica-id"})
HIGHLIGHT = ("fusion", "dot", "convolution", "custom-call") + COLLECTIVE_KINDS


@dataclasses.dataclass(frozen=True)
class HloReport:
    """What XLA made of one function at one set of argument shapes.

    Build it with :func:`inspect`. Byte and FLOP counts are per device.
    """

    name: str
    target: str  # the platform ('cpu', 'gpu', 'tpu') or the topology's name ('v5e:2x2')
    platform: str
    device_kind: str
    device_count: int
    compile_only: bool  # compiled for devices this machine does not have
    jaxpr: str
    stablehlo: str
    hlo: str
    op_counts: Mapping[str, int]  # top-level ops (inside fusions: see ``fusions``)
    fusions: tuple[Fusion, ...]
    collectives: tuple[Collective, ...]
    flops: float | None
    bytes_accessed: float | None
    transcendentals: float | None
    argument_bytes: int | None
    output_bytes: int | None
    alias_bytes: int | None
    temp_bytes: int | None
    trace_time_s: float  # tracing + lowering to StableHLO
    compile_time_s: float  # XLA compilation only
    cost: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def arithmetic_intensity(self) -> float | None:
        """FLOPs per byte accessed (XLA's counts), or None when either is missing."""
        if not self.flops or not self.bytes_accessed:
            return None
        return self.flops / self.bytes_accessed

    @property
    def peak_bytes(self) -> int | None:
        """Arguments + outputs + temporaries - aliased buffers: the device memory the
        program needs at once (XLA's memory analysis; per device)."""
        parts = (self.argument_bytes, self.output_bytes, self.temp_bytes)
        if any(p is None for p in parts):
            return None
        return sum(parts) - (self.alias_bytes or 0)

    @property
    def collective_bytes(self) -> int:
        """Sum of the collectives' operand bytes per device."""
        return sum(c.bytes for c in self.collectives)

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """``{kind: (arrays, bytes per device)}`` summed over the collectives.

        The same shape as ``tpu_course.plans.CollectivePlan.by_kind()``, so a prediction
        and the compiled program compare with ``==``.
        """
        out: dict[str, tuple[int, int]] = {}
        for c in self.collectives:
            arrays, total = out.get(c.kind, (0, 0))
            out[c.kind] = (arrays + 1, total + c.bytes)
        return out

    def by_shape(self) -> dict[tuple[str, str, tuple[int, ...], int], tuple[int, int]]:
        """``{(kind, dtype, shape on one device, group size): (arrays, bytes per device)}``,
        largest bytes first (ties in program order): which arrays the collectives move,
        where ``by_kind`` sums them by kind only (the same counts, split finer)."""
        out: dict[tuple[str, str, tuple[int, ...], int], tuple[int, int]] = {}
        for c in self.collectives:
            key = (c.kind, c.dtype, c.shape, c.group_size)
            arrays, total = out.get(key, (0, 0))
            out[key] = (arrays + 1, total + c.bytes)
        return dict(sorted(out.items(), key=lambda item: -item[1][1]))

    @property
    def compute_ops(self) -> dict[str, int]:
        """``op_counts`` without bookkeeping ops (parameters, tuples, constants, bitcasts)."""
        return {k: v for k, v in self.op_counts.items() if k not in _BOOKKEEPING}

    def lines(self, *opcodes: str, clean: bool = True) -> list[str]:
        """The optimised-HLO lines whose opcode is one of ``opcodes`` (all lines of the
        top-level computations when none is given), cleaned by :func:`clean_line`."""
        out = []
        for ins in parse_module(self.hlo).top_level():
            if not opcodes or ins.opcode in opcodes or any(
                    ins.opcode == o + "-start" for o in opcodes):
                out.append(clean_line(ins.line) if clean else ins.line)
        return out

    def rows(self) -> list[tuple[str, str]]:
        """The compact table as (label, value) pairs."""
        def num(x: float | None, unit: str = "") -> str:
            return "n/a" if x is None else f"{x:,.0f}{unit}"

        where = self.target + (" (compile-only: no such device here)" if self.compile_only else "")
        ai = self.arithmetic_intensity
        rows = [
            ("function", self.name),
            ("compiled for", f"{where}; {self.device_count} x {self.device_kind}"),
            ("FLOPs per device", num(self.flops)),
            ("bytes accessed per device", num(self.bytes_accessed)),
            ("arithmetic intensity", "n/a" if ai is None else f"{ai:.2f} FLOP/byte"),
            ("argument / output / temp bytes",
             f"{num(self.argument_bytes)} / {num(self.output_bytes)} / {num(self.temp_bytes)}"),
            ("ops (top level)", ", ".join(f"{k} x{v}" for k, v in self.compute_ops.items()) or "-"),
            ("fusions", str(len(self.fusions))),
            ("collectives", "; ".join(str(c) for c in self.collectives) or "none"),
            ("trace + lower / compile time", f"{self.trace_time_s:.3f} s / {self.compile_time_s:.3f} s"),
        ]
        return rows

    def summary(self) -> str:
        """The compact table as text."""
        return tables.text(self.rows())

    def __repr__(self) -> str:
        return f"HloReport(\n{self.summary()}\n)"

    def _repr_html_(self) -> str:
        return tables.html(self.rows(), labels=True, align_left=True)

    def show_hlo(self, highlight: Iterable[str] = HIGHLIGHT, clean: bool = True) -> "HloText":
        """The optimised HLO with the lines of the ``highlight`` opcodes marked."""
        return HloText(self.hlo, tuple(highlight), clean)

    def diff(self, other: "HloReport") -> "ReportDiff":
        """What changed from this report to ``other`` (see :func:`diff`)."""
        return diff(self, other)


@dataclasses.dataclass(frozen=True)
class HloText:
    """HLO text that renders with interesting lines highlighted (``>>`` in plain text)."""

    text: str
    highlight: tuple[str, ...]
    clean: bool = True

    def _marked(self) -> list[tuple[bool, str]]:
        """(highlighted?, line) for the computations' lines (the module header and the
        source-location tables are left out)."""
        out: list[tuple[bool, str]] = []
        inside = False
        for line in self.text.splitlines():
            if not inside:
                if COMPUTATION_RE.match(line) and not line.startswith("HloModule"):
                    inside = True
                    out.append((False, line))
                continue
            if line.strip() == "}":
                inside = False
                out += [(False, line), (False, "")]
                continue
            m = INSTRUCTION_RE.match(line)
            hot = bool(m) and any(m.group("op") in (h, h + "-start") for h in self.highlight)
            out.append((hot, "  " + clean_line(line, numbers=False) if self.clean and m else line))
        return out

    def __str__(self) -> str:
        # A long instruction continues on indented lines (a notebook's column is 88 wide).
        return wrap_lines("\n".join((">> " if hot else "   ") + line
                                     for hot, line in self._marked()))

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<span style='background:#fff3b0;font-weight:bold'>{html.escape(l)}</span>\n"
            if hot else html.escape(l) + "\n" for hot, l in self._marked())
        return f"<pre style='font-size:11px;line-height:1.25'>{rows}</pre>"


@dataclasses.dataclass(frozen=True)
class ReportDiff:
    """Side-by-side numbers of two reports, and the HLO lines that differ."""

    names: tuple[str, str]
    rows: tuple[tuple[str, str, str], ...]  # (label, before, after)
    hlo_diff: tuple[str, ...]

    def __str__(self) -> str:
        return tables.text(self.rows, header=("", *self.names), right=True, min_width=16)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return tables.html(self.rows, header=("", *self.names), labels=True)


def diff(before: HloReport, after: HloReport) -> ReportDiff:
    """Compare two reports: FLOPs, bytes, memory, fusions, each op count, collectives."""
    def fmt(x: Any) -> str:
        if x is None:
            return "n/a"
        return f"{x:,.0f}" if isinstance(x, (int, float)) else str(x)

    rows = [(label, fmt(getattr(before, attr)), fmt(getattr(after, attr))) for label, attr in (
        ("FLOPs", "flops"), ("bytes accessed", "bytes_accessed"), ("temp bytes", "temp_bytes"),
        ("output bytes", "output_bytes"), ("collective bytes", "collective_bytes"))]
    rows.append(("fusions", str(len(before.fusions)), str(len(after.fusions))))
    ops = sorted(set(before.compute_ops) | set(after.compute_ops))
    rows += [(f"op {op}", str(before.compute_ops.get(op, 0)), str(after.compute_ops.get(op, 0)))
             for op in ops]
    lines = difflib.unified_diff(before.lines(), after.lines(), lineterm="", n=0)
    return ReportDiff((before.name, after.name), tuple(rows),
                      tuple(l for l in lines if l[:1] in "+-" and l[:3] not in ("+++", "---")))


# --------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes JAX's pretty-printer may add

_TRACER_HELP = (
    "{fn} could not be traced: {what}. Under jit, arrays are abstract tracers (a shape "
    "and a dtype, no values), so Python cannot branch or loop on them, nor turn them into "
    "Python numbers or NumPy arrays. Use jnp.where / lax.cond / lax.fori_loop for "
    "value-dependent control flow, or mark the argument static "
    "(jax.jit(f, static_argnums=...)) if it is a configuration value. JAX said: {msg}"
)


def _tracer_error_types() -> tuple[type, ...]:
    import jax

    names = ("ConcretizationTypeError", "TracerBoolConversionError", "TracerIntegerConversionError",
             "TracerArrayConversionError", "UnexpectedTracerError", "NonConcreteBooleanIndexError")
    return tuple(getattr(jax.errors, n) for n in names if hasattr(jax.errors, n))


def _fn_name(fn: Callable) -> str:
    inner = getattr(fn, "__wrapped__", fn)
    return getattr(inner, "__name__", None) or type(fn).__name__


def _place_on(args: Any, device: Any, devices: set) -> Any:
    """Turn array leaves into ShapeDtypeStructs on ``device`` (keeping shardings that
    already live on the target's devices)."""
    import jax
    import numpy as np
    from jax.sharding import SingleDeviceSharding

    def leaf(x: Any) -> Any:
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            return x
        sharding = getattr(x, "sharding", None)
        if sharding is not None and set(sharding.device_set) <= devices:
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=SingleDeviceSharding(device))

    return jax.tree_util.tree_map(leaf, args)


def _arg_devices(args: Any) -> list[Any]:
    import jax

    for x in jax.tree_util.tree_leaves(args):
        sharding = getattr(x, "sharding", None)
        if sharding is not None:
            return sorted(sharding.device_set, key=lambda d: d.id)
    return []


def inspect(fn: Callable, *args: Any, target: "str | Topology | None" = None,
            **kwargs: Any) -> HloReport:
    """Trace, lower and compile ``fn(*args, **kwargs)`` and report what XLA produced.

    ``args`` may be arrays or ``jax.ShapeDtypeStruct`` placeholders (nothing runs).
    ``fn`` may already be jitted (its static arguments are respected). ``target``:

    * ``None``: the local default backend, or the devices the arguments' shardings name;
      the report's ``target`` is then their platform (``'cpu'``, ``'tpu'`` ...);
    * a compile-only TPU topology, by name (``"v5e:2x2"``, ``"v6e:1x1"`` ...; see
      :data:`VERIFIED_TOPOLOGIES`) or as a :class:`Topology`: arguments sharded over its
      devices (a mesh built from ``topology.devices``) keep their shardings, the others
      are placed on its first device; the report's ``target`` is the topology's name.

    Raises:
        HloTraceError: ``fn`` branches on, or converts, an array value while tracing.
        ValueError: unknown ``target``.
        TpuCompilerMissing: a TPU target without libtpu installed.

    >>> import jax.numpy as jnp
    >>> r = inspect(lambda a, b: a @ b, jnp.ones((64, 32)), jnp.ones((32, 16)))
    >>> r.flops == 2 * 64 * 32 * 16
    True
    """
    import jax

    name = _fn_name(fn)
    if target is not None:
        if not isinstance(target, (str, Topology)):
            raise errors.CourseTypeError(
                f"target={target!r}: expected None (this machine's default backend), a "
                "compile-only TPU topology name such as 'v5e:2x2' (valid: "
                f"{', '.join(valid_topologies())}), or a Topology from tpu_topology().")
        topo = aot.as_topology(target)
        devices = topo.devices
        args, kwargs = _place_on((args, kwargs), devices[0], set(devices))
        devices = _arg_devices((args, kwargs)) or devices[:1]
        target_name = topo.name
    else:
        devices = _arg_devices((args, kwargs)) or [jax.devices()[0]]
        target_name = devices[0].platform
    jitted = fn if hasattr(fn, "trace") and hasattr(fn, "lower") else jax.jit(fn)
    start = time.perf_counter()
    try:
        traced = jitted.trace(*args, **kwargs)
    except _tracer_error_types() as err:
        what = type(err).__name__
        raise HloTraceError(_TRACER_HELP.format(fn=name, what=what,
                                                msg=str(err).splitlines()[0])) from err
    lowered = traced.lower()
    trace_time_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_time_s = time.perf_counter() - start

    hlo_text = compiled.as_text()
    module = parse_module(hlo_text)
    cost = normalise_cost(compiled.cost_analysis())
    memory = normalise_memory(compiled.memory_analysis())
    op_counts = collections.Counter(ins.opcode for ins in module.top_level())
    local = set()
    try:
        local = set(jax.devices(devices[0].platform))
    except RuntimeError:
        pass
    return HloReport(
        name=name, target=target_name, platform=devices[0].platform,
        device_kind=devices[0].device_kind, device_count=len(devices),
        compile_only=devices[0] not in local,
        jaxpr=_ANSI.sub("", str(traced.jaxpr)), stablehlo=lowered.as_text(), hlo=hlo_text,
        op_counts=dict(sorted(op_counts.items())), fusions=tuple(parse_fusions(module)),
        collectives=tuple(parse_collectives(hlo_text)),
        flops=cost.get("flops"), bytes_accessed=cost.get("bytes accessed"),
        transcendentals=cost.get("transcendentals"),
        argument_bytes=memory["argument_bytes"], output_bytes=memory["output_bytes"],
        alias_bytes=memory["alias_bytes"], temp_bytes=memory["temp_bytes"],
        trace_time_s=trace_time_s, compile_time_s=compile_time_s, cost=cost,
    )
