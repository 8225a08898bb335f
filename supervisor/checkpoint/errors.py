"""Exceptions of the checkpoint library.

Every failure a caller can act on is a :class:`CheckpointError` (an ``Exception``; DCP's own
``CheckpointException`` derives from ``BaseException`` and is wrapped at the edge so that an
ordinary ``except Exception`` sees it). The ``reason`` attribute is one short line meant for
logs, the CLI and the supervisor's event file.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class: something about a checkpoint is wrong or an operation on one failed."""

    def __init__(self, reason: str, *, path: str | None = None) -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}" if path else reason)


class ManifestError(CheckpointError):
    """The manifest is missing, unreadable, oversized, malformed or of an unknown version."""


class UnsafePathError(ManifestError):
    """A path listed in a manifest would escape its checkpoint directory."""


class UnsafeContentError(CheckpointError):
    """A file would make a restore run code or read what it must not (a crafted DCP pickle);
    refused before anything in it is executed or loaded."""


class VerificationError(CheckpointError):
    """A listed file is missing, has the wrong size or the wrong checksum."""


class NoCheckpointError(CheckpointError):
    """No checkpoint under a root verifies (the reasons of each one skipped are attached)."""

    def __init__(self, reason: str, *, path: str | None = None, skipped=()) -> None:
        super().__init__(reason, path=path)
        self.skipped = list(skipped)


class CheckpointSaveError(CheckpointError):
    """A save failed; nothing was published and the previous checkpoint is still the latest."""


class CheckpointLoadError(CheckpointError):
    """A restore failed: a chosen checkpoint could not be loaded, or none verifies where one is
    required. ``skipped`` holds the checkpoints refused on the way, with their reasons."""

    def __init__(self, reason: str, *, path: str | None = None, skipped=()) -> None:
        super().__init__(reason, path=path)
        self.skipped = list(skipped)
