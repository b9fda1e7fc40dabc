"""The commands: `fullasync train|eval|export|report|doctor` (`main.py`, one module per command) and the demo.

Each command is a thin layer over `fullasync.api` and the components; nothing below imports this package.
Does not own: any component's logic. May import: every package (`contracts`, `config`, `infra`, `observe`,
`weights`, `engines`, `trainer`, `client`, `gateway`, `rollout`, `run`, `models`, `tasks`, `data`, `presets`, `api`,
`launch`, `types`, `errors`).
"""
