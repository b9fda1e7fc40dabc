"""What a run shows of itself: console and file logging (`logs.py`), per-step metrics (`metrics.py`), the
experiment loggers W&B / MLflow / SwanLab / TensorBoard (`tracking.py`) and sampled rollouts (`samples.py`).

Does not own: what is measured (the components report it).
May import: `config`, `contracts`, `infra`, `types`, `errors`.
"""
