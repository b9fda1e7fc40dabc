"""fullasync_agents: existing agent harnesses plugged into fullasync unchanged, with offline task sets.

Owns: adapters that run a harness's own released code against an episode's gateway base URL
(`fullasync_agents.mini_swe.MiniSweAgentGenerator`; `fullasync_agents.terminus.Terminus2Generator`, in harbor's
Python >= 3.12 interpreter), the coding-agent CLIs run once per episode against its base URL
(`fullasync_agents.claude_code`, `fullasync_agents.codex`, over `coding_agents`; installed by `make
setup-coding-agents`), verifiers environments run unchanged in verifiers' own interpreter
(`fullasync_agents.verifiers`, `data.task=verifiers:<id>`; `make setup-verifiers`), the task sets they train on
(`fullasync_agents.swe_tasks`, toy repositories, also as SWE-bench-style records; `fullasync_agents.terminal_tasks`,
harbor-format terminal tasks), per-episode sandboxes (`sandbox`, a copy on the host; `containers`, the row's
container), a warm harness process forking one process per episode under a hard time limit (`zygote`, `launcher`),
and what both adapters share (`harness_generator`, `lazy_exports`). Installed from the repository's `agents/` folder
under this name (the bare name `agents` belongs to the OpenAI Agents SDK). Does not own: the gateway, recording or
training (all in `fullasync`).
"""
