"""Models beside the policy (`RemoteModel`, `ServedModel`, `client.judge`): a remote OpenAI-compatible judge called
with a limit on its calls at once, retried with backoff on 429 / 5xx, an infrastructure failure when it never
answers, never recorded into the episode, and never in the policy's way; a served judge's calls through engines of
its own (the run's served judge, killed and restarted, on the real stack: tests/integration/test_training_loop.py).

Real: the openai SDK, HTTP on loopback, the RolloutService and its client on a simulated engine. The judge is the
test's: a loopback server answering what each test scripts (failures, then answers; or holding every call)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from fullasync.client import ClientConfig, RolloutService
from fullasync.client.beside import BesideClient, BesideModelError, RemoteModel, ServedModel, beside_models
from fullasync.errors import FailureKind, InvalidRequestError
from fullasync.gateway.http import ServedApp
from fullasync.rollout.ledger import failure_kind
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer


class Judge:
    """A loopback chat-completions endpoint: answers `statuses` in turn (then 200s), each call held until `hold`
    is set (when given); counts its calls at once."""

    def __init__(self, statuses: list[int] | None = None, hold: asyncio.Event | None = None) -> None:
        self.statuses = list(statuses or [])
        self.hold = hold
        self.received: list[dict] = []
        self.now = self.most = 0

    async def answer(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.received.append(body)
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            if self.hold is not None:
                await self.hold.wait()
            else:
                await asyncio.sleep(0.01)
            if self.statuses:
                status = self.statuses.pop(0)
                return JSONResponse({"error": {"message": f"scripted {status}"}}, status_code=status)
            return JSONResponse({"id": "j", "object": "chat.completion", "created": 0, "model": body["model"],
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": "score: 7"}}]})
        finally:
            self.now -= 1


@contextlib.asynccontextmanager
async def served(judge: Judge):
    app = ServedApp(Starlette(routes=[Route("/v1/chat/completions", judge.answer, methods=["POST"])]), "judge")
    await app.start()
    try:
        yield f"{app.url}/v1"
    finally:
        await app.stop()


def service_with(base_url: str, **spec) -> RolloutService:
    engines = [SimulatedEngine("sim-0", DecodeCost(step_base_s=1e-3, max_num_seqs=16))]
    return RolloutService(engines, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096),
                          beside={"judge": BesideClient("judge", RemoteModel(base_url, "judge-model", backoff_s=0.01,
                                                                             **spec))})


ASK = [{"role": "user", "content": "Score this answer from 0 to 10."}]


async def test_a_judge_that_answers_429_and_500_is_tried_again_and_its_calls_are_counted_not_recorded():
    judge = Judge(statuses=[429, 500, 503])
    async with served(judge) as url:
        service = service_with(url, retries=3)
        client = service.client("row/0")
        answer = await client.judge.chat.completions.create(messages=ASK)
        assert answer.choices[0].message.content == "score: 7" and judge.received[-1]["model"] == "judge-model"
        assert len(judge.received) == 4 and not client.episode.calls  # three failures, then the answer
        metrics = service.beside_metrics()
        assert metrics["beside/judge/calls"] == 1 and metrics["beside/judge/retries"] == 3
        assert metrics["beside/judge/failures"] == 0 and metrics["beside/judge/latency_s"] > 0


async def test_a_judge_that_never_answers_is_the_infrastructures_failure_and_a_bad_request_is_not_retried():
    async with served(Judge(statuses=[500] * 10)) as url:
        service = service_with(url, retries=2)
        with pytest.raises(BesideModelError, match="did not answer after 3 tries") as raised:
            await service.client().judge.chat.completions.create(messages=ASK)
        assert failure_kind(raised.value, None) is FailureKind.INFRA  # the episode runs again, never scored 0
        assert service.beside_metrics()["beside/judge/failures"] == 1
    judge = Judge(statuses=[400])
    async with served(judge) as url:
        service = service_with(url, retries=2)
        with pytest.raises(Exception, match="scripted 400"):  # the endpoint refused the request itself
            await service.client().judge.chat.completions.create(messages=ASK)
        assert len(judge.received) == 1
    async with served(Judge()) as url:  # nothing listens on a port it stopped: connection refused, retried
        pass
    service = service_with(url, retries=1)
    with pytest.raises(BesideModelError, match="did not answer after 2 tries"):
        await service.client().judge.chat.completions.create(messages=ASK)


async def test_judge_calls_wait_only_on_their_own_limit_never_the_policys_calls():
    hold = asyncio.Event()
    judge = Judge(hold=hold)
    async with served(judge) as url:
        service = service_with(url, max_concurrency=3)
        judged = [asyncio.create_task(service.client(f"j/{i}").judge.chat.completions.create(messages=ASK))
                  for i in range(8)]
        while judge.now < 3:
            await asyncio.sleep(0.01)
        # every judge place is taken and each call held: the policy's calls still go through, all of them
        async with asyncio.timeout(60):
            for i in range(6):
                client = service.client(f"row-{i}/0")
                await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=4,
                                                extra_body={"ignore_eos": True})
                assert len(client.episode.calls) == 1
        assert judge.now == 3 and not any(task.done() for task in judged)
        hold.set()
        answers = await asyncio.wait_for(asyncio.gather(*judged), 60)
        assert len(answers) == 8 and judge.most == 3  # never more than its limit at once


async def test_what_a_model_beside_the_policy_needs_is_checked_saying_what_is_wrong(monkeypatch):
    with pytest.raises(ValueError, match="has a role of"):
        RemoteModel("http://127.0.0.1:1/v1", "m", role="critic")
    with pytest.raises(ValueError, match="must be an http"):
        RemoteModel("127.0.0.1:1/v1", "m")
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        RemoteModel("http://127.0.0.1:1/v1", "m", max_concurrency=0)
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match=r"\$JUDGE_KEY is not set"):
        service_with("http://127.0.0.1:1/v1", api_key_env="JUDGE_KEY")
    no_judge = RolloutService([SimulatedEngine("sim-0", DecodeCost())], SimTokenizer(), ClientConfig())
    with pytest.raises(LookupError, match="exactly one model of role judge"):
        no_judge.client().judge  # noqa: B018


def test_the_runs_beside_setting_reads_as_models_each_field_as_its_type():
    models = beside_models({"judge": {"base_url": "http://127.0.0.1:8001/v1", "model": "j", "max_concurrency": "4",
                                      "backoff_s": "0.25"},  # as the command line gives them: strings
                            "rm": {"base_url": "http://127.0.0.1:8002/v1", "model": "r", "role": "reward_model"}})
    assert models["judge"] == RemoteModel("http://127.0.0.1:8001/v1", "j", max_concurrency=4, backoff_s=0.25)
    assert models["rm"].role == "reward_model" and models["rm"].retries == 3
    with pytest.raises(ValueError, match=r"beside.judge: \['concurrency'\] not a field .* its fields: \["):
        beside_models({"judge": {"base_url": "http://127.0.0.1:1/v1", "model": "j", "concurrency": "4"}})
    with pytest.raises(ValueError, match="beside.judge needs model"):
        beside_models({"judge": {"base_url": "http://127.0.0.1:1/v1"}})
    with pytest.raises(ValueError, match="beside.judge.retries='many' is not int"):
        beside_models({"judge": {"base_url": "http://127.0.0.1:1/v1", "model": "j", "retries": "many"}})


def test_a_path_in_the_beside_setting_is_a_model_the_run_serves_itself():
    models = beside_models({"judge": {"path": "smollm2-135m-instruct", "engines": "2", "kv_cache_mb": "64"}})
    assert models["judge"] == ServedModel("smollm2-135m-instruct", engines=2, kv_cache_mb=64)
    with pytest.raises(ValueError, match="either path .* or base_url .*, not both"):
        beside_models({"judge": {"path": "m", "base_url": "http://127.0.0.1:1/v1", "model": "j"}})
    with pytest.raises(ValueError, match=r"\['api_key_env'\] not a field of a served model"):
        beside_models({"judge": {"path": "m", "api_key_env": "KEY"}})
    with pytest.raises(ValueError, match="beside.judge.engines='two' is not int"):
        beside_models({"judge": {"path": "m", "engines": "two"}})
    with pytest.raises(ValueError, match="engines, max_model_len, kv_cache_mb and max_concurrency must be >= 1"):
        ServedModel("m", engines=0)
    with pytest.raises(TypeError, match="served by the run: it needs its engines' backend"):
        BesideClient("judge", ServedModel("m"))


async def test_a_served_judge_answers_through_its_own_engines_and_a_judge_past_its_restarts_fails_at_once():
    from fullasync.launch.beside import ServedBackend
    from fullasync.weights.sync import WeightSync

    policy_engine, judge_engine = SimulatedEngine("policy-0", DecodeCost()), SimulatedEngine("judge-0", DecodeCost())
    judge_service = RolloutService([judge_engine], SimTokenizer(), ClientConfig(model_name="judge"))
    sync = WeightSync([judge_engine], restart_on_failure=True)
    backend = ServedBackend("judge", judge_service, sync)
    judge = BesideClient("judge", ServedModel("m", retries=1, backoff_s=0.0), backend)
    service = RolloutService([policy_engine], SimTokenizer(), ClientConfig(model_name="policy"),
                             beside={"judge": judge})
    client = service.client("episode-0")
    answer = await client.judge.chat.completions.create(messages=ASK, max_tokens=5)
    assert answer.model == "judge" and answer.choices[0].message.content is not None
    assert client.episode.calls == [] and judge_service.router.held("judge-0") == 0  # nothing kept
    assert judge.metrics()["beside/judge/calls"] == 1 and judge.metrics()["beside/judge/restarts"] == 0
    with pytest.raises(InvalidRequestError, match="unknown model 'policy'"):  # its own name only: a request it refuses
        await client.judge.chat.completions.create(model="policy", messages=ASK, max_tokens=5)
    sync._fail(RuntimeError("an engine could not be restarted"))  # what its supervisor keeps when it gives up
    with pytest.raises(BesideModelError, match="its engines could not be restarted"):
        await client.judge.chat.completions.create(messages=ASK, max_tokens=5)
    assert judge.metrics()["beside/judge/failures"] == 1 and judge.metrics()["beside/judge/retries"] == 0
