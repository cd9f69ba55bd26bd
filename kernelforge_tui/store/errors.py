"""The store's errors: each one line for the user, saying what went wrong and what to do."""

from kernelforge_tui.errors import BadInput


class StoreError(BadInput):
    """A run directory that cannot be opened or used as asked: the message says why and what to do."""


class UnknownNode(StoreError, LookupError):
    """A node id the run does not hold."""


class UnreadableRecord(StoreError):
    """A stored record (a profile) that no longer reads as its model: written by another kernelforge version."""
