"""The run's configuration: every knob, declared once with its default, its help and whether a resumed run may
change it. A leaf: it imports no component; the components take their defaults from it.

- `run.py`: `RunConfig` and its sections, the meaning of `mode`, the cross-field checks (`RunConfig.validate`).
- `trainer.py`: `TrainerConfig` (optimiser, loss, corrections, LoRA, the weight transport), nested in `RunConfig`.
- `fields.py`: `setting` / `section` (a field with its help) and the walk over them (`config_fields`).
- `checks.py`: checks of single values (Ray resources, logger and chat-template names) and their choice lists.
- `doc.py`: the help printed by `fullasync train --help` and docs/config.md.

Does not own: what a component does with a value, or any I/O beyond checking that a named file exists.
May import: `contracts`, `types`, `errors`.
"""

from fullasync.config.fields import ConfigField, config_fields, section, setting, shared_settings
from fullasync.config.run import (
    BUILTIN_MODEL,
    CheckpointSection,
    DataSection,
    EngineSection,
    LoggingSection,
    Mode,
    ModelSection,
    RolloutSection,
    RunConfig,
)
from fullasync.config.trainer import Correction, LoraConfig, TrainerConfig

__all__ = ["BUILTIN_MODEL", "CheckpointSection", "ConfigField", "Correction", "DataSection", "EngineSection",
           "LoggingSection", "LoraConfig", "Mode", "ModelSection", "RolloutSection", "RunConfig", "TrainerConfig",
           "config_fields", "section", "setting", "shared_settings"]
