"""Where a run is assembled and supervised: the one place that wires engines, rollouter, queue and trainer.

- `assemble.py`: `assemble(...)` builds one run's components; `Run.execute(rows)` validates, generates,
  trains and stops everything again, in that order, and awaits the rollouter's crash and the engines' failure
  beside the loop.
- `loop.py`: the training loop (pull groups → train → push), which sees the rollouter only through
  `RolloutControl`; new versions reach the rollouter from the weight sync it observes.
- `queue.py`: `MessageQueue` (the `GroupQueue` between rollouter and trainer), in process or as a Ray actor.
- `validation.py`: held-out evaluation, run while training generation is paused.
- `checkpoint.py`: the checkpoint format, atomic saves, finding the newest complete one, and refusing
  one written by an incompatible run (`Run.checkpoint` / `Run.restore` capture and restore the state).

`AsyncAgentTrainer` (`fullasync.api`), the simulator (`fullasync.sim`) and the benchmarks all call `assemble`.
Does not own: starting engines or the trainer (the caller hands them in), generation or the update itself.
May import: `contracts`, `config`, `infra`, `observe`, `weights`, `client`, `gateway`, `rollout`, `types`,
`errors`.
"""

from fullasync.contracts.run import GroupQueue, Trainer
from fullasync.run.assemble import Run, RunSettings, assemble
from fullasync.run.loop import LoopResult, TrainingLoop
from fullasync.run.queue import RayGroupQueue

__all__ = ["GroupQueue", "LoopResult", "RayGroupQueue", "Run", "RunSettings", "Trainer", "TrainingLoop", "assemble"]
