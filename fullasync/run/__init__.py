"""Where a run is assembled and supervised: the one place that wires engines, rollouter, queue and trainer.

- `contracts.py`: the typed seams — `GroupQueue` (with `RayGroupQueue`, the Ray actor behind it) and
  `Trainer` (`VerlTrainer` and the simulator's `SimulatedTrainer` both satisfy it).
- `assemble.py`: `assemble(...)` builds one run's components; `Run.execute(rows)` validates, generates,
  trains and stops everything again, in that order.
- `loop.py`: the training loop (pull groups → train → push), which sees the rollouter only through
  `RolloutControl`.
- `validation.py`: held-out evaluation, run while training generation is paused.
- `checkpoint.py`: the checkpoint format, atomic saves, finding the newest complete one, and refusing
  one written by an incompatible run (`Run.checkpoint` / `Run.restore` capture and restore the state).

`AsyncAgentTrainer` (`fullasync.api`), the simulator (`fullasync.sim`) and the benchmarks all call `assemble`.
"""

from fullasync.contracts.run import GroupQueue, Trainer
from fullasync.run.assemble import Run, RunSettings, assemble
from fullasync.run.loop import LoopResult, TrainingLoop
from fullasync.run.queue import RayGroupQueue

__all__ = ["GroupQueue", "LoopResult", "RayGroupQueue", "Run", "RunSettings", "Trainer", "TrainingLoop", "assemble"]
