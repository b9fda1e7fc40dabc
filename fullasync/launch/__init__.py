"""Launching a run's parts from its config: the model directory, the engines' and the client's settings, the trainer.

- `model.py`: `resolve_model_path` (model.path → a directory engines and trainer load, the chat template applied);
  it touches neither the client nor an engine, so exporting a checkpoint loads neither.
- `parts.py`: `engine_config`, `client_config`, `check_chat_setup` (the template and the client's parsers fit,
  before anything starts), `start_trainer` (with its ready line) and `log_layout` (what runs where).
- `beside.py`: `ServedModels`, the models beside the policy the run serves itself (a judge on engines of its own).

`AsyncAgentTrainer` (`fullasync.api`), `fullasync evaluate` and `export`, the examples and the benchmarks launch
through these. Does not own: the run itself (`fullasync.run`), the engines' or the trainer's own code.
May import: `contracts`, `config`, `infra`, `observe`, `weights`, `engines`, `trainer`, `client`, `models`, `tasks`,
`presets`, `types`, `errors`.
"""
