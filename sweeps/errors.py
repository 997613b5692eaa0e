"""The one error type of the sweep layer: bad flags, impossible resource requests."""


class SweepError(ValueError):
    """A sweep cannot start as asked; the message names the value and what is allowed."""
