"""Which recorded calls an episode trains (`Episode.settled_calls`): a call whose answer's connection closed before
another request on it is doubtful (read, or thrown away unread: HTTP cannot tell); it is left out only when the
harness asked the same prompt again and never went on from it."""

from __future__ import annotations

from fullasync.client.episode import Episode, HeldCalls
from fullasync.types import FinishReason, ModelCall


def call(prompt: tuple[int, ...], output: tuple[int, ...]) -> ModelCall:
    return ModelCall(prompt_ids=prompt, output_ids=output, output_logprobs=(-1.0,) * len(output),
                     output_versions=(0,) * len(output), finish_reason=FinishReason.STOP)


def recorded(episode: Episode, made: ModelCall, doubtful: bool = False) -> ModelCall:
    held = HeldCalls(episode)
    held.calls.append(made)
    held.commit()
    held.doubt(doubtful)
    return made


def test_a_doubtful_call_asked_again_and_not_gone_on_from_is_left_out():
    episode = Episode("e")
    dropped = recorded(episode, call((1, 2), (7, 8)), doubtful=True)  # a stream hung up on, then asked again
    again = recorded(episode, call((1, 2), (9,)))
    assert episode.calls == [dropped, again] and episode.settled_calls() == [again]


def test_a_doubtful_call_that_a_later_call_goes_on_from_is_kept():
    episode = Episode("e")
    first = recorded(episode, call((1, 2), (7, 8)), doubtful=True)  # a fresh connection per call, closed after
    asked_again = recorded(episode, call((1, 2), (5,)))
    went_on = recorded(episode, call((1, 2, 7, 8, 3), (4,)))  # the harness used the first answer after all
    assert episode.settled_calls() == [first, asked_again, went_on]


def test_a_doubtful_call_nobody_asks_again_is_kept_and_a_new_delivery_lifts_the_doubt():
    episode = Episode("e")
    last = recorded(episode, call((1, 2), (7,)), doubtful=True)  # the episode's last answer, its client closed
    assert episode.settled_calls() == [last]
    other = Episode("f")
    held = HeldCalls(other)
    held.calls.append(call((1, 2), (9,)))
    held.commit()
    held.doubt(True)
    held.doubt(False)  # handed again to the SDK's retry, on a connection that stays open
    recorded(other, call((1, 2), (5,)))
    assert other.settled_calls() == other.calls


def test_a_request_that_goes_on_from_a_call_proves_it_received_even_if_that_request_fails():
    """Terminus-2 runs the first answer's command, whose output overflows the context: the request that goes on
    from the answer is refused (context_length_exceeded, nothing recorded), harbor summarises and starts a fresh
    context from the instruction — the first call's prompt again. The refused request showed the first answer
    was received, before or after its connection's close was seen."""
    for close_seen_first in (True, False):
        episode = Episode("e")
        first = call((1, 2), (7, 8))
        held = HeldCalls(episode)
        held.calls.append(first)
        held.commit()
        if close_seen_first:
            held.doubt(True)
        episode.went_on((1, 2, 7, 8, 9, 9, 9))  # the overflowing request, refused
        held.doubt(True)  # (or the close seen only now)
        fresh = recorded(episode, call((1, 2), (5,)))
        assert episode.settled_calls() == [first, fresh]
