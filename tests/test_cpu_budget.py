"""The suite holds each test file to a CPU budget (the root conftest.py; issue 39).

A file's CPU-seconds are its tests' (setup and teardown included), in the test process
and in the processes it waited for. Here a tiny test file, whose test burns CPU in a
child process, runs under that conftest with a budget of 0.05 s: the run fails and names
the file; with the real budget it passes.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytestmark = pytest.mark.stack_independent

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
conftest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conftest)

BURN = '''
import subprocess, sys

def test_burns_cpu_in_a_child():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)

def test_cheap():
    assert True
'''


@pytest.mark.parametrize("budget, fails", [(0.05, True), (30.0, False)])
def test_a_file_over_its_cpu_budget_fails_the_run(pytester, budget, fails):
    source = (ROOT / "conftest.py").read_text()
    pytester.makeconftest(source.replace("TEST_FILE_BUDGET_CPU_S = 30.0",
                                         f"TEST_FILE_BUDGET_CPU_S = {budget}"))
    pytester.makepyfile(test_burn=BURN)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=2)  # every test passed: the budget alone decides
    assert result.ret == (pytest.ExitCode.TESTS_FAILED if fails else pytest.ExitCode.OK)
    result.stdout.fnmatch_lines(["*CPU-seconds per test file*", "* CPU-s  test_burn.py"])
    if fails:
        result.stdout.fnmatch_lines(["FAILED (CPU budget) test_burn.py: * CPU-s, over its "
                                     "budget of 0 CPU-s*"])


def test_the_budget_and_its_exceptions():
    assert conftest.TEST_FILE_BUDGET_CPU_S == 30.0
    for path, allowed in conftest.OVER_BUDGET_CPU_S.items():  # each a real file, above 30
        assert (ROOT / path).is_file() and allowed > conftest.TEST_FILE_BUDGET_CPU_S, path
    assert conftest.budget_cpu_s("notebooks/08_language_model.ipynb") is None
    assert conftest.over_budget({"tests/test_x.py": 29.0}) == []
