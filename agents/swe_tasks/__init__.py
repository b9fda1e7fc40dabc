"""The offline toy SWE task sets: 30 stdlib-Python repositories with one seeded bug each (`tasks.py`), and the
`settings` family, 200 repositories whose fix copies one name from the issue (`settings.py`)."""

from fullasync_agents.swe_tasks.catalog import BUGS, HELD_OUT_FAMILIES, TRAIN_FAMILIES, Bug
from fullasync_agents.swe_tasks.settings import setting_rows
from fullasync_agents.swe_tasks.tasks import held_out_rows, oracle_command, rows, train_rows

__all__ = ["BUGS", "Bug", "HELD_OUT_FAMILIES", "TRAIN_FAMILIES", "held_out_rows", "oracle_command", "rows",
           "setting_rows", "train_rows"]
