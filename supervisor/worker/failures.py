"""Whether an exception that ends a rank was caused by a peer (torch loaded only if the script did)."""

from __future__ import annotations

import sys

# What a rank sees when *another* rank died or hung under it: gloo's "Connection reset by
# peer ... Check the logs of the remote worker", NCCL's remote errors, a store that vanished.
PEER_MARKERS = ("by peer", "remote worker", "remote process", "broken pipe", "ncclremoteerror",
                "connection closed", "connection refused", "communicator was aborted")


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a communication failure caused by a peer rather than by this rank."""
    dist = sys.modules.get("torch.distributed")
    network = tuple(t for t in (getattr(dist, "DistNetworkError", None), getattr(dist, "DistStoreError", None))
                    if isinstance(t, type))
    if network and isinstance(exc, network):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, OSError)) and any(m in text for m in PEER_MARKERS)
