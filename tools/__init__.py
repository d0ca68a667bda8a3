"""Authoring tools for the course (not shipped in the learner package): `python -m tools.notebooks`."""
