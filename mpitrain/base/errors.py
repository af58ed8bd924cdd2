"""Errors a user can fix (bad input, bad config); caught only at the CLI edge."""
import os


class MpitrainError(Exception):
    """A problem with the user's input: printed as one line, no traceback."""


class ConfigError(MpitrainError):
    """An invalid config key or value."""


class DataError(MpitrainError):
    """A missing, corrupt or inconsistent dataset file."""


def describe(error: OSError) -> str:
    """An operating-system error in a few words, for a one-line message: "Permission denied", "No space
    left on device" (the words of its errno; h5py puts its own multi-line text where strerror belongs),
    else its text on one line."""
    return os.strerror(error.errno) if error.errno else " ".join(str(error).split())
