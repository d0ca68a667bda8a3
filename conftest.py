"""Repository-wide pytest hooks: the warnings policy, and notebook times under nbval.

* Deprecation and future warnings fail the run (``tpu_course.warnings_policy``): its
  filters become pytest ``filterwarnings`` lines here, and ``TPU_COURSE_STRICT_WARNINGS=1``
  is set so that the notebook kernels nbval starts (separate processes, which inherit
  this environment) install the same policy when the notebook imports ``tpu_course``.
* nbval runs each notebook cell as one test item; this sums the items of each notebook
  so the CI log shows one line per notebook, against its budget: 2 minutes, and 3 for
  chapter 8, whose issue (28) sets it (a 100-step training run on 8 simulated devices).
* The files that take longest run first (``RUN_FIRST``), so that none is handed out last
  and runs alone while the other workers idle.
"""

from __future__ import annotations

import collections
import os

from tpu_course import warnings_policy

NOTEBOOK_BUDGET_S = 120.0
#: Notebooks with a budget of their own (path from the repository root: seconds).
NOTEBOOK_BUDGETS_S = {"notebooks/08_language_model.ipynb": 180.0}
_times: dict[str, float] = collections.defaultdict(float)

#: Longest first: the files that took longest under CI's load (2026-12-02, seconds of
#: wall time on the newest line: chapter 8 256, lab 5's checker tests ~170, chapter 5
#: 136, ...). Under ``--dist loadfile`` pytest-xdist hands out whole files in collection
#: order, which this sets (the Makefile passes ``--no-loadscope-reorder``: by default
#: xdist orders files by their number of items, which says little about their time: a
#: notebook is one item per cell). Files not named here follow in collection order.
RUN_FIRST = (
    "notebooks/08_language_model.ipynb", "tests/test_checks_ch05.py",
    "notebooks/05_first_model.ipynb", "tests/test_checks_ch06.py", "tests/test_grade.py",
    "tests/test_lm.py", "tests/test_train.py", "tests/test_checks_ch08.py",
    "tests/test_checks_ch03.py", "tests/test_checks_ch07.py",
    "solutions/05_first_model.ipynb", "notebooks/06_scaling_out.ipynb",
    "tests/test_parallel.py", "tests/test_setup_cell.py", "tests/test_doctor.py",
    "notebooks/07_pallas_kernels.ipynb", "tests/test_multihost.py",
    "solutions/07_pallas_kernels.ipynb", "solutions/08_language_model.ipynb",
    "notebooks/03_jax_for_pytorch_people.ipynb", "tests/test_checkpoints.py",
    "tests/test_runtime.py", "solutions/06_scaling_out.ipynb",
)


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


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(RUN_FIRST)}
    # a stable sort: each file's items keep their order, unnamed files theirs
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _times[path] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _times:
        return
    terminalreporter.section("notebook times")
    for path, seconds in sorted(_times.items()):
        budget = NOTEBOOK_BUDGETS_S.get(path, NOTEBOOK_BUDGET_S)
        flag = f"  OVER ITS {budget / 60:.0f}-MINUTE BUDGET" if seconds > budget else ""
        terminalreporter.write_line(f"{seconds:7.1f} s  {path}{flag}")
