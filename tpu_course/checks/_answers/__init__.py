"""The course's own answers to lab exercises, one module per chapter (``_answers.ch01``).

Only the checkers import them. They are private on purpose: an answer that is, or calls,
one of these (or the package helper that computes the same result) is refused by its
checker (``checks.refuse_course_code``), since the learner writes it.
"""
