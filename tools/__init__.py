"""Authoring tools for the course (not shipped in the learner package): `python -m tools.notebooks`."""

#: The setup cell's tag: ``tools.notebooks`` writes it; the slides, the website
#: (docs/_ext/course_site.py) and the workshop's reading times leave that cell out.
SETUP_TAG = "course-setup"
