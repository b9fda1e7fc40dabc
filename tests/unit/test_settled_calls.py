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


def test_a_request_that_carries_a_doubtful_answer_rewritten_goes_on_from_it():
    """smolagents cuts its reply at its stop word and strips it before sending it back, and sends a tool call back as
    text of its own: the client renders that turn afresh, so the next prompt continues the call's prompt with the
    answer's first tokens but not all of them (the stop word's, the EOS). That request went on from the answer: it
    is trained, though its harness also asked the same prompt again (a sub-agent, a retry that raced it)."""
    prompt, answer = (1, 2), (7, 8, 9, 31, 32)  # 31, 32: the stop word, cut from what the harness sends back
    for by_request in (True, False):
        episode = Episode("e")
        used = recorded(episode, call(prompt, answer), doubtful=True)  # a stream hung up on after its finish
        asked_again = recorded(episode, call(prompt, (5, 6)))
        carried = (*prompt, 7, 8, 9, 40, 3)  # its text up to the stop word, then the template's turn end
        if by_request:
            episode.went_on(carried)  # answered or not
            assert episode.settled_calls() == [used, asked_again]
        else:
            went_on = recorded(episode, call(carried, (4,)))
            assert episode.settled_calls() == [used, asked_again, went_on]


def test_a_rewritten_turn_goes_on_from_the_answer_it_shares_most_with_and_a_tie_shows_nothing():
    """The harness hung up on the first answer, asked again, and went on from the second, rewritten: the first is
    still left out, though both answers start alike. Where the rewritten turn is as close to either, nothing shows
    which answer the harness used: the doubtful one is left out, as before."""
    prompt = (1, 2)
    episode = Episode("e")
    ignored = recorded(episode, call(prompt, (7, 8, 9, 3)), doubtful=True)
    asked_again = recorded(episode, call(prompt, (7, 8, 6, 6, 3)))
    went_on = recorded(episode, call((*prompt, 7, 8, 6, 40, 3), (4,)))  # the second's text, cut
    assert episode.settled_calls() == [asked_again, went_on]
    tie = Episode("f")
    ignored = recorded(tie, call(prompt, (7, 8, 9, 3)), doubtful=True)
    asked_again = recorded(tie, call(prompt, (7, 8, 6, 3)))
    edited = recorded(tie, call((*prompt, 7, 8, 40, 3), (4,)))  # the harness rewrote the turn past the shared start
    assert tie.settled_calls() == [asked_again, edited] and ignored not in tie.settled_calls()
    fresh = Episode("g")
    doubted = recorded(fresh, call(prompt, (7,)), doubtful=True)
    recorded(fresh, call(prompt, (5,)))  # the same prompt again: an empty continuation is not going on
    fresh.went_on(prompt)
    assert doubted not in fresh.settled_calls()
