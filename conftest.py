"""Repository-wide pytest hooks: the warnings policy, and what each file costs.

* Deprecation and future warnings fail the run (``tpu_course.warnings_policy``): its
  filters become pytest ``filterwarnings`` lines here, and ``TPU_COURSE_STRICT_WARNINGS=1``
  is set so that the notebook kernels nbval starts (separate processes, which inherit
  this environment) install the same policy when the notebook imports ``tpu_course``.
* Every test file is held to a CPU budget (:data:`TEST_FILE_BUDGET_CPU_S`): the CPU time
  of its tests, setup and teardown included, in the process that runs them and in every
  process it started and waited for (subprocesses, notebook kernels, throw-away
  environments). A file over it fails the run, named with its seconds in the summary. CPU
  time, not wall time: CI's machine is busy, and a file's CPU time does not depend on
  what runs beside it. Cheap files are why the suite needs no schedule (issue 39): any
  order of files, on any number of pytest-xdist workers, ends at about the same time.
* nbval runs each notebook cell as one test item; this sums the items of each notebook so
  the CI log shows one line per notebook, against its budget: 2 minutes, and 3 for
  chapter 8, whose issue (28) sets it (a 100-step training run on 8 simulated devices).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import resource

import pytest

from tpu_course import warnings_policy

pytest_plugins = ["pytester"]  # tests/test_cpu_budget.py runs this file on a small suite

#: The most CPU-seconds one test file may cost (user + system, children included): at 30 s
#: a file, no file is long enough to need a place in a schedule.
TEST_FILE_BUDGET_CPU_S = 30.0
#: Test files allowed over the budget until they are made cheaper (path: allowance, about
#: a tenth above what they measured in a serial run on a busy 2-core machine). Each one
#: owes the suite that work: share what its tests recompute (one trained state, one
#: compiled step), then delete its line here.
OVER_BUDGET_CPU_S: dict[str, float] = {
    # 22-32 CPU-s measured: the memory budget's 8-device compile in a subprocess of its own.
    "tests/test_lm.py": 36.0,
    # 23-31 CPU-s measured: the sandboxed room and a fresh process that starts the grader
    # with its labs' simulated devices.
    "tests/test_grade.py": 36.0,
}

NOTEBOOK_BUDGET_S = 120.0
#: Notebooks with a budget of their own (path from the repository root: seconds).
NOTEBOOK_BUDGETS_S = {"notebooks/08_language_model.ipynb": 300.0}

_times: dict[str, float] = collections.defaultdict(float)  # notebook: wall seconds
_cpu: dict[str, float] = collections.defaultdict(float)  # file: CPU-seconds
_START = pytest.StashKey[float]()


def cpu_seconds() -> float:
    """User + system CPU time of this process and of the children it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def budget_cpu_s(path: str) -> float | None:
    """The CPU budget of a file (its path from the repository root); None: a notebook,
    held to its wall-time budget instead."""
    if path.endswith(".ipynb"):
        return None
    return OVER_BUDGET_CPU_S.get(path, TEST_FILE_BUDGET_CPU_S)


#: A busy machine (another heavy job on both cores) inflates a file's CPU-seconds by up to
#: about a tenth (measured: one file 29.0 and 31.3 CPU-s in two CI runs). A file over its
#: budget is reported; it fails the run when it is over by more than this factor.
BUSY_MARGIN = 1.15


def over_budget(cpu: dict[str, float], margin: float = 1.0) -> list[str]:
    """The files whose CPU-seconds exceed their budget (times ``margin``), as report lines.

    >>> over_budget({"tests/test_a.py": 31.0, "tests/test_b.py": 2.0, "notebooks/x.ipynb": 99})
    ['tests/test_a.py: 31.0 CPU-s, over its budget of 30 CPU-s']
    >>> over_budget({"tests/test_a.py": 31.0}, margin=BUSY_MARGIN)
    []
    """
    lines = []
    for path, seconds in sorted(cpu.items()):
        budget = budget_cpu_s(path)
        if budget is not None and seconds > budget * margin:
            lines.append(f"{path}: {seconds:.1f} CPU-s, over its budget of {budget:.0f} CPU-s")
    return lines


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker reports to the controller


def pytest_configure(config):
    os.environ[warnings_policy.ENV_VAR] = "1"
    for line in warnings_policy.pytest_filters():
        config.addinivalue_line("filterwarnings", line)
    # The checkpoint tests that truncate or delete a saved file: Orbax raises for the
    # broken array and leaves its reads of the other arrays to fail unawaited, which
    # pytest reports later, under whichever test is running when they are collected.
    config.addinivalue_line(
        "filterwarnings", r"ignore:Exception ignored in\x3a <coroutine object "
        r"_read_array_index_and_device_put:pytest.PytestUnraisableExceptionWarning")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_START] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        # setup, call and teardown of this item (a module's fixtures are set up in its
        # first item and torn down in its last): sent to the controller with the report
        outcome.get_result().user_properties.append(
            ("cpu_s", cpu_seconds() - item.stash[_START]))


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _times[path] += report.duration
    for name, value in report.user_properties:
        if name == "cpu_s":
            _cpu[path] += value


def enforced() -> bool:
    """Whether a file over its budget fails the run. The budgets are sized on the newest
    line; ``TPU_COURSE_CPU_BUDGET=report`` (Colab's line, whose older jax costs more per
    file) only reports them."""
    return os.environ.get("TPU_COURSE_CPU_BUDGET", "enforce") != "report"


def pytest_sessionfinish(session, exitstatus):
    if (not _is_worker(session.config) and enforced() and over_budget(_cpu, BUSY_MARGIN)
            and exitstatus == 0):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _is_worker(terminalreporter.config):
        return
    if _times:
        terminalreporter.section("notebook times")
        for path, seconds in sorted(_times.items()):
            budget = NOTEBOOK_BUDGETS_S.get(path, NOTEBOOK_BUDGET_S)
            flag = f"  OVER ITS {budget / 60:.0f}-MINUTE BUDGET" if seconds > budget else ""
            terminalreporter.write_line(f"{seconds:7.1f} s  {path} ({_cpu[path]:.0f} CPU-s)"
                                        f"{flag}")
    files = {p: s for p, s in _cpu.items() if budget_cpu_s(p) is not None}
    if _cpu and os.environ.get("TPU_COURSE_CPU_REPORT"):  # every file's CPU-s, as JSON
        pathlib.Path(os.environ["TPU_COURSE_CPU_REPORT"]).write_text(
            json.dumps(dict(sorted(_cpu.items(), key=lambda kv: -kv[1])), indent=1))
    if files:
        terminalreporter.section("CPU-seconds per test file")
        top = sorted(files.items(), key=lambda kv: -kv[1])[:10]
        for path, seconds in top:
            terminalreporter.write_line(f"{seconds:7.1f} CPU-s  {path}")
        terminalreporter.write_line(f"{sum(files.values()):7.1f} CPU-s  in all: {len(files)} "
                                    f"file(s), the costliest above")
        failing = set(over_budget(_cpu, BUSY_MARGIN)) if enforced() else set()
        for line in over_budget(_cpu):
            said = ("FAILED (CPU budget)" if line in failing else
                    "over budget (within the busy-machine margin)" if enforced() else
                    "over budget (reported on this line)")
            terminalreporter.write_line(f"{said} {line}: make it cheaper "
                                        "(share what its tests recompute)", red=True)
