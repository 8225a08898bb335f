"""The checkpoint library: complete continuation state, verified two-phase commit, discovery.

Public API::

    CheckpointManager(root, model=..., optimizer=..., ...)   save / restore / wait / close
    DataCursor                                              the world-size-free data position
    latest_complete(root, level)  verify(path, level)  prune(root, keep)  read_manifest(path)

See ``docs/checkpoints.md`` for the on-disk format and the guarantees.
"""

from supervisor.checkpoint.discovery import (
    Discovery,
    PruneResult,
    Skipped,
    Verified,
    candidates,
    in_flight,
    latest_complete,
    prune,
    read_manifest,
    require_latest,
    verify,
)
from supervisor.checkpoint.errors import (
    CheckpointError,
    CheckpointLoadError,
    CheckpointSaveError,
    ManifestError,
    NoCheckpointError,
    UnsafeContentError,
    UnsafePathError,
    VerificationError,
)
from supervisor.checkpoint.manager import CheckpointManager, RestoreResult, SaveResult
from supervisor.checkpoint.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest
from supervisor.checkpoint.state import RNG_DERIVED, RNG_EXACT, DataCursor, derived_seed

__all__ = [
    "FORMAT_VERSION", "MANIFEST_NAME", "RNG_DERIVED", "RNG_EXACT",
    "CheckpointError", "CheckpointLoadError", "CheckpointManager", "CheckpointSaveError",
    "DataCursor", "Discovery", "Manifest", "ManifestError", "NoCheckpointError",
    "PruneResult", "RestoreResult", "SaveResult", "Skipped", "UnsafeContentError", "UnsafePathError", "Verified", "VerificationError",
    "candidates", "derived_seed", "in_flight", "latest_complete", "prune", "read_manifest",
    "require_latest", "verify",
]
