"""The adapter's error: vLLM is missing, would not start, or a server answered wrongly."""

from draftsmith.artifacts.errors import UserError


class VllmError(UserError, RuntimeError):
    """vLLM is missing, would not start, or its server answered wrongly; the message says what to do."""
