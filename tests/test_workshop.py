"""The workshop agendas: generated from the notebooks' metadata, checked like README's table."""

import shutil

import pytest

from tools import workshop

pytestmark = pytest.mark.stack_independent  # not rerun on the Colab line (pyproject.toml)


@pytest.fixture()
def course(tmp_path):
    """A copy of chapter 1, lab 1's solution and the guide, to break on purpose."""
    for folder, name in (("notebooks", "01_systolic_array"), ("solutions", "01_systolic_array")):
        (tmp_path / folder).mkdir()
        for suffix in (".py", ".ipynb"):
            shutil.copy(workshop.ROOT / folder / f"{name}{suffix}", tmp_path / folder)
    shutil.copy(workshop.ROOT / workshop.GUIDE, tmp_path / workshop.GUIDE)
    workshop.sync(tmp_path)
    return tmp_path


def test_the_committed_course_has_complete_data_and_current_agendas():
    assert workshop.problems() == []


def test_every_agenda_fits_its_length_and_the_longer_ones_keep_the_shorter():
    blocks, _ = workshop.blocks_in_order()
    previous: set = set()
    for agenda in workshop.AGENDAS:
        chosen = workshop.included(blocks, agenda)
        days, problems = workshop.schedule(chosen, agenda)
        assert problems == [] and len(days) <= agenda.days
        for day in days:
            assert sum(b.minutes for b in day if b) <= agenda.teaching_minutes_per_day
            assert day.count(None) == agenda.breaks_per_day
        assert previous <= set(chosen)
        previous = set(chosen)
    assert {b.kind for b in previous} == {"section", "exercise"}


def test_exercise_minutes_and_needs_come_from_the_lab_registry():
    from tpu_course import checks

    blocks, _ = workshop.blocks_in_order()
    exercises = [b for b in blocks if b.kind == "exercise" and b.chapter == 2]
    registry = checks.lab(2).exercises
    assert [b.minutes for b in exercises] == [e.minutes for e in registry]
    assert [b.needs for b in exercises] == [e.needs for e in registry]


def test_a_section_without_data_is_named(course):
    twin = course / "notebooks" / "01_systolic_array.py"
    text = twin.read_text()
    data = ' workshop={"minutes": 8, "agenda": "half-day"}\n# ## 2.'
    assert data in text
    twin.write_text(text.replace(data, "\n# ## 2."))
    problems = workshop.problems(course)
    assert any("'2. The simulator at work" in p and "no workshop=" in p for p in problems)


def test_minutes_shorter_than_reading_and_running_are_refused(course):
    twin = course / "notebooks" / "01_systolic_array.py"
    twin.write_text(twin.read_text().replace('{"minutes": 8, "agenda": "half-day"}',
                                             '{"minutes": 1, "agenda": "half-day"}'))
    problems = workshop.problems(course)
    assert any("says 1 min, but reading and running it takes" in p for p in problems)


def test_an_agenda_that_no_longer_fits_is_refused():
    blocks, _ = workshop.blocks_in_order()
    everything = [workshop.dataclasses.replace(b, agenda="half-day") for b in blocks]
    _, problems = workshop.schedule(everything, workshop.AGENDAS[0])
    assert problems and "does not fit" in problems[0]


def test_stale_tables_are_reported_and_sync_rewrites_them(course):
    guide = course / workshop.GUIDE
    twin = course / "notebooks" / "01_systolic_array.py"
    twin.write_text(twin.read_text().replace('{"minutes": 8, "agenda": "half-day"}',
                                             '{"minutes": 9, "agenda": "half-day"}'))
    assert any("stale" in p for p in workshop.problems(course))
    workshop.sync(course)
    assert not any("stale" in p for p in workshop.problems(course))
    assert "| 9 |" in guide.read_text()
