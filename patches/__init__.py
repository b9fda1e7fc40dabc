"""Runtime adaptations of upstream libraries, applied by code (users never run `git apply`).

Each module adapts one upstream for one purpose, checks the upstream version it was written
against, is idempotent, and has a test (tests/integration/test_<name>_patch.py) that fails when
upstream changes what the module relies on, or no longer needs it.

The directory `patches/` installs as the package `fullasync_patches` (a bare `patches` could be any
other distribution's), so code imports `fullasync_patches.<name>`.

- `fullasync_patches.verl_cpu`: a CPU platform for verl 0.9.1 (gloo, FSDP2 on CPU).
- `fullasync_patches.ray_loopback`: keeps a local Ray head on 127.0.0.1.
"""
