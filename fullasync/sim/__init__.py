"""A simulated inference engine and trainer that run the real control code on a virtual clock.

`fullasync.sim` models the expensive parts of RL post-training — decoding, prefill, training,
weight pushes — as time on an asyncio clock, and plugs them into the real rollouter, admission
control, message queue, weight sync, client continuation and training loop through the same
protocols as vLLM and verl. `bench/scheduling.py` uses it to measure how close each mode gets to
the throughput bound of a workload.
"""
