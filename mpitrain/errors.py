"""Errors a user can fix (bad input, bad config); caught only at the CLI edge."""


class MpitrainError(Exception):
    """A problem with the user's input: printed as one line, no traceback."""


class ConfigError(MpitrainError):
    """An invalid config key or value."""


class DataError(MpitrainError):
    """A missing, corrupt or inconsistent dataset file."""
