"""A teacher's scores from a real vLLM engine (the shared one): prompt-scoring a sequence the engine sampled gives
back the log-probs it sampled with (the same weights, nothing pushed in between), its prefix cached or not; and a
teacher that cannot score the policy's sequences is refused before anything starts, in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fullasync.client.beside import RemoteModel, ServedModel
from fullasync.contracts.engine import GenerateRequest, SamplingOptions
from fullasync.launch.beside import run_teacher, served_engine_config
from fullasync.models import build_pretrained_model, with_chat_template
from fullasync.rollout.teacher import TeacherScorer
from fullasync.types import FinishReason, ModelCall, Trajectory


async def sampled(engine, request_id: str, prompt: tuple[int, ...]) -> ModelCall:
    result = await engine.generate(GenerateRequest(request_id, prompt, 12, SamplingOptions(temperature=1.0, seed=3,
                                                                                           ignore_eos=True)))
    return ModelCall(prompt, result.output_ids, result.output_logprobs, result.output_versions, FinishReason.LENGTH)


async def test_the_engines_prompt_scores_of_its_own_samples_are_its_sampling_log_probs(engine, tokenizer):
    prompt = tuple(tokenizer.encode("12+30="))
    first = await sampled(engine, "sample-a", prompt)
    follow_up = first.all_ids + tuple(tokenizer.encode(" and 5+5="))  # extends the first call: one lineage
    second = await sampled(engine, "sample-b", follow_up)
    other = await sampled(engine, "sample-c", tuple(tokenizer.encode("7+1=")))  # a lineage of its own
    scorer = TeacherScorer("teacher", [engine])
    scored = await scorer.score_trajectory(Trajectory((first, other, second), reward=1.0))
    for call in scored.calls:
        assert len(call.teacher_logprobs) == len(call.output_ids) == 12
        assert call.teacher_logprobs == pytest.approx(call.output_logprobs, abs=2e-4)
    assert scorer.stats.sequences == 2 and scorer.stats.tokens == len(second.all_ids) + len(other.all_ids)
    again = await scorer.score(second.all_ids)  # its whole prefix in the engine's cache by now
    start = len(first.prompt_ids) - 1  # `again` scores each token after the first
    assert again[start : start + 12] == pytest.approx(scored.calls[0].teacher_logprobs, abs=1e-5)
    assert again[len(second.prompt_ids) - 1 :] == pytest.approx(scored.calls[2].teacher_logprobs, abs=1e-5)


def test_a_teacher_that_cannot_score_the_policys_tokens_is_refused_saying_what_to_change(tiny_model_path):
    def teacher(**fields):
        return {"teacher": ServedModel(**{"path": tiny_model_path, "role": "teacher", "max_model_len": 512, **fields})}

    assert run_teacher({"judge": ServedModel(tiny_model_path)}, tiny_model_path, 512) is None
    assert run_teacher(teacher(), tiny_model_path, 512) == "teacher"
    with pytest.raises(ValueError, match=r"tokenizer is not the policy's \(vocabularies of"):
        run_teacher(teacher(path=str(build_pretrained_model("smollm2-135m-instruct"))), tiny_model_path, 512)
    templated = str(with_chat_template(tiny_model_path, "chatml-tools"))
    with pytest.raises(ValueError, match=r"tokenizer is not the policy's \(different chat templates\)"):
        run_teacher(teacher(path=templated), tiny_model_path, 512)
    with pytest.raises(ValueError, match=r"beside.teacher.max_model_len=256 is shorter .* set it >= 512"):
        run_teacher(teacher(max_model_len=256), tiny_model_path, 512)
    positions = json.loads((Path(tiny_model_path) / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(ValueError, match=rf"holds {positions} positions .* engine.max_model_len <= {positions - 1}"):
        run_teacher(teacher(max_model_len=positions), tiny_model_path, positions)
    assert served_engine_config("teacher", teacher()["teacher"], tiny_model_path, 0).max_model_len == 513
    capped = teacher(max_model_len=positions)["teacher"]  # one more than the model holds: the engine stops there
    assert served_engine_config("teacher", capped, tiny_model_path, 0).max_model_len == positions
    remote = {"remote": RemoteModel("http://127.0.0.1:9/v1", "t", role="teacher")}
    assert run_teacher(remote, tiny_model_path, 512) == "remote"  # an endpoint's tokenizer is asked of it, later
    with pytest.raises(ValueError, match="all have role teacher: distillation takes one"):
        run_teacher({**teacher(), "second": ServedModel(tiny_model_path, role="teacher")}, tiny_model_path, 512)


async def test_a_run_whose_endpoint_teacher_does_not_answer_is_refused_before_starting(tmp_path, tiny_model_path):
    from fullasync.api import AsyncAgentTrainer
    from fullasync.config import ModelSection, RunConfig

    run = AsyncAgentTrainer(RunConfig(output_dir=str(tmp_path), model=ModelSection(path=tiny_model_path)),
                            beside={"teacher": RemoteModel("http://127.0.0.1:9/v1", "t", role="teacher")})
    with pytest.raises(ValueError, match=r"beside.teacher \(http://127.0.0.1:9\): /tokenize did not answer"):
        await run.train_async()
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing started
