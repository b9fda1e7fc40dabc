"""Errors a user of fullasync can catch; each message says what was wrong and how to fix it."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A model call was malformed (bad messages, tools, parameters, unknown model, prompt too long).

    `param` names the offending request field and `code` is OpenAI's error code where it has one
    (`context_length_exceeded`), as the OpenAI API reports them.
    """

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class EngineDiedError(RuntimeError):
    """An engine process is gone, or stopped making progress; the message names it."""


class EngineResumeTimeoutError(TimeoutError):
    """A generation was interrupted by a weight push and the engine did not resume in time."""
