"""Train a policy through mini-swe-agent (its released code, unchanged) fully asynchronously (Hydra).
Run from the repository root:

    python examples/mini_swe/train.py                                   # tiny warmed-up policy, this machine
    python examples/mini_swe/train.py total_steps=40 agent.step_limit=4 max_staleness=4
    python examples/mini_swe/train.py model.path=/models/Qwen2.5-7B-Instruct agent.action_format=tool_call \\
        agent.hint=false agent.templates_from=<site-packages>/minisweagent/config/mini.yaml \\
        agent.max_tokens=1024 agent.step_limit=30 engine.max_model_len=32768 engine.num_engines=8
    python examples/mini_swe/train.py --cfg job                         # print the merged config

Owns: wiring the toy SWE task set (train families for training, held-out families for evaluation) and
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from a checkout

import hydra  # noqa: E402
from fullasync_agents.mini_swe import MiniSweAgentGenerator  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from examples import harness_train  # noqa: E402
from examples.mini_swe.config import BUILTIN_POLICY, MiniSweTrainConfig  # noqa: E402

ConfigStore.instance().store(name="mini_swe_schema", node=MiniSweTrainConfig)
PER_EPISODE = "model_calls_per_episode"


class TrackedMiniSwe(harness_train.TracksWeightVersions, MiniSweAgentGenerator):
    """The adapter, counting the weight versions each episode's tokens came from (pushes that landed mid-episode)."""


async def run(config: MiniSweTrainConfig) -> dict[str, Any]:
    from fullasync_agents.swe_tasks import rows

    started = time.monotonic()
    if config.model.path == BUILTIN_POLICY:
        from examples.mini_swe.warmup import build_warm_policy

        config.model.path = str(build_warm_policy())
        print(f"[mini_swe] warm policy {config.model.path} ready in {time.monotonic() - started:.0f} s", flush=True)
    train, held_out = rows("train", hint=config.agent.hint), rows("held_out", hint=config.agent.hint)
    generator = TrackedMiniSwe(config.agent_config())
    return await harness_train.train_and_summarize(config, generator, train, held_out, started, PER_EPISODE,
                                                   lambda: generator.model_calls)


def report(summary: dict[str, Any]) -> str:
    return harness_train.report(summary, "mini_swe", PER_EPISODE, "model calls")


@hydra.main(config_path="config", config_name="train", version_base=None)
def main(cfg) -> None:
    from fullasync.logs import configure_logging

    configure_logging()
    config: MiniSweTrainConfig = OmegaConf.to_object(cfg)
    config.validate()
    print(report(asyncio.run(run(config))), flush=True)


if __name__ == "__main__":
    main()
