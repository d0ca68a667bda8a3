"""Read optimised HLO text and XLA's analyses: the parser behind :mod:`tpu_course.hlo`.

* :func:`parse_module`: HLO text split into computations of parsed instructions; its
  :meth:`HloModule.top_level` is the one definition of "the program's own instructions"
  (not those inside fusions, not reducers).
* :func:`parse_collectives`: every collective, one :class:`Collective` per operand, named
  by what it does: the TPU compiler's "all-reduce-scatter" fusion (an all-reduce whose
  result is sliced to this device's shard in the same fusion) is a ``reduce-scatter``.
* :func:`parse_fusions`, :func:`parse_replica_groups`, :func:`clean_line`.
* :func:`normalise_cost` / :func:`normalise_memory`: XLA's analyses change shape between
  versions (a dict, a list of dicts, ``None``); these are the one place that copes.

``bytes`` of a collective is the size of its **operand on one device**, from the logical
shape (dims x dtype size), not counting TPU tile padding: an all-reduce of a
``f32[512,256]`` gradient moves 512 * 256 * 4 = 524288 bytes in and out of each device.

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
import math
import re
import textwrap
from typing import Any, Iterator, Mapping

from tpu_course import comms


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

#: Every collective opcode XLA writes (each also as ``<kind>-start``): the rows of the one
#: table of collectives, ``tpu_course.comms.COLLECTIVES``.
COLLECTIVE_KINDS = tuple(comms.COLLECTIVES)

INSTRUCTION_RE = re.compile(
    r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<op>[a-z][\w\-]*)\((?P<rest>.*)$"
)
_ARRAY_RE = re.compile(r"\b(?P<dtype>pred|token|[a-z]+\d+[a-z0-9]*)\[(?P<dims>[\d,]*)\]")
COMPUTATION_RE = re.compile(r"^\s*(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(\(.*\))?\s*(->.*)?\{\s*$")


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

    def top_level(self) -> Iterator[Instruction]:
        """The instructions of the program's own computations: not those inside a
        fusion, not reducers and other ``to_apply`` helpers."""
        for name, comp in self.computations.items():
            if name not in self.fused and name not in self.appliers:
                yield from comp

    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}


def parse_module(text: str) -> HloModule:
    """Parse optimised HLO text (``compiled.as_text()``) into computations."""
    comps: dict[str, list[Instruction]] = {}
    current, entry = None, ""
    for line in text.splitlines():
        if current is None:
            m = COMPUTATION_RE.match(line)
            if m and not line.lstrip().startswith("HloModule"):
                current = m.group("name")
                comps[current] = []
                if m.group("entry"):
                    entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        m = INSTRUCTION_RE.match(line)
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
    # The TPU compiler splits one asynchronous collective into an "async collective
    # fusion": a start fusion, the body (async_collective_fusion.N) and a done fusion,
    # each holding a copy of the same collective. Count it once, in the body.
    async_parts = {target for ins in module.instructions
                   if ins.opcode == "fusion" and ins.name.startswith(("async-collective-start",
                                                                      "async-collective-done"))
                   for target in re.findall(r"\bcalls=%?([\w.\-]+)", ins.attributes)}
    # It also lets one gather progress across several compute fusions (each an
    # async_collective_fusion.N holding a matmul and a copy of the gather), every copy
    # with the collective's channel_id: inside fusions, count each channel once.
    # (Outside fusions a channel_id may repeat: the CPU backend gives the unrolled
    # steps of a ring, distinct collectives, one channel.)
    fused_channels: set[tuple[str, str]] = set()
    out: list[Collective] = []
    for ins in module.instructions:
        kind, is_async = _collective_kind(ins.opcode)
        if kind is None or ins.computation in async_parts:
            continue
        channel = re.search(r"\bchannel_id=(\d+)", ins.attributes)
        if channel and ins.computation in module.fused:
            if (kind, channel.group(1)) in fused_channels:
                continue
            fused_channels.add((kind, channel.group(1)))
        fused_in = ins.computation if ins.computation in module.fused else None
        slices = _scatter_slices(module, ins) if kind == "all-reduce" and fused_in else None
        if slices is not None:
            # the TPU compiler writes a reduce-scatter as an all-reduce whose result is
            # sliced in the same fusion ("all-reduce-scatter"): report what it does
            kind = "reduce-scatter"
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
            if slices is not None and k in slices:
                result_dims = slices[k]
            out.append(Collective(
                kind=kind, shape=tuple(dims), dtype=NUMPY_DTYPE.get(dtype, dtype),
                bytes=int(DTYPE_BYTES.get(dtype, 0) * math.prod(dims)),
                replica_groups=groups, result_shape=tuple(result_dims), name=ins.name,
                source_target_pairs=pairs, is_async=is_async, fused_in=fused_in,
            ))
    return out


def _scatter_slices(module: HloModule, ins: Instruction) -> dict[int, tuple[int, ...]] | None:
    """For an all-reduce inside a fusion: ``{operand index: sliced shape}`` when its
    results are cut to a shard by ``dynamic-slice`` in the same fusion (the TPU
    compiler's "all-reduce-scatter"), else ``None``. A combined all-reduce hands out its
    results through ``get-tuple-element``; each one sliced counts."""
    comp = module.computations[ins.computation]
    index = {ins.name: 0}
    for i in comp:
        m = re.search(r"\bindex=(\d+)", i.attributes)
        if i.opcode == "get-tuple-element" and i.operands[:1] == (ins.name,) and m:
            index[i.name] = int(m.group(1))
    out = {index[i.operands[0]]: i.arrays[0][1] for i in comp
           if i.opcode == "dynamic-slice" and i.operands and i.operands[0] in index
           and len(i.arrays) == 1}
    return out or None


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
    """The fusions of the top-level computations, with the ops each one contains."""
    out = []
    for ins in module.top_level():
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


def wrap_lines(text: str, width: int = 88, indent: int = 6) -> str:
    """``text`` (HLO, StableHLO, a jaxpr) with each line wider than ``width`` continued
    on lines indented ``indent`` more than its own, so it fits a notebook's code column
    (88 characters: CONTRIBUTING). Short lines are left as they are.

    >>> line = "  %d = f32[8]{0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    >>> print(wrap_lines(line, 40))
      %d = f32[8]{0} dot(%a, %b),
            lhs_contracting_dims={1},
            rhs_contracting_dims={0}
    """
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        lead = " " * (len(line) - len(line.lstrip()) + indent)
        out += textwrap.wrap(line, width, subsequent_indent=lead, break_on_hyphens=False,
                             drop_whitespace=True)
    return "\n".join(out)
