"""Errors a job reports as one clear line (no stack trace from deep inside Spark)."""


class ClickevalError(Exception):
    """Base class: the message alone tells the user what is wrong and where."""


class ConfigError(ClickevalError):
    """A config key is unknown or its value is not allowed."""


class InputError(ClickevalError):
    """An input file cannot be read at all (missing, unreadable, not the declared format)."""
