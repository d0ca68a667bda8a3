"""Repository-wide pytest hooks: print how long each notebook took under nbval.

nbval runs each notebook cell as one test item; this sums the items of each notebook so
the CI log shows one line per notebook, against the course's 2-minute budget.
"""

from __future__ import annotations

import collections

NOTEBOOK_BUDGET_S = 120.0
_times: dict[str, float] = collections.defaultdict(float)


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
