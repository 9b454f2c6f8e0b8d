"""The KV cache: the paged block pool, the prefix caches over it (with vLLM's LRU free
queue of the block cache), and the factory that picks one for a run."""
