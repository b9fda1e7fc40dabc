"""A push storm over many long calls, and the teacher-forced check that every token's label is true.

The storm: concurrent calls of five kinds (chat, streamed chat, chat with n=2, completion, streamed completion) on
one real engine while perturbed weights are pushed every 20-250 ms in a chosen pause mode. Every version's
weights are kept, so afterwards each recorded token can be scored again in torch under the weights its labels name.

The check (`check_calls`): what a token's labels claim, computed again.
- `output_versions[i] == output_weight_versions[i] == v` claims: policy v sampled token i from a context whose
  every position policy v computed. Reference: one forward of prompt + output under v's weights.
- `output_weight_versions[i] = w > output_versions[i] = k` (a KEEP push inside the request) claims: weights w
  sampled it over KV that older weights computed, the oldest being k. The request ran frozen across the push, so
  each position was computed by the weights in force when the engine processed it: the prompt by the weights of
  the call's first token (k), the input of output token j by the weights that sampled token j. Reference: the
  same sequence computed position by position under those weights (a KV cache carried across weight swaps).
A token passes when its recorded log-prob is within `TOLERANCE` of the reference.

Run as a script for many storms: `python tests/integration/label_storm.py --runs 20 --mode abort`; `--max-pushes 0`
pushes until every call has ended, `--busy-cores 1` keeps a core busy during each storm.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fullasync.client import ClientConfig, RolloutService
from fullasync.contracts.engine import PauseMode
from fullasync.types import ModelCall

TOLERANCE = 1e-4  # float32 engine vs float32 torch forward; agreement is ~3e-6
KINDS = ("chat", "chat_stream", "chat_n2", "completion", "completion_stream")


@dataclass(frozen=True)
class StormSettings:
    calls: int = 48
    min_tokens: int = 300
    max_tokens: int = 900
    push_gap_s: tuple[float, float] = (0.02, 0.25)  # the pause between the end of one push and the next
    # None: push until every call has ended, however many pushes that takes (the engine's starvation rule is what
    # lets the calls end when pushes outpace prefilling the interrupted contexts again)
    max_pushes: int | None = 40
    mode: PauseMode = PauseMode.ABORT
    noise: float = 0.02  # each push's weights: the storm's first ones plus this much seeded noise
    seed: int = 0


@dataclass
class StormResult:
    calls: list[ModelCall]
    temperatures: list[float]  # each call's: the engine's log-probs are those of the tempered distribution
    weights: dict[int, dict[str, torch.Tensor]]  # every version the engine served during the storm
    pushes: int = 0
    wall_s: float = 0.0

    @property
    def resumes(self) -> int:
        return sum(call.num_resumes for call in self.calls)


@dataclass(frozen=True)
class Mismatch:
    """The first token of a call whose recorded log-prob its labels do not reproduce."""

    call: int
    position: int  # output index
    tokens: int  # the call's output length
    version: int
    weight_version: int
    recorded: float
    reference: float
    label_change: bool  # its version differs from the token before it (a push landed just before it)
    num_resumes: int
    bad_tokens: int  # how many of the call's tokens miss

    def __str__(self) -> str:
        return (f"call {self.call}: token {self.position}/{self.tokens} labelled v{self.version} (weights "
                f"v{self.weight_version}) recorded {self.recorded:.4f}, its labels give {self.reference:.4f} "
                f"(|diff| {abs(self.recorded - self.reference):.3g}); at a label change: {self.label_change}; "
                f"{self.bad_tokens} bad tokens; {self.num_resumes} resumes")


@dataclass
class CheckReport:
    mismatches: list[Mismatch] = field(default_factory=list)
    max_diff: float = 0.0
    tokens: int = 0


async def run_storm(engine, policy, tokenizer, settings: StormSettings) -> StormResult:
    """The storm on `engine` (whose weights `policy` mirrors); every version's weights come back with the calls.
    Every push meets calls in flight: when the calls end before the storm's pushes do (a fast machine), another
    wave of calls starts, so `max_pushes` is what a storm pushes on any machine; without `max_pushes` the storm
    pushes until its one wave of calls has ended."""
    rng = random.Random(settings.seed)
    service = RolloutService([engine], tokenizer, ClientConfig(max_model_len=2048))
    start = dict(policy.current)  # each push's weights are these plus fresh noise: storms do not drift apart
    weights = {policy.weight_sync.version: start}
    plans: list[tuple[str, int, float, bool]] = []
    clients = []
    tasks: list[asyncio.Task[None]] = []

    def launch(count: int) -> None:
        for _ in range(count):
            index = len(plans)
            plans.append((KINDS[index % len(KINDS)], rng.randint(settings.min_tokens, settings.max_tokens),
                          rng.choice((1.0, 0.7)), index % 2 == 0))
            clients.append(service.client())
            tasks.append(asyncio.create_task(_call(clients[index], index, *plans[index])))

    started = time.perf_counter()
    launch(settings.calls)
    pushes = 0
    while settings.max_pushes is None or pushes < settings.max_pushes:
        if all(task.done() for task in tasks):
            if settings.max_pushes is None:
                break
            launch(max(1, settings.calls // 4))
        await asyncio.wait([task for task in tasks if not task.done()], timeout=rng.uniform(*settings.push_gap_s))
        if all(task.done() for task in tasks):
            continue  # nothing in flight for this push to meet: the next wave first
        new = policy.perturbed(seed=settings.seed * 1000 + pushes, scale=settings.noise, around=start)
        timing = await policy.push(new, mode=settings.mode)
        weights[timing.version] = dict(policy.current)
        pushes += 1
    await asyncio.gather(*tasks)  # a call that failed fails the storm
    calls = [(call, temperature) for client, (_, _, temperature, _) in zip(clients, plans, strict=True)
             for call in client.episode.calls]
    return StormResult([call for call, _ in calls], [temperature for _, temperature in calls], weights, pushes,
                       time.perf_counter() - started)


async def _call(client, index: int, kind: str, max_tokens: int, temperature: float, ignore_eos: bool) -> None:
    extra = {"ignore_eos": ignore_eos}
    chat = dict(model="policy", messages=[{"role": "user", "content": f"Story {index}: tell me about numbers."}],
                max_tokens=max_tokens, temperature=temperature, extra_body=extra)
    text = dict(model="policy", prompt=f"Count with me, {index}: 1 2 3", max_tokens=max_tokens,
                temperature=temperature, extra_body=extra)
    if kind == "chat":
        await client.chat.completions.create(**chat)
    elif kind == "chat_n2":
        await client.chat.completions.create(**chat, n=2)
    elif kind == "chat_stream":
        async for _ in await client.chat.completions.create(**chat, stream=True):
            continue
    elif kind == "completion":
        await client.completions.create(**text)
    else:
        async for _ in await client.completions.create(**text, stream=True):
            continue


def check_calls(model, calls: Sequence[ModelCall], temperatures: Sequence[float],
                weights: dict[int, dict[str, torch.Tensor]]) -> CheckReport:
    """Score every token again under the weights its labels name (module docstring); the first miss of each call."""
    report = CheckReport()
    for index, (call, temperature) in enumerate(zip(calls, temperatures, strict=True)):
        reference = reference_logprobs(model, call, temperature, weights)
        diffs = [abs(a - b) for a, b in zip(call.output_logprobs, reference, strict=True)]
        report.tokens += len(diffs)
        report.max_diff = max(report.max_diff, *diffs, 0.0)
        bad = [i for i, diff in enumerate(diffs) if diff > TOLERANCE]
        if bad:
            first = bad[0]
            weight_versions = call.output_weight_versions or call.output_versions
            report.mismatches.append(Mismatch(
                index, first, len(diffs), call.output_versions[first], weight_versions[first],
                call.output_logprobs[first], reference[first],
                first > 0 and call.output_versions[first] != call.output_versions[first - 1], call.num_resumes,
                len(bad)))
    return report


def reference_logprobs(model, call: ModelCall, temperature: float,
                       weights: dict[int, dict[str, torch.Tensor]]) -> list[float]:
    """log p(output_i) at `temperature`, as the labels of token i say it was computed (module docstring)."""
    weight_versions = call.output_weight_versions or call.output_versions
    ids = list(call.prompt_ids) + list(call.output_ids)
    start = len(call.prompt_ids)
    reference = [0.0] * len(call.output_ids)
    pure: dict[int, list[int]] = {}  # version -> the outputs it alone computed
    for i, (label, weight) in enumerate(zip(call.output_versions, weight_versions, strict=True)):
        if label == weight:
            pure.setdefault(label, []).append(i)
    for version, outputs in pure.items():  # the sequence up to its last such output is enough
        logprobs = _forward(model, weights[version], ids[:start + outputs[-1]], temperature)
        for i in outputs:
            reference[i] = float(logprobs[start - 1 + i, ids[start + i]])
    mixed = [i for i, (label, weight) in enumerate(zip(call.output_versions, weight_versions, strict=True))
             if weight != label]
    if mixed:  # frozen across KEEP pushes: position p computed by the weights that sampled the token it predicts
        processed_by = [weight_versions[0]] * (start - 1) + list(weight_versions)
        chunks, past, position = [], None, 0
        while position < len(ids) - 1:
            end = position
            while end < len(ids) - 1 and processed_by[end] == processed_by[position]:
                end += 1
            chunk, past = _forward_cached(model, weights[processed_by[position]], ids[position:end], temperature,
                                          past)
            chunks.append(chunk)
            position = end
        scores = torch.cat(chunks)
        for i in mixed:
            reference[i] = float(scores[start - 1 + i, ids[start + i]])
    return reference


def _load(model, state: dict[str, torch.Tensor]) -> None:
    model.load_state_dict(state, strict=False)
    if model.config.tie_word_embeddings:
        model.tie_weights()


def _forward(model, state, ids: list[int], temperature: float) -> torch.Tensor:
    return _forward_cached(model, state, ids, temperature, None)[0]


def _forward_cached(model, state, ids: list[int], temperature: float, past) -> tuple[torch.Tensor, object]:
    _load(model, state)
    with torch.no_grad():
        out = model(torch.tensor([ids]), past_key_values=past, use_cache=True)
    return torch.log_softmax(out.logits[0].float() / temperature, dim=-1), out.past_key_values


def summary(result: StormResult, report: CheckReport) -> str:
    starved = sum(call.starved_resumes for call in result.calls)
    return (f"{len(result.calls)} calls, {report.tokens} tokens, {result.pushes} pushes, {result.resumes} resumes "
            f"({starved} after an interruption before a token), "
            f"{len(report.mismatches)} calls with a mislabelled token, max |diff| {report.max_diff:.2e}, "
            f"{result.wall_s:.1f} s ({report.tokens / result.wall_s:.0f} tokens/s)")


async def _main(runs: int, mode: PauseMode, settings: StormSettings, prefix_caching: bool, starved_wait_s: float,
                give_up_s: float, busy_cores: int) -> None:
    from policy_weights import PolicyWeights

    from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
    from fullasync.infra.runtime import init_ray
    from fullasync.models import build_tiny_model, load_tokenizer
    from fullasync.weights.sync import WeightSync

    init_ray()
    path = str(build_tiny_model())
    tokenizer = load_tokenizer(path)
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=path, max_model_len=2048,
                                                           enable_prefix_caching=prefix_caching,
                                                           starved_wait_s=starved_wait_s))
    policy = PolicyWeights(path, WeightSync([engine], version=await engine.version()))
    failed = []
    diffs = []
    try:
        for run in range(runs):
            storm = StormSettings(**{**settings.__dict__, "seed": settings.seed + run, "mode": mode})
            busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(busy_cores)]
            try:
                result = await asyncio.wait_for(run_storm(engine, policy, tokenizer, storm), give_up_s)
            except TimeoutError:
                print(f"run {run} (seed {storm.seed}, {mode.value}): not finished after {give_up_s:.0f} s", flush=True)
                failed.append(run)
                break  # its calls are still in flight on the engine
            finally:
                for process in busy:
                    process.kill()
            report = check_calls(policy.model, result.calls, result.temperatures, result.weights)
            diffs.append(report.max_diff)
            print(f"run {run} (seed {storm.seed}, {mode.value}): {summary(result, report)}", flush=True)
            for mismatch in report.mismatches:
                print(f"  {mismatch}", flush=True)
            if report.mismatches:
                failed.append(run)
    finally:
        await engine.shutdown()
    print(f"{runs - len(failed)} of {runs} runs clean; max |diff| over runs {max(diffs, default=0.0):.2e} "
          f"(median {statistics.median(diffs or [0.0]):.2e}); failed runs {failed}")


if __name__ == "__main__":
    import argparse

    from fullasync.engines.vllm import VLLMEngineConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mode", choices=[m.value for m in PauseMode if m is not PauseMode.WAIT], default="abort")
    parser.add_argument("--calls", type=int, default=48)
    parser.add_argument("--min-tokens", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=900)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-pushes", type=int, default=40, help="0: push until every call has ended")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--starved-wait-s", type=float, default=VLLMEngineConfig.starved_wait_s,
                        help="the engine's starvation rule (0: off)")
    parser.add_argument("--give-up-s", type=float, default=600.0, help="a storm not finished by then fails the runs")
    parser.add_argument("--busy-cores", type=int, default=0, help="cores kept busy by other processes during each "
                        "storm (not during its check)")
    args = parser.parse_args()
    asyncio.run(_main(args.runs, PauseMode(args.mode), StormSettings(
        calls=args.calls, min_tokens=args.min_tokens, max_tokens=args.max_tokens, seed=args.seed,
        max_pushes=args.max_pushes or None),
        not args.no_prefix_caching, args.starved_wait_s, args.give_up_s, args.busy_cores))
