"""User-facing errors.

Every error a user can cause (bad argument, bad checkpoint folder) is an `UnmaskError` whose
message names the offending value. The CLI prints it on one line and exits with status 2.
"""


class UnmaskError(ValueError):
    """A problem with user input or with a checkpoint folder, with a message naming the value;
    `param`, when set, is the parameter at fault (the server reports it as OpenAI's `param`)."""

    def __init__(self, message: str = "", param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class CheckpointError(UnmaskError):
    """A checkpoint folder is missing files, has unknown architecture, or mismatching tensors."""


class UnmaskWarning(UserWarning):
    """Input that was used but may not mean what the user intended (named in the message)."""
