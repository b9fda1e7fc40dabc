"""How a weight version travels from the trainer into every engine: below both, so the trainer never imports
the engines.

- `sync.py`: `WeightSync`, the push as a transaction over all engines (versions, retries, restarts' weights).
- `transport.py`: the transports (`ObjectStoreTransport`, `StreamTransport`), picked by the config's
  `trainer.weight_transport` (`weight_transport(kind, trainer)`).
- `stream.py`: a push streamed by the trainer's ranks to the engines' workers (plan, send, receive).
- `shm.py`: buckets of whole tensors in shared memory; `digests.py`: checksums of what arrived.
- `vllm.py`: the shared-memory backend registered in vLLM's weight-transfer factory (loaded in vLLM's processes).

Does not own: when a push happens (the run's loop) or pausing inside an engine (`Engine.install`).
May import: `contracts`, `config`, `infra`, `observe`, `types`, `errors`.
"""
