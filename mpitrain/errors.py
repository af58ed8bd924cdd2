"""Errors a user can fix (bad input, bad config); caught only at the CLI edge."""


class MpitrainError(Exception):
    """A problem with the user's input: printed as one line, no traceback."""


class ConfigError(MpitrainError):
    """An invalid config key or value."""


class DataError(MpitrainError):
    """A missing, corrupt or inconsistent dataset file."""


def describe(error: OSError) -> str:
    """An operating-system error in a few words, for a one-line message: "Permission denied",
    "No space left on device" (its strerror), else its text (h5py's errors have no strerror)."""
    return error.strerror or str(error)
