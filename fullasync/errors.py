"""Errors a user of fullasync can catch; each message says what was wrong and how to fix it."""

from __future__ import annotations

import copy
import enum
from typing import TypeVar

E = TypeVar("E", bound=BaseException)

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's error code for a prompt + output past the context


class FullasyncError(Exception):
    """The base of every error fullasync raises for a user to handle: `except FullasyncError` catches them all.
    Each also keeps the built-in base it always had (ValueError, RuntimeError, ...), so older handlers still work."""


class InvalidRequestError(FullasyncError, ValueError):
    """A model call was malformed (bad messages, tools, parameters, unknown model, prompt too long).

    `param` names the offending request field and `code` is OpenAI's error code where it has one
    (`context_length_exceeded`), as the OpenAI API reports them.
    """

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class TrainerWorkerDiedError(FullasyncError, RuntimeError):
    """A trainer rank's process is gone; the message names the rank and the call. A run restarts its trainer
    from the newest complete checkpoint (`trainer.restart_on_failure`); it reaches the caller when out of restarts."""


class EngineDiedError(FullasyncError, RuntimeError):
    """An engine process is gone, or stopped making progress; the message names it."""


def again(error: E) -> E:
    """A fresh copy of `error` (same type, message and attributes, no traceback) to raise once more. An error kept and
    raised to every caller (a dead engine's, until its restart) would otherwise gather every raise's frames in one
    traceback, growing for as long as the engine stays dead."""
    return copy.copy(error)


class EngineResumeTimeoutError(FullasyncError, TimeoutError):
    """A generation was interrupted by a weight push and the engine did not resume in time."""


class WeightInstallError(FullasyncError, RuntimeError):
    """An engine could not install a weight version exactly as pushed (the transfer broke off, or it serves
    tensors other than those pushed); the message names the engine and the tensors."""


class WeightPushError(FullasyncError, RuntimeError):
    """A weight push could not be completed on every engine; the message names the engine and what to do."""


class InfraError(FullasyncError, RuntimeError):
    """Raise from a harness when infrastructure failed (a sandbox, a tool server, a container that would not start),
    not the harness and not the policy: the episode is generated again (bounded by rollout.infra_retries) and,
    meanwhile, left out of its group's statistics."""


class PolicyOutputError(InvalidRequestError):
    """The policy's own output made the episode impossible to go on (a tool call with no name that the harness
    echoed back, an action no parser reads): the episode is trained with the calls it made and
    rollout.failure_reward, so the policy learns not to do it. The client raises it for a request whose
    malformed part is an assistant turn it returned; a harness may raise it for an action it cannot parse."""


class FailureKind(str, enum.Enum):
    """Why an episode ended without a reward of its harness's."""

    HARNESS = "harness"  # the harness raised
    TIMEOUT = "timeout"  # the episode's own time ran out (rollout.episode_timeout_s, engine restarts not counted)
    INFRA = "infra"  # an engine died or stayed paused, or the harness raised InfraError: retried, never trained
    MODEL = "model"  # the policy's output broke the episode (PolicyOutputError): trained with failure_reward
    LENGTH = "length"  # the conversation outgrew the context (context_length_exceeded): trained with failure_reward

    @property
    def trained(self) -> bool:
        """The policy caused it: the episode is trained (with rollout.failure_reward) rather than dropped."""
        return self in (FailureKind.MODEL, FailureKind.LENGTH)
