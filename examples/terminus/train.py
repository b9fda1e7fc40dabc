"""Train a policy through Terminus-2 (harbor 0.24.0's released code, unchanged) fully asynchronously (Hydra).
Run from the repository root, after `make setup setup-terminus`:

    python examples/terminus/train.py                                   # tiny warmed-up policy, this machine
    python examples/terminus/train.py total_steps=40 agent.max_turns=4 max_staleness=4
    python examples/terminus/train.py model.path=/models/Qwen2.5-7B-Instruct agent.hint=false \\
        agent.max_tokens=2048 agent.max_turns=30 agent.pane_width=160 agent.pane_height=40 \\
        agent.context_length=32768 engine.max_model_len=32768 engine.num_engines=8
    python examples/terminus/train.py --cfg job                         # print the merged config

Owns: wiring the terminal task set (training families for training, the held-out family for evaluation)
and `Terminus2Generator` into `AsyncAgentTrainer`, and the summary (`<output_dir>/summary.json` and the
closing lines): held-out solve rate before and after training with standard errors, wall time,
episodes/s, agent turns per episode, and episodes a weight push landed in. Training itself is fullasync's.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from a checkout

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from examples.terminus.config import BUILTIN_POLICY, TerminusTrainConfig  # noqa: E402
from fullasync_agents.terminus import Terminus2Generator  # noqa: E402

ConfigStore.instance().store(name="terminus_schema", node=TerminusTrainConfig)


class TrackedTerminus(Terminus2Generator):
    """The adapter, counting the weight versions each episode's tokens came from (pushes that landed mid-episode)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.episodes_spanning_versions = 0
        self.episodes_with_resumed_calls = 0
        self.episodes = 0

    async def generate(self, episode, row):
        try:
            return await super().generate(episode, row)
        finally:
            calls = episode.client.episode.calls
            self.episodes += 1
            self.episodes_spanning_versions += len({v for call in calls for v in call.output_versions}) > 1
            self.episodes_with_resumed_calls += any(call.num_resumes for call in calls)


def solve_rate(mean: float | None, episodes: int) -> dict[str, float | None]:
    """The held-out solve rate with its binomial standard error over `episodes`."""
    if mean is None:
        return {"rate": None, "stderr": None}
    return {"rate": mean, "stderr": math.sqrt(max(mean * (1 - mean), 0.0) / episodes)}


async def run(config: TerminusTrainConfig) -> dict[str, Any]:
    from fullasync.api import AsyncAgentTrainer
    from fullasync_agents.terminal_tasks import rows

    started = time.monotonic()
    if config.model.path == BUILTIN_POLICY:
        from examples.terminus.warmup import TerminusWarmupSpec, build_warm_policy

        config.model.path = str(build_warm_policy(TerminusWarmupSpec(pane_height=config.agent.pane_height)))
        print(f"[terminus] warm policy {config.model.path} ready in {time.monotonic() - started:.0f} s", flush=True)
    train, held_out = rows("train", hint=config.agent.hint), rows("held_out", hint=config.agent.hint)
    config.val_samples_per_row = config.evaluation.samples_per_row
    generator = TrackedTerminus(config.agent_config())
    result = await AsyncAgentTrainer(config, rollout_fn=generator, train_dataset=train,
                                     val_dataset=held_out).train_async()
    episodes = len(held_out) * config.evaluation.samples_per_row
    turns = generator.turns
    summary = {
        "wall_s": time.monotonic() - started,
        **result.summary(),
        "held_out_before": solve_rate(result.val_before, episodes),
        "held_out_after": solve_rate(result.val_after, episodes),
        "held_out_episodes": episodes,
        "trained_episodes_per_s": result.samples_per_s,
        "turns_per_episode": sum(turns) / len(turns) if turns else 0.0,
        "exit_statuses": dict(generator.exit_statuses),
        "episodes": generator.episodes,
        "episodes_spanning_weight_versions": generator.episodes_spanning_versions,
        "episodes_with_resumed_calls": generator.episodes_with_resumed_calls,
    }
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def report(summary: dict[str, Any]) -> str:
    before, after = summary["held_out_before"], summary["held_out_after"]
    rate = "{rate:.3f} ± {stderr:.3f}".format
    return "\n".join([
        f"[terminus] held-out solve rate {rate(**before)} → {rate(**after)} "
        f"({summary['held_out_episodes']} episodes each, binomial standard errors)",
        f"[terminus] {summary['steps']} steps, wall {summary['wall_s']:.0f} s (training {summary['train_wall_s']:.0f} s), "
        f"{summary['trained_episodes_per_s']:.3f} trained episodes/s, {summary['turns_per_episode']:.2f} agent turns "
        f"per episode; rows {summary['rows']}; failures {summary['episode_failures']}",
        f"[terminus] exits {summary['exit_statuses']}; of {summary['episodes']} episodes, "
        f"{summary['episodes_spanning_weight_versions']} spanned weight versions (a push landed mid-episode), "
        f"{summary['episodes_with_resumed_calls']} had a generation interrupted and resumed",
    ])


@hydra.main(config_path="config", config_name="train", version_base=None)
def main(cfg) -> None:
    from fullasync.logs import configure_logging

    configure_logging()
    config: TerminusTrainConfig = OmegaConf.to_object(cfg)
    config.validate()
    print(report(asyncio.run(run(config))), flush=True)


if __name__ == "__main__":
    main()
