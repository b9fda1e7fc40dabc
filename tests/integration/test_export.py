"""`fullasync export`: a step checkpoint becomes a Hugging Face folder with exactly the weights trained to it;
`checkpoint.save_hf_every` writes such folders during the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from fullasync.api import AsyncAgentTrainer
from fullasync.cli.export import export_checkpoint
from fullasync.config import CheckpointSection, RunConfig


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        found.update(load_file(str(path)))
    assert found, f"no safetensors in {directory}"
    return found


def log_probs(directory: Path, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.mark.slow
@pytest.mark.extended
async def test_an_exported_step_checkpoint_is_the_policy_the_run_trained(ray_cluster, tmp_path):
    config = RunConfig(total_steps=2, val_samples_per_row=1, save_checkpoint=True, output_dir=str(tmp_path / "run"),
                       checkpoint=CheckpointSection(every=2, save_hf_every=1))
    trainer = AsyncAgentTrainer(config)
    result = await trainer.train_async()
    assert result.steps == 2
    (step,) = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    exported = await export_checkpoint(step, tmp_path / "exported")
    final = tmp_path / "run" / "checkpoint"  # what the run saved after its last step (the same step)
    ours, theirs = tensors(exported), tensors(final)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids = list(range(5, 40))
    assert torch.equal(log_probs(exported, ids), log_probs(final, ids))
    base = tensors(Path(trainer.model_path()))
    assert any(not torch.equal(ours[k], base[k]) for k in ours if k in base)  # trained: not the starting weights
    assert json.loads((exported / "fullasync_export.json").read_text())["step"] == 2
    with pytest.raises(ValueError, match="already holds files"):
        await export_checkpoint(step, exported)
    # checkpoint.save_hf_every=1: the policy after each step as a Hugging Face folder, written during the run
    saved = sorted((tmp_path / "run" / "hf").iterdir())
    assert [path.name for path in saved] == ["step_00000001", "step_00000002"]
    after_two = tensors(saved[1])
    assert all(torch.equal(after_two[k], theirs[k]) for k in theirs)
    assert not torch.equal(log_probs(saved[0], ids), log_probs(saved[1], ids))  # a step trained between them
    assert [json.loads((path / "fullasync_export.json").read_text())["step"] for path in saved] == [1, 2]
