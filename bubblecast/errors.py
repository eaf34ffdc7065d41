"""Errors that mean "bad input": the command line turns them into exit code 2."""


class BubblecastError(ValueError):
    """A user-facing error with a one-line message (no traceback is ever shown for it)."""
