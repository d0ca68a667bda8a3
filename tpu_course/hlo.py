"""Look inside what ``jit`` produces: jaxpr, StableHLO, optimised HLO, cost and memory.

``inspect(fn, *args)`` traces, lowers and compiles ``fn`` at those arguments (it never
runs it) and returns an :class:`HloReport`: the three program texts, an op histogram,
the fusions and which ops each one swallowed, the collectives (kind, operand shape,
dtype, bytes per device, replica groups), XLA's FLOP and byte counts, the memory
analysis (argument, output and temporary bytes) and the compile time.

``target`` picks what to compile for: ``None`` is the local backend (or whatever
devices the arguments' shardings name), a string such as ``"v5e:2x2"`` a *compile-only*
TPU topology. Compile-only targets need the TPU extra (``pip install "tpu-course[aot]"``,
which brings ``libtpu``): the real TPU compiler then runs on this machine and produces
the program a TPU would run, with its tiled layouts (``T(8,128)``), padding, fusions
and collectives, without any TPU present. Reports say so (``compile_only``).

Conventions:

* ``flops`` and ``bytes_accessed`` come from XLA's cost analysis of the compiled
  program; for an SPMD program they are **per device** (the module every device runs).
* ``bytes`` of a collective is the size of its **operand on one device**, from the
  logical shape (dims x dtype size), not counting TPU tile padding: an all-reduce of a
  ``f32[512,256]`` gradient moves 512 * 256 * 4 = 524288 bytes in and out of each device.
* XLA's analyses change shape between versions (a dict, a list of dicts, ``None``):
  :func:`normalise_cost` and :func:`normalise_memory` are the one place that copes.

>>> c = parse_collectives('''
... ENTRY %main (p: f32[64,512]) -> f32[512,256] {
...   %dot.1 = f32[512,256]{1,0} parameter(0)
...   ROOT %all-reduce = f32[512,256]{1,0} all-reduce(%dot.1), channel_id=1, replica_groups=[2,4]<=[8], to_apply=%add
... }''')
>>> c[0].kind, c[0].shape, c[0].dtype, c[0].bytes, c[0].replica_groups
('all-reduce', (512, 256), 'float32', 524288, ((0, 1, 2, 3), (4, 5, 6, 7)))
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import html
import math
import os
import re
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from tpu_course import errors, runtime

# --------------------------------------------------------------------------------------
# Compile-only TPU topologies
# --------------------------------------------------------------------------------------

#: Topologies checked to compile on a CPU-only machine with libtpu (jax 0.12, libtpu
#: from ``jax[tpu]``). Other shapes of the same generation may work too; these are the
#: ones the course uses and tests. Devices per name: v4 reports two per chip.
VERIFIED_TOPOLOGIES: Mapping[str, tuple[str, ...]] = {
    "v4": ("2x2x1", "2x2x2"),
    "v5e": ("1x1", "2x2", "2x4", "4x4", "16x16"),
    "v5p": ("2x2x1", "2x2x2"),
    "v6e": ("1x1", "2x2", "2x4", "4x4"),
}

#: The hardware-table key of each topology generation.
_TOPOLOGY_CHIP = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}

_INSTALL_HINT = (
    'Install the TPU extra: pip install "tpu-course[aot]" (or pip install "jax[tpu]"; '
    "about 700 MB, it brings libtpu, the TPU compiler). On Colab or a Cloud TPU VM it is "
    "already there."
)


class TpuCompilerMissing(errors.CourseError, ImportError):
    """The TPU compiler (``libtpu``, from the ``aot`` extra) is not installed."""


class HloTraceError(errors.CourseTypeError):
    """``fn`` could not be traced: a Python decision depended on an array's value."""


def tpu_compiler_problem() -> str | None:
    """None when compile-only TPU targets can work here, else why not and the fix.

    Two things must hold: ``libtpu`` is installed, and it is the build that the installed
    jax pins in its ``tpu`` extra. A mismatched libtpu crashes the whole process (a
    segmentation fault, not an exception) the first time it compiles for a topology:
    Colab's TPU runtime in August 2026 ships jax 0.7.2 with libtpu 0.0.21.1, while jax
    0.7.2 pins libtpu 0.0.23, and compiling for ``v5e:2x2`` there kills the kernel. So the
    course compiles for compile-only targets only with the pinned build; a real TPU
    runtime still runs everything on its own chips.
    """
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        return "the TPU compiler (libtpu) is not installed. " + _INSTALL_HINT
    try:
        have = md.version("libtpu")
        pins = [r for r in (md.requires("jax") or ()) if r.replace(" ", "").startswith("libtpu")]
    except md.PackageNotFoundError:  # a libtpu not installed by pip: nothing to compare
        return None
    from packaging.requirements import Requirement

    for line in pins:
        spec = Requirement(line).specifier
        if not spec.contains(have, prereleases=True):
            return (
                f"libtpu {have} is installed, but jax {md.version('jax')} is built for "
                f"libtpu{spec}; compiling for a TPU target with a mismatched libtpu crashes "
                f"the process, so compile-only targets are off here. To turn them on, "
                f"install the matching build in a fresh runtime: pip install "
                f"'libtpu{spec}' (or pip install 'jax[tpu]=={md.version('jax')}')."
            )
    return None


def tpu_compiler_available() -> bool:
    """True when compile-only TPU targets can work here (see :func:`tpu_compiler_problem`)."""
    return tpu_compiler_problem() is None


def compile_only_available(name: str = "v5e:1x1") -> bool:
    """True when this runtime can compile for the compile-only topology ``name``: libtpu
    is installed and accepts it. Notebooks use it to decide whether to show TPU-compiled
    programs or a note; it never raises.
    """
    if not tpu_compiler_available():
        return False
    try:
        tpu_topology(name)
    except Exception:  # noqa: BLE001 - any failure means "not here"
        return False
    return True


def valid_topologies() -> list[str]:
    """Every verified compile-only target name, e.g. ``'v5e:2x2'``.

    >>> "v5e:2x4" in valid_topologies(), "v6e:2x2" in valid_topologies()
    (True, True)
    """
    return [f"{gen}:{shape}" for gen, shapes in VERIFIED_TOPOLOGIES.items() for shape in shapes]


_TOPOLOGY_RE = re.compile(r"^(?P<gen>[a-z0-9]+):(?P<shape>\d+(x\d+){1,2})$")
_TOPOLOGIES: dict[str, Any] = {}


def tpu_topology(name: str) -> Any:
    """The compile-only topology ``name`` (``'v5e:2x2'``, ``'v6e:2x4'``, ``'v5p:2x2x1'`` ...).

    Returns JAX's ``TopologyDescription``; its ``.devices`` are compile-only TPU devices
    to build a mesh from (see :func:`tpu_mesh`). Cached per name.

    Raises:
        ValueError: the name is not a known generation or shape (the message lists the
            verified ones).
        TpuCompilerMissing: libtpu is not installed (the message says how to get it).
    """
    if not isinstance(name, str):
        raise errors.CourseTypeError(f"topology {name!r}: expected a name such as 'v5e:2x2'; "
                                     f"valid: {', '.join(valid_topologies())}.")
    key = name.strip().lower()
    if key in _TOPOLOGIES:
        return _TOPOLOGIES[key]
    match = _TOPOLOGY_RE.match(key)
    listing = ", ".join(valid_topologies())
    if not match or match.group("gen") not in VERIFIED_TOPOLOGIES:
        raise errors.CourseValueError(
            f"unknown TPU topology {name!r}: expected 'generation:shape' with a generation "
            f"in {sorted(VERIFIED_TOPOLOGIES)}; verified targets are {listing}."
        )
    problem = tpu_compiler_problem()
    if problem:
        raise TpuCompilerMissing(f"compiling for {name!r} needs the TPU compiler: {problem}")
    import jax
    from jax.experimental import topologies

    with runtime.quiet_libtpu():  # the first backend start loads libtpu too
        backend = jax.default_backend()
    if backend != "tpu":
        # On a machine without a TPU, libtpu would otherwise take a per-machine lock
        # (/tmp/libtpu_lockfile) and refuse a second process; compile-only use needs no
        # lock. Not set on a real TPU, where the lock protects the chips.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        with runtime.quiet_libtpu():
            try:
                topo = topologies.get_topology_desc(key, "tpu")
            except Exception as err:
                # Older libtpu (jax 0.7) assumes 2x2x1 chips per host and rejects a
                # smaller slice unless told its per-host bounds.
                dims = [int(d) for d in match.group("shape").split("x")]
                if "chips_per_host_bounds" not in str(err) or math.prod(dims) >= 4:
                    raise
                topo = topologies.get_topology_desc(
                    key, "tpu", chips_per_host_bounds=tuple(dims + [1] * (3 - len(dims))))
    except Exception as err:  # JaxRuntimeError: INVALID_ARGUMENT from libtpu
        raise errors.CourseValueError(
            f"the TPU compiler rejected topology {name!r}: {str(err).splitlines()[0]}. "
            f"Verified targets: {listing}."
        ) from err
    _TOPOLOGIES[key] = topo
    return topo


def tpu_mesh(name: str, axis_shape: Sequence[int] | None = None,
             axis_names: Sequence[str] = ("data",)) -> Any:
    """A ``jax.sharding.Mesh`` over the compile-only devices of topology ``name``.

    ``axis_shape`` defaults to all devices on one axis. Build argument placeholders with
    ``jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))``.
    """
    import numpy as np
    from jax.sharding import Mesh

    devices = list(tpu_topology(name).devices)
    shape = tuple(axis_shape) if axis_shape is not None else (len(devices),)
    if math.prod(shape) != len(devices):
        raise errors.CourseValueError(
            f"mesh shape {shape} holds {math.prod(shape)} devices but {name!r} has "
            f"{len(devices)}; pick a shape whose product is {len(devices)}."
        )
    if len(axis_names) != len(shape):
        raise errors.CourseValueError(f"{len(shape)} mesh axes need {len(shape)} names, got {axis_names!r}")
    return Mesh(np.array(devices, dtype=object).reshape(shape), tuple(axis_names))


# --------------------------------------------------------------------------------------
# Normalising XLA's analyses
# --------------------------------------------------------------------------------------

def normalise_cost(raw: Any) -> dict[str, float]:
    """XLA's ``cost_analysis()`` as one flat ``{name: float}`` dict.

    Older JAX returns a list with one dict per program (summed here), newer JAX one dict,
    some backends ``None`` (an empty dict here). A negative count is XLA's "unknown"
    (the GPU backend gives -1 FLOPs for some library matmuls): it is left out, so
    callers see a missing value rather than a wrong one.

    >>> normalise_cost([{"flops": 2.0, "bytes accessed": 8.0}, {"flops": 1.0}])
    {'flops': 3.0, 'bytes accessed': 8.0}
    >>> normalise_cost(None), normalise_cost({"flops": -1.0, "bytes accessed": 8})
    ({}, {'bytes accessed': 8.0})
    """
    if raw is None:
        return {}
    parts = [raw] if isinstance(raw, Mapping) else list(raw)
    out: dict[str, float] = {}
    unknown: set[str] = set()
    for part in parts:
        for key, value in (part or {}).items():
            try:
                x = float(value)
            except (TypeError, ValueError):
                continue
            if x < 0:
                unknown.add(key)
            out[key] = out.get(key, 0.0) + x
    return {k: v for k, v in out.items() if k not in unknown}


_MEMORY_FIELDS = {
    "argument_bytes": "argument_size_in_bytes",
    "output_bytes": "output_size_in_bytes",
    "alias_bytes": "alias_size_in_bytes",
    "temp_bytes": "temp_size_in_bytes",
    "code_bytes": "generated_code_size_in_bytes",
}


def normalise_memory(raw: Any) -> dict[str, int | None]:
    """XLA's ``memory_analysis()`` as ``{argument_bytes, output_bytes, alias_bytes,
    temp_bytes, code_bytes}``; each ``None`` when the backend does not report it.

    >>> normalise_memory(None)["temp_bytes"] is None
    True
    """
    if isinstance(raw, (list, tuple)):
        raw = raw[0] if raw else None
    out: dict[str, int | None] = {}
    for ours, theirs in _MEMORY_FIELDS.items():
        value = getattr(raw, theirs, None) if raw is not None else None
        if value is None and isinstance(raw, Mapping):
            value = raw.get(theirs)
        out[ours] = int(value) if value is not None else None
    return out


# --------------------------------------------------------------------------------------
# Parsing HLO text
# --------------------------------------------------------------------------------------

#: Bytes per element of each HLO element type.
DTYPE_BYTES: Mapping[str, float] = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4,
    "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8,
    "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1,
    "f8e4m3b11fnuz": 1, "f8e3m4": 1, "f4e2m1fn": 0.5, "f8e8m0fnu": 1, "token": 0,
}

#: HLO element type -> numpy-style dtype name.
NUMPY_DTYPE: Mapping[str, str] = {
    "pred": "bool", "s4": "int4", "u4": "uint4", "s8": "int8", "u8": "uint8", "s16": "int16",
    "u16": "uint16", "s32": "int32", "u32": "uint32", "s64": "int64", "u64": "uint64",
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "c64": "complex64", "c128": "complex128", "f8e4m3fn": "float8_e4m3fn",
    "f8e5m2": "float8_e5m2",
}

COLLECTIVE_KINDS = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-broadcast",
)

_INSTR_RE = re.compile(
    r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<op>[a-z][\w\-]*)\((?P<rest>.*)$"
)
_ARRAY_RE = re.compile(r"\b(?P<dtype>pred|token|[a-z]+\d+[a-z0-9]*)\[(?P<dims>[\d,]*)\]")
_COMP_RE = re.compile(r"^\s*(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(\(.*\))?\s*(->.*)?\{\s*$")


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction line, parsed."""

    name: str
    opcode: str
    shape_text: str
    arrays: tuple[tuple[str, tuple[int, ...]], ...]  # (hlo dtype, dims) per array leaf
    operands: tuple[str, ...]
    attributes: str
    computation: str
    line: str

    @property
    def bytes(self) -> int:
        """Logical size of the result (sum over tuple leaves), in bytes."""
        return int(sum(DTYPE_BYTES.get(dt, 0) * math.prod(dims) for dt, dims in self.arrays))


def _split_operands(rest: str) -> tuple[str, str]:
    """Split ``a, b), attr=...`` at the parenthesis that closes the operand list."""
    depth = 1
    for i, ch in enumerate(rest):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth == 0:
                return rest[:i], rest[i + 1:]
    return rest, ""


def _arrays(shape_text: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(
        (m.group("dtype"), tuple(int(d) for d in m.group("dims").split(",") if d))
        for m in _ARRAY_RE.finditer(re.sub(r"\{[^{}]*\}", "", shape_text))
    )


@dataclasses.dataclass(frozen=True)
class HloModule:
    """An HLO module's text split into computations of parsed instructions."""

    computations: Mapping[str, tuple[Instruction, ...]]
    entry: str
    fused: frozenset[str]  # computations called by fusion instructions
    appliers: frozenset[str]  # reducers (to_apply=) and other small helpers

    @property
    def instructions(self) -> list[Instruction]:
        return [i for comp in self.computations.values() for i in comp]

    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}


def parse_module(text: str) -> HloModule:
    """Parse optimised HLO text (``compiled.as_text()``) into computations."""
    comps: dict[str, list[Instruction]] = {}
    current, entry = None, ""
    for line in text.splitlines():
        if current is None:
            m = _COMP_RE.match(line)
            if m and not line.lstrip().startswith("HloModule"):
                current = m.group("name")
                comps[current] = []
                if m.group("entry"):
                    entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR_RE.match(line)
        if not m:
            continue
        operand_text, attrs = _split_operands(m.group("rest"))
        comps[current].append(Instruction(
            name=m.group("name"), opcode=m.group("op"), shape_text=m.group("shape"),
            arrays=_arrays(m.group("shape")),
            operands=tuple(re.findall(r"%([\w.\-]+)", operand_text)),
            attributes=attrs, computation=current, line=line.strip(),
        ))
    fused, appliers = set(), set()
    for ins in (i for c in comps.values() for i in c):
        for target in re.findall(r"\bcalls=%?([\w.\-]+)", ins.attributes):
            (fused if ins.opcode == "fusion" else appliers).add(target)
        appliers.update(re.findall(r"\bto_apply=%?([\w.\-]+)", ins.attributes))
    return HloModule({k: tuple(v) for k, v in comps.items()}, entry, frozenset(fused),
                     frozenset(appliers - fused))


def parse_replica_groups(attrs: str) -> tuple[tuple[int, ...], ...] | None:
    """The device groups of a collective, from any of XLA's three spellings.

    * explicit: ``replica_groups={{0,1},{2,3}}``;
    * iota: ``replica_groups=[4,2]<=[2,4]T(1,0)`` (reshape ``iota(8)`` to ``[2,4]``,
      transpose, read off 4 groups of 2);
    * mesh axes: ``replica_groups=mesh['a'=2,'b'=4] {'a'}`` (groups along axis ``a``).

    Returns ``None`` when there is no ``replica_groups`` attribute or it cannot be read.

    >>> parse_replica_groups("replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add")
    ((0, 4), (1, 5), (2, 6), (3, 7))
    >>> parse_replica_groups("replica_groups=mesh['a'=2,'b'=2] {'a'}, x=1")
    ((0, 2), (1, 3))
    >>> parse_replica_groups("replica_groups={{0,1},{2,3}}")
    ((0, 1), (2, 3))
    """
    import numpy as np

    m = re.search(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}", attrs)
    if m:
        return tuple(tuple(int(x) for x in g.split(",") if x.strip())
                     for g in re.findall(r"\{([\d,\s]*)\}", m.group(1)))
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
    if m:
        out_shape = [int(x) for x in m.group(1).split(",")]
        dims = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        ids = ids.reshape(out_shape)
        return tuple(tuple(int(x) for x in row) for row in ids.reshape(out_shape[0], -1))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if m:
        axes = [(a, int(n)) for a, n in re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))]
        chosen = re.findall(r"'([^']+)'", m.group(2))
        names = [a for a, _ in axes]
        if not axes or any(c not in names for c in chosen):
            return None
        ids = np.arange(math.prod(n for _, n in axes)).reshape([n for _, n in axes])
        keep = [names.index(c) for c in chosen]
        rest = [i for i in range(len(names)) if i not in keep]
        ids = ids.transpose(rest + keep).reshape(-1, math.prod(axes[i][1] for i in keep))
        return tuple(tuple(int(x) for x in row) for row in ids)
    return None


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective operand: what a device sends into a cross-device operation.

    A combined collective (XLA merges several all-reduces into one instruction with a
    tuple of operands) gives one item per operand, all with the same ``name``.
    """

    kind: str  # 'all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute', ...
    shape: tuple[int, ...]  # operand shape on one device
    dtype: str  # numpy-style name: 'float32', 'bfloat16', ...
    bytes: int  # operand bytes per device: prod(shape) * itemsize
    replica_groups: tuple[tuple[int, ...], ...] | None  # device ids that communicate together
    result_shape: tuple[int, ...]
    name: str  # the HLO instruction
    source_target_pairs: tuple[tuple[int, int], ...] = ()  # collective-permute only
    is_async: bool = False  # came from an ``-start`` / ``-done`` pair
    fused_in: str | None = None  # the fusion computation holding it, if any

    @property
    def group_size(self) -> int:
        """Devices per replica group (1 when unknown)."""
        if self.replica_groups:
            return len(self.replica_groups[0])
        return 1

    def __str__(self) -> str:
        groups = "" if self.replica_groups is None else f", groups of {self.group_size}"
        return (f"{self.kind} {self.dtype}{list(self.shape)} ({self.bytes:,} B per device"
                f"{groups})")


def _collective_kind(opcode: str) -> tuple[str | None, bool]:
    for kind in COLLECTIVE_KINDS:
        if opcode == kind:
            return kind, False
        if opcode == kind + "-start":
            return kind, True
    return None, False


def parse_collectives(text: str) -> list[Collective]:
    """Every collective in optimised HLO text, one item per operand (see :class:`Collective`)."""
    module = parse_module(text)
    table = module.by_name()
    roots = {name: next((i for i in comp if i.line.startswith("ROOT")), None)
             for name, comp in module.computations.items()}
    # The TPU compiler splits one asynchronous collective into an "async collective
    # fusion": a start fusion, the body (async_collective_fusion.N) and a done fusion,
    # each holding a copy of the same collective. Count it once, in the body.
    async_parts = {target for ins in module.instructions
                   if ins.opcode == "fusion" and ins.name.startswith(("async-collective-start",
                                                                      "async-collective-done"))
                   for target in re.findall(r"\bcalls=%?([\w.\-]+)", ins.attributes)}
    out: list[Collective] = []
    for ins in module.instructions:
        kind, is_async = _collective_kind(ins.opcode)
        if kind is None or ins.computation in async_parts:
            continue
        fused_in = ins.computation if ins.computation in module.fused else None
        root = roots.get(ins.computation) if fused_in else None
        scatter_result = None
        if (kind == "all-reduce" and root is not None and root.opcode == "dynamic-slice"
                and ins.name in root.operands and len(root.arrays) == 1):
            # the TPU compiler writes a reduce-scatter as an all-reduce whose result is
            # sliced in the same fusion ("all-reduce-scatter"): report what it does
            kind, scatter_result = "reduce-scatter", root.arrays[0][1]
        groups = parse_replica_groups(ins.attributes)
        pairs = tuple(
            (int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}",
                                                     _attr(ins.attributes, "source_target_pairs"))
        )
        results = ins.arrays
        if is_async and kind in ("all-gather", "collective-permute") and len(results) == 2 * len(ins.operands):
            results = results[len(ins.operands):]  # (operands..., results...) tuple
        for k, operand in enumerate(ins.operands):
            src = table.get(operand)
            if src is not None and len(src.arrays) == 1:
                dtype, dims = src.arrays[0]
            elif k < len(results):  # operand not found: infer from the result
                dtype, dims = results[k]
                dims = _operand_dims(kind, dims, ins.attributes, groups)
            else:
                continue
            result_dims = results[k][1] if k < len(results) else dims
            if scatter_result is not None:
                result_dims = scatter_result
            out.append(Collective(
                kind=kind, shape=tuple(dims), dtype=NUMPY_DTYPE.get(dtype, dtype),
                bytes=int(DTYPE_BYTES.get(dtype, 0) * math.prod(dims)),
                replica_groups=groups, result_shape=tuple(result_dims), name=ins.name,
                source_target_pairs=pairs, is_async=is_async, fused_in=fused_in,
            ))
    return out


def _attr(attrs: str, key: str) -> str:
    m = re.search(key + r"=(\{(?:[^{}]|\{[^{}]*\})*\})", attrs)
    return m.group(1) if m else ""


def _operand_dims(kind: str, dims: tuple[int, ...], attrs: str,
                  groups: tuple[tuple[int, ...], ...] | None) -> tuple[int, ...]:
    m = re.search(r"dimensions=\{(\d+)\}", attrs)
    if not m or not groups or kind not in ("all-gather", "reduce-scatter"):
        return dims
    d, n = int(m.group(1)), len(groups[0])
    out = list(dims)
    out[d] = dims[d] // n if kind == "all-gather" else dims[d] * n
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Fusion:
    """One fusion instruction: the ops XLA merged into a single kernel."""

    name: str
    kind: str  # 'kLoop', 'kInput', 'kOutput', 'kCustom'
    ops: Mapping[str, int]  # opcode -> count inside the fused computation (no parameters)
    shape: str  # the fusion's result shape text

    def __str__(self) -> str:
        inside = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in self.ops.items())
        return f"{self.name} ({self.kind}): {inside}"


def parse_fusions(module: HloModule) -> list[Fusion]:
    """The fusions of the non-fused computations, with the ops each one contains."""
    out = []
    for comp_name, comp in module.computations.items():
        if comp_name in module.fused or comp_name in module.appliers:
            continue
        for ins in comp:
            if ins.opcode != "fusion":
                continue
            called = re.search(r"\bcalls=%?([\w.\-]+)", ins.attributes)
            kind = re.search(r"\bkind=(\w+)", ins.attributes)
            body = module.computations.get(called.group(1), ()) if called else ()
            ops = collections.Counter(i.opcode for i in body if i.opcode != "parameter")
            out.append(Fusion(ins.name, kind.group(1) if kind else "?",
                              dict(sorted(ops.items())), re.sub(r"\{[^{}]*\}", "", ins.shape_text)))
    return out


def clean_line(line: str, numbers: bool = True) -> str:
    """An HLO line without what varies between runs and versions: metadata, backend
    config, frontend attributes and (with ``numbers``) the ``.N`` numbers on names.

    >>> clean_line('%fusion.3 = f32[8]{0} fusion(%p.1), kind=kLoop, calls=%fc.2, '
    ...            'metadata={op_name="x"}')
    '%fusion = f32[8]{0} fusion(%p), kind=kLoop, calls=%fc'
    """
    for key in ("metadata", "backend_config", "frontend_attributes", "statistics",
                "origin", "schedule_name"):
        line = re.sub(r",\s*" + key + r"=(\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\}|\"[^\"]*\")",
                      "", line)
    if numbers:
        line = re.sub(r"(%[A-Za-z_][\w\-]*?)(\.\d+)+\b", r"\1", line)
    return line.strip()


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
    target: str  # 'cpu', 'gpu', 'tpu' or a topology such as 'v5e:2x2'
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

    @property
    def compute_ops(self) -> dict[str, int]:
        """``op_counts`` without bookkeeping ops (parameters, tuples, constants, bitcasts)."""
        return {k: v for k, v in self.op_counts.items() if k not in _BOOKKEEPING}

    def lines(self, *opcodes: str, clean: bool = True) -> list[str]:
        """The optimised-HLO lines whose opcode is one of ``opcodes`` (all lines of the
        top-level computations when none is given), cleaned by :func:`clean_line`."""
        module = parse_module(self.hlo)
        out = []
        for comp_name, comp in module.computations.items():
            if comp_name in module.fused or comp_name in module.appliers:
                continue
            for ins in comp:
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
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows())

    def __repr__(self) -> str:
        return f"HloReport(\n{self.summary()}\n)"

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
                       for k, v in self.rows())
        return f"<table>{body}</table>"

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
                if _COMP_RE.match(line) and not line.startswith("HloModule"):
                    inside = True
                    out.append((False, line))
                continue
            if line.strip() == "}":
                inside = False
                out += [(False, line), (False, "")]
                continue
            m = _INSTR_RE.match(line)
            hot = bool(m) and any(m.group("op") in (h, h + "-start") for h in self.highlight)
            out.append((hot, "  " + clean_line(line, numbers=False) if self.clean and m else line))
        return out

    def __str__(self) -> str:
        return "\n".join((">> " if hot else "   ") + line for hot, line in self._marked())

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
        width = max(len(r[0]) for r in self.rows)
        head = f"{'':<{width}}  {self.names[0]:>16}  {self.names[1]:>16}"
        return "\n".join([head] + [f"{a:<{width}}  {b:>16}  {c:>16}" for a, b, c in self.rows])

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        head = f"<tr><th></th><th>{html.escape(self.names[0])}</th><th>{html.escape(self.names[1])}</th></tr>"
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(a)}</th><td>{html.escape(b)}</td>"
                       f"<td>{html.escape(c)}</td></tr>" for a, b, c in self.rows)
        return f"<table>{head}{body}</table>"


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


def _topology_name(device: Any) -> str | None:
    """The compile-only topology (from :func:`tpu_topology`) a device belongs to."""
    for name, topo in _TOPOLOGIES.items():
        if any(device is d or device == d for d in topo.devices):
            return name
    return None


def _arg_devices(args: Any) -> list[Any]:
    import jax

    for x in jax.tree_util.tree_leaves(args):
        sharding = getattr(x, "sharding", None)
        if sharding is not None:
            return sorted(sharding.device_set, key=lambda d: d.id)
    return []


def inspect(fn: Callable, *args: Any, target: str | None = None, **kwargs: Any) -> HloReport:
    """Trace, lower and compile ``fn(*args, **kwargs)`` and report what XLA produced.

    ``args`` may be arrays or ``jax.ShapeDtypeStruct`` placeholders (nothing runs).
    ``fn`` may already be jitted (its static arguments are respected). ``target``:

    * ``None``: the local default backend, or the devices the arguments' shardings name
      (for example a mesh built with :func:`tpu_mesh`);
    * ``"v5e:2x2"``, ``"v6e:1x1"`` ...: a compile-only TPU topology; unsharded arguments
      are placed on its first device (see :data:`VERIFIED_TOPOLOGIES`).

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
        topo = tpu_topology(target) if isinstance(target, str) else target
        if isinstance(topo, (bool, int, float)) or not isinstance(
                getattr(topo, "devices", None), (list, tuple)):
            raise errors.CourseTypeError(
                f"target={target!r}: expected None (this machine's default backend), a "
                "compile-only TPU topology name such as 'v5e:2x2' (valid: "
                f"{', '.join(valid_topologies())}), or a topology from tpu_topology().")
        devices = list(topo.devices)
        args, kwargs = _place_on((args, kwargs), devices[0], set(devices))
        devices = _arg_devices((args, kwargs)) or devices[:1]
    else:
        devices = _arg_devices((args, kwargs)) or [jax.devices()[0]]
    target_name = _topology_name(devices[0]) or devices[0].platform
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
    op_counts = collections.Counter(
        ins.opcode for comp_name, comp in module.computations.items()
        if comp_name not in module.fused and comp_name not in module.appliers for ins in comp)
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
