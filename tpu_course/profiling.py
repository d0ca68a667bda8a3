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


def _build(raw: list[tuple[str, str, str, float, float]], path: str, steps: int) -> Profile:
    by_thread: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, (_, thread, process, _, _) in enumerate(raw):
        by_thread[(process, thread)].append(i)
    own = [0.0] * len(raw)
    for indices in by_thread.values():
        for i, t in zip(indices, _self_times([(raw[i][3], raw[i][4]) for i in indices])):
            own[i] = t
    events = tuple(Event(name, thread, process, start, duration, own[i],
                         classify(name, thread, process))
                   for i, (name, thread, process, start, duration) in enumerate(raw))
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


def _from_json(path: pathlib.Path) -> list[tuple[str, str, str, float, float]]:
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
        raw.append((name, threads.get((pid, tid), str(tid)), processes.get(pid, str(pid)),
                    _number(path, e, "ts", name), duration))
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
