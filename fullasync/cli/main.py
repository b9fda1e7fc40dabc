"""`fullasync train`: the command line, a Hydra app over `RunConfig`; and `fullasync doctor`, `fullasync --version`.

    fullasync train                                   # built-in task, fully async, defaults
    fullasync train mode=sync trainer.lr=1e-5         # overrides
    fullasync train preset=gpu-1x8-8b data.train_dataset=rows.jsonl data.rollout_fn=my_agent:rollout_fn  # a GPU node
    fullasync train --cfg job                         # print the merged config and exit
    fullasync train --help                            # every field with its type, default and help
    fullasync train --hydra-help                      # Hydra's own options
    fullasync eval model.path=outputs/run/checkpoint  # held-out score ± SE of a model through the harness
    fullasync export outputs/run/checkpoints/step_00000030 my-model   # a step checkpoint as a Hugging Face folder
    fullasync export outputs/run/checkpoints/step_00000030 my-model --push-to-hub me/my-model   # ... and upload it
    fullasync doctor                                  # can this environment run fullasync? (how to fix what fails)
    fullasync doctor --gpu                            # + CUDA and driver, Ray's GPUs, engine + trainer step + push
    fullasync doctor --containers                     # + episode containers: podman, free disk, the base image
    fullasync report outputs/run                      # the run's curves: outputs/run/report/index.html and PNGs
    fullasync --version

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
from fullasync.config.compose import UndeclaredSettingError, build_config, schema_node
from fullasync.config.doc import HELP_FLAGS, exit_with_help_if_asked

COMMANDS = ("train", "eval", "export", "doctor", "report")
PRESETS = "pkg://fullasync.presets"  # the primary config (train.yaml) and the `preset` group
EXIT_INTERRUPTED = 143  # 128 + SIGTERM: stopped by a signal after saving a checkpoint


def _register() -> None:
    ConfigStore.instance().store(name="fullasync_train", node=schema_node(RunConfig))


def _run_config(cfg: DictConfig) -> RunConfig:
    """The composed config as a RunConfig; a setting no field declares exits 2 naming the nearest one."""
    from fullasync.engines.vllm.args import engine_arg_names

    try:
        return build_config(cfg, RunConfig, engine_arg_names)
    except UndeclaredSettingError as error:
        print(f"fullasync: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def _train(cfg: DictConfig) -> None:
    config = _run_config(cfg)  # before the imports below (~12 s): a mistyped setting is refused at once

    from fullasync.api import AsyncAgentTrainer
    from fullasync.infra.placement import LayoutError
    from fullasync.models.hub import InvalidModelError
    from fullasync.observe.tracking import LoggerUnavailableError
    from fullasync.run.checkpoint import IncompatibleCheckpointError

    try:
        trainer = AsyncAgentTrainer(config)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"fullasync: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        result = trainer.train()
    except (InvalidModelError, LoggerUnavailableError, LayoutError) as error:
        print(f"fullasync: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None
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


def _eval(cfg: DictConfig) -> None:
    """`fullasync eval`: the config's model on its held-out rows (data.val_dataset or the task's) through its
    harness, `val_samples_per_row` episodes per row; the report goes to output_dir/eval.json."""
    config = _run_config(cfg)  # before the imports below: a mistyped setting is refused at once

    import asyncio

    from fullasync.cli.evaluate import evaluate_model
    from fullasync.observe.logs import configure_logging

    configure_logging()
    try:
        report = asyncio.run(evaluate_model(config))
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"fullasync: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    logging.getLogger("fullasync").info("%s: %s → %s/eval.json", config.model.path, report.line(),
                                        config.output_dir)


def _export(argv: list[str]) -> int:
    import argparse
    import asyncio
    from pathlib import Path

    from fullasync.cli.export import HubUploadError, check_hub_upload, export_checkpoint, push_to_hub
    from fullasync.observe.logs import configure_logging

    parser = argparse.ArgumentParser(prog="fullasync export", description="a step checkpoint of a run "
                                     "(output_dir/checkpoints/step_N) as a Hugging Face model folder")
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory: output_dir/checkpoints/step_NNNNNNNN")
    parser.add_argument("target", type=Path, help="a new or empty directory for the model")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="settings the checkpoint does not fix, e.g. trainer.worker_num_cpus=1")
    parser.add_argument("--push-to-hub", metavar="REPO", default=None,
                        help="then upload the folder to this Hugging Face Hub model repo (org/name; created if absent)")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        if args.push_to_hub:
            check_hub_upload(args.push_to_hub)  # before the export's minutes of work
        target = asyncio.run(export_checkpoint(args.checkpoint, args.target, args.overrides))
    except (ValueError, FileNotFoundError, HubUploadError) as error:
        print(f"fullasync export: {error}", file=sys.stderr)
        return 2
    print(f"fullasync export: {target}")
    if args.push_to_hub:
        url = push_to_hub(target, args.push_to_hub, private=args.private)
        print(f"fullasync export: uploaded to {url}")
    return 0


def _report(argv: list[str]) -> int:
    import argparse
    from pathlib import Path

    from fullasync.cli.report import ReportError, held_out_line, read_steps, read_validations, write_report

    parser = argparse.ArgumentParser(prog="fullasync report", description="a run's curves as PNG files and an "
                                     "HTML page, from its metrics.jsonl (and result.json)")
    parser.add_argument("output_dir", type=Path, help="the run's output_dir")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default OUTPUT_DIR/report)")
    args = parser.parse_args(argv)
    try:
        page = write_report(args.output_dir, args.out)
    except ReportError as error:
        print(f"fullasync report: {error}", file=sys.stderr)
        return 2
    print(f"fullasync report: {held_out_line(read_validations(args.output_dir), read_steps(args.output_dir))}")
    print(f"fullasync report: {page}")
    return 0


def main() -> None:
    import hydra

    usage = ("usage: fullasync {train,eval} [key=value ...] [--cfg job] [--help] [--hydra-help] | "
             "fullasync export CHECKPOINT DIR [key=value ...] [--push-to-hub REPO] | "
             "fullasync doctor [--gpu|--stack|--containers] | fullasync report OUTPUT_DIR [--out DIR] | "
             "fullasync --version")
    examples = (__doc__ or "").split("\n", 2)[2]  # the lines after the docstring's title
    if len(sys.argv) == 2 and sys.argv[1] in HELP_FLAGS:
        print(f"{usage}\n\n{examples}", end="")
        raise SystemExit(0)
    if len(sys.argv) == 2 and sys.argv[1] in ("--version", "-V"):
        from importlib.metadata import version

        print(f"fullasync {version('fullasync')}")
        raise SystemExit(0)
    if sys.argv[1:2] == ["doctor"]:
        if sys.argv[2:] not in ([], ["--gpu"], ["--stack"], ["--containers"]):
            print(f"fullasync doctor takes --gpu, --stack or --containers (got {' '.join(sys.argv[2:])})\n{usage}",
                  file=sys.stderr)
            raise SystemExit(2)
        from fullasync.cli import doctor

        extra = {"--gpu": doctor.GPU_CHECKS, "--stack": (doctor.stack_check,),
                 "--containers": (doctor.containers_check,)}.get(sys.argv[2] if sys.argv[2:] else "", ())
        raise SystemExit(doctor.run(doctor.CHECKS + extra))
    if sys.argv[1:2] == ["report"]:
        raise SystemExit(_report(sys.argv[2:]))
    if sys.argv[1:2] == ["export"]:
        raise SystemExit(_export(sys.argv[2:]))
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(usage, file=sys.stderr)
        raise SystemExit(2)
    exit_with_help_if_asked(sys.argv[2:], RunConfig, f"{usage}\n\n{examples}")
    command = sys.argv[1]
    sys.argv = [f"fullasync {command}", *sys.argv[2:]]
    _register()
    app = hydra.main(version_base=None, config_path=PRESETS, config_name="train")(  # train.yaml: schema, preset
        _eval if command == "eval" else _train)
    app()


if __name__ == "__main__":
    main()
