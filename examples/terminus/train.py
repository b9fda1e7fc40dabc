"""Train a policy through Terminus-2 (harbor 0.24.0's released code, unchanged) fully asynchronously (Hydra).
Run from the repository root, after `make setup setup-terminus`:

    python -m examples.terminus.train                                   # tiny warmed-up policy, this machine
    python -m examples.terminus.train total_steps=40 agent.max_turns=4 max_staleness=4
    python -m examples.terminus.train model.path=/models/Qwen2.5-7B-Instruct agent.tasks=commands agent.hint=false \\
        agent.max_tokens=2048 agent.max_turns=30 agent.pane_width=160 agent.pane_height=40 \\
        engine.max_model_len=32768 engine.num_engines=8
    python -m examples.terminus.train --cfg job                         # print the merged config
    python -m examples.terminus.train --help                            # every field with its type, default and help

Owns: wiring a terminal task set (`agent.tasks`: the `settings` family, held-out names never trained on, or
the 20 shipped `commands` tasks, a held-out family) and `Terminus2Generator` into `AsyncAgentTrainer`, and the
summary (`<output_dir>/summary.json` and the closing lines): held-out solve rate before and after training with
standard errors, wall time, episodes/s, agent turns per episode, and episodes a weight push landed in.
Training itself is fullasync's.
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
from examples.terminus.config import BUILTIN_POLICY, TerminusTrainConfig
from fullasync.config.doc import exit_with_help_if_asked
from fullasync_agents.terminus import Terminus2Generator

ConfigStore.instance().store(name="terminus_schema", node=TerminusTrainConfig)
PER_EPISODE = "turns_per_episode"


class TrackedTerminus(harness_train.TracksWeightVersions, Terminus2Generator):
    """The adapter, counting the weight versions each episode's tokens came from (pushes that landed mid-episode)."""


async def run(config: TerminusTrainConfig) -> dict[str, Any]:
    from fullasync_agents.terminal_tasks import rows
    from fullasync_agents.terminal_tasks.settings import setting_rows

    started = time.monotonic()
    if config.model.path == BUILTIN_POLICY:
        from examples.terminus.warmup import TerminusWarmupSpec, build_warm_policy

        config.model.path = str(build_warm_policy(TerminusWarmupSpec(pane_height=config.agent.pane_height)))
        print(f"[terminus] warm policy {config.model.path} ready in {time.monotonic() - started:.0f} s", flush=True)
    task_rows = setting_rows if config.agent.tasks == "settings" else rows
    train, held_out = task_rows("train", hint=config.agent.hint), task_rows("held_out", hint=config.agent.hint)
    generator = TrackedTerminus(config.agent_config())
    return await harness_train.train_and_summarize(config, generator, train, held_out, started, PER_EPISODE,
                                                   lambda: generator.turns)


def report(summary: dict[str, Any]) -> str:
    return harness_train.report(summary, "terminus", PER_EPISODE, "agent turns")


@hydra.main(config_path="config", config_name="train", version_base=None)
def main(cfg) -> None:
    from fullasync.observe.logs import configure_logging

    configure_logging()
    config: TerminusTrainConfig = OmegaConf.to_object(cfg)
    config.validate()
    print(report(asyncio.run(run(config))), flush=True)


if __name__ == "__main__":
    exit_with_help_if_asked(sys.argv[1:], TerminusTrainConfig, __doc__ or "",
                            Path(__file__).parent / "config" / "train.yaml")
    main()
