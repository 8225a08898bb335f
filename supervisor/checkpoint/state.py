"""Continuation state beyond model and optimizer: RNG streams and the data cursor.

RNG guarantee. Each rank's Python, NumPy, torch CPU (and CUDA) generators are saved per rank.
Resumed at the writer's world size, every rank gets its own exact streams back
(``exact``). At another world size there is no meaningful map from old ranks to new ones,
so every rank is re-seeded from ``(seed, step, rank)`` (``derived``): deterministic and
distinct per rank, but not the stream the uninterrupted job would have drawn. The manifest
records both rules and :class:`~supervisor.checkpoint.manager.RestoreResult` says which held.
A job whose randomness must survive a world-size change should draw it from
:func:`derived_seed` keyed by sample index rather than from a per-rank stream.
"""

from __future__ import annotations

import base64
import hashlib
import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

RNG_EXACT = "exact"
RNG_DERIVED = "derived"
RNG_GUARANTEE = {
    "same_world_size": RNG_EXACT,
    "other_world_size": f"{RNG_DERIVED} from (seed, step, rank)",
}


def derived_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit seed that depends only on ``(seed, step, rank)``, stable across releases."""
    digest = hashlib.blake2b(f"{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def capture_rng() -> dict[str, Any]:
    """Every generator this process draws from, as JSON-able data."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": base64.b64encode(np.asarray(keys, dtype="<u4").tobytes()).decode(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [
            base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()
        ]
    return state


MAX_RNG_BYTES = 1 << 20
"""An RNG file is ~20 KiB (Python's 625 words, NumPy's 624, torch's 5 KiB, per CUDA device 16 B)."""


@dataclass(frozen=True)
class PreparedRng:
    """RNG state checked against fresh generators of each kind: applying it cannot fail."""

    python: tuple
    numpy: tuple
    torch: torch.Tensor
    cuda: tuple[torch.Tensor, ...] | None


def prepare_rng(state: Any) -> PreparedRng:
    """Check saved RNG state (as :func:`capture_rng` makes it) by loading it into fresh
    generators, never the live ones. Raises :class:`ValueError` for any way it can be wrong
    (missing keys, wrong types, out-of-range words, a wrong-sized torch state)."""
    try:
        py = state["python"]
        py_state = (py["version"], tuple(py["state"]), py["gauss"])
        random.Random().setstate(py_state)
        npst = state["numpy"]
        keys = np.frombuffer(base64.b64decode(npst["keys"], validate=True), dtype="<u4").astype(np.uint32)
        np_state = (npst["kind"], keys, npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
        np.random.RandomState().set_state(np_state)
        cpu = _bytes_tensor(state["torch"])
        torch.Generator().set_state(cpu)
        cuda = None
        if "cuda" in state:
            if not isinstance(state["cuda"], list):
                raise ValueError("cuda is not a list")
            cuda = tuple(_bytes_tensor(s) for s in state["cuda"])
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - every way the state can be wrong is one ValueError
        text = str(exc).strip().splitlines()
        raise ValueError(f"RNG state is unusable: {type(exc).__name__}: {text[0][:200] if text else ''}") from None
    return PreparedRng(py_state, np_state, cpu, cuda)


def apply_rng(prepared: PreparedRng) -> None:
    """Make the live generators what ``prepared`` holds."""
    random.setstate(prepared.python)
    np.random.set_state(prepared.numpy)
    torch.set_rng_state(prepared.torch)
    if prepared.cuda is not None and torch.cuda.is_available():
        if len(prepared.cuda) != torch.cuda.device_count():
            raise ValueError(
                f"RNG state holds {len(prepared.cuda)} CUDA generators, this process sees "
                f"{torch.cuda.device_count()} devices"
            )
        torch.cuda.set_rng_state_all(list(prepared.cuda))


def restore_rng(state: dict[str, Any]) -> None:
    """:func:`prepare_rng` then :func:`apply_rng` (ValueError, the live generators untouched,
    when the state is unusable)."""
    apply_rng(prepare_rng(state))


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)  # also seeds every CUDA device


def _bytes_tensor(b64: str) -> torch.Tensor:
    raw = bytearray(base64.b64decode(b64, validate=True))
    if not raw:
        raise ValueError("empty generator state")
    return torch.frombuffer(raw, dtype=torch.uint8).clone()


@dataclass
class DataCursor:
    """Where the job is in its data, independent of the world size.

    The global sample order depends on ``(seed, epoch)`` only; ``position`` counts samples of
    that epoch already consumed by the whole job, ``total`` those consumed since the start.
    A sampler derives each rank's slice from (position, rank, world size), so a resume at any
    world size continues with exactly the next unseen samples. Mutated in place by
    :meth:`advance` and by a restore, so the sampler that holds it sees the restored value.
    """

    seed: int = 0
    epoch: int = 0
    position: int = 0
    total: int = 0

    def advance(self, samples: int, epoch_size: int | None = None) -> None:
        if samples < 0:
            raise ValueError("samples must be >= 0")
        self.position += samples
        self.total += samples
        if epoch_size is not None and self.position >= epoch_size:
            self.epoch += 1
            self.position = 0

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if not isinstance(sd, dict):
            raise ValueError(f"data cursor state must be a mapping, got {type(sd).__name__}")
        for key in ("seed", "epoch", "position", "total"):
            v = sd.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"data cursor field {key} must be an integer >= 0, got {v!r:.80}")
        self.seed, self.epoch, self.position, self.total = sd["seed"], sd["epoch"], sd["position"], sd["total"]
