"""`fullasync export CHECKPOINT DIR`: any step checkpoint of a run as a Hugging Face model folder.

Owns: rebuilding the run's configuration from the checkpoint's fingerprint (the fields a resumed run must share:
the model, its chat template, the trainer's shape), loading the checkpoint's trainer state into a trainer of
that shape, and writing the policy as a Hugging Face directory (config, safetensors, tokenizer) that
`transformers`, vLLM and `fullasync eval model.path=DIR` load — plus `fullasync_export.json` naming the
checkpoint, its step and weight version. The trainer is the run's own (verl, FSDP2), so the export holds exactly
the weights the run trained at that step; and uploading such a folder to the Hugging Face Hub (`--push-to-hub`),
checked before the export starts (offline mode, no token and a malformed repo id each fail in a second). Does
not own: the checkpoint's format (`fullasync.run.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from omegaconf import OmegaConf

from fullasync.config import RunConfig, config_fields
from fullasync.errors import FullasyncError
from fullasync.run import checkpoint
from fullasync.run.export_note import write_export_note
from fullasync.types import JsonValue


class HubUploadError(FullasyncError, RuntimeError):
    """An upload to the Hub that cannot work from here (the message says why and what to do)."""


def check_hub_upload(repo_id: str) -> None:
    """Raise `HubUploadError` if an upload of `repo_id` cannot start: a malformed id, offline mode, no token."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise HubUploadError(f"--push-to-hub {repo_id!r} is not a repo id (org/name): {error}") from None
    if "/" not in repo_id:
        raise HubUploadError(f"--push-to-hub {repo_id!r}: name the owner too (org/name or user/name)")
    if constants.HF_HUB_OFFLINE:
        raise HubUploadError("--push-to-hub needs the Hub, but HF_HUB_OFFLINE is set: unset it, or export without "
                             "--push-to-hub and upload the folder later (`hf upload REPO DIR`)")
    if get_token() is None:
        raise HubUploadError("--push-to-hub needs a Hugging Face token: run `hf auth login` or set HF_TOKEN")


def push_to_hub(folder: Path, repo_id: str, private: bool = False) -> str:
    """Upload `folder` (an export) to the model repo `repo_id`, creating it when absent; returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                               commit_message=f"fullasync export of {folder.name}")
    return str(commit.commit_url)


FINGERPRINT_ONLY = ("data.num_rows", "data.rows_sha256")  # a run's fingerprint entries that are not config fields


def config_from_fingerprint(fingerprint: Mapping[str, JsonValue], overrides: Sequence[str] = ()) -> RunConfig:
    """The run's `RunConfig` as far as the fingerprint records it (other fields at their defaults), then
    `overrides` (`key=value`, e.g. trainer.worker_num_cpus=1)."""
    config = OmegaConf.structured(RunConfig)
    declared = {field.name for field in config_fields(RunConfig())}
    for key, value in fingerprint.items():
        if key in declared:  # not FINGERPRINT_ONLY, nor a setting an earlier version had
            OmegaConf.update(config, key, value, merge=False)
    config = OmegaConf.merge(config, OmegaConf.from_dotlist(list(overrides)))
    built = OmegaConf.to_object(config)
    assert isinstance(built, RunConfig)
    return built


async def export_checkpoint(checkpoint_dir: Path, target: Path, overrides: Sequence[str] = ()) -> Path:
    """Write the policy of the checkpoint at `checkpoint_dir` to `target` (which must not hold files yet)."""
    from fullasync.infra.runtime import init_ray
    from fullasync.launch.model import resolve_model_path
    from fullasync.trainer.verl_trainer import VerlTrainer

    saved = checkpoint.load(checkpoint_dir)
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"{target} already holds files: export into a new or empty directory")
    config = config_from_fingerprint(saved.fingerprint, overrides)
    model_path = resolve_model_path(config)
    init_ray(log_to_driver=config.worker_logs)
    trainer = VerlTrainer(model_path, config.resolved_trainer())
    await trainer.start()
    try:
        await trainer.load_state(str(saved.trainer_dir))
        await trainer.save_checkpoint(str(target))
    finally:
        await trainer.shutdown()
    write_export_note(target, step=saved.loop.steps, weight_version=saved.loop.version,
                      base_model=config.model.path, checkpoint=str(checkpoint_dir.resolve()))
    return target
