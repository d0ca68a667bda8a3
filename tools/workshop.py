"""Workshop agendas for INSTRUCTORS.md, generated from timing data kept with the notebooks.

The data lives where the author works:

* every section of a chapter (the cell that holds its ``## `` heading, and the title cell
  for the introduction) carries ``workshop`` cell metadata in the jupytext twin::

      # %% [markdown] workshop={"minutes": 8, "agenda": "half-day"}

  ``minutes`` is the time the block takes in a room (reading, running, talking it
  through); ``agenda`` is the shortest workshop that keeps it (``half-day``, ``one-day``,
  ``two-days``; ``self-paced`` for what no workshop has time for); an optional ``needs``
  (``tpu``) marks a section whose numbers only mean something on a TPU;
* every lab exercise takes its minutes and what it needs from the lab's registry
  (``tpu_course.checks``, the same data as the scorecard); its heading cell in the
  solution's twin carries ``workshop={"agenda": ...}``.

``python -m tools.notebooks sync`` writes the agenda tables into INSTRUCTORS.md between
``<!-- agendas: begin -->`` and ``<!-- agendas: end -->``; ``check`` (run by
``make test-unit``) says when they are stale, when a section has no data, and when an
author's minutes disagree with the block's length: never less than the time to read its
prose and code and run its cells (as measured when the committed notebook was executed),
never more than three times that plus 30 minutes.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import re
from typing import Any, Iterable

from tools import SETUP_TAG

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE = "INSTRUCTORS.md"
BEGIN, END = "<!-- agendas: begin -->", "<!-- agendas: end -->"


@dataclasses.dataclass(frozen=True)
class Agenda:
    """One workshop length: the days it spans, and the breaks each day has."""

    level: str
    title: str
    days: int
    minutes_per_day: int
    breaks_per_day: int
    break_minutes: int = 15

    @property
    def teaching_minutes_per_day(self) -> int:
        return self.minutes_per_day - self.breaks_per_day * self.break_minutes


AGENDAS = (
    Agenda("half-day", "Half day (3 h)", days=1, minutes_per_day=180, breaks_per_day=1),
    Agenda("one-day", "One day (6 h)", days=1, minutes_per_day=360, breaks_per_day=2),
    Agenda("two-days", "Two days (2 x 6 h)", days=2, minutes_per_day=360, breaks_per_day=2),
)
LEVELS = tuple(a.level for a in AGENDAS) + ("self-paced",)

# Where a block runs. A section's default, and each value of the lab registry's `needs`.
RUNTIME = {
    "cpu": "any, CPU included",
    "tpu": "any; TPU numbers on a TPU",
    "accelerator": "TPU or GPU (skipped on CPU)",
    "tpu-chip": "a TPU (skipped on CPU and GPU)",
    "tpu-compiler": "TPU compiler (Kaggle, a TPU VM, or the `aot` extra)",
}

# Reading speeds for the lower bound on an author's minutes.
PROSE_WORDS_PER_MINUTE = 200
CODE_WORDS_PER_MINUTE = 100


@dataclasses.dataclass(frozen=True)
class Block:
    """A section of a chapter or an exercise of a lab, as an agenda row."""

    chapter: int
    kind: str            # "section" or "exercise"
    title: str
    minutes: int
    agenda: str
    needs: str
    source: str          # the twin that holds its data
    floor: float = 0.0   # minutes to read it and run it, measured

    @property
    def label(self) -> str:
        where = f"Ch {self.chapter}" if self.kind == "section" else f"Lab {self.chapter}"
        return f"{where} · {self.title}"


def _jupytext() -> Any:
    try:
        import jupytext
    except ImportError as err:  # pragma: no cover - dev dependency
        raise ImportError("the workshop tools need jupytext: run `make setup`") from err
    return jupytext


def _heading(source: str, pattern: str = r"#{1,2} ") -> str | None:
    for line in source.splitlines():
        if re.match(pattern, line):
            return line.lstrip("#").strip()
    return None


def _seconds(cell: Any) -> float:
    """How long the committed execution of ``cell`` took (nbclient's timestamps)."""
    ex = cell.get("metadata", {}).get("execution", {})
    start, end = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not start or not end:
        return 0.0
    parse = lambda s: datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    return max(0.0, (parse(end) - parse(start)).total_seconds())


def _floors(ipynb: pathlib.Path, starts: list[int]) -> list[float]:
    """Reading + running minutes of the cell ranges that begin at ``starts``."""
    import nbformat

    if not ipynb.exists():
        return [0.0] * len(starts)
    cells = nbformat.read(ipynb, as_version=4).cells
    bounds = starts + [len(cells)]
    floors = []
    for a, b in zip(bounds, bounds[1:]):
        minutes = 0.0
        for cell in cells[a:b]:
            words = len(cell.source.split())
            if SETUP_TAG in cell.metadata.get("tags", []):
                words = 0  # folded and never read: only its run time counts
            if cell.cell_type == "markdown":
                minutes += words / PROSE_WORDS_PER_MINUTE
            else:
                minutes += words / CODE_WORDS_PER_MINUTE + _seconds(cell) / 60
        floors.append(minutes)
    return floors


def _chapter(path: pathlib.Path) -> int:
    return int(path.name[:2])


def section_blocks(root: pathlib.Path = ROOT) -> tuple[list[Block], list[str]]:
    """Every chapter section with its workshop data, and what is missing or wrong."""
    blocks, problems = [], []
    for twin in sorted((root / "notebooks").glob("[0-9][0-9]_*.py")):
        nb = _jupytext().read(twin)
        found = []
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "markdown":
                continue
            title = _heading(cell.source)
            if title is None:
                continue
            data = cell.metadata.get("workshop")
            where = f"{twin.relative_to(root)} ({title[:50]!r})"
            if not isinstance(data, dict) or "minutes" not in data or "agenda" not in data:
                problems.append(f"{where}: no workshop={{\"minutes\": N, \"agenda\": ...}} "
                                "in the cell's metadata")
                continue
            if data["agenda"] not in LEVELS:
                problems.append(f"{where}: agenda {data['agenda']!r} is not one of {LEVELS}")
                continue
            if data.get("needs", "cpu") not in ("cpu", "tpu"):
                problems.append(f"{where}: needs {data['needs']!r} is not 'cpu' or 'tpu'")
                continue
            if title.startswith("Chapter"):
                title = "Introduction and setup"
            found.append((i, Block(_chapter(twin), "section", title, int(data["minutes"]),
                                   data["agenda"], data.get("needs", "cpu"),
                                   str(twin.relative_to(root)))))
        floors = _floors(twin.with_suffix(".ipynb"), [i for i, _ in found])
        blocks += [dataclasses.replace(b, floor=f) for (_, b), f in zip(found, floors)]
    return blocks, problems


def exercise_blocks(root: pathlib.Path = ROOT) -> tuple[list[Block], list[str]]:
    """Every lab exercise: minutes and needs from the registry, agenda from the twin."""
    from tpu_course import checks

    blocks, problems = [], []
    for twin in sorted((root / "solutions").glob("[0-9][0-9]_*.py")):
        number = _chapter(twin)
        try:
            registry = {int(re.search(r"\d+", e.title).group()): e
                        for e in checks.lab(number).exercises}
        except ValueError as exc:
            problems.append(f"{twin.relative_to(root)}: {exc}")
            continue
        nb = _jupytext().read(twin)
        found, seen = [], set()
        for i, cell in enumerate(nb.cells):
            title = _heading(cell.source, r"## Exercise \d+") if cell.cell_type == "markdown" else None
            if title is None:
                continue
            k = int(re.search(r"\d+", title).group())
            where = f"{twin.relative_to(root)} (Exercise {k})"
            exercise = registry.get(k)
            if exercise is None:
                problems.append(f"{where}: lab {number}'s registry has no Exercise {k}")
                continue
            seen.add(k)
            stated = re.search(r"\((\d+) min\)", title)
            if stated and int(stated.group(1)) != exercise.minutes:
                problems.append(f"{where}: the heading says {stated.group(1)} min, the "
                                f"registry {exercise.minutes}: make them agree")
            data = cell.metadata.get("workshop")
            if not isinstance(data, dict) or data.get("agenda") not in LEVELS:
                problems.append(f"{where}: no workshop={{\"agenda\": ...}} (one of {LEVELS}) "
                                "in the heading cell's metadata")
                continue
            name = re.sub(r"^Exercise \d+( \(\w+\))?:?\s*", "", title)
            name = re.sub(r"\s*\(\d+ min\)$", "", name)
            found.append((i, Block(number, "exercise", f"Exercise {k}: {name}",
                                   exercise.minutes, data["agenda"], exercise.needs,
                                   str(twin.relative_to(root)))))
        problems += [f"{twin.relative_to(root)}: Exercise {k} of lab {number}'s registry has "
                     "no `## Exercise` heading cell" for k in sorted(set(registry) - seen)]
        floors = _floors(twin.with_suffix(".ipynb"), [i for i, _ in found])
        blocks += [dataclasses.replace(b, floor=f) for (_, b), f in zip(found, floors)]
    return blocks, problems


def blocks_in_order(root: pathlib.Path = ROOT) -> tuple[list[Block], list[str]]:
    """Course order: each chapter's sections, then its lab's exercises."""
    sections, p1 = section_blocks(root)
    exercises, p2 = exercise_blocks(root)
    order = {"section": 0, "exercise": 1}
    blocks = sorted(sections + exercises, key=lambda b: (b.chapter, order[b.kind]))
    return blocks, p1 + p2


def length_problems(blocks: Iterable[Block]) -> list[str]:
    """Authors' minutes against the measured reading-and-running time of each block."""
    problems = []
    for b in blocks:
        if b.floor == 0.0:
            continue
        if b.minutes < b.floor:
            problems.append(f"{b.source}: {b.label!r} says {b.minutes} min, but reading and "
                            f"running it takes {b.floor:.1f} min: raise its minutes")
        elif b.kind == "section" and b.minutes > 3 * b.floor + 30:
            problems.append(f"{b.source}: {b.label!r} says {b.minutes} min for "
                            f"{b.floor:.1f} min of reading and running: lower it")
    return problems


def included(blocks: Iterable[Block], agenda: Agenda) -> list[Block]:
    rank = LEVELS.index(agenda.level)
    return [b for b in blocks if LEVELS.index(b.agenda) <= rank]


def schedule(blocks: list[Block], agenda: Agenda) -> tuple[list[list[Block | None]], list[str]]:
    """Blocks packed into days in course order, ``None`` marking a break; and overflows."""
    budget = agenda.teaching_minutes_per_day
    days: list[list[Block]] = [[]]
    for b in blocks:
        if sum(x.minutes for x in days[-1]) + b.minutes > budget and days[-1]:
            days.append([])
        days[-1].append(b)
    problems = []
    if len(days) > agenda.days:
        over = sum(b.minutes for b in blocks) - budget * agenda.days
        problems.append(f"the {agenda.title} agenda does not fit: about {over} min too many "
                        f"(move blocks to a longer agenda in their workshop metadata)")
    timed: list[list[Block | None]] = []
    for day in days:
        total = sum(b.minutes for b in day)
        marks = [total * (k + 1) / (agenda.breaks_per_day + 1)
                 for k in range(agenda.breaks_per_day)]
        row: list[Block | None] = []
        elapsed = 0
        for b in day:
            if marks and elapsed > 0 and elapsed + b.minutes / 2 > marks[0]:
                row.append(None)
                marks.pop(0)
            row.append(b)
            elapsed += b.minutes
        row += [None] * len(marks)  # a short day still has its breaks, at the end
        timed.append(row)
    return timed, problems


def _clock(minutes: int) -> str:
    return f"{minutes // 60}:{minutes % 60:02d}"


def agenda_markdown(blocks: list[Block], agenda: Agenda) -> str:
    chosen = included(blocks, agenda)
    days, _ = schedule(chosen, agenda)
    out = [f"### {agenda.title}", ""]
    for d, day in enumerate(days, 1):
        if agenda.days > 1:
            out += [f"**Day {d}**", ""]
        out += ["| Start | Block | Minutes | Runs on |", "| --- | --- | ---: | --- |"]
        t = 0
        for b in day:
            if b is None:
                out.append(f"| {_clock(t)} | *Break* | {agenda.break_minutes} | |")
                t += agenda.break_minutes
            else:
                out.append(f"| {_clock(t)} | {b.label} | {b.minutes} | {RUNTIME[b.needs]} |")
                t += b.minutes
        out += [f"| {_clock(t)} | *End* | | |", ""]
    cut = [b for b in blocks if b not in chosen]
    if cut:
        per_chapter: dict[int, list[Block]] = {}
        for b in cut:
            per_chapter.setdefault(b.chapter, []).append(b)
        out += [f"Left out of the {agenda.title.lower()} "
                f"({sum(b.minutes for b in cut)} min; for learners to do afterwards):", ""]
        for ch, bs in per_chapter.items():
            out.append(f"- Chapter {ch}: " + "; ".join(f"{b.title} ({b.minutes})" for b in bs))
        out.append("")
    return "\n".join(out)


def agendas_markdown(blocks: list[Block]) -> str:
    total = sum(b.minutes for b in blocks)
    head = [f"Generated by `make sync` from the notebooks' workshop metadata and the labs' "
            f"registry: {len(blocks)} blocks, {total} min ({total / 60:.1f} h) in all.", ""]
    return "\n".join(head + [agenda_markdown(blocks, a) for a in AGENDAS]).rstrip() + "\n"


def _splice(text: str, body: str) -> str | None:
    if BEGIN not in text or END not in text:
        return None
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}{END}{tail}"


def problems(root: pathlib.Path = ROOT) -> list[str]:
    """Everything wrong with the workshop data and INSTRUCTORS.md's tables."""
    blocks, found = blocks_in_order(root)
    found += length_problems(blocks)
    for agenda in AGENDAS:
        found += schedule(included(blocks, agenda), agenda)[1]
    guide = root / GUIDE
    if not guide.exists():
        return found + [f"{GUIDE} is missing"]
    text = guide.read_text()
    wanted = _splice(text, agendas_markdown(blocks))
    if wanted is None:
        found.append(f"{GUIDE} has no {BEGIN} ... {END} markers for the agendas")
    elif wanted != text:
        found.append(f"{GUIDE}'s agendas are stale: run `make sync`")
    return found


def sync(root: pathlib.Path = ROOT) -> None:
    """Rewrite INSTRUCTORS.md's agenda tables from the data."""
    guide = root / GUIDE
    blocks, _ = blocks_in_order(root)
    text = guide.read_text()
    new = _splice(text, agendas_markdown(blocks))
    if new is not None and new != text:
        guide.write_text(new)
