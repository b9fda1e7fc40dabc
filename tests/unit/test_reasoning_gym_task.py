"""data.task=reasoning_gym:...: reasoning-gym's own generators and scorers (the released package, offline) as a task.

The spec (one generator, a weighted mixture, reasoning-gym's composite YAML) and its refusals; the rows (fixed,
plain JSON, held-out questions never training ones, the mixture's shares); the episode through the real client
(SmolLM2's tokenizer, a scripted engine) scored by the generator's own scorer; and the per-task split of the step's
rewards, the step line and the held-out score. And the built-in arithmetic task, which `data.task` builds in the same
place, asking the model by the run's served name.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from scripted_engine import ScriptedEngine, chat_tokenizer, script_texts

from fullasync.client import ClientConfig, RolloutService
from fullasync.config import RunConfig
from fullasync.observe.metrics import format_line, reward_stats
from fullasync.run.validation import ValidationResult
from fullasync.tasks import reasoning_gym
from fullasync.tasks.catalog import built_task
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup, row_task

pytest.importorskip("reasoning_gym", reason="make setup-environments installs reasoning-gym")  # make test has it

MIXTURE = "chain_sum*3+leg_counting"


@pytest.fixture(scope="module")
def task() -> reasoning_gym.ReasoningGymTask:
    return reasoning_gym.ReasoningGymTask(reasoning_gym.parse_spec(MIXTURE), 400, 60)


def test_a_spec_names_one_generator_or_a_weighted_mixture():
    assert reasoning_gym.parse_spec("chain_sum").generators == (reasoning_gym.Generator("chain_sum", 1.0),)
    spec = reasoning_gym.parse_spec(" chain_sum*2.5 + leg_counting ")
    assert [(g.name, g.weight) for g in spec.generators] == [("chain_sum", 2.5), ("leg_counting", 1.0)]


@pytest.mark.parametrize(("spec", "says"), [
    ("chain_summ", "no generator 'chain_summ'; did you mean chain_sum"),
    ("chain_sum*0", "weight 0.0 must be > 0"),
    ("chain_sum*two", "weight 'two' is not a number"),
    ("chain_sum+chain_sum", "named twice"),
    ("chain_sum+", "name a generator"),
    ("missing.yaml", "no composite config at missing.yaml"),
])
def test_a_wrong_spec_is_refused_saying_what_is_wrong(spec, says):
    with pytest.raises(ValueError, match=says.replace("*", r"\*").replace(".", r"\.")):
        reasoning_gym.parse_spec(spec)


def test_reasoning_gyms_composite_yaml_gives_the_generators_their_settings_size_and_seed(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text("size: 30\nseed: 5\ndatasets:\n"
                    "  - {name: chain_sum, weight: 1, config: {min_terms: 2, max_terms: 2, min_digits: 1, "
                    "max_digits: 1}}\n  - {name: leg_counting, weight: 1, config: {}}\n")
    spec = reasoning_gym.parse_spec(str(path))
    assert spec.size == 30 and spec.seed == 5 and spec.generators[0].config["max_terms"] == 2
    made = reasoning_gym.ReasoningGymTask(spec, 1000, 5)
    rows = made.rows("train")
    assert len(rows) == 30  # the YAML's size replaces data.task_rows
    sums = [row for row in rows if row["task"] == "chain_sum"]
    assert sums and all(len(row["question"].split(":")[-1].split()) == 4 for row in sums)  # "a ± b =": two terms
    (tmp_path / "bad.yaml").write_text("size: 3\n")
    with pytest.raises(ValueError, match="needs `datasets:`"):
        reasoning_gym.parse_spec(str(tmp_path / "bad.yaml"))


def test_each_held_out_question_comes_once_and_a_generator_too_small_for_the_rows_asked_is_refused(tmp_path):
    """Two one-digit terms make 200 questions: 150 training draws hold ~107 of them, and the held-out rows are
    drawn from the rest, each once (a question twice would count as two rows in the held-out standard error)."""
    path = tmp_path / "sums.yaml"
    path.write_text("datasets:\n  - {name: chain_sum, config: {min_terms: 2, max_terms: 2, min_digits: 1, "
                    "max_digits: 1}}\n")
    spec = reasoning_gym.parse_spec(str(path))
    made = reasoning_gym.ReasoningGymTask(spec, 150, 60)
    train = {row["question"] for row in made.rows("train")}
    held_out = [row["question"] for row in made.rows("val")]
    assert len(held_out) == len(set(held_out)) == 60 and not train & set(held_out)
    with pytest.raises(ValueError, match=r"made only \d+ distinct held-out questions that are not training "
                                         r"questions, of 90 asked; lower data.task_val_rows or data.task_rows"):
        reasoning_gym.ReasoningGymTask(spec, 150, 90)


def test_the_rows_are_fixed_plain_and_the_held_out_questions_are_never_training_ones(task):
    train, val = task.rows("train"), task.rows("val")
    assert len(train) == 400 and len(val) == 60
    again = reasoning_gym.ReasoningGymTask(reasoning_gym.parse_spec(MIXTURE), 400, 60)
    assert again.rows("train") == train and again.rows("val") == val  # the same rows on every machine
    assert json.loads(json.dumps(train)) == train and set(train[0]) == {"id", "task", "question", "answer"}
    assert len({row["id"] for row in train + val}) == 460
    assert not {row["question"] for row in train} & {row["question"] for row in val}
    assert len({row["question"] for row in val}) == len(val)  # each held-out question once
    shares = Counter(row["task"] for row in train)
    assert set(shares) == {"chain_sum", "leg_counting"} and 0.65 < shares["chain_sum"] / 400 < 0.85  # 3:1
    with pytest.raises(ValueError, match="split must be"):
        task.rows("test")


def test_the_generators_own_scorers_score_the_last_answer_tag(task):
    by_task = {row["task"]: row for row in task.rows("val")}
    for row in by_task.values():
        assert task.score(f"I think... <answer>{row['answer']}</answer>", row) == 1.0
        assert task.score(f"<answer>{row['answer']}</answer> no, <answer>-1</answer>", row) == 0.0
        assert task.score(row["answer"], row) == 0.0  # no tag: the scorer sees no answer
        assert task.score(None, row) == 0.0
    with pytest.raises(KeyError, match="not one of this task's rows"):
        task.score("<answer>1</answer>", {"id": "elsewhere"})


async def test_an_episode_asks_under_reasoning_gyms_prompt_and_is_scored_through_the_real_client(task):
    tokenizer = chat_tokenizer()
    engine = ScriptedEngine()
    service = RolloutService([engine], tokenizer, ClientConfig(model_name="policy", max_model_len=2048))
    row = next(row for row in task.rows("train") if row["task"] == "leg_counting")
    script_texts(engine, tokenizer, f"Count them.\n<answer>{row['answer']}</answer>", "<answer>0</answer>")
    rewards = []
    for _ in range(2):
        client = service.client()
        rewards.append(await task.rollout_fn(client, row))
        (call,) = client.episode.calls
        prompt = tokenizer.decode(call.prompt_ids)
        assert "<answer>answer here</answer>" in prompt and row["question"].strip() in prompt
        client.close()
    assert rewards == [1.0, 0.0]
    assert engine.requests[0].max_tokens == 2048 - len(engine.requests[0].prompt_ids)  # to the context's end


def test_data_task_builds_the_rows_and_names_the_served_model():
    config = RunConfig()
    config.data.task, config.data.task_rows, config.data.task_val_rows = "reasoning_gym:leg_counting", 12, 4
    config.model.served_name, config.data.task_prompt = "mine", "simple"
    built = built_task(config)
    assert built is not None and len(built.train_rows) == 12 and len(built.val_rows) == 4
    assert built.rollout_fn.__self__.model == "mine"
    assert built.rollout_fn.__self__.system_prompt.startswith("You are a helpful assistant")
    config.data.task = "reasoning-gym:leg_counting"
    with pytest.raises(ValueError, match="is not a task; use arithmetic | reasoning_gym:"):
        built_task(config)
    config.data.task = ""
    assert built_task(config) is None


def test_the_system_prompt_is_one_of_reasoning_gyms_by_name_or_the_users_text():
    spec = reasoning_gym.parse_spec("leg_counting")
    direct = reasoning_gym.ReasoningGymTask(spec, 2, 0, prompt="direct").system_prompt
    assert direct.startswith("Answer the question directly") and "<answer>" in direct
    assert reasoning_gym.ReasoningGymTask(spec, 2, 0, prompt="Reply in tags.").system_prompt == "Reply in tags."
    with pytest.raises(ValueError, match="data.task_prompt is empty: name one of .*direct"):
        reasoning_gym.ReasoningGymTask(spec, 2, 0, prompt=" ")


async def test_the_built_in_arithmetic_task_asks_the_model_by_its_served_name():
    tokenizer = chat_tokenizer()
    engine = ScriptedEngine()
    service = RolloutService([engine], tokenizer, ClientConfig(model_name="mine", max_model_len=512))
    config = RunConfig()
    config.model.served_name = "mine"
    built = built_task(config)
    assert built is not None
    row = built.val_rows[0]
    script_texts(engine, tokenizer, str(row["answer"]))
    client = service.client()
    assert await built.rollout_fn(client, row) == 1.0  # "policy" would be an unknown model here
    client.close()


def _group(task: str | None, *rewards: float) -> TrajectoryGroup:
    call = ModelCall(prompt_ids=(1,), output_ids=(2,), output_logprobs=(-0.1,), output_versions=(0,),
                     finish_reason=FinishReason.STOP)
    return TrajectoryGroup("r", tuple(Trajectory((call,), reward) for reward in rewards),
                           metadata={"task": task} if task else {})


def test_a_rows_task_name_splits_the_steps_rewards_and_the_step_line_names_them():
    assert row_task({"task": "chain_sum"}) == "chain_sum" and row_task({"task": "Fix the bug in foo.py"}) is None
    assert row_task({"task": "x" * 65}) is None and row_task("chain_sum") is None and row_task({}) is None
    stats = reward_stats([_group("chain_sum", 1.0, 0.0), _group("leg_counting", 1.0, 1.0), _group(None, 0.0, 0.0)])
    assert stats["reward/mean"] == 0.5
    assert stats["reward/task/chain_sum"] == 0.5 and stats["reward/task/leg_counting"] == 1.0
    assert "reward 0.500 ± 0.500 (chain_sum 0.50 leg_counting 1.00) | staleness" in format_line(3, stats)
    assert "(" not in format_line(3, reward_stats([_group(None, 1.0)])).split("|")[1]
    many = {f"reward/task/t{i}": 0.0 for i in range(8)}
    assert "t5 0.00 +2 more)" in format_line(1, {"reward/mean": 0.0, **many})


def test_the_held_out_score_is_split_by_the_tasks_the_rows_name():
    result = ValidationResult(0.5, 6, 0, None, ((1.0, 1.0), (0.0, 1.0), (0.0, 0.0)), ("a", "b", None))
    assert result.evaluation().metrics == {"episodes": 6.0, "task/a": 1.0, "task/b": 0.5}
