"""Read a ``jax.profiler`` trace without TensorBoard or xprof: where did the step's time go?

``with jax.profiler.trace(directory): ...`` writes, under
``directory/plugins/profile/<run>/``, a ``<host>.xplane.pb`` and a
``<host>.trace.json.gz``: the Chrome trace-event format (gzip + JSON; Google's "Trace
Event Format" document), one ``"ph": "X"`` event per timed region with its process,
thread, start ``ts`` and ``dur`` in microseconds. :func:`read` loads the newest such file
(falling back to ``jax.profiler.ProfileData`` on the ``.xplane.pb`` where no JSON was
written) and returns a :class:`Profile`: every event with its *self* time (its duration
minus the events nested inside it on the same thread) and a category:

* ``collectives``: names of the collectives in :data:`tpu_course.comms.COLLECTIVES`
  (``all-reduce``, ``AllReduce``, ``all_reduce`` alike) and their rendezvous;
* ``compute``: the other work on a device, XLA's ops on any thread (fusions, dots,
  copies: jax 0.7.2's CPU client runs them on its own client threads at times), and
  what runs on XLA's executor threads;
* ``host``: the Python thread and the runtime's client threads (dispatch, argument
  handling, buffer bookkeeping);
* ``other``: waits, thread-pool bookkeeping, launch spans that wrap device work, and
  anything on a thread none of these patterns names.

The rules are patterns on the names (see :func:`classify`), never a list copied from one
jax version: op names differ between versions and backends. Threads run concurrently,
so the categories add up to thread time, which can exceed the wall time.

>>> classify("all-reduce.3", "tf_XLAExecute/12", "/host:CPU")
'collectives'
>>> classify("fusion.12", "XLA Ops", "/device:TPU:0")
'compute'
>>> classify("$profiler.py:471 trace", "python", "/host:CPU")
'host'
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import pathlib
import re
import zlib
from collections import defaultdict
from typing import Any

from tpu_course import comms, errors, tables

CATEGORIES = ("compute", "collectives", "host", "other")


def _collective_pattern() -> re.Pattern:
    # 'all-reduce' -> all[-_ ]?reduce, which also matches 'AllReduce' and 'all_reduce'
    words = [re.split(r"[-_]", kind) for kind in comms.COLLECTIVES]
    names = [r"[-_ ]?".join(map(re.escape, w)) for w in words]
    return re.compile("|".join(names + ["rendezvous", r"\bpsum\b"]), re.IGNORECASE)


_COLLECTIVE = _collective_pattern()
_WAIT = re.compile(r"wait|await|listener|sleep|idle|barrier|\bsync\b|\bselect\b|\bpoll",
                   re.IGNORECASE)
_LAUNCH = re.compile(r"execut(e|able)|launch", re.IGNORECASE)
_HOST_THREAD = re.compile(r"python|main|pjrt|client|host", re.IGNORECASE)
_DEVICE = re.compile(r"/device:|tpu|gpu", re.IGNORECASE)
_EXECUTOR = re.compile(r"xla|eigen|ops|stream|compute|device", re.IGNORECASE)
# an HLO instruction's name ("dot_general.1", "fusion.12", "reduce-window"): lower case,
# where the runtime's own regions are CamelCase ("ParseArguments", "PjitFunction(f)")
_HLO_OP = re.compile(r"[a-z][a-z0-9_\-]*(\.[0-9]+)*")


def classify(name: str, thread: str, process: str) -> str:
    """The category of one event from its name, its thread's and its process's names."""
    if _COLLECTIVE.search(name):
        return "collectives"
    if _WAIT.search(name):
        return "other"
    if _DEVICE.search(process) or _HLO_OP.fullmatch(name):
        return "compute"  # on a device, or an op run by whichever thread the runtime chose
    if name.startswith("$") or _HOST_THREAD.search(thread):
        return "other" if _LAUNCH.search(name) else "host"
    return "compute" if _EXECUTOR.search(thread) else "other"


@dataclasses.dataclass(frozen=True)
class Event:
    """One timed region of the trace (microseconds from the trace's start)."""

    name: str
    thread: str
    process: str
    start_us: float
    duration_us: float
    self_us: float  # duration minus the events nested inside it on the same thread
    category: str
    op: str = ""  # the HLO instruction it ran ("ynn_fusion.79"), where the trace says so


def op_name(name: str) -> str:
    """An event name without its instance number: ``'fusion.12'`` -> ``'fusion'``.

    >>> op_name("dot.1"), op_name("all-reduce-start.3"), op_name("Rendezvous")
    ('dot', 'all-reduce-start', 'Rendezvous')
    """
    return re.sub(r"(\.\d+)+$", "", name)


@dataclasses.dataclass(frozen=True)
class Profile:
    """The events of one trace, and summaries of them per step."""

    events: tuple[Event, ...]
    path: str
    steps: int = 1  # how many steps the trace covers: the summaries divide by it

    def __post_init__(self) -> None:
        errors.check_int("steps", self.steps, low=1, where="Profile")

    def time_by_category(self) -> dict[str, float]:
        """Seconds of self time per step, per category (all of :data:`CATEGORIES`)."""
        totals = dict.fromkeys(CATEGORIES, 0.0)
        for event in self.events:
            totals[event.category] += event.self_us / 1e6 / self.steps
        return totals

    def top_ops(self, n: int = 10, category: str | None = None) -> list[tuple[str, str, int, float]]:
        """(op, category, count per step, self milliseconds per step), largest first."""
        n = errors.check_int("n", n, low=1)
        if category is not None:
            errors.check_choice("category", category, CATEGORIES)
        groups: dict[tuple[str, str], list[float]] = defaultdict(list)
        for event in self.events:
            if category in (None, event.category):
                groups[(op_name(event.name), event.category)].append(event.self_us)
        rows = [(name, cat, round(len(times) / self.steps), sum(times) / 1e3 / self.steps)
                for (name, cat), times in groups.items()]
        return sorted(rows, key=lambda row: -row[3])[:n]

    def category_table(self) -> str:
        times = self.time_by_category()
        total = sum(times.values()) or 1.0
        return tables.text([(c, f"{t * 1e3:,.2f}", f"{t / total:.0%}") for c, t in times.items()],
                           ("category", "ms per step", "share"))

    def ops_table(self, n: int = 10) -> str:
        rows = [(name[:40], cat, count, f"{ms:,.3f}") for name, cat, count, ms
                in self.top_ops(n)]
        return tables.text(rows, ("op", "category", "count", "ms per step"))

    def by_kind(self, kinds: dict[str, str] | None = None, *,
                collective_bytes: float | None = None) -> "KindSummary":
        """A step's device work by kind of operation (:data:`KINDS`), per step.

        Device work is every event that ran an HLO instruction (named for one, or with
        the trace's ``hlo_op``), and every host transfer; the runtime's wrappers
        (``ThunkExecutor::Execute``, launch spans), the waits and the profiler's own
        start-up and stop (the Python frames of ``jax.profiler.trace``) are left out.
        Each kind's time is the **union over all threads** of its events' intervals
        (the wall time during which at least one device was doing it), divided by
        ``steps``: never a sum over threads, so no row exceeds the step. Kinds overlap
        in time (one device multiplies while another waits in a collective), so the
        rows need not add up to the window.

        ``kinds`` (from :func:`op_kinds` on the compiled step's HLO) names each
        instruction's kind from the call stack XLA kept; without it, or for an
        instruction it does not name, the kind comes from the name alone (``dot``,
        ``convolution``; ``adam`` or ``optax`` for the optimizer), and attention's own
        work (scores' scaling, mask, softmax) cannot be told apart: it counts as
        ``other``. ``collective_bytes``: a predicted number of bytes per device per
        step, printed beside the collectives' measured time.
        """
        if kinds is not None and not isinstance(kinds, dict):
            raise errors.CourseTypeError(
                f"kinds={kinds!r:.60}: expected a dict of HLO instruction -> kind, as "
                f"profiling.op_kinds(compiled.as_text()) returns; got {type(kinds).__name__}")
        if collective_bytes is not None:
            collective_bytes = errors.check_number("collective_bytes", collective_bytes, low=0)
        spans: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
        for event in self.events:
            kind = _kind_of(event, kinds or {})
            if kind is not None:
                spans[kind].append((event.start_us, event.start_us + event.duration_us))
        every = [s for k in KINDS for s in spans[k]]
        window = (max(e for _, e in every) - min(s for s, _ in every)) if every else 0.0
        rows = tuple((k, _union_us(spans[k]) / 1e3 / self.steps, len(spans[k]) / self.steps)
                     for k in KINDS)
        attributed = kinds is not None and any(v == "attention" for v in kinds.values())
        return KindSummary(rows, window / 1e3 / self.steps, self.steps, collective_bytes,
                           attributed)

    def _repr_html_(self) -> str:
        times = self.time_by_category()
        return tables.html([(c, f"{t * 1e3:,.2f}") for c, t in times.items()],
                           ("category", "ms per step"), labels=True)

    def __str__(self) -> str:
        return (f"{len(self.events):,} events, {self.steps} step(s), from "
                f"{pathlib.Path(self.path).name}\n{self.category_table()}")

    def plot(self, ax: Any = None, max_threads: int = 12) -> Any:
        """A timeline: one row per thread (the busiest ``max_threads``), bars coloured by
        category. Returns the Matplotlib axes."""
        import matplotlib.pyplot as plt

        max_threads = errors.check_int("max_threads", max_threads, low=1)
        busy: dict[str, float] = defaultdict(float)
        for event in self.events:
            busy[event.thread] += event.duration_us
        threads = sorted(busy, key=lambda t: -busy[t])[:max_threads]
        if ax is None:
            _, ax = plt.subplots(figsize=(9, 0.35 * len(threads) + 1.2))
        colours = dict(zip(CATEGORIES, ("tab:blue", "tab:red", "tab:green", "lightgrey")))
        start = min((e.start_us for e in self.events), default=0.0)
        for row, thread in enumerate(threads):
            for category in CATEGORIES:
                bars = [((e.start_us - start) / 1e3, e.duration_us / 1e3) for e in self.events
                        if e.thread == thread and e.category == category]
                if bars:
                    ax.broken_barh(bars, (row - 0.4, 0.8), color=colours[category],
                                   label=category if row == 0 or category not in
                                   ax.get_legend_handles_labels()[1] else None)
        ax.set_yticks(range(len(threads)), [t[:24] for t in threads])
        ax.invert_yaxis()
        ax.set_xlabel("milliseconds from the trace's start")
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), loc="upper right", fontsize="small")
        return ax


#: The kinds of device work :meth:`Profile.by_kind` reports, in its order.
KINDS = ("matmul", "attention", "collectives", "optimizer", "host transfer", "other")
_TRANSFER = re.compile(r"transfer|to[-_ ]?host|from[-_ ]?host|host[-_ ]?to[-_ ]?device|"
                       r"device[-_ ]?to[-_ ]?host|\bh2d\b|\bd2h\b|infeed|outfeed|"
                       r"BufferFromPyval", re.IGNORECASE)
_MATMUL = re.compile(r"^(dot|convolution|conv|einsum|matmul|gemm|cublas)|"
                     r"[-_.](dot|convolution|matmul|gemm)([-_.]|$)", re.IGNORECASE)
_OPTIMIZER = re.compile(r"adam|optax", re.IGNORECASE)


def _kind_of(event: Event, kinds: dict[str, str]) -> str | None:
    """The kind of device work of one event, or None where it is no device work."""
    if _TRANSFER.search(event.name):
        return "host transfer"
    if event.category == "collectives":
        return "collectives"
    op = event.op or event.name
    if not (event.op or (event.category == "compute" and _HLO_OP.fullmatch(event.name))):
        return None  # a wrapper, a wait, the runtime or the profiler itself
    if op in kinds:
        return kinds[op]
    if _MATMUL.search(op_name(op)):
        return "matmul"
    return "optimizer" if _OPTIMIZER.search(op) else "other"


def _union_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals."""
    total, end = 0.0, -math.inf
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


@dataclasses.dataclass(frozen=True)
class KindSummary:
    """:meth:`Profile.by_kind`'s answer: per kind, milliseconds per step (union over
    threads) and events per step; ``window_ms``: first to last device event, per step."""

    rows: tuple[tuple[str, float, float], ...]  # (kind, ms per step, events per step)
    window_ms: float
    steps: int
    collective_bytes: float | None = None  # predicted bytes per device per step
    attention_attributed: bool = False  # whether op_kinds told attention's ops apart

    def ms(self, kind: str) -> float:
        """Milliseconds per step of one kind."""
        errors.check_choice("kind", kind, KINDS)
        return dict((k, t) for k, t, _ in self.rows)[kind]

    def __str__(self) -> str:
        table = []
        for kind, ms, count in self.rows:
            share = f"{ms / self.window_ms:.0%}" if self.window_ms else "-"
            table.append((kind, f"{ms:,.3f}", f"{count:,.0f}", share))
        lines = [tables.text(table, ("kind", "ms per step", "events per step",
                                     "of the window"), right=True)]
        lines.append(f"window: {self.window_ms:,.3f} ms per step, first to last device "
                     f"event; {self.steps} step(s) traced")
        lines.append("per step: the union over all threads of each kind's intervals,\n"
                     "divided by the steps (not a sum over threads); left out: the\n"
                     "profiler's start-up and stop, waits, and the runtime's wrappers")
        if not self.attention_attributed:
            lines.append("attention: its softmax and mask could not be told apart from\n"
                         "other work (no call stacks in this HLO): counted in other; its\n"
                         "matmuls are in matmul")
        if self.collective_bytes is not None:
            ms = self.ms("collectives")
            lines.append(f"collectives: {self.collective_bytes / 1e3:,.0f} kB per device "
                         f"predicted from the shardings,\n{ms:,.3f} ms measured per step")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return "<pre>" + __import__("html").escape(str(self)) + "</pre>"


#: call-stack functions whose non-matmul work :func:`op_kinds` calls attention
ATTENTION_FUNCTIONS = re.compile(r"(^|\.)\w*Attention\w*\.__call__$|attention",
                                 re.IGNORECASE)


def op_kinds(hlo_text: str) -> dict[str, str]:
    r"""Each HLO instruction's kind of work, from a compiled program's text
    (``jax.jit(f).lower(...).compile().as_text()``), read from its metadata.

    ``matmul``: a ``dot_general`` or convolution (whatever fusion holds it);
    ``attention``: other work whose call stack passes through a function that
    :data:`ATTENTION_FUNCTIONS` matches (``Attention.__call__``: the scores' scaling, the
    mask, the softmax); ``optimizer``: work whose call stack (or source file) is in
    optax outside its losses (clipping, Adam's moments, the update); the rest is left
    out (and counted as ``other`` by :meth:`Profile.by_kind`). Call stacks are in the
    HLO text of recent jax (``StackFrames``); older versions keep only the innermost
    source file, so attention is not told apart there.

    >>> text = ('FileNames\n1 "/x/optax/_src/transform.py"\n\nFunctionNames\n'
    ...         '1 "scale_by_adam"\n\nFileLocations\n1 {file_name_id=1 '
    ...         'function_name_id=1 line=3}\n\nStackFrames\n1 {file_location_id=1 '
    ...         'parent_frame_id=0}\n\n%fusion.2 = f32[4]{0} fusion(...), '
    ...         'metadata={op_name="jit(step)/mul" stack_frame_id=1}\n'
    ...         '%dot.1 = f32[4]{0} dot(...), metadata={op_name="jit(step)/dot_general"}')
    >>> op_kinds(text)
    {'fusion.2': 'optimizer', 'dot.1': 'matmul'}
    """
    if not isinstance(hlo_text, str):
        raise errors.CourseTypeError(
            f"hlo_text={hlo_text!r:.60}: expected the compiled program's text "
            f"(compiled.as_text()), got {type(hlo_text).__name__}")
    tables_: dict[str, dict[int, str]] = {}
    section = None
    for line in hlo_text.splitlines():
        if line.strip() in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line.strip()
            tables_[section] = {}
            continue
        m = re.match(r"(\d+) (.*)$", line) if section else None
        if m:
            tables_[section][int(m.group(1))] = m.group(2)
        else:
            section = None
    files = {k: v.strip('"') for k, v in tables_.get("FileNames", {}).items()}
    functions = {k: v.strip('"') for k, v in tables_.get("FunctionNames", {}).items()}

    def field(text: str, name: str) -> int:
        m = re.search(rf"\b{name}=(\d+)", text)
        return int(m.group(1)) if m else 0

    locations = {k: (files.get(field(v, "file_name_id"), ""),
                     functions.get(field(v, "function_name_id"), ""))
                 for k, v in tables_.get("FileLocations", {}).items()}
    frames = {k: (field(v, "file_location_id"), field(v, "parent_frame_id"))
              for k, v in tables_.get("StackFrames", {}).items()}

    def stack(frame: int) -> list[tuple[str, str]]:
        seen, out = set(), []
        while frame in frames and frame not in seen:
            seen.add(frame)
            location, frame = frames[frame]
            out.append(locations.get(location, ("", "")))
        return out

    kinds = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\b([\w\-]+)\(.*"
                     r"metadata=\{([^}]*)\}", line)
        if not m:
            continue
        name, opcode, meta = m.groups()
        op = re.search(r'op_name="([^"]*)"', meta)
        op = op.group(1) if op else ""
        calls = stack(field(meta, "stack_frame_id"))
        source = re.search(r'source_file="([^"]*)"', meta)
        if source:
            calls.append((source.group(1), ""))
        if opcode in ("dot", "convolution") or re.search(r"dot_general|conv_general", op):
            kinds[name] = "matmul"
        elif any(ATTENTION_FUNCTIONS.search(fn) for _, fn in calls if fn):
            kinds[name] = "attention"
        elif any("optax" in f and "losses" not in f for f, _ in calls):
            kinds[name] = "optimizer"
    return kinds


def _self_times(spans: list[tuple[float, float]]) -> list[float]:
    """Self time of each (start, duration) span on one thread (nested spans)."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], -spans[i][1]))
    own = [d for _, d in spans]
    stack: list[int] = []
    for i in order:
        start, duration = spans[i]
        while stack and spans[stack[-1]][0] + spans[stack[-1]][1] <= start:
            stack.pop()
        if stack:  # nested in the innermost open span: not that span's own time
            own[stack[-1]] -= min(duration, sum(spans[stack[-1]]) - start)
        stack.append(i)
    return [max(0.0, t) for t in own]


def _build(raw: list[tuple], path: str, steps: int) -> Profile:
    """A Profile from (name, thread, process, start_us, duration_us[, hlo_op]) tuples."""
    by_thread: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, (_, thread, process, *_) in enumerate(raw):
        by_thread[(process, thread)].append(i)
    own = [0.0] * len(raw)
    for indices in by_thread.values():
        for i, t in zip(indices, _self_times([(raw[i][3], raw[i][4]) for i in indices])):
            own[i] = t
    events = tuple(Event(name, thread, process, start, duration, own[i],
                         classify(name, thread, process), *rest)
                   for i, (name, thread, process, start, duration, *rest) in enumerate(raw))
    return Profile(events, path, steps)


class TraceError(errors.CourseValueError):
    """A trace file that cannot be read as one: what is wrong with it, and what to do."""


_RETRACE = ("capture the trace again (`with jax.profiler.trace(directory): ...` around a few "
            "steps, waiting for their results inside the block) and read the new one")


def _bad(path: pathlib.Path, what: str) -> TraceError:
    return TraceError(f"{path} {what}: not a trace jax.profiler wrote, or one cut short. "
                      f"{_RETRACE.capitalize()}.")


def _number(path: pathlib.Path, e: dict, key: str, name: str) -> float:
    value = e.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _bad(path, f"has an event {name!r} whose {key!r} is {value!r}, not a number")
    try:
        x = float(value)
    except ValueError:
        raise _bad(path, f"has an event {name!r} whose {key!r} is {value!r}, not a number") from None
    if not math.isfinite(x):
        raise _bad(path, f"has an event {name!r} whose {key!r} is {value!r}")
    return x


def _from_json(path: pathlib.Path) -> list[tuple]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, EOFError, zlib.error) as err:
        raise _bad(path, f"cannot be read as gzip ({type(err).__name__}: {err})") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise _bad(path, f"is not JSON inside its gzip ({type(err).__name__}: "
                         f"{str(err)[:100]})") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise _bad(path, "holds no list of trace events (expected {\"traceEvents\": [...]} "
                         "or a list)")
    if not all(isinstance(e, dict) for e in events):
        bad = next(e for e in events if not isinstance(e, dict))
        raise _bad(path, f"holds a trace event that is {type(bad).__name__} {bad!r:.60}, not "
                         "an object")
    processes: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for e in events:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[_key(e.get("pid"))] = str(args.get("name", e.get("pid")))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(_key(e.get("pid")), _key(e.get("tid")))] = str(args.get("name", ""))
    raw = []
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") != "X" or name.startswith("end: "):
            continue
        duration = _number(path, e, "dur", name) if "dur" in e else 0.0
        if duration < 0:
            raise _bad(path, f"has an event {name!r} with a negative duration ({duration:g} us)")
        if not duration:
            continue
        pid, tid = _key(e.get("pid")), _key(e.get("tid"))
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        raw.append((name, threads.get((pid, tid), str(tid)), processes.get(pid, str(pid)),
                    _number(path, e, "ts", name), duration, str(args.get("hlo_op", ""))))
    return raw


def _key(value: Any) -> Any:
    """A process or thread id as a dict key (a list or dict id becomes its text)."""
    return value if isinstance(value, (str, int, float, type(None))) else repr(value)


# Which fields of an XSpace are nested messages (planes -> lines -> events) and which are
# other length-delimited fields (None). Older jaxlibs abort the whole process on a
# malformed XSpace instead of raising, so the bytes are walked first.
_XSPACE = {1: {3: {4: {}}}, 2: None, 3: None, 4: None}


def _check_wire(blob: bytes, schema: dict, depth: int = 0) -> None:
    """Raise ValueError unless ``blob`` is well-formed protobuf wire data for ``schema``."""
    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while i < len(blob) and shift < 70:
            byte = blob[i]
            value, i, shift = value | (byte & 0x7F) << shift, i + 1, shift + 7
            if byte < 0x80:
                return value, i
        raise ValueError(f"a number runs past the end at byte {i}")

    i = 0
    while i < len(blob):
        tag, i = varint(i)
        field, wire = tag >> 3, tag & 7
        if field == 0 or wire in (3, 4, 6, 7):
            raise ValueError(f"field {field} has wire type {wire} at depth {depth}")
        if field in schema and wire != 2:
            raise ValueError(f"field {field} at depth {depth} is not length-delimited")
        if wire == 0:
            _, i = varint(i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            size, i = varint(i)
            if i + size > len(blob):
                raise ValueError(f"a field of {size} bytes runs past the end (truncated?)")
            if schema.get(field) is not None:
                _check_wire(blob[i:i + size], schema[field], depth + 1)
            i += size
    if i > len(blob):
        raise ValueError("the last field runs past the end (truncated?)")


def _from_xplane(path: pathlib.Path) -> list[tuple[str, str, str, float, float]]:
    # ProfileData exists in recent jax; event.stats is avoided on purpose (reading it
    # with deprecation warnings as errors aborts the process on some versions)
    from jax.profiler import ProfileData

    if path.stat().st_size == 0:
        raise TraceError(f"{path} is empty (0 bytes): the trace was not written completely "
                         f"(the process ended inside the block?). {_RETRACE.capitalize()}.")
    try:
        _check_wire(path.read_bytes(), _XSPACE)
    except ValueError as err:
        raise _bad(path, f"cannot be read as an XSpace ({err})") from None
    try:
        data = ProfileData.from_file(str(path))
        raw = []
        for plane in data.planes:
            for line in plane.lines:
                for event in line.events:
                    if event.name.startswith("end: "):
                        continue
                    if event.duration_ns < 0:
                        raise _bad(path, f"has an event {event.name!r} with a negative "
                                         f"duration ({event.duration_ns} ns)")
                    if event.duration_ns > 0:
                        raw.append((event.name, line.name, plane.name, event.start_ns / 1e3,
                                    event.duration_ns / 1e3))
    except TraceError:
        raise
    except Exception as err:  # noqa: BLE001 - the protobuf reader raises bare Exceptions
        raise _bad(path, f"cannot be read as an XSpace ({type(err).__name__}: "
                         f"{str(err)[:100]})") from None
    return raw


def read(directory: str | pathlib.Path, steps: int = 1) -> Profile:
    """The newest trace under ``directory`` (what ``jax.profiler.trace`` wrote there).

    ``steps``: how many steps ran inside the trace, so the summaries are per step.
    ``directory`` may also be a trace file itself (``.trace.json.gz`` or ``.xplane.pb``).
    A trace that cannot be read, holds an event with a negative or non-numeric time, or
    holds no timed event at all is a :class:`TraceError` saying which and what to do.
    """
    if isinstance(directory, bool) or not isinstance(directory, (str, os.PathLike)):
        raise errors.CourseTypeError(
            f"directory={directory!r}: expected the folder given to jax.profiler.trace (a "
            f"string or pathlib.Path), got {type(directory).__name__}.")
    if not str(directory).strip():
        raise errors.CourseValueError(
            f"directory={directory!r} is empty: pass the folder given to jax.profiler.trace")
    steps = errors.check_int("steps", steps, low=1)
    base = pathlib.Path(directory)
    if base.is_file():
        if base.name.endswith(".trace.json.gz"):
            return _profile(_from_json(base), base, steps)
        if base.name.endswith(".xplane.pb"):
            return _profile(_from_xplane(base), base, steps)
        raise errors.CourseValueError(
            f"directory={str(base)!r} is a file, not a trace: pass the folder given to "
            "jax.profiler.trace, or its .trace.json.gz or .xplane.pb file")
    if not base.is_dir():
        raise errors.CourseValueError(
            f"directory={str(base)!r} does not exist: capture a trace first with "
            f"`with jax.profiler.trace({str(base)!r}): ...` around a few steps")
    found = sorted(base.glob("**/*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if found:
        return _profile(_from_json(found[-1]), found[-1], steps)
    planes = sorted(base.glob("**/*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if planes:
        return _profile(_from_xplane(planes[-1]), planes[-1], steps)
    raise errors.CourseValueError(
        f"no trace under {str(base)!r}: capture one first with "
        f"`with jax.profiler.trace({str(base)!r}): ...` around a few steps, and wait "
        "for their results inside the block (.block_until_ready())")


def _profile(raw: list[tuple[str, str, str, float, float]], path: pathlib.Path,
             steps: int) -> Profile:
    if not raw:
        raise TraceError(
            f"{path} holds no timed events: nothing ran inside the `with "
            "jax.profiler.trace(...)` block, or its work had not finished when the block "
            "ended. Run a few steps inside it and wait for their results there "
            "(.block_until_ready()), then read the new trace.")
    return _build(raw, str(path), steps)
