"""Pushes denser than the engine can prefill the interrupted contexts again: every generation still advances and ends.

The moment is made, not hoped for. ABORT: a push is fired as soon as each (re)submitted request has been sent to
the engine (its `generate` leaves before the push's pause, so the pause meets it in vLLM), for as long as a call is
unfinished, with no cap on the number of pushes. RECOMPUTE (nothing is resubmitted): each push is fired as soon as
the one before has resumed the engine. Either way every push lands while the interrupted contexts are being
prefilled again; without the engine's starvation rule the calls stop advancing. What fails is a per-call counter —
for ABORT the interruptions in a row before a token that each resubmission carries (`GenerateRequest.starved`), for
RECOMPUTE the pushes in a row between which a request gained no token — not a timeout. The pushes stop (and the test
fails) once a counter passes its bound, so a broken rule fails in seconds instead of pushing forever. Every token's
label is then checked against the weights it names (`label_storm.check_calls`). The contexts are those a coding
agent brings: a few thousand tokens per call."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from label_storm import check_calls
from policy_weights import PolicyWeights

from fullasync.client import ClientConfig, RolloutService
from fullasync.contracts.engine import GenerateRequest, PauseMode
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.models import TinyModelSpec, build_tiny_model, load_tokenizer
from fullasync.weights.sync import WeightSync

CONTEXT = 8192
# the engine's setting; a new request that reaches the engine while a push waits may be interrupted before its token
# once whatever the setting (the push does not wait for newcomers), so a call's count can reach 1 at 0
TOLERANCE = max(VLLMEngineConfig.starved_interruptions, 1)
GIVE_UP = TOLERANCE + 3  # a counter this high: the rule is broken, stop pushing

pytestmark = pytest.mark.slow  # CI's slow tier: an 8k-context engine of its own


@pytest.fixture(scope="module")
async def long_engine(ray_cluster):
    """An engine (and its weights, kept in torch) with room for contexts of several thousand tokens."""
    path = str(build_tiny_model(TinyModelSpec(max_position_embeddings=CONTEXT)))
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=path, max_model_len=CONTEXT))
    policy = PolicyWeights(path, WeightSync([engine], version=await engine.version()))
    yield engine, policy, load_tokenizer(path)
    await engine.shutdown()


class SentToEngine:
    """The engine, with `sent` set once each request's `generate` has been sent to the engine actor, and the most
    `starved` that any request of a call carried (by the call's request id)."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.sent = asyncio.Event()
        self.starved: dict[str, int] = {}

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    async def generate(self, request: GenerateRequest):
        call = request.request_id.rsplit("-", 1)[0]  # a resubmission's id is the call's and its resume count
        self.starved[call] = max(self.starved.get(call, 0), request.starved)
        reply = asyncio.ensure_future(self._engine.generate(request))
        await asyncio.sleep(0)  # the reply's first step sends the request to the actor, before anything set below
        self.sent.set()
        return await reply


@dataclass
class Storm:
    pushes: int = 0
    worst: int = 0  # the counter's highest value
    waited_s: float = 0.0  # how long the pushes waited for starved requests' tokens
    weights: dict = field(default_factory=dict)


async def _pushes_until_done(policy: PolicyWeights, mode: PauseMode, tasks, trigger, counter) -> Storm:
    """Push perturbed weights on every `trigger()` until every task is done or `counter()` reaches GIVE_UP."""
    storm = Storm(weights={policy.weight_sync.version: dict(policy.current)})
    start = dict(policy.current)
    while not all(task.done() for task in tasks):
        gate = asyncio.ensure_future(trigger())
        await asyncio.wait([gate, *[task for task in tasks if not task.done()]], return_when=asyncio.FIRST_COMPLETED)
        if not gate.done():
            gate.cancel()
            continue  # a call ended: look again
        timing = await policy.push(policy.perturbed(seed=storm.pushes, scale=0.02, around=start), mode=mode)
        storm.weights[timing.version] = dict(policy.current)
        storm.pushes += 1
        storm.waited_s += timing.starved_wait_s
        storm.worst = max(storm.worst, await counter())
        if storm.worst >= GIVE_UP:
            break
    return storm


def _prompts(calls: int, words: int) -> list[str]:
    """`calls` prompts of ~8 tokens a word (the tiny model's tokenizer)."""
    return [f"Repository {i}: " + " ".join(f"file{(i * 7 + j) % 97}.py" for j in range(words)) for i in range(calls)]


async def _start_calls(service: RolloutService, prompts: list[str], max_tokens: int):
    clients = [service.client() for _ in prompts]
    tasks = [asyncio.create_task(client.completions.create(
        model="policy", prompt=prompt, max_tokens=max_tokens, temperature=1.0, extra_body={"ignore_eos": True}))
        for client, prompt in zip(clients, prompts, strict=True)]
    return clients, tasks


def _check_labels(policy: PolicyWeights, clients, storm: Storm, max_tokens: int):
    """Every call ended with all its tokens, each labelled true; the calls."""
    calls = [call for client in clients for call in client.episode.calls]
    assert len(calls) == len(clients) and all(len(call.output_ids) == max_tokens for call in calls)
    report = check_calls(policy.model, calls, [1.0] * len(calls), storm.weights)
    assert not report.mismatches, "\n".join(map(str, report.mismatches))
    return calls


@pytest.mark.parametrize(("calls", "words"), [(6, 650), (16, 250)], ids=["5k-token-contexts", "2k-token-contexts"])
async def test_abort_pushes_on_every_resubmission_starve_no_call(long_engine, calls, words):
    """ABORT: a push as each resubmission reaches the engine; no call is interrupted more than the engine's
    tolerance in a row before a token, every call ends with all its tokens, every label true."""
    engine, policy, tokenizer = long_engine
    watched = SentToEngine(engine)
    service = RolloutService([watched], tokenizer, ClientConfig(max_model_len=CONTEXT))
    max_tokens = 12
    clients, tasks = await _start_calls(service, _prompts(calls, words), max_tokens)

    async def sent() -> None:
        await watched.sent.wait()
        watched.sent.clear()

    async def most_starved() -> int:
        return max(watched.starved.values(), default=0)

    storm = await _pushes_until_done(policy, PauseMode.ABORT, tasks, sent, most_starved)
    assert storm.worst <= TOLERANCE, (f"a call carried {storm.worst} interruptions in a row before a token "
                                      f"(tolerance {TOLERANCE}) after {storm.pushes} pushes")
    await asyncio.gather(*tasks)
    calls = _check_labels(policy, clients, storm, max_tokens)
    assert any(call.num_resumes for call in calls), f"{storm.pushes} pushes: no call met one"
    assert storm.waited_s > 0, "no push came before a request's first token"
    assert min(len(call.prompt_ids) for call in calls) > 6 * words


async def test_recompute_pushes_back_to_back_starve_no_request(long_engine):
    """RECOMPUTE: each push as soon as the one before resumed the engine, which prefills every interrupted request
    again; no request goes more than the tolerance's pushes without a token (one more for a token that was on its way
    when a push landed), and every call ends with every label true."""
    engine, policy, tokenizer = long_engine
    service = RolloutService([engine], tokenizer, ClientConfig(max_model_len=CONTEXT))
    max_tokens = 12
    clients, tasks = await _start_calls(service, _prompts(6, 650), max_tokens)
    seen: dict[str, tuple[int, int]] = {}  # request id -> (tokens, pushes in a row without a new one)

    async def at_once() -> None:
        return None

    async def without_token() -> int:
        tokens = await engine.in_flight_tokens()
        for request_id, count in tokens.items():
            before, in_a_row = seen.get(request_id, (-1, 0))
            seen[request_id] = (count, in_a_row + 1 if count == before else 0)
        return max((seen[request_id][1] for request_id in tokens), default=0)

    storm = await _pushes_until_done(policy, PauseMode.RECOMPUTE, tasks, at_once, without_token)
    assert storm.worst <= TOLERANCE + 1, (f"a request went {storm.worst} pushes without a token (tolerance "
                                          f"{TOLERANCE}) after {storm.pushes} pushes")
    await asyncio.gather(*tasks)
    calls = _check_labels(policy, clients, storm, max_tokens)
    assert any(len(set(call.output_versions)) > 1 for call in calls), f"{storm.pushes} pushes: no call met one"
    assert storm.waited_s > 0, "no push came before a request's first token"
