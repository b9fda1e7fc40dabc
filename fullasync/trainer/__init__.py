"""The trainer: verl's FSDP2 TrainingWorker behind an async API, and the batches it trains on.

- `TrainerConfig` (`config/trainer.py`): optimiser, loss, advantage and worker settings.
- `build_batch` / `TrainBatch` (`batch.py`): trajectory groups → verl's padded layout with
  per-group outcome advantages, behaviour log-probs and per-token versions.
- `VerlTrainer` (`verl_trainer.py`): start, compute_logprobs, train_step, export_weights (gathered, or
  streamed by the ranks: stream_plan / stream_weights), save_checkpoint, shutdown.

- `corrections.py`: off-policy corrections from per-token versions and log-probs; `worker.py` /
  `worker_group.py` / `verl_setup.py`: verl's workers in Ray and their settings.

`TrainerConfig` loads without torch, Ray or verl; the other names are imported on first use.
Does not own: how weights reach the engines (`weights`), when a step runs (`run`). Never imports `engines`.
May import: `contracts`, `config`, `infra`, `observe`, `weights`, `types`, `errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fullasync.config import TrainerConfig

if TYPE_CHECKING:
    from fullasync.trainer.batch import TrainBatch, build_batch
    from fullasync.trainer.verl_trainer import VerlTrainer

_LAZY = {
    "TrainBatch": "fullasync.trainer.batch",
    "build_batch": "fullasync.trainer.batch",
    "VerlTrainer": "fullasync.trainer.verl_trainer",
}

__all__ = ["TrainBatch", "TrainerConfig", "VerlTrainer", "build_batch"]


def __getattr__(name: str) -> object:  # the names above, imported on first use
    if name not in _LAZY:
        raise AttributeError(f"module 'fullasync.trainer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
