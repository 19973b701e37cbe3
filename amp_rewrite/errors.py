"""Errors that reach the user as one line."""


class UserError(Exception):
    """A mistake in the user's input or options: reported as one line, exit code 2."""
