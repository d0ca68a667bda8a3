"""The course's pytest plugin, loaded before any other (``-p tools.pytest_plugin`` in
pyproject.toml): nbformat, which nbval imports as pytest starts, without jsonschema's
URI grammar (3 CPU-seconds in every pytest process and xdist worker; see
:func:`tpu_course.checks.worker.skip_uri_grammar`)."""

from tpu_course.checks.worker import skip_uri_grammar

skip_uri_grammar()
