"""fullasync_agents: existing agent harnesses plugged into fullasync unchanged, with offline task sets.

Owns: adapters that run a harness's own released code against an episode's gateway base URL
(`fullasync_agents.mini_swe.MiniSweAgentGenerator`), the toy SWE task set they train on
(`fullasync_agents.swe_tasks`) and process-tree clean-up (`fullasync_agents.processes`). Installed
from the repository's `agents/` folder under this name (the bare name `agents` belongs to the
OpenAI Agents SDK). Does not own: the gateway, recording or training (all in `fullasync`).
"""
