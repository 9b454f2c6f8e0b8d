"""The KV cache: the paged block pool, the prefix caches over it, and the factory that picks
one for a run."""
