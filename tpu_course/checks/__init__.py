"""Lab checkers, one sub-module per chapter (``checks.ch01`` ... ``checks.ch06``).

Every checker returns a :class:`CheckResult`: truthy when the answer is right, with a
message that says what was expected and what came back when it is not. In a notebook the
result renders as a coloured line; ``assert_passed`` turns a failure into an exception.
"""

from tpu_course.checks._core import CheckResult, close_enough, fail, ok

__all__ = ["CheckResult", "close_enough", "fail", "ok"]
