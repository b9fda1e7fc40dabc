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

from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples.harness_train import HarnessExample, TracksWeightVersions
from examples.mini_swe.config import BUILTIN_POLICY, MiniSweTrainConfig
from fullasync_agents.mini_swe import MiniSweAgentGenerator


class TrackedMiniSwe(TracksWeightVersions, MiniSweAgentGenerator):
    """The adapter, counting the weight versions each episode's tokens came from (pushes that landed mid-episode)."""


def warm_policy(config: MiniSweTrainConfig) -> Path:
    from examples.mini_swe.warmup import build_warm_policy

    return build_warm_policy()


def task_families() -> dict[str, Callable[..., list[dict[str, Any]]]]:
    from fullasync_agents.swe_tasks import rows, setting_rows
    from fullasync_agents.swe_tasks.records import swe_records

    return {"settings": setting_rows, "bugs": rows,
            "swe-settings": lambda split, hint: swe_records("settings", split, hint=hint)}


EXAMPLE = HarnessExample(
    tag="mini_swe", schema=MiniSweTrainConfig, builtin_policy=BUILTIN_POLICY, warm_policy=warm_policy,
    task_families=task_families, generator=lambda config: TrackedMiniSwe(config.agent_config()),
    per_episode=("model_calls_per_episode", "model calls", lambda generator: generator.model_calls))
run, report = EXAMPLE.run, EXAMPLE.report

if __name__ == "__main__":
    EXAMPLE.main(__doc__ or "", Path(__file__).parent / "config")
