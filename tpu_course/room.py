"""The room around the grades: who handed each file in, the roster, and what is written.

:mod:`tpu_course.grade` finds the files, runs them and judges them; this module says who
each submission belongs to and writes the results an instructor hands on:

- **Who**: the newest hand-in record the notebook holds (``checks.hand_in(LAB, MY_ID)``,
  the last cell of every lab, stores ``{"tpu_course": {"learner", "lab", "handed_in"}}``
  in an output's metadata); else, as a fallback that ``summary.md`` lists, a name made from
  the file's path: the learner's folder when the file is named after the lab
  (``ada/lab-1.ipynb``), else the file's own name, copy suffixes kept (``ada (1)``), with
  as many folders in front as it takes to keep different folders apart
  (``section1/ada`` and ``section2/ada``). Two files of one id and lab: the newest by
  its stored hand-in time counts (a handed-in file before one named only), and both are
  listed; files of different ids never replace each other.
- **The roster** (``--roster``): a CSV of ``id, name, section, email`` (a header row
  optional, in any order; one id a line still works). A hand-in id that is a roster
  e-mail, or differs from a roster id only in case, is that learner.
- **What is written**: ``gradebook.csv`` (one row per learner), ``canvas.csv`` (a Canvas
  gradebook import), ``moodle.csv`` (a Moodle grade import), ``nbgrader.csv`` (the shape
  of ``nbgrader export``), ``summary.md`` (per lab and section; grading time per lab) and
  ``feedback/ID/lab-N.md`` and ``.html``. Every CSV field that a spreadsheet would read as
  a formula is neutralised (:func:`safe`).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import html
import os
import pathlib
import re
import urllib.parse
from typing import Any, Iterable, Mapping, Sequence

from tpu_course import errors

#: Which learner ids came from where, as ``grades.csv`` says.
FROM_HAND_IN, FROM_NAME = "hand-in", "file name"


class RosterError(errors.CourseValueError):
    """The roster cannot be read."""


# -- text that is safe where it goes ---------------------------------------------------------


def one_line(text: Any, limit: int = 400) -> str:
    """A message on one line (a CSV cell, a Markdown table cell), at most ``limit`` long."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def safe(value: Any) -> Any:
    """A CSV field a spreadsheet will not read as a formula (``=``, ``+``, ``-``, ``@``, a
    tab or a carriage return first get a ``'`` in front).

    >>> safe("=1+1"), safe("-3"), safe("ada"), safe(-3)
    ("'=1+1", "'-3", 'ada', -3)
    """
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def unsafe(value: str) -> str:
    """What :func:`safe` was given (for rows read back from ``grades.csv``)."""
    if value.startswith("'") and value[1:2] in ("=", "+", "-", "@", "\t", "\r"):
        return value[1:]
    return value


def safe_name(text: str) -> str:
    """A learner id as one folder name, distinct for distinct ids (characters a file name
    cannot hold are %-encoded, not dropped).

    >>> safe_name("ben_"), safe_name("ben"), safe_name("../x"), safe_name(".")
    ('ben_', 'ben', '..%2Fx', '%2E')
    """
    name = urllib.parse.quote(text, safe=" _-()")
    if name in ("", ".", ".."):
        return name.replace(".", "%2E") or "%00"
    return name


def write_csv(path: pathlib.Path, header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> None:
    """A CSV with every field made safe, written whole (a temporary file, then renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([safe(h) for h in header])
        writer.writerows([safe(c) for c in row] for row in rows)
    os.replace(tmp, path)


# -- the roster ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Person:
    """One learner on the roster."""

    id: str
    name: str = ""
    section: str = ""
    email: str = ""


_HEADERS = {
    "id": ("id", "learner", "learner id", "student id", "student_id", "login", "username",
           "user", "sis login id", "sis user id", "id number"),
    "name": ("name", "student", "full name", "student name"),
    "section": ("section", "group", "class"),
    "email": ("email", "e-mail", "email address", "mail"),
}


class Roster:
    """The people of a room, in roster order: ``Roster.read(path)``; ``find(id)``."""

    def __init__(self, people: Sequence[Person] = ()) -> None:
        self.people: dict[str, Person] = {}
        for p in people:
            self.people.setdefault(p.id, p)
        self._folded = {k.casefold(): k for k in self.people}
        self._folded.update({p.email.casefold(): p.id for p in self.people.values()
                             if p.email})

    def __bool__(self) -> bool:
        return bool(self.people)

    def __contains__(self, learner: str) -> bool:
        return learner in self.people

    def ids(self) -> list[str]:
        return list(self.people)

    def get(self, learner: str) -> Person:
        return self.people.get(learner) or Person(learner)

    def find(self, learner: str) -> str:
        """The roster id of ``learner`` (an id in another case, or an e-mail), or itself."""
        return learner if learner in self.people else self._folded.get(learner.casefold(),
                                                                        learner)

    def sections(self) -> list[str]:
        return list(dict.fromkeys(p.section for p in self.people.values()))

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Roster":
        """A roster CSV: ``id, name, section, email`` (a header row naming them, in any
        order, is optional), or one id a line; blank lines and ``#`` lines are skipped.

        Raises:
            RosterError: the file cannot be read, or holds no id.
        """
        try:
            text = pathlib.Path(path).read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as err:
            raise RosterError(f"--roster {str(path)!r} cannot be read ({err}): give a CSV of "
                              "id, name, section, email (or one learner id a line)") from None
        rows = [[c.strip() for c in r] for r in csv.reader(text.splitlines())]
        rows = [r for r in rows if any(r) and not r[0].startswith("#")]
        columns = {"id": 0, "name": 1, "section": 2, "email": 3}
        if rows:
            head = [c.casefold() for c in rows[0]]
            named = {k: next((head.index(n) for n in names if n in head), None)
                     for k, names in _HEADERS.items()}
            if named["id"] is not None or (named["name"] is not None and named["email"]
                                           is not None):
                if named["id"] is None:  # name and email only: the e-mail is the id
                    named["id"] = named["email"]
                columns = named
                rows = rows[1:]

        def cell(row: list[str], key: str) -> str:
            i = columns.get(key)
            return row[i] if i is not None and i < len(row) else ""

        people = [Person(cell(r, "id"), cell(r, "name"), cell(r, "section"), cell(r, "email"))
                  for r in rows if cell(r, "id")]
        if not people:
            raise RosterError(f"--roster {str(path)!r} holds no learner id: give a CSV of "
                              "id, name, section, email (or one learner id a line)")
        return cls(people)


# -- who handed a file in --------------------------------------------------------------------


def _when(text: Any) -> datetime.datetime | None:
    try:
        when = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)


def hand_in_record(nb: Any, lab: int | None) -> tuple[str, datetime.datetime | None] | None:
    """The newest hand-in record for ``lab`` among the notebook's outputs: (id, when)."""
    from tpu_course.checks import engine

    found: list[tuple[datetime.datetime | None, int, str]] = []
    order = 0
    for cell in nb.get("cells") or []:
        for out in cell.get("outputs") or [] if isinstance(cell, Mapping) else []:
            if not isinstance(out, Mapping):
                continue
            meta = out.get("metadata")
            record = meta.get("tpu_course") if isinstance(meta, Mapping) else None
            if not isinstance(record, Mapping):
                data = out.get("data")
                record = data.get(engine.HAND_IN_TYPE) if isinstance(data, Mapping) else None
            if not isinstance(record, Mapping) or not isinstance(record.get("learner"), str):
                continue
            who = one_line(record["learner"], 128)
            try:
                same_lab = lab is None or int(record.get("lab")) == lab
            except (TypeError, ValueError):
                same_lab = False
            if who and same_lab:
                order += 1
                found.append((_when(record.get("handed_in")), order, who))
    if not found:
        return None
    oldest = datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    when, _, who = max(found, key=lambda f: (f[0] or oldest, f[1]))
    return who, when


_LAB_NAME = re.compile(r"^(lab[\s_-]*\d+|\d\d_[a-z0-9_]+)$", re.IGNORECASE)
_COPY = re.compile(r"^(copy of\s+)+|\s*\(\d+\)$|[\s_-]*copy\d*$", re.IGNORECASE)


def _bare(stem: str) -> str:
    previous = None
    while previous != stem:
        previous, stem = stem, _COPY.sub("", stem).strip()
    return stem


def name_key(path: str | os.PathLike, rooms: Iterable[str | os.PathLike] = ()) -> pathlib.Path:
    """What a file's path says about who handed it in: the learner's folder when the file
    is named after a lab (``ada/lab-1.ipynb``; nbgrader's ``ada/lab1/01_x.ipynb`` too),
    unless that folder is the room itself (one of ``rooms``, the folders being graded);
    else the file itself, without ``.ipynb``."""
    path = pathlib.Path(os.path.abspath(path))
    rooms = {pathlib.Path(os.path.abspath(r)) for r in rooms}
    if _LAB_NAME.match(_bare(path.stem)):
        folder = path.parent
        if folder not in rooms and _LAB_NAME.match(folder.name) and folder.parent not in rooms \
                and folder.parent != folder.parent.parent:
            folder = folder.parent
        if folder not in rooms and folder != folder.parent:
            return folder
    return path.with_suffix("")


def name_ids(paths: Sequence[str | os.PathLike],
             rooms: Iterable[str | os.PathLike] = ()) -> dict[pathlib.Path, str]:
    """Each file's fallback id: its :func:`name_key`'s last part, with as many folders in
    front as keep different keys apart.

    >>> ids = name_ids(["r/s1/ada/lab-1.ipynb", "r/s2/ada/lab-1.ipynb", "r/bob.ipynb",
    ...                 "r/01_systolic_array (1).ipynb", "r/01_systolic_array (2).ipynb"],
    ...                rooms=["r"])
    >>> sorted(ids.values())
    ['01_systolic_array (1)', '01_systolic_array (2)', 'bob', 's1/ada', 's2/ada']
    """
    rooms = list(rooms)
    keys = {pathlib.Path(os.path.abspath(p)): name_key(p, rooms) for p in paths}
    distinct = set(keys.values())
    labels: dict[pathlib.Path, str] = {}
    for key in distinct:
        parts = key.parts[1:] or (str(key),)
        n = 1
        while n < len(parts) and any(o != key and o.parts[1:][-n:] == parts[-n:]
                                     for o in distinct):
            n += 1
        labels[key] = "/".join(parts[-n:])
    return {p: labels[k] for p, k in keys.items()}


def assign(subs: Sequence[Any], roster: Roster | None = None,
           rooms: Iterable[str | os.PathLike] = ()) -> None:
    """Set each submission's ``learner``, ``id_from`` and ``handed_in`` (in place): the
    notebook's hand-in record, else its name id; roster ids where they match."""
    roster = roster or Roster()
    fallback = name_ids([s.path for s in subs], rooms)
    for s in subs:
        record = hand_in_record(s.nb, s.lab) if s.nb is not None else None
        if record is not None:
            s.learner, s.handed_in = record
            s.id_from = FROM_HAND_IN
        else:
            s.learner = fallback[pathlib.Path(os.path.abspath(s.path))]
            s.id_from, s.handed_in = FROM_NAME, None
            last = s.learner.rsplit("/", 1)[-1]
            if s.learner not in roster and last in roster and sum(
                    v.rsplit("/", 1)[-1] == last for v in set(fallback.values())) == 1:
                s.learner = last
        s.learner = roster.find(s.learner)


def _mtime(path: pathlib.Path) -> datetime.datetime:
    try:
        stamp = os.lstat(path).st_mtime
    except OSError:
        stamp = 0.0
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc)


def drop_duplicates(subs: Sequence[Any]) -> None:
    """Of several files of one learner and lab, the newest counts: a handed-in file before
    one named only, then the later stored hand-in time, then the later file time. The
    others get ``superseded_by`` (in place); files of different ids never meet here."""
    groups: dict[tuple[str, int], list[Any]] = {}
    for s in subs:
        s.superseded_by = None
        if s.lab is not None and not s.problem:
            groups.setdefault((s.learner, s.lab), []).append(s)

    def rank(s: Any) -> tuple:
        handed = getattr(s, "id_from", FROM_NAME) == FROM_HAND_IN
        return (handed, getattr(s, "handed_in", None) or _mtime(s.path), _mtime(s.path),
                str(s.path))

    for group in groups.values():
        newest = max(group, key=rank)
        for s in group:
            if s is not newest:
                s.superseded_by = newest.path


def when_handed_in(sub: Any) -> str:
    """The submission's time, ISO (its stored hand-in time, else the file's time)."""
    when = getattr(sub, "handed_in", None) or _mtime(sub.path)
    return when.isoformat(timespec="seconds")


# -- what is written -------------------------------------------------------------------------


def _exercises(number: int) -> tuple[str, list[Any]]:
    from tpu_course import checks

    lab = checks.lab(number)
    return lab.title, lab.exercises


def graded_labs(rows: Sequence[dict]) -> list[int]:
    return sorted({int(r["lab"]) for r in rows if r.get("lab") not in ("", None)})


def _lab_rows(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r.get("lab") not in ("", None)]


def _points(rows: Sequence[dict]) -> int:
    return sum(int(r.get("points") or 0) for r in rows)


def _most(rows: Sequence[dict]) -> int:
    return sum(int(r.get("max_points") or 0) for r in rows if r["status"] != "skipped")


def _lab_max(number: int) -> int:
    return sum(int(e.points) for e in _exercises(number)[1])


def learners(rows: Sequence[dict], roster: Roster) -> list[str]:
    """The roster's learners, then everyone else who was graded, in order."""
    return list(dict.fromkeys([*roster.ids(), *(r["learner"] for r in _lab_rows(rows))]))


def _totals(rows: Sequence[dict]) -> dict[tuple[str, int], int]:
    totals: dict[tuple[str, int], int] = {}
    for r in _lab_rows(rows):
        key = (r["learner"], int(r["lab"]))
        totals[key] = totals.get(key, 0) + int(r.get("points") or 0)
    return totals


def write_gradebook(path: pathlib.Path, rows: Sequence[dict], roster: Roster) -> None:
    """One row per learner: name and section, each exercise's points, each lab's total,
    the total."""
    header, keys = ["learner", "name", "section"], []
    for number in graded_labs(rows):
        _, exercises = _exercises(number)
        for e in exercises:
            header.append(f"Lab {number}: {e.title} [{int(e.points)}]")
            keys.append((number, e.title))
        header.append(f"Lab {number} total [{_lab_max(number)}]")
        keys.append((number, None))
    header.append("total")
    out = []
    for learner in learners(rows, roster):
        mine = {(int(r["lab"]), r["exercise"]): r for r in _lab_rows(rows)
                if r["learner"] == learner}
        person = roster.get(learner)
        cells, total = [learner, person.name, person.section], 0
        for number, title in keys:
            if title is None:
                got = [r for (n, _), r in mine.items() if n == number]
                cells.append(_points(got) if got else "")
                total += _points(got)
            else:
                cells.append(mine[(number, title)].get("points", 0)
                             if (number, title) in mine else "")
        out.append([*cells, total])
    write_csv(path, header, out)


def _lab_column(number: int) -> str:
    return f"Lab {number}: {_exercises(number)[0]}"


def write_canvas(path: pathlib.Path, rows: Sequence[dict], roster: Roster) -> None:
    """A Canvas gradebook import: ``Student, ID, SIS User ID, SIS Login ID, Section``, one
    column per lab (a new assignment in Canvas, named ``Lab N: title``), a second row
    ``Points Possible`` with each lab's maximum, then one row per learner: the roster's
    name, the id as SIS User ID, the e-mail (else the id) as SIS Login ID, the section; a
    lab not handed in is left blank (Canvas leaves its cell as it was)."""
    labs, totals = graded_labs(rows), _totals(rows)
    header = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
              *(_lab_column(n) for n in labs)]
    out = [["    Points Possible", "", "", "", "", *(_lab_max(n) for n in labs)]]
    for learner in learners(rows, roster):
        p = roster.get(learner)
        out.append([p.name or learner, "", learner, p.email or learner, p.section,
                    *(totals.get((learner, n), "") for n in labs)])
    write_csv(path, header, out)


def write_moodle(path: pathlib.Path, rows: Sequence[dict], roster: Roster) -> None:
    """A Moodle grade import (Grades > Import > CSV file): ``ID number`` and ``Email
    address`` to identify the learner by (map either under "Identify user by"), ``Full
    name`` and ``Group`` for reading, then one column per lab (map each to its grade
    item); a lab not handed in is left blank."""
    labs, totals = graded_labs(rows), _totals(rows)
    header = ["ID number", "Email address", "Full name", "Group",
              *(_lab_column(n) for n in labs)]
    out = []
    for learner in learners(rows, roster):
        p = roster.get(learner)
        out.append([learner, p.email, p.name, p.section,
                    *(totals.get((learner, n), "") for n in labs)])
    write_csv(path, header, out)


#: ``nbgrader export``'s columns, in its order.
NBGRADER_COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name",
                    "first_name", "email", "raw_score", "late_submission_penalty", "score",
                    "max_score")


def _split_name(name: str) -> tuple[str, str]:
    """(last, first) from ``"Last, First"`` or ``"First Last"``."""
    if "," in name:
        last, first = name.split(",", 1)
        return last.strip(), first.strip()
    parts = name.split()
    return (parts[-1], " ".join(parts[:-1])) if parts else ("", "")


def write_nbgrader(path: pathlib.Path, rows: Sequence[dict], roster: Roster,
                   stamps: Mapping[tuple[str, int], str]) -> None:
    """``nbgrader export``'s shape: one row per learner and lab (assignment ``lab-N``),
    everyone for every graded lab; one not handed in has no timestamp and scores 0."""
    totals = _totals(rows)
    out = []
    for number in graded_labs(rows):
        most = float(_lab_max(number))
        for learner in learners(rows, roster):
            p = roster.get(learner)
            last, first = _split_name(p.name)
            score = float(totals.get((learner, number), 0))
            out.append([f"lab-{number}", "", stamps.get((learner, number), ""), learner, last,
                        first, p.email, score, 0.0, score, most])
    write_csv(path, NBGRADER_COLUMNS, out)


_MARK = {"passed": "passed", "failed": "not yet", "not written": "not written",
         "skipped": "skipped", "error": "error", "timeout": "timed out"}


def write_feedback(folder: pathlib.Path, rows: Sequence[dict]) -> None:
    """``folder/ID/lab-N.md`` and ``.html`` (the id %-encoded where a file name cannot
    hold it): each exercise's status, message and hint."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in _lab_rows(rows):
        groups.setdefault((r["learner"], int(r["lab"])), []).append(r)
    for (learner, number), mine in groups.items():
        title, _ = _exercises(number)
        passed = sum(r["status"] == "passed" for r in mine)
        gradable = sum(r["status"] != "skipped" for r in mine)
        head = f"Lab {number}: {title}"
        said = (f"Feedback for {learner}, from {pathlib.Path(mine[0]['file']).name} (graded "
                f"{mine[0].get('graded_at', '')}): {passed} of {gradable} exercises passed, "
                f"{_points(mine)} of {_most(mine)} points.")
        md = [f"# {head}", "", said, ""]
        page = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(head)}"
                "</title></head><body>", f"<h1>{html.escape(head)}</h1>",
                f"<p>{html.escape(said)}</p>"]
        for r in mine:
            mark = _MARK.get(r["status"], r["status"])
            md += [f"## {r['exercise']}: {mark}", "", r["message"], ""]
            page += [f"<h2>{html.escape(r['exercise'])}: {mark}</h2>",
                     f"<p>{html.escape(r['message'])}</p>"]
            if r.get("hint"):
                md += [f"Hint: {r['hint']}", ""]
                page.append(f"<p><em>Hint:</em> {html.escape(r['hint'])}</p>")
        target = folder / safe_name(learner)
        target.mkdir(parents=True, exist_ok=True)
        (target / f"lab-{number}.md").write_text("\n".join(md))
        (target / f"lab-{number}.html").write_text("\n".join([*page, "</body></html>", ""]))


def _cell(text: Any) -> str:
    return one_line(text).replace("|", "/").replace("`", "'")


def _per_submission(rows: Sequence[dict], key: str) -> dict[int, list[float]]:
    """Each lab's ``key`` (``seconds``, ``peak_gb``), one value per submission."""
    per: dict[int, dict[str, float]] = {}
    for r in _lab_rows(rows):
        try:
            value = float(r.get(key) or "nan")
        except (TypeError, ValueError):
            continue
        if value == value:
            per.setdefault(int(r["lab"]), {})[r["file"]] = value
    return {n: list(files.values()) for n, files in sorted(per.items())}


def summary(rows: Sequence[dict], *, head: Sequence[str] = (), subs: Sequence[Any] = (),
            roster: Roster | None = None) -> str:
    """The Markdown summary: grading time per lab; per lab and section, each learner's
    total and each exercise's pass share; ids from file names; superseded and ungraded
    files."""
    roster = roster or Roster()
    lines = ["# Lab grades", "", *head]
    times, peaks = _per_submission(rows, "seconds"), _per_submission(rows, "peak_gb")
    if times:
        lines += ["## Grading time per lab", "",
                  "| Lab | Submissions | Mean seconds per submission | Longest | Total | "
                  "Most memory |", "|---|---|---|---|---|---|"]
        lines += [f"| {n} | {len(s)} | {sum(s) / len(s):.0f} | {max(s):.0f} | {sum(s):.0f} | "
                  + (f"{max(peaks[n]):.2f} GB |" if peaks.get(n) else "- |")
                  for n, s in times.items()]
        lines += ["", "(Seconds from the start of a notebook's run to its verdicts, with "
                  "whatever else ran at the same time; memory summed over its processes.)",
                  ""]
    sections = roster.sections() if roster else []
    split = len([s for s in sections if s]) > 0
    for number in graded_labs(rows):
        title, exercises = _exercises(number)
        lab_rows = [r for r in _lab_rows(rows) if int(r["lab"]) == number]
        graded = list(dict.fromkeys(r["learner"] for r in lab_rows))
        lines += [f"## Lab {number}: {title} ({len(graded)} submission(s))", ""]
        groups: list[tuple[str | None, list[str]]] = []
        if split:
            for section in sections:
                groups.append((section or "no section",
                               [g for g in graded if g in roster
                                and roster.get(g).section == section]))
        elif roster:
            groups.append((None, [g for g in graded if g in roster]))
        unknown = [g for g in graded if g not in roster]
        if not roster:
            groups.append((None, graded))
        elif unknown:
            groups.append(("Not on the roster", unknown))
        for name, members in groups:
            if name is not None:
                lines += [f"### {_cell(name)}" + (" (section)" if name != "Not on the roster"
                                                   else ""), ""]
            if members:
                lines += ["| Learner | Name | File | Id from | Passed | Points | Not passed |",
                          "|---|---|---|---|---|---|---|"]
            else:
                lines.append("No submission graded.")
            for learner in members:
                mine = [r for r in lab_rows if r["learner"] == learner]
                passed = sum(r["status"] == "passed" for r in mine)
                gradable = sum(r["status"] != "skipped" for r in mine)
                others: dict[str, int] = {}
                for r in mine:
                    if r["status"] != "passed":
                        others[r["status"]] = others.get(r["status"], 0) + 1
                rest = ", ".join(f"{n} {s}" for s, n in others.items()) or "-"
                lines.append(f"| `{_cell(learner)}` | {_cell(roster.get(learner).name)} | "
                             f"`{_cell(pathlib.Path(mine[0]['file']).name)}` | "
                             f"{_cell(mine[0].get('id_from') or '')} | {passed} of {gradable}"
                             f" | {_points(mine)} of {_most(mine)} | {rest} |")
            if roster and name != "Not on the roster":
                section = None if name is None else ("" if name == "no section" else name)
                absent = [i for i in roster.ids() if i not in graded
                          and (section is None or roster.get(i).section == section)]
                lines += ["", "On the roster, no submission: "
                          f"{', '.join(map(_cell, absent)) if absent else 'none'}."]
            lines.append("")
        lines += ["| Exercise | Passed | Share of the room |", "|---|---|---|"]
        for e in exercises:
            these = [r for r in lab_rows if r["exercise"] == e.title]
            passed = sum(r["status"] == "passed" for r in these)
            share = f"{100 * passed / len(these):.0f}%" if these else "-"
            lines.append(f"| {e.title} | {passed} of {len(these)} | {share} |")
        lines.append("")
    named = [s for s in subs if getattr(s, "id_from", "") == FROM_NAME and s.lab is not None
             and not s.problem]
    if named:
        lines += ["## Ids taken from file names", "",
                  "These notebooks hold no hand-in record (their hand-in cell was not run, "
                  "or ran without an id), so their id comes from the file's path. Files of "
                  "different paths are never merged: check the ids below against your "
                  "roster, and ask these learners to run the last cell with their id.", "",
                  "| Id | Lab | File |", "|---|---|---|"]
        lines += [f"| `{_cell(s.learner)}` | {s.lab} | `{_cell(s.path)}` |" for s in named]
        lines.append("")
    old = [s for s in subs if getattr(s, "superseded_by", None) is not None]
    if old:
        lines += ["## Superseded (not graded: the learner's newest file for the lab counts)",
                  "", "| Learner | Lab | File | Handed in | Counted instead |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{_cell(s.learner)}` | {s.lab} | `{_cell(s.path)}` | "
                  f"{when_handed_in(s)} ({s.id_from}) | `{_cell(s.superseded_by)}` |"
                  for s in old]
        lines.append("")
    ungraded = [r for r in rows if r.get("lab") in ("", None)]
    if ungraded:
        lines += ["## Not graded", "", "| File | Status | Why |", "|---|---|---|"]
        lines += [f"| `{_cell(r['file'])}` | {r['status']} | {_cell(r['message'])} |"
                  for r in ungraded]
        lines.append("")
    return "\n".join(lines)
