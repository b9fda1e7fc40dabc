"""Generation for training: dataset rows through the user's `rollout_fn`, n episodes each, into the queue.

- `rollouter.py`: `Rollouter` (admission, the row tasks, the zero-variance filter, stopping rows grown too
  stale); `staleness.py`: `StalenessManager`, admission as a ceiling on staleness; `ledger.py`: what became
  of every row; `generator.py`: a plain `rollout_fn` wrapped as a generator once (`as_generator`);
  `group_rewards.py`: a row's episodes scored together before its group is queued;
  `deadline.py`: an episode's timeout; `processes.py`: a harness's process tree, ended with it; `state.py`:
  what a checkpoint keeps of the rollout side.

Does not own: the queue's storage (`run/queue.py`), training, engines, or the HTTP gateway (the run hands in
how an episode is reached). May import: `contracts`, `config`, `infra`, `observe`, `client`, `types`, `errors`.
"""
