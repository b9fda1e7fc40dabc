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

from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples.harness_train import HarnessExample, TracksWeightVersions
from examples.terminus.config import BUILTIN_POLICY, TerminusTrainConfig
from fullasync_agents.terminus import Terminus2Generator


class TrackedTerminus(TracksWeightVersions, Terminus2Generator):
    """The adapter, counting the weight versions each episode's tokens came from (pushes that landed mid-episode)."""


def warm_policy(config: TerminusTrainConfig) -> Path:
    from examples.terminus.warmup import TerminusWarmupSpec, build_warm_policy

    return build_warm_policy(TerminusWarmupSpec(pane_height=config.agent.pane_height))


def task_families() -> dict[str, Callable[..., list[dict[str, Any]]]]:
    from fullasync_agents.terminal_tasks import rows
    from fullasync_agents.terminal_tasks.settings import setting_rows

    return {"settings": setting_rows, "commands": rows}


EXAMPLE = HarnessExample(
    tag="terminus", schema=TerminusTrainConfig, builtin_policy=BUILTIN_POLICY, warm_policy=warm_policy,
    task_families=task_families, generator=lambda config: TrackedTerminus(config.agent_config()),
    per_episode=("turns_per_episode", "agent turns", lambda generator: generator.turns))
run, report = EXAMPLE.run, EXAMPLE.report

if __name__ == "__main__":
    EXAMPLE.main(__doc__ or "", Path(__file__).parent / "config")
