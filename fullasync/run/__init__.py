"""Where a run is assembled and supervised: the one place that wires engines, rollouter, queue and trainer.

- `assemble.py`: `assemble(...)` builds one run's components (`RunParts`).
- `runner.py`: `RunSettings` (read from the config once) and `Run`: `Run.execute(rows)` validates, generates,
  trains and stops everything again, in that order, and awaits the rollouter's crash and the engines' failure
  beside the loop; it checkpoints and restores the whole run.
- `loop.py`: the training loop (batch → train → push), which sees the rollouter only through `RolloutControl`;
  new versions reach the rollouter from the weight sync, hand-overs from the batcher, both of which it observes.
- `batching.py`: `Batcher`, the trainer's side of the queue: each step's batch (reads that wake on events, not a
  clock) and its last groups bound late; it publishes each hand-over to its observers.
- `healing.py`: `HealingTrainer`, the trainer behind calls that survive a dead rank (restart, train again, retry).
- `result.py`: `LoopResult`, the run's account.
- `queue.py`: `MessageQueue` (the `GroupQueue` between rollouter and trainer), in process or as a Ray actor.
- `validation.py`: held-out evaluation, run while training generation is paused.
- `checkpoint.py`: the checkpoint format, atomic saves, finding the newest complete one, and refusing
  one written by an incompatible run (`Run.checkpoint` / `Run.restore` capture and restore the state).

`AsyncAgentTrainer` (`fullasync.api`), the simulator (`fullasync.sim`) and the benchmarks all call `assemble`.
This package's `__init__` imports nothing: a caller of `run/checkpoint.py` alone (`fullasync export`) loads
neither the client nor the gateway.
Does not own: starting engines or the trainer (the caller hands them in), generation or the update itself.
May import: `contracts`, `config`, `infra`, `observe`, `weights`, `client`, `gateway`, `rollout`, `types`,
`errors`.
"""
