"""The KV pool a run gets for its ``--prefix-cache`` mode (a factory apart from the classes
it builds, so the base prefix cache does not import its own subclasses). Each prefix
cache's module is imported when a run asks for that cache, so a run without one loads
neither."""

from __future__ import annotations

from sim.config import PREFIX_CACHE_MODES
from sim.kv.block_pool import KVCacheManager


def make_kv(mode: str, num_gpu_blocks: int, block_size: int = 16) -> KVCacheManager:
    """The block allocator for ``--prefix-cache`` ``mode``: the plain pool for "none",
    BlockHashCache for "block", RadixCache for "radix"."""
    if mode == "none":
        return KVCacheManager(num_gpu_blocks, block_size)
    if mode == "block":
        from sim.kv.block_cache import BlockHashCache

        return BlockHashCache(num_gpu_blocks, block_size)
    if mode == "radix":
        from sim.kv.radix_cache import RadixCache

        return RadixCache(num_gpu_blocks, block_size)
    raise ValueError(f"prefix_cache must be one of {', '.join(PREFIX_CACHE_MODES)}, "
                     f"got {mode!r}")
