"""A simulated inference engine and trainer that run the real control code on a virtual clock.

`fullasync.sim` models the expensive parts of RL post-training — decoding, prefill, training,
weight pushes — as time on an asyncio clock, and plugs them into the real rollouter, admission
control, message queue, weight sync, client continuation and training loop through the same
protocols as vLLM and verl. `bench/scheduling.py` uses it to measure how close each mode gets to
the throughput bound of a workload, `bench/control_plane.py` to measure the driver's CPU and event-loop
lag at thousands of episodes (`loop_lag.py`), and `bench/peer_schedulers.py` to run other frameworks'
scheduling rules (`peers.py`) on the same devices and workloads.

Does not own: any control logic (it runs the real one). May import: `contracts`, `config`, `infra`, `observe`,
`weights`, `client`, `rollout`, `run`, `types`, `errors`.
"""
