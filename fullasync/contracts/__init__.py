"""The seams between components, as records and protocols (stdlib only; torch and Ray are named for the type
checker). As AReaL's `areal/api`: a component implements one of these, another calls it, and neither imports the
other.

- `engine.py`: `Engine` (what the router, client, weight sync and run do with an engine), `GenerateRequest` /
  `GenerateResult` / `TokenDelta`, `SamplingOptions`, `PauseMode`, `InstallTiming`.
- `run.py`: `GroupQueue` and `Trainer` (the loop's view of the queue and the trainer), `QueueBatch`, `QueueStats`.
- `weights.py`: `WeightsPayload` (what one version is on its way to `Engine.install`) and `WeightTransport`.
- `tokenizer.py`: `Tokenizer`, what the client and the chat-template checks use of a tokenizer (a Hugging Face
  tokenizer has it; so does the simulator's).

Does not own: any implementation. May import: `types`, `errors`.
"""
