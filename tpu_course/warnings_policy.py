"""Against API drift: deprecation and future warnings fail the tests and the notebook runs.

An API that jax, flax, optax or orbax is about to remove first warns, for a release or
two; a course that ignores the warning breaks in learners' notebooks when the API goes
(this is what broke the Flax guides, flax#5100, and other courses, jax-ai-stack#281). So
in CI every ``DeprecationWarning``, ``PendingDeprecationWarning`` and ``FutureWarning``
is an error, except the known ones listed in :data:`ALLOWED`, each with its reason.

Filters match on category and message, not on module: a warning raised with
``stacklevel`` is attributed to the *caller* (a notebook cell, a course module), so a
module filter would miss exactly the warnings that matter.

Where the policy applies (one list, two routes):

* the unit tests: ``conftest.py`` at the repository root turns :func:`pytest_filters`
  into pytest ``filterwarnings`` lines (so collection and every test see them);
* the notebooks under nbval, whose kernels are separate processes: the same
  ``conftest.py`` sets ``TPU_COURSE_STRICT_WARNINGS=1`` in the environment (the
  Makefile exports it too), kernels inherit it, and ``import tpu_course`` (every
  notebook's banner cell) then calls :func:`install`. ``true``, ``yes`` and ``on`` work
  as ``1`` does; a value that is neither on nor off is named in a warning. Without the
  variable, importing the package changes no warning filter.

To allow a new upstream warning (say on Colab's jax 0.7.2 / flax 0.11.2), add an
:class:`Allowed` entry below with the version it appears in and why it is not ours to fix.

>>> policy_lines = pytest_filters()
>>> policy_lines[0]
'error::DeprecationWarning'
"""

from __future__ import annotations

import dataclasses
import os
import warnings

#: The environment variable that turns the policy on in a process (and its kernels).
ENV_VAR = "TPU_COURSE_STRICT_WARNINGS"

#: What fails: the warnings an API gives before it changes or goes away.
ERROR_CATEGORIES: tuple[type[Warning], ...] = (
    DeprecationWarning, PendingDeprecationWarning, FutureWarning)


@dataclasses.dataclass(frozen=True)
class Allowed:
    """A known warning that is not the course's to fix, and why.

    ``message`` is a regular expression matched (case-insensitively) against the start
    of the warning's text; it must not contain ``:`` (pytest's filter syntax splits on
    it: write ``\\x3a`` instead).
    """

    category: type[Warning]
    message: str
    reason: str


#: The known upstream warnings that are allowed, each with its reason. Keep it short:
#: an entry is a debt with a date on it.
ALLOWED: tuple[Allowed, ...] = (
    Allowed(DeprecationWarning, r"'[A-Za-z_]+' (argument is )?deprecated[ ,-]+use '[a-z_]+'",
            "pyparsing >= 3.3 renamed its camelCase API; matplotlib 3.10 (Colab's) still calls "
            "it when it is imported (matplotlib 3.11 does not). Upstream, not the course's."),
    Allowed(DeprecationWarning, r"Kernel\._parent_header is deprecated in ipykernel 6",
            "ipywidgets 7.7.1 (Colab's) reads it whenever a widget is shown; ipywidgets 8 "
            "does not. Upstream, not the course's."),
    Allowed(PendingDeprecationWarning, r"For consistency across implementations, it is "
            r"recommended that `do_shutdown`",
            "ipykernel 7 warns about its own IPythonKernel when a kernel shuts down; as an "
            "error it stops the shutdown and the kernel is killed. Upstream, not the course's."),
    Allowed(UserWarning, r"Error reading persistent compilation cache entry",
            "CI turns JAX's persistent compilation cache on (Makefile); jax 0.7-0.12 cannot "
            "read back an executable compiled for a compile-only TPU topology, warns and "
            "compiles it again, which changes nothing but the notebook's stderr. Upstream."),
)


def install() -> None:
    """Turn the policy on in this process: the categories become errors, except ALLOWED."""
    for category in ERROR_CATEGORIES:
        warnings.filterwarnings("error", category=category)
    for entry in ALLOWED:  # installed last, so they take precedence
        warnings.filterwarnings("ignore", message=entry.message, category=entry.category)


#: What the variable may say (compared without case or surrounding spaces).
ON_VALUES = ("1", "true", "yes", "on")
OFF_VALUES = ("", "0", "false", "no", "off")


class PolicyVariableWarning(UserWarning):
    """``TPU_COURSE_STRICT_WARNINGS`` holds a value that is neither on nor off."""


def requested(value: str | None = None) -> bool:
    """Whether ``value`` (default: the environment's ``TPU_COURSE_STRICT_WARNINGS``) turns
    the policy on: ``1``, ``true``, ``yes`` or ``on`` (any case). Unset, empty, ``0``,
    ``false``, ``no`` or ``off`` leave it off; anything else leaves it off with a
    :class:`PolicyVariableWarning` that names the value and the ones understood.

    >>> requested("yes"), requested("ON "), requested("0"), requested("")
    (True, True, False, False)
    """
    value = os.environ.get(ENV_VAR, "") if value is None else value
    word = str(value).strip().lower()
    if word in ON_VALUES:
        return True
    if word not in OFF_VALUES:
        warnings.warn(
            f"{ENV_VAR}={value!r} is not understood, so the warnings policy stays off: set "
            f"it to {' / '.join(ON_VALUES)} to turn it on, or to 0 (or unset it) to leave it "
            "off.", PolicyVariableWarning, stacklevel=2)
    return False


def install_if_requested() -> bool:
    """:func:`install` when ``TPU_COURSE_STRICT_WARNINGS`` says so (:func:`requested`);
    says whether it did."""
    if requested():
        install()
        return True
    return False


def pytest_filters() -> list[str]:
    """The policy as pytest ``filterwarnings`` lines (later lines take precedence)."""
    lines = [f"error::{c.__name__}" for c in ERROR_CATEGORIES]
    for entry in ALLOWED:
        if ":" in entry.message:
            raise ValueError(f"ALLOWED message {entry.message!r} contains ':'; write \\x3a")
        category = entry.category
        name = (category.__name__ if category.__module__ == "builtins"
                else f"{category.__module__}.{category.__qualname__}")
        lines.append(f"ignore:{entry.message}:{name}")
    return lines
