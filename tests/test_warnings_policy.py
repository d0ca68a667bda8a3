"""The warnings policy: upstream deprecations fail, wherever they are attributed.

The notebook route is the one that matters most and is the easiest to lose: nbval's
kernels are separate processes. These tests run a fresh Python as a kernel would be run
(the environment inherited, ``tpu_course`` imported by the notebook) and plant a
deprecation from a jax-like module, raised with ``stacklevel=2`` as jax does, so that it
is attributed to the caller.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from tpu_course import warnings_policy

PLANT = textwrap.dedent("""
    import sys, types, warnings
    fake = types.ModuleType("jax_like")
    exec('''
    import warnings
    def old_api():
        warnings.warn("jax_like.old_api is deprecated; use new_api", DeprecationWarning,
                      stacklevel=2)
        return 1
    ''', fake.__dict__)
    sys.modules["jax_like"] = fake
    import tpu_course  # what a notebook's banner cell does
    try:
        fake.old_api()
    except DeprecationWarning as err:
        print("FAILED:", err)
    else:
        print("PASSED")
""")


def _run(code: str, strict: bool | str) -> str:
    env = {k: v for k, v in os.environ.items() if k != warnings_policy.ENV_VAR}
    if strict:
        env[warnings_policy.ENV_VAR] = "1" if strict is True else strict
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_deprecation_attributed_to_the_caller_fails_where_the_policy_is_on():
    assert _run(PLANT, strict=True) == "FAILED: jax_like.old_api is deprecated; use new_api"


def test_yes_turns_the_policy_on_as_1_does():
    assert _run(PLANT, strict="yes") == "FAILED: jax_like.old_api is deprecated; use new_api"


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("TRUE", True), (" on ", True),
                                       ("0", False), ("", False), ("off", False), ("No", False)])
def test_the_variable_reads_the_usual_words_for_on_and_off(value, on):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these is worth a warning
        assert warnings_policy.requested(value) is on


def test_a_value_that_is_neither_is_named_in_a_warning_and_leaves_the_policy_off():
    with pytest.warns(warnings_policy.PolicyVariableWarning,
                      match=r"TPU_COURSE_STRICT_WARNINGS='2' is not understood, so the warnings "
                            r"policy stays off: set it to 1 / true / yes / on"):
        assert warnings_policy.requested("2") is False


def test_without_the_variable_importing_tpu_course_changes_no_filter():
    assert _run(PLANT, strict=False) == "PASSED"


def test_the_test_process_has_the_policy_and_the_variable_for_kernels():
    assert os.environ.get(warnings_policy.ENV_VAR) == "1"  # set by conftest.py
    with pytest.raises(FutureWarning):
        warnings.warn("a jax API will change", FutureWarning, stacklevel=2)


def test_allowed_entries_are_ignored_and_everything_else_is_not(monkeypatch):
    entry = warnings_policy.Allowed(DeprecationWarning, r"known upstream thing",
                                    "a test entry")
    monkeypatch.setattr(warnings_policy, "ALLOWED", (entry,))
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings_policy.install()
        warnings.warn("Known upstream thing is deprecated", DeprecationWarning, stacklevel=1)
        with pytest.raises(DeprecationWarning):
            warnings.warn("something else is deprecated", DeprecationWarning, stacklevel=1)
    assert warnings_policy.pytest_filters()[-1] == "ignore:known upstream thing:DeprecationWarning"


def test_pytest_accepts_every_filter_line():
    from _pytest.config import parse_warning_filter

    for line in warnings_policy.pytest_filters():
        parse_warning_filter(line, escape=False)
    for entry in warnings_policy.ALLOWED:
        assert entry.reason.strip(), f"{entry.message!r} needs a reason"
