"""The offline toy SWE task set (30 stdlib-Python repositories, one seeded bug each): see `tasks.py`."""

from fullasync_agents.swe_tasks.catalog import BUGS, HELD_OUT_FAMILIES, TRAIN_FAMILIES, Bug
from fullasync_agents.swe_tasks.tasks import held_out_rows, oracle_command, rows, train_rows

__all__ = ["BUGS", "Bug", "HELD_OUT_FAMILIES", "TRAIN_FAMILIES", "held_out_rows", "oracle_command", "rows",
           "train_rows"]
