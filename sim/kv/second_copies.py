"""Second copies of cached blocks: a block whose content was already cached when it was
computed (two requests prefilling the same prefix at once). vLLM 0.33 keeps every such
block under its hash (``BlockPool.cache_full_blocks``; a hash maps to several blocks) and a
lookup finds the first, so evicting one copy leaves the content cached. The block index
(sim/kv/prefix_index.py) holds one block per slot; the later copies of a slot wait here,
oldest first, each with ``key[b] == slot``, and the oldest one left takes the slot over
when the block there is evicted."""

from __future__ import annotations

import numpy as np


class SecondCopies:
    """Slot -> the later copies indexed at it, oldest first. Rare: empty in most runs,
    so callers ask ``bool(copies)`` before any work."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at: dict[int, list[int]] = {}

    def __bool__(self) -> bool:
        return bool(self._at)

    def add(self, pos: np.ndarray, blocks: np.ndarray) -> None:
        """``blocks`` are later copies of the blocks cached at slots ``pos``."""
        for p, b in zip(pos.tolist(), blocks.tolist(), strict=True):
            self._at.setdefault(p, []).append(b)

    def evicting(self, blocks: np.ndarray, key: np.ndarray, arena: np.ndarray) -> None:
        """``blocks`` are about to lose their entries (taken for reuse): the oldest copy
        left of each one that holds its slot (``arena[key[b]] == b``) takes the slot
        over, and copies among them are forgotten."""
        at = self._at
        going = set(blocks.tolist())
        for b in going:
            p = key.item(b)
            alts = at.get(p) if p else None
            if alts is None:
                continue
            if arena.item(p) == b:
                while alts and (alts[0] in going or key.item(alts[0]) != p):
                    alts.pop(0)
                if alts:
                    arena[p] = alts.pop(0)
            elif b in alts:
                alts.remove(b)
            if not alts:
                del at[p]

    def renumber(self, old_key: np.ndarray, key: np.ndarray) -> None:
        """The index moved its slots (``key`` now, ``old_key`` before): follow them,
        dropping copies no longer indexed at their slot."""
        at: dict[int, list[int]] = {}
        for p, alts in self._at.items():
            for b in alts:
                if old_key.item(b) == p:
                    at.setdefault(key.item(b), []).append(b)
        self._at = at

    def holds(self, slot: int, block: int) -> bool:
        """Whether ``block`` is a later copy waiting at ``slot`` (for checks)."""
        return block in self._at.get(slot, ())
