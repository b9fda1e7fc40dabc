"""The verl trainer's state through a checkpoint: real verl (FSDP2 on CPU), real Ray, the tiny model.

A restored trainer must be the saved one: the same optimizer state bit for bit, the same step, and
the same next update (weights after one more identical step are bitwise equal).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_trainer import fresh_model, groups_for

from fullasync.config import LoraConfig
from fullasync.trainer import TrainerConfig, VerlTrainer


def optimizer_files(path: Path) -> dict[str, dict]:
    return {p.name: torch.load(p, weights_only=False) for p in sorted(path.glob("optim_world_size_*_rank_*.pt"))}


def assert_bitwise_equal(a, b, where: str = "") -> None:
    """Nested optimizer state: tensors equal bit for bit, everything else equal."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(_bits(a), _bits(b)), f"{where} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_bitwise_equal(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bitwise_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.slow  # CI's slow tier: kill-and-resume restores a run end to end in the same tier
@pytest.mark.parametrize("lora", [LoraConfig(), LoraConfig(rank=4, alpha=8)],
                         ids=["full", "lora"])
async def test_a_restored_trainer_has_the_saved_optimizer_state_and_takes_the_same_next_step(
        ray_cluster, tiny_model_path, tmp_path, lora):
    config = TrainerConfig(lr=1e-2, micro_batch_size=2, call_timeout_s=120, lora=lora)
    model = fresh_model(tiny_model_path)
    groups = groups_for(model)
    original = VerlTrainer(tiny_model_path, config)
    await original.start()
    try:
        await original.train_step(original.build_batch(groups), 0)
        await original.train_step(original.build_batch(groups), 1)
        await original.save_state(str(tmp_path / "saved"))
        await original.train_step(original.build_batch(groups), 2)
        after_original = await original.export_weights()
        after_original = {k: v.clone() for k, v in (await after_original).items()}
    finally:
        await original.shutdown()

    restored = VerlTrainer(tiny_model_path, config)
    await restored.start()
    try:
        await restored.load_state(str(tmp_path / "saved"))
        assert restored.step == 2
        await restored.save_state(str(tmp_path / "again"))
        saved, again = optimizer_files(tmp_path / "saved"), optimizer_files(tmp_path / "again")
        assert saved and saved.keys() == again.keys()
        assert_bitwise_equal(saved, again)
        assert any(isinstance(v, torch.Tensor) and v.abs().sum() > 0 for v in _tensors(saved)), "empty optimizer state"
        await restored.train_step(restored.build_batch(groups), 2)
        after_restored = await (await restored.export_weights())
    finally:
        await restored.shutdown()
    assert after_original.keys() == after_restored.keys() and len(after_original) > 3
    for name, tensor in after_original.items():
        assert torch.equal(tensor, after_restored[name]), f"{name}: the next step differs after the restore"


async def test_loading_a_state_saved_by_another_number_of_ranks_says_which_setting_to_use(tiny_model_path, tmp_path):
    (tmp_path / "trainer.json").write_text('{"step": 3, "num_workers": 2}')
    trainer = VerlTrainer(tiny_model_path, TrainerConfig(micro_batch_size=2))  # checked before any rank is asked
    with pytest.raises(ValueError, match="resume with trainer.num_workers=2"):
        await trainer.load_state(str(tmp_path))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (so -0.0 vs 0.0 or two NaN payloads count as different); a DTensor's local shard."""
    if hasattr(tensor, "to_local"):
        tensor = tensor.to_local()
    flat = tensor.detach().reshape(-1).contiguous()
    return flat.view(torch.uint8) if flat.is_floating_point() else flat


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
