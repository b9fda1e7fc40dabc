"""Models by Hugging Face hub ID: `model.path=org/name` (with `model.revision`) resolved to a local snapshot.

Owns: telling a hub ID from a local path, and resolving it once, before any engine or trainer starts, through
`huggingface_hub` — the local cache first (`HF_HOME`, `HF_HUB_CACHE`), the hub only when the cache lacks it and
the hub is not declared offline (`HF_HUB_OFFLINE=1`); tokens are the library's (`HF_TOKEN`, `hf auth login`).
Engines and trainer get the snapshot's local directory. Every failure is an `InvalidModelError` saying what to do.
Does not own: named built-in models (`fullasync.models.pretrained`) or chat templates.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fullasync.errors import FullasyncError

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class InvalidModelError(FullasyncError, ValueError):
    """`model.path` names no model this run can load; the message says what was tried and what to do."""


def looks_like_hub_id(path: str) -> bool:
    """`org/name` that is not a path on this machine."""
    return bool(HUB_ID.match(path)) and not Path(path).exists()


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def resolve_hub_model(repo_id: str, revision: str = "") -> Path:
    """The local snapshot directory of `repo_id` at `revision` ("" = main), downloaded if needed and allowed."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{repo_id}@{revision or 'main'}"
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, local_files_only=True))
    except LocalEntryNotFoundError:
        if _offline():
            raise InvalidModelError(
                f"model.path={repo_id!r}: {at} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and the "
                "hub is offline (HF_HUB_OFFLINE=1): download it where the hub is reachable "
                f"(`hf download {repo_id}` with the same HF_HOME) or pass a local model directory") from None
    try:
        return Path(snapshot_download(repo_id, revision=revision or None))
    except GatedRepoError:
        raise InvalidModelError(f"model.path={repo_id!r} is gated: accept its terms on the hub and log in "
                                "(`hf auth login` or HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise InvalidModelError(f"model.path={repo_id!r}: no such model on the hub (or it is private: log in with "
                                "`hf auth login` or HF_TOKEN); a local directory must exist") from None
    except RevisionNotFoundError:
        raise InvalidModelError(f"model.revision={revision!r} does not exist for {repo_id}") from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as error:
        raise InvalidModelError(f"model.path={repo_id!r}: {at} is not cached and could not be downloaded "
                                f"({type(error).__name__}: {error}); set HF_HUB_OFFLINE=1 to use the cache only, "
                                "or pass a local model directory") from None
