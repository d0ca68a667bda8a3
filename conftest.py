"""Repository-wide pytest hooks: the warnings policy, and notebook times under nbval.

* Deprecation and future warnings fail the run (``tpu_course.warnings_policy``): its
  filters become pytest ``filterwarnings`` lines here, and ``TPU_COURSE_STRICT_WARNINGS=1``
  is set so that the notebook kernels nbval starts (separate processes, which inherit
  this environment) install the same policy when the notebook imports ``tpu_course``.
* nbval runs each notebook cell as one test item; this sums the items of each notebook
  so the CI log shows one line per notebook, against the course's 2-minute budget.
"""

from __future__ import annotations

import collections
import os

from tpu_course import warnings_policy

NOTEBOOK_BUDGET_S = 120.0
_times: dict[str, float] = collections.defaultdict(float)


def pytest_configure(config):
    os.environ[warnings_policy.ENV_VAR] = "1"
    for line in warnings_policy.pytest_filters():
        config.addinivalue_line("filterwarnings", line)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _times[path] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _times:
        return
    terminalreporter.section("notebook times")
    for path, seconds in sorted(_times.items()):
        flag = "  OVER THE 2-MINUTE BUDGET" if seconds > NOTEBOOK_BUDGET_S else ""
        terminalreporter.write_line(f"{seconds:7.1f} s  {path}{flag}")
