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
from supervisor.checkpoint.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest

# Saving and restoring need torch; discovery and verification do not. The controller (and its
# container image) imports only the latter, so the torch-bound names load on first use.
_LAZY = {
    "CheckpointManager": "supervisor.checkpoint.manager", "RestoreResult": "supervisor.checkpoint.manager",
    "SaveResult": "supervisor.checkpoint.manager", "RNG_DERIVED": "supervisor.checkpoint.state",
    "RNG_EXACT": "supervisor.checkpoint.state", "DataCursor": "supervisor.checkpoint.state",
    "derived_seed": "supervisor.checkpoint.state",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "FORMAT_VERSION", "MANIFEST_NAME", "RNG_DERIVED", "RNG_EXACT",
    "CheckpointError", "CheckpointLoadError", "CheckpointManager", "CheckpointSaveError",
    "DataCursor", "Discovery", "Manifest", "ManifestError", "NoCheckpointError",
    "PruneResult", "RestoreResult", "SaveResult", "Skipped", "UnsafeContentError", "UnsafePathError", "Verified", "VerificationError",
    "candidates", "derived_seed", "in_flight", "latest_complete", "prune", "read_manifest",
    "require_latest", "verify",
]
