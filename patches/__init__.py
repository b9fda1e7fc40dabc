"""Runtime adaptations of upstream libraries, applied by code (users never run `git apply`).

Each module adapts one upstream for one purpose, checks the upstream version it was written
against, is idempotent, and has a test (tests/test_<name>_patch.py) that fails when upstream
changes what the module relies on, or no longer needs it.

- `patches.verl_cpu`: a CPU platform for verl 0.9.1 (gloo, fp32, FSDP2 on CPU).
- `patches.ray_loopback`: keeps a local Ray head on 127.0.0.1.
"""
