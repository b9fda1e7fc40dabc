"""Claude Code and Codex CLI, unchanged, for many episodes through the gateway: how many finish, what the gateway
answered (by status), whether every answer each CLI received was recorded (recorded calls = answers 200 minus
untrained background calls) and token-exact (each call's prompt extends the one before by the ids sampled: one
training sequence), with a weight push in the middle of a call in every other episode.

The policy is the suite's edge fake at the engine (tests/scripted_engine.py: a shell tool call in the template's
format, then a final answer) — the tiny random policy writes no tool calls; the gateway, the client and the CLIs
are real (`make setup-coding-agents`). Asserts nothing; prints one line per CLI.

    .venv/bin/python bench/coding_agent_episodes.py [--episodes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))  # the edge fake the suite uses

from scripted_engine import ScriptedEngine, script_texts

from fullasync.client import ClientConfig, RolloutService
from fullasync.gateway import Gateway
from fullasync.models import build_pretrained_model, load_tokenizer, with_chat_template
from fullasync_agents.claude_code import ClaudeCodeConfig, run_claude_code
from fullasync_agents.codex import CodexConfig, run_codex
from fullasync_agents.coding_agents import CodingAgentEpisode

TOOLS = {"claude_code": ("Bash", "command"), "codex": ("exec_command", "cmd")}
ANSWER = "Done: out.txt holds hello."


def exact(calls: list) -> bool:
    return all(later.prompt_ids[: len(earlier.all_ids)] == earlier.all_ids for earlier, later in
               zip(calls, calls[1:], strict=False))


async def run_cli(cli: str, episodes: int, tokenizer) -> str:
    engine = ScriptedEngine()
    gateway = Gateway(RolloutService([engine], tokenizer, ClientConfig(model_name="policy", max_model_len=32768)),
                      untrained_models=("policy-background",))
    await gateway.start()
    finished = recorded_ok = one_sequence = resumed = 0
    started = time.perf_counter()
    try:
        for index in range(episodes):
            tool, argument = TOOLS[cli]
            call = json.dumps({"name": tool, "arguments": {argument: "printf hello > out.txt"}})
            script_texts(engine, tokenizer, f"<tool_call>\n{call}\n</tool_call>", ANSWER)
            if index % 2:
                engine.push_after(call=engine.calls, tokens=5)
            episode = gateway.open_episode()
            answered_before, untrained_before = gateway.answered[200], gateway.untrained_calls
            with tempfile.TemporaryDirectory() as workdir:
                where = CodingAgentEpisode(episode.base_url, episode.api_key, workdir,
                                           "Write the word hello into the file out.txt, then say that you are done.")
                run = await (run_claude_code(ClaudeCodeConfig(max_turns=4, max_output_tokens=256,
                                                              background_model="policy-background"), where)
                             if cli == "claude_code" else run_codex(CodexConfig(), where))
                wrote = (Path(workdir) / "out.txt").is_file()
            gateway.close_episode(episode)
            calls = episode.client.trajectory(reward=1.0).calls
            finished += run.returncode == 0 and wrote
            received = gateway.answered[200] - answered_before - (gateway.untrained_calls - untrained_before)
            recorded_ok += len(calls) == received
            one_sequence += exact(list(calls)) and len(episode.client.trajectory(1.0).to_sequences()) == 1
            resumed += sum(c.num_resumes for c in calls)
    finally:
        await gateway.stop()
    statuses = dict(sorted(Counter(gateway.answered).items()))
    return (f"{cli}: {finished}/{episodes} finished (tool run, exit 0); answers by status {statuses}; recorded = "
            f"received in {recorded_ok}/{episodes}; one token-exact sequence in {one_sequence}/{episodes}; "
            f"{resumed} resumes across pushes; untrained background calls {gateway.untrained_calls}; "
            f"{time.perf_counter() - started:.0f} s")


async def main(episodes: int) -> None:
    tokenizer = load_tokenizer(with_chat_template(build_pretrained_model("smollm2-135m-instruct"), "chatml-tools"))
    for cli in ("claude_code", "codex"):
        print(await run_cli(cli, episodes, tokenizer), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    asyncio.run(main(parser.parse_args().episodes))
