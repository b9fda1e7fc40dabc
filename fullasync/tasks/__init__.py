"""The built-in task that `fullasync train` runs by default: single-digit sums (`arithmetic.py`), and the
short supervised warm-up that gives it a starting policy with a checkable margin to gain (`warmup.py`).

Does not own: the run (`api`) or models' builds (`models`).
May import: `contracts`, `config`, `infra`, `models`, `types`, `errors`.
"""
