"""A training episode's reward given after it ended by the run's judge (`reward_fn(judge, row, trajectory)`,
`CustomGenerator.reward`), and the judge's answer read as a score (`BesideClient.score`).

The control code is real (Rollouter, its ledger and failure log, StalenessManager, MessageQueue, BesideClient with
its retries and counts); the policy's engine is the simulator's; the judge is the test's: a backend answering the
texts each test scripts, recording what it was asked.
"""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletion
from sim_rollouts import rows_through_a_rollouter

from fullasync.client.beside import BesideClient, BesideModelError, JudgeScoreError, RemoteModel, last_number
from fullasync.errors import FailureKind
from fullasync.rollout.generator import CustomGenerator, as_generator
from fullasync.rollout.rollouter import RolloutSettings, RowOutcome

N = 4


class ScriptedJudge:
    """A judge backend: answers `texts` in turn (the last one from then on); keeps every request."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.asked: list[dict] = []

    async def create(self, **request: object) -> ChatCompletion:
        self.asked.append(request)
        text = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
        return ChatCompletion.model_validate({
            "id": "j", "object": "chat.completion", "created": 0, "model": "judge",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})

    def metrics(self) -> dict[str, float]:
        return {}

    async def close(self) -> None:
        return None


def judge_client(backend: ScriptedJudge, score_retries: int = 2) -> BesideClient:
    return BesideClient("judge", RemoteModel("http://127.0.0.1:9/v1", "judge", backoff_s=0.0,
                                             score_retries=score_retries), backend)


async def answers(client, row) -> float:
    """An episode of 4 sampled tokens whose own reward is 1 (the judge's must replace it)."""
    await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=4, extra_body={"ignore_eos": True})
    return 1.0


async def judged(judge, row, trajectory) -> float:
    """Asks the judge about the row and the episode's answer, and reads its score out of 10."""
    (call,) = trajectory.calls
    return await judge.score([{"role": "user", "content": f"{row['question']} answered with "
                                                           f"{len(call.output_ids)} tokens: score 0-10"}]) / 10


def run_rows(generator, count: int, judge: BesideClient, infra_retries: int = 2):
    settings = RolloutSettings(n=N, max_running_rows=2, episode_timeout_s=1e6, infra_retries=infra_retries)
    rollouter, groups = rows_through_a_rollouter(generator, settings,
                                                 ((f"row-{i}", {"question": f"q{i}"}) for i in range(count)),
                                                 beside={"judge": judge})
    return dict(rollouter.outcomes), {g.row_id: g for g in groups}, rollouter.ledger.failures


def test_each_training_episode_gets_the_judges_score_and_keeps_its_own_reward_beside_it():
    backend = ScriptedJudge("The answer is fine. Score: 7")
    outcomes, groups, failures = run_rows(as_generator(answers, reward_fn=judged), 3, judge_client(backend))
    assert set(outcomes.values()) == {RowOutcome.QUEUED} and failures.count == 0
    for group in groups.values():
        assert [t.reward for t in group.trajectories] == pytest.approx([0.7] * N)
        assert [t.metadata["episode_reward"] for t in group.trajectories] == [1.0] * N
    assert len(backend.asked) == 3 * N  # once per episode, about its own row and answer
    assert {request["messages"][0]["content"] for request in backend.asked} == {
        f"q{i} answered with 4 tokens: score 0-10" for i in range(3)}


def test_an_answer_with_no_score_is_asked_again_and_counted():
    backend = ScriptedJudge("I cannot decide.", "Hmm.", "score: 3")
    judge = judge_client(backend, score_retries=2)
    outcomes, groups, failures = run_rows(as_generator(answers, reward_fn=judged), 1, judge)
    assert outcomes == {"row-0": RowOutcome.QUEUED} and failures.count == 0
    assert [t.reward for t in groups["row-0"].trajectories] == pytest.approx([0.3] * N)
    assert judge.metrics()["beside/judge/unscored"] == 2.0 and len(backend.asked) == N + 2


def test_a_judge_that_never_gives_a_score_is_the_infrastructures_failure_never_a_reward():
    judge = judge_client(ScriptedJudge("no score here"), score_retries=1)
    outcomes, groups, failures = run_rows(as_generator(answers, reward_fn=judged), 2, judge, infra_retries=1)
    assert outcomes == {"row-0": RowOutcome.FAILED, "row-1": RowOutcome.FAILED} and not groups  # nothing scored 0
    assert failures.kinds == {FailureKind.INFRA.value: 2 * N * 2} and failures.infra_retries == 2 * N  # run again
    assert failures.reasons == {"JudgeScoreError": 2 * N * 2}
    assert judge.metrics()["beside/judge/unscored"] == 2 * N * 2 * 2 and judge.metrics()["beside/judge/failures"] > 0


def test_a_reward_that_is_no_number_fails_its_episode_at_once_as_a_bug():
    async def wordy(judge, row, trajectory):
        return "high"

    outcomes, groups, failures = run_rows(as_generator(answers, reward_fn=wordy), 1, judge_client(ScriptedJudge("1")))
    assert outcomes == {"row-0": RowOutcome.FAILED} and not groups
    assert failures.kinds == {FailureKind.HARNESS.value: N} and failures.infra_retries == 0  # not run again
    assert "reward_fn returned 'high'" in failures.recent[-1].error


def test_a_generator_scores_its_episodes_by_overriding_reward():
    class Judged(CustomGenerator):
        async def generate(self, episode, row):
            return await answers(episode.client, row)

        async def reward(self, client, row, trajectory):
            return await client.judge.score([{"role": "user", "content": row["question"]}], parse=len)

    outcomes, groups, _ = run_rows(Judged(), 1, judge_client(ScriptedJudge("abcde")))
    assert [t.reward for t in groups["row-0"].trajectories] == [5.0] * N


def test_the_default_score_is_the_last_number_of_the_answer():
    assert last_number("Between 2 and 9 I give it 8.5") == 8.5
    assert last_number("score: -1") == -1.0
    assert last_number("no digits") is None
    assert issubclass(JudgeScoreError, BesideModelError)


def test_what_cannot_score_episodes_is_refused_before_anything_starts():
    """(A reward_fn in a run without a judge: tests/integration/test_config_components.py.)"""
    def not_async(judge, row, trajectory):
        return 1.0

    class Judged(CustomGenerator):
        async def generate(self, episode, row):
            return 0.0

        def reward(self, client, row, trajectory):  # not async
            return 1.0

    with pytest.raises(TypeError, match="reward_fn .* is not an async function"):
        as_generator(answers, reward_fn=not_async)
    with pytest.raises(TypeError, match="override its `async def reward"):
        as_generator(Judged(), reward_fn=judged)
    with pytest.raises(TypeError, match="Judged.reward must be `async def"):
        as_generator(Judged())
