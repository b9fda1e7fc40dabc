"""Train a policy through mini-swe-agent (its released code, unchanged) fully asynchronously (Hydra).
Run from the repository root:

    python -m examples.mini_swe.train                                   # tiny warmed-up policy, this machine
    python -m examples.mini_swe.train total_steps=40 agent.step_limit=4 max_staleness=4
    python -m examples.mini_swe.train model.path=/models/Qwen2.5-7B-Instruct agent.action_format=tool_call \\
        agent.tasks=bugs agent.hint=false agent.templates_from=<site-packages>/minisweagent/config/mini.yaml \\
        agent.max_tokens=1024 agent.step_limit=30 engine.max_model_len=32768 engine.num_engines=8
    python -m examples.mini_swe.train --cfg job                         # print the merged config
    python -m examples.mini_swe.train --help                            # every field with its type, default and help

Owns: wiring a toy SWE task set (`agent.tasks`: the `settings` family, held-out names never trained on, or the
seeded `bugs`, held-out bug families) and
`MiniSweAgentGenerator` into `AsyncAgentTrainer`, and the summary (`<output_dir>/summary.json` and the
closing lines): held-out solve rate before and after training with standard errors, wall time,
episodes/s, model calls per episode, and episodes a weight push landed in. Training itself is fullasync's.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from examples import harness_train
from examples.mini_swe.config import BUILTIN_POLICY, MiniSweTrainConfig
from fullasync.config.doc import exit_with_help_if_asked
from fullasync_agents.mini_swe import MiniSweAgentGenerator

ConfigStore.instance().store(name="mini_swe_schema", node=MiniSweTrainConfig)
PER_EPISODE = "model_calls_per_episode"


class TrackedMiniSwe(harness_train.TracksWeightVersions, MiniSweAgentGenerator):
    """The adapter, counting the weight versions each episode's tokens came from (pushes that landed mid-episode)."""


async def run(config: MiniSweTrainConfig) -> dict[str, Any]:
    from fullasync_agents.swe_tasks import rows, setting_rows

    started = time.monotonic()
    if config.model.path == BUILTIN_POLICY:
        from examples.mini_swe.warmup import build_warm_policy

        config.model.path = str(build_warm_policy())
        print(f"[mini_swe] warm policy {config.model.path} ready in {time.monotonic() - started:.0f} s", flush=True)
    task_rows = setting_rows if config.agent.tasks == "settings" else rows
    train, held_out = task_rows("train", hint=config.agent.hint), task_rows("held_out", hint=config.agent.hint)
    generator = TrackedMiniSwe(config.agent_config())
    return await harness_train.train_and_summarize(config, generator, train, held_out, started, PER_EPISODE,
                                                   lambda: generator.model_calls)


def report(summary: dict[str, Any]) -> str:
    return harness_train.report(summary, "mini_swe", PER_EPISODE, "model calls")


@hydra.main(config_path="config", config_name="train", version_base=None)
def main(cfg) -> None:
    from fullasync.observe.logs import configure_logging

    configure_logging()
    config: MiniSweTrainConfig = OmegaConf.to_object(cfg)
    config.validate()
    print(report(asyncio.run(run(config))), flush=True)


if __name__ == "__main__":
    exit_with_help_if_asked(sys.argv[1:], MiniSweTrainConfig, __doc__ or "",
                            Path(__file__).parent / "config" / "train.yaml")
    main()
