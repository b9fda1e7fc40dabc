"""Episodes with several lineages: a call joins the open sequence its prompt extends, one that extends none starts
a new lineage (`Trajectory.lineages`, `Trajectory.to_sequences`)."""

from __future__ import annotations

import itertools

from fullasync.sim.trainer import sequence_tokens
from fullasync.types import PROMPT_VERSION, FinishReason, ModelCall, Trajectory

_logprobs = itertools.count(1)


def call(prompt, output, version=0) -> ModelCall:
    """A call whose log-probs are distinct over the whole module (a misplaced one cannot match by chance)."""
    return ModelCall(prompt_ids=tuple(prompt), output_ids=tuple(output),
                     output_logprobs=tuple(-0.01 * next(_logprobs) for _ in output),
                     output_versions=(version,) * len(output), finish_reason=FinishReason.STOP)


def trained(sequence):
    """(token ids, log-probs, versions) of the sequence's loss-masked tokens."""
    rows = [(t, lp, v) for t, lp, v, m in zip(sequence.token_ids, sequence.logprobs, sequence.versions,
                                              sequence.loss_mask, strict=True) if m]
    return tuple(tuple(column) for column in zip(*rows, strict=True)) if rows else ((), (), ())


def outputs(*calls):
    """What the sequence of `calls` must train: their outputs, log-probs and versions, in order."""
    return (tuple(t for c in calls for t in c.output_ids), tuple(lp for c in calls for lp in c.output_logprobs),
            tuple(v for c in calls for v in c.output_versions))


# A parent agent (system prompt 1 2 3) hands a task to a sub-agent (its own prompt 50 51) and the two take turns.
A1 = call([1, 2, 3], [10, 11], version=0)
B1 = call([50, 51], [60], version=0)
A2 = call([*A1.all_ids, 90], [12, 13], version=1)  # 90: the sub-agent's first report, inserted as a tool result
B2 = call([*B1.all_ids, 91], [61, 62], version=1)  # 91: a tool result of the sub-agent's own
INTERLEAVED = (A1, B1, A2, B2)


def test_interleaved_parent_and_sub_agent_calls_train_as_two_sequences():
    trajectory = Trajectory(INTERLEAVED, reward=1.0)
    assert trajectory.lineages() == ((0, 2), (1, 3))
    parent, sub_agent = trajectory.to_sequences()
    assert parent.token_ids == (1, 2, 3, 10, 11, 90, 12, 13)
    assert parent.loss_mask == (0, 0, 0, 1, 1, 0, 1, 1)
    assert parent.versions == (PROMPT_VERSION,) * 3 + (0, 0, PROMPT_VERSION, 1, 1)
    assert parent.prompt_length == 3
    assert sub_agent.token_ids == (50, 51, 60, 91, 61, 62)
    assert sub_agent.loss_mask == (0, 0, 1, 0, 1, 1)
    assert sub_agent.prompt_length == 2
    assert trained(parent) == outputs(A1, A2)
    assert trained(sub_agent) == outputs(B1, B2)


def test_a_compacted_context_extends_nothing_and_starts_a_third_lineage():
    summary = call([1, 2, 3, 95], [14], version=2)  # the parent's history replaced by a summary (95)
    after = call([*summary.all_ids, 92], [15], version=2)  # the parent goes on in the compacted context
    b3 = call([*B2.all_ids, 93], [63], version=2)
    trajectory = Trajectory((*INTERLEAVED, summary, b3, after), reward=0.0)
    assert trajectory.lineages() == ((0, 2), (1, 3, 5), (4, 6))
    parent, sub_agent, compacted = trajectory.to_sequences()
    assert trained(parent) == outputs(A1, A2)
    assert trained(sub_agent) == outputs(B1, B2, b3)
    assert compacted.token_ids == (1, 2, 3, 95, 14, 92, 15) and compacted.prompt_length == 4
    assert trained(compacted) == outputs(summary, after)


def test_a_fork_of_a_shared_prefix_starts_a_lineage_that_trains_only_its_own_tokens():
    first = call([*A1.all_ids, 96], [20])  # extends A1: joins its lineage
    second = call([*A1.all_ids, 97], [21, 22])  # extends A1 too, but A1's lineage has grown past it: a fork
    on_first = call([*first.all_ids, 98], [23])
    trajectory = Trajectory((A1, first, second, on_first), reward=1.0)
    assert trajectory.lineages() == ((0, 1, 3), (2,))
    main, fork = trajectory.to_sequences()
    assert trained(main) == outputs(A1, first, on_first)
    assert fork.token_ids == (*A1.all_ids, 97, 21, 22) and fork.prompt_length == len(A1.all_ids) + 1
    assert trained(fork) == outputs(second)  # A1's tokens are the fork's context, trained once (in `main`)


def test_a_call_joins_the_longest_context_it_extends_and_the_earliest_among_equal_ones():
    one, two = call([1], [2]), call([1], [2])  # two samples of one prompt: two lineages of equal contexts
    both = call([1, 2, 3], [4])  # extends both: the earliest
    longer = call([1, 2, 3, 4, 5], [6])  # extends the first (now [1 2 3 4]) and the second ([1 2]): the longest
    second_only = call([1, 2, 7], [8])
    trajectory = Trajectory((one, two, both, longer, second_only), reward=0.0)
    assert trajectory.lineages() == ((0, 2, 3), (1, 4))
    first, second = trajectory.to_sequences()
    assert trained(first) == outputs(one, both, longer)
    assert trained(second) == outputs(two, second_only)


def test_every_sampled_token_is_trained_once_and_the_simulator_counts_what_is_built():
    summary = call([1, 2, 3, 95], [14])
    for calls in (INTERLEAVED, (A1, B1, summary, A2, B2), (B1, A1, B2, A2)):
        trajectory = Trajectory(calls, reward=0.0)
        sequences = trajectory.to_sequences()
        assert sorted(t for s in sequences for t in trained(s)[0]) == sorted(t for c in calls for t in c.output_ids)
        assert sequence_tokens(trajectory) == sum(len(s.token_ids) for s in sequences)
        first_calls = [lineage[0] for lineage in trajectory.lineages()]
        assert first_calls == sorted(first_calls)  # sequences in the order of their first call
