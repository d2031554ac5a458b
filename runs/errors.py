"""Exceptions a task may raise to steer the executor."""


class PermanentError(Exception):
    """Raised by a task whose failure retrying cannot fix: the run goes `dead` at once."""
