"""Rollout samples: what the policy generated, decoded, written every few train steps for a person to read.

Owns: `RolloutSamples`, which writes the episodes trained at a step (every `logging.samples_every`
steps) to `<output_dir>/rollouts/step_<N>.jsonl`, one JSON object per episode: its row, reward,
metadata, the trainer's version at the step, and per model call the decoded prompt and completion, token counts,
finish reason, the weight versions its tokens were sampled with and their staleness at the step, and the completion
as segments of one version each (a call resumed under new weights has several; `fullasync report` colours them).
Does not own: the metrics (`fullasync.observe.metrics`) or what decides the step (`fullasync.run.loop`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from fullasync.types import ModelCall, Trajectory, TrajectoryGroup

Record = dict[str, Any]  # an episode, or one of its calls or segments, as `step_N.jsonl` holds it (JSON)


class Decoder(Protocol):
    """A tokenizer's `decode` (a flat list of ids gives one string)."""

    def decode(self, token_ids: list[int], /, skip_special_tokens: bool = ...) -> str | list[str]: ...


class RolloutSamples:
    """Decoded episodes of every `every`-th step (0: never) under `directory`."""

    def __init__(self, directory: Path, tokenizer: Decoder, every: int) -> None:
        if every < 0:
            raise ValueError(f"logging.samples_every={every} must be >= 0 (0 = never)")
        self.directory = directory
        self.tokenizer = tokenizer
        self.every = every

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def path(self, step: int) -> Path:
        return self.directory / f"step_{step}.jsonl"

    def write(self, step: int, groups: Sequence[TrajectoryGroup], trainer_version: int) -> list[Record]:
        """Write the step's episodes to `path(step)` (the file appears whole: written aside, then renamed);
        returns the records written."""
        self.directory.mkdir(parents=True, exist_ok=True)
        records = [self.record(step, group.row_id, index, trajectory, trainer_version)
                   for group in groups for index, trajectory in enumerate(group.trajectories)]
        staging = self.path(step).with_suffix(".jsonl.tmp")
        with open(staging, "w") as out:
            out.writelines(json.dumps(record, default=repr) + "\n" for record in records)
        os.replace(staging, self.path(step))
        return records

    def record(self, step: int, row_id: str, index: int, trajectory: Trajectory, trainer_version: int) -> dict:
        return {"step": step, "row_id": row_id, "episode": index, "reward": trajectory.reward,
                "metadata": dict(trajectory.metadata), "trainer_version": trainer_version,
                "calls": [self._call(call, trainer_version) for call in trajectory.calls]}

    def _call(self, call: ModelCall, trainer_version: int) -> Record:
        versions = call.output_versions
        return {
            "prompt": str(self.tokenizer.decode(list(call.prompt_ids), skip_special_tokens=False)),
            "completion": str(self.tokenizer.decode(list(call.output_ids), skip_special_tokens=False)),
            "prompt_tokens": len(call.prompt_ids), "completion_tokens": len(call.output_ids),
            "finish_reason": call.finish_reason.value,
            "versions": [min(versions), max(versions)] if versions else [],
            "staleness": trainer_version - min(versions) if versions else None,
            "resumed": call.num_resumes,
            "segments": self._segments(call),
        }

    def _segments(self, call: ModelCall) -> list[Record]:
        """The completion as runs of tokens of one weight version, each decoded on its own: [{version, text}]."""
        runs: list[tuple[int, list[int]]] = []
        for token, version in zip(call.output_ids, call.output_versions, strict=True):
            if runs and runs[-1][0] == version:
                runs[-1][1].append(token)
            else:
                runs.append((version, [token]))
        return [{"version": version, "text": str(self.tokenizer.decode(tokens, skip_special_tokens=False))}
                for version, tokens in runs]
