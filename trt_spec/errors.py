"""The base of every error trt-spec raises on purpose (stdlib only: the Triton python models import it)."""


class TrtSpecError(Exception):
    """A failure a user can act on: its message is one line naming the problem and the fix (the CLI prints it so)."""
