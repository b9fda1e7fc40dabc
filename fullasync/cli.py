"""`fullasync train`: the command line, a Hydra app over `RunConfig`.

    fullasync train                                   # built-in task, fully async, defaults
    fullasync train mode=sync trainer.lr=1e-5         # overrides
    fullasync train --cfg job                         # print the merged config and exit
    fullasync train --help                            # every field with its type, default and help
    fullasync train --hydra-help                      # Hydra's own options

A run checkpoints into output_dir/checkpoints (checkpoint.every) and the same command continues it
(resume=auto). SIGTERM or Ctrl-C: the step under way finishes, a checkpoint is saved and the command
exits with status 143; a second signal stops at once.
"""

from __future__ import annotations

import logging
import sys

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from fullasync.config import RunConfig
from fullasync.config_doc import HELP_FLAGS, exit_with_help_if_asked

COMMANDS = ("train",)
EXIT_INTERRUPTED = 143  # 128 + SIGTERM: stopped by a signal after saving a checkpoint


def _register() -> None:
    ConfigStore.instance().store(name="fullasync_train", node=RunConfig)


def _train(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    from fullasync.api import AsyncAgentTrainer
    from fullasync.run.checkpoint import IncompatibleCheckpointError

    config = OmegaConf.to_object(cfg)
    assert isinstance(config, RunConfig)  # the structured schema registered by _register
    try:
        trainer = AsyncAgentTrainer(config)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"fullasync: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        result = trainer.train()
    except IncompatibleCheckpointError as error:
        print(f"fullasync: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    log = logging.getLogger("fullasync")
    if result.interrupted:
        log.warning("stopped by a signal at step %d; run the same command to continue from the checkpoint",
                    result.steps)
        raise SystemExit(EXIT_INTERRUPTED)
    log.info("done: %d steps, %d samples in %.1f s (%.1f samples/s), rows %s, episode failures %d%s, "
             "max token staleness %d", result.steps, result.trained_samples, result.train_wall_s,
             result.samples_per_s, result.outcomes, result.episode_failures,
             f" {result.failure_reasons}" if result.failure_reasons else "", result.max_token_staleness)
    if result.val_before is not None and result.val_after is not None:
        failed = f" ({result.val_failed_episodes} validation episodes failed)" if result.val_failed_episodes else ""
        log.info("held-out accuracy: before %.3f → after %.3f (%+.3f)%s", result.val_before, result.val_after,
                 result.val_after - result.val_before, failed)


def main() -> None:
    import hydra

    usage = f"usage: fullasync {{{','.join(COMMANDS)}}} [key=value ...] [--cfg job] [--help] [--hydra-help]"
    examples = (__doc__ or "").split("\n", 2)[2]  # the lines after the docstring's title
    if len(sys.argv) == 2 and sys.argv[1] in HELP_FLAGS:
        print(f"{usage}\n\n{examples}", end="")
        raise SystemExit(0)
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(usage, file=sys.stderr)
        raise SystemExit(2)
    exit_with_help_if_asked(sys.argv[2:], RunConfig, f"{usage}\n\n{examples}")
    sys.argv = [f"fullasync {sys.argv[1]}", *sys.argv[2:]]
    _register()
    app = hydra.main(version_base=None, config_name="fullasync_train")(_train)
    app()


if __name__ == "__main__":
    main()
