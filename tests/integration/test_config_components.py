"""The run's components made from its config: the engines and the client from their sections, with no field
copied by hand; and the examples' cross-field checks (their validation runs the trainer's, which loads verl).
Nothing is started here."""

from __future__ import annotations

import dataclasses
import re

import pytest

from examples.deepresearch.agent import AgentConfig
from examples.deepresearch.config import DeepResearchConfig
from examples.mini_swe.config import AgentSection as MiniSweAgent
from examples.mini_swe.config import MiniSweTrainConfig
from examples.terminus.config import AgentSection as TerminusAgent
from examples.terminus.config import TerminusTrainConfig
from fullasync.api import AsyncAgentTrainer
from fullasync.client import ClientConfig
from fullasync.config import EngineSection, ModelSection, RunConfig
from fullasync.engines.vllm import VLLMEngineConfig
from fullasync.launch.parts import RESTART_GRACE_S, RUN_ENGINE_FIELDS, client_config, engine_config
from fullasync.presets import preset_config, preset_names


def test_an_engine_on_its_own_has_the_run_defaults():
    engine, model, run = EngineSection(), ModelSection(), RunConfig()
    assert engine_config(run, "/m") == VLLMEngineConfig(model_path="/m")
    alone = VLLMEngineConfig(model_path="/m")
    assert (alone.served_model_name, alone.seed) == (model.served_name, run.seed)
    for name in EngineSection.__dataclass_fields__.keys() - set(RUN_ENGINE_FIELDS) - {"dtype"}:
        assert getattr(alone, name) == getattr(engine, name), name
    assert (engine.dtype, alone.dtype) == ("auto", "float32")  # a run's auto is the trainer's precision: fp32


@pytest.mark.parametrize("trainer_dtype, engine_dtype, served", [
    ("fp32", "auto", "float32"), ("bf16", "auto", "bfloat16"), ("bf16", "float32", "float32")])
def test_the_engine_dtype_follows_the_trainer_unless_set(trainer_dtype, engine_dtype, served):
    config = RunConfig(engine=EngineSection(dtype=engine_dtype))
    config.trainer.model_dtype = trainer_dtype
    assert engine_config(config, "/m").dtype == served


def test_the_engines_get_every_engine_setting_of_the_run():
    config = RunConfig(seed=7, model=ModelSection(served_name="agent"), engine=EngineSection(
        dtype="bfloat16", max_model_len=4096, max_logprobs=5, stall_timeout_s=50.0, probe_interval_s=2.0,
        start_timeout_s=9.0, kv_cache_mb=16, ray_resources={"node": 0.5},
        vllm={"max_num_seqs": 3, "enable_prefix_caching": False, "enforce_eager": True,
              "hf_overrides": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}}))
    made = engine_config(config, "/m")
    for name in EngineSection.__dataclass_fields__.keys() - set(RUN_ENGINE_FIELDS):
        assert getattr(made, name) == getattr(config.engine, name), name
    assert (made.served_model_name, made.seed, made.max_num_seqs, made.enable_prefix_caching) == (
        "agent", 7, 3, False)  # vLLM's arguments the engine config declares become its fields; the rest pass on
    assert made.extra_engine_kwargs == {"kv_cache_memory_bytes": 16 * 2**20, "enforce_eager": True,
                                        "hf_overrides": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}}
    assert made.ray_resources is not config.engine.ray_resources  # a copy: the frozen config owns its own


@pytest.mark.parametrize("vllm, refusal", [
    ({"gpu_memory_utilisation": 0.5}, "engine.vllm.gpu_memory_utilisation is not an argument of the installed "
                                      "vLLM's EngineArgs (did you mean engine.vllm.gpu_memory_utilization?)"),
    ({"max_model_len": 8192}, "engine.vllm.max_model_len: the run sets it; set engine.max_model_len"),
    ({"kv_cache_memory_bytes": 2**30}, "engine.vllm.kv_cache_memory_bytes: the run sets it; set engine.kv_cache_mb"),
    ({"enforce_eager": "perhaps"}, "engine.vllm.enforce_eager='perhaps': vLLM takes bool"),
    ({"max_num_seqs": [7]}, "engine.vllm.max_num_seqs=[7]: vLLM takes int | None"),
])
def test_vllm_arguments_are_checked_against_the_installed_vllm_before_anything_starts(vllm, refusal):
    config = RunConfig(engine=EngineSection(vllm=vllm))
    with pytest.raises(ValueError, match=re.escape(refusal)):
        engine_config(config, "/m")
    with pytest.raises(ValueError, match=re.escape(refusal)):
        AsyncAgentTrainer(config)  # at construction: before Ray, a model or an engine


def test_the_client_serves_the_engines_context_and_top_logprobs_limit():
    config = RunConfig(model=ModelSection(served_name="agent", tool_parser="qwen"),
                       engine=EngineSection(max_model_len=4096, max_logprobs=5, start_timeout_s=9.0))
    config.rollout.resume_timeout_s = 11.0
    client, engine = client_config(config), engine_config(config, "/m")
    assert (client.max_model_len, client.max_top_logprobs, client.model_name) == (
        engine.max_model_len, engine.max_logprobs, engine.served_model_name)
    assert (client.tool_parser, client.resume_timeout_s, client.restart_wait_s) == ("qwen", 11.0, 9.0 + RESTART_GRACE_S)
    config.engine.restart_on_failure = False
    assert client_config(config).restart_wait_s == 0.0
    waits = EngineSection().start_timeout_s + RESTART_GRACE_S  # restart_on_failure is on by default
    assert client_config(RunConfig()) == dataclasses.replace(ClientConfig(), restart_wait_s=waits)


@pytest.mark.parametrize("config, message", [
    (TerminusTrainConfig(agent=TerminusAgent(max_tokens=4096)),
     r"agent.max_tokens=4096 must be below engine.max_model_len=4096; lower agent.max_tokens"),
    (TerminusTrainConfig(agent=TerminusAgent(model_name="hosted_vllm/other")),
     r"agent.model_name='hosted_vllm/other' does not name model.served_name='policy'"),
    (MiniSweTrainConfig(agent=MiniSweAgent(model_name="hosted_vllm/other")),
     r"set agent.model_name=hosted_vllm/policy"),
    (MiniSweTrainConfig(agent=MiniSweAgent(tasks="other")),
     r"agent.tasks='other'; choose one of \('settings', 'bugs', 'swe-settings'\)"),
    (MiniSweTrainConfig(agent=MiniSweAgent(tasks="swe-settings")),
     r"agent.tasks=swe-settings runs each row in its container: set agent.environment_class=container"),
    (MiniSweTrainConfig(agent=MiniSweAgent(temperature=0.5)),
     r"agent.temperature=0.5 differs from trainer.temperature=.*; set both"),
    (TerminusTrainConfig(agent=TerminusAgent(temperature=0.5)), r"agent.temperature=0.5 differs from trainer"),
    (TerminusTrainConfig(agent=TerminusAgent(agent_timeout_s=300.0)),
     r"agent.agent_timeout_s=300.0 must be below episode_timeout_s=300.0 .*; lower agent_timeout_s"),
    (MiniSweTrainConfig(agent=MiniSweAgent(step_limit=0)), r"agent.step_limit=0 must be >= 1"),
    (TerminusTrainConfig(agent=TerminusAgent(tasks="bugs")),
     r"agent.tasks='bugs'; choose one of \('settings', 'commands'\)"),
    (DeepResearchConfig(data=dataclasses.replace(RunConfig().data, task=""), agent=AgentConfig(model="other")),
     r"agent.model='other' is not the served model.served_name='policy'; set agent.model=policy"),
])
def test_the_examples_check_their_harness_against_the_run(config, message):
    if isinstance(config, DeepResearchConfig):
        config.engine.max_model_len = config.agent.max_context_tokens
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_terminus_gets_the_engines_context_as_its_own():
    config = TerminusTrainConfig()
    config.engine.max_model_len = 8192
    config.agent.agent_timeout_s = 200.0
    assert (config.agent_config().context_length, config.agent_config().agent_timeout_s) == (8192, 200.0)


@pytest.mark.parametrize("name", preset_names())
def test_each_preset_passes_the_runs_own_checks(name):
    preset_config(name).validate()


def test_the_trainer_builds_the_model_the_engines_serve_with_their_overrides():
    rope = {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            "max_position_embeddings": 8192}
    config = RunConfig(engine=EngineSection(max_model_len=8192, vllm={"hf_overrides": rope}))
    assert config.resolved_trainer().hf_overrides == rope
    config.trainer.hf_overrides = dict(rope)  # the same, set on both: fine
    config.validate()
    config.trainer.hf_overrides = {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}
    with pytest.raises(ValueError, match="differ: the engines would sample from another model than the one trained"):
        config.validate()


def test_a_reward_fn_needs_the_runs_one_judge_before_anything_starts():
    async def rollout(client, row):
        return 0.0

    async def judged(judge, row, trajectory):
        return await judge.score([{"role": "user", "content": "score it"}])

    with pytest.raises(ValueError, match=r"reward_fn\(judge, row, trajectory\) needs exactly one model of role judge"
                                         r".* the run has 0 .*beside.judge.path=<model>"):
        AsyncAgentTrainer(RunConfig(), rollout_fn=rollout, train_dataset=[{"q": 1}], reward_fn=judged)
    config = RunConfig()
    config.beside = {"judge": {"base_url": "http://127.0.0.1:9/v1", "model": "judge"}}
    trainer = AsyncAgentTrainer(config, rollout_fn=rollout, train_dataset=[{"q": 1}], reward_fn=judged)
    assert trainer.generator.reward_fn is judged
