"""The SGLang router's approximate prefix tree (sgl-router ``src/policies/tree.rs``, used by
its ``cache_aware`` policy in ``src/policies/cache_aware.rs``): what the router believes
each replica has cached, learnt from the prompts it routed there, not read from the
replicas. The ``cache-aware-approx`` router (policies/routers.py) routes by it.

SGLang keeps one radix tree over prompt *text* for all workers ("tenants"): routing a
request inserts its text under the chosen worker, stamping every node on the path with the
time; a match walks the tree as far as the text agrees, names a worker holding the
deepest node reached and stamps that worker's path (``touch`` here), whether or not the
request then goes there; every ``eviction_interval_secs`` (default 120 s) each worker
whose nodes hold more than ``max_tree_size`` characters (default 2**26) loses its least
recently used leaves until it fits.

Here a node is one segment of a prompt (sim/kv/prefix_content.py: a Mooncake hash block, a
system prompt, a conversation turn), keyed by the whole prefix through it, so a tenant's
nodes are closed under prefixes as SGLang's are. Sizes are in tokens: ``max_tree_size``
characters are taken as ``MAX_TREE_SIZE_TOKENS`` at ``CHARS_PER_TOKEN`` characters a token
(the usual rule of thumb for English text and BPE vocabularies). A tenant's nodes are an
LRU list touched deepest first, so the least recent node is always a leaf of that tenant
(a node is touched whenever any node below it is) and eviction pops from the front, as
SGLang's heap of leaves pops them. Differences: SGLang's nodes are maximal shared runs of
text, and evicting one removes the whole run, where this removes a segment at a time; and
where several workers hold the deepest node SGLang names the first in its hash map's
order, where the router here takes the least loaded (policies/routers.py), so runs are
deterministic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

#: sgl-router's CacheAwareConfig defaults: eviction_interval_secs and max_tree_size.
EVICTION_INTERVAL_S = 120.0
MAX_TREE_SIZE_CHARS = 1 << 26
CHARS_PER_TOKEN = 4
MAX_TREE_SIZE_TOKENS = MAX_TREE_SIZE_CHARS // CHARS_PER_TOKEN

#: A prompt as the router's tree sees it: (node key, tokens) per segment, root first.
Path = list[tuple[int, int]]


def prompt_path(segments: Sequence[tuple[int, int]]) -> Path:
    """``segments`` ((segment id, tokens), in prompt order) as tree nodes: each keyed by
    the hash of the previous node's key, the previous segment's token count and the
    segment's id, so equal keys mean equal prompts up to the node's end (up to 64-bit
    hash collisions)."""
    path: Path = []
    key, prev = 0, 0
    for sid, tokens in segments:
        key = hash((key, prev, sid))
        path.append((key, tokens))
        prev = tokens
    return path


class ApproxPrefixTree:
    """The prompts routed to each of ``num_tenants`` replicas, with SGLang's LRU eviction
    by size. Raises ValueError for num_tenants < 1, max_size_tokens < 1 or
    eviction_interval_s <= 0."""

    __slots__ = ("_interval", "_max", "_next_eviction", "_nodes", "size_tokens")

    def __init__(self, num_tenants: int, max_size_tokens: int = MAX_TREE_SIZE_TOKENS,
                 eviction_interval_s: float = EVICTION_INTERVAL_S) -> None:
        if num_tenants < 1:
            raise ValueError(f"num_tenants must be >= 1, got {num_tenants}")
        if max_size_tokens < 1:
            raise ValueError(f"max_size_tokens must be >= 1, got {max_size_tokens}")
        if not eviction_interval_s > 0:
            raise ValueError(f"eviction_interval_s must be > 0, got {eviction_interval_s}")
        # Per tenant: node key -> tokens of its segment inserted there, least recent first.
        self._nodes: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(num_tenants)]
        self.size_tokens = [0] * num_tenants
        self._max = max_size_tokens
        self._interval = eviction_interval_s
        self._next_eviction = eviction_interval_s

    def match(self, path: Path) -> tuple[int, list[int], int]:
        """The longest prefix of ``path`` in the tree: its tokens, the tenants holding all
        of it (ascending; none when nothing matched) and how many of ``path``'s nodes it
        reaches into."""
        best, tenants, depth = 0, [], 0
        for t, nodes in enumerate(self._nodes):
            got = k = 0
            for key, tokens in path:
                have = nodes.get(key)
                if have is None:
                    break
                k += 1
                if have < tokens:  # the tree holds a shorter cut of this segment
                    got += have
                    break
                got += tokens
            if got > best:
                best, tenants, depth = got, [t], k
            elif got == best and got:
                tenants.append(t)
        return best, tenants, depth

    def touch(self, path: Path, tenant: int) -> None:
        """Make ``path`` (nodes ``tenant`` holds: a match's) its most recent, deepest
        first, as SGLang's match stamps the matched worker's path."""
        nodes = self._nodes[tenant]
        for key, _ in reversed(path):
            nodes.move_to_end(key)

    def insert(self, path: Path, tenant: int) -> None:
        """Record ``path`` as routed to ``tenant`` now: its nodes become the tenant's most
        recent, the deepest touched first so that it is evicted before its parents."""
        nodes = self._nodes[tenant]
        added = 0
        for key, tokens in reversed(path):
            have = nodes.get(key)
            if have is None:
                nodes[key] = tokens
                added += tokens
            else:
                if tokens > have:
                    nodes[key] = tokens
                    added += tokens - have
                nodes.move_to_end(key)
        self.size_tokens[tenant] += added

    def evict_due(self, now: float) -> None:
        """Run the eviction rounds due by ``now`` (one at each multiple of the interval;
        rounds with no insert between them change nothing, so one stands for all): every
        tenant over the size limit drops its least recently used leaves until it fits."""
        if now < self._next_eviction:
            return
        while self._next_eviction <= now:
            self._next_eviction += self._interval
        for t, nodes in enumerate(self._nodes):
            size = self.size_tokens[t]
            while size > self._max:
                size -= nodes.popitem(last=False)[1]
            self.size_tokens[t] = size
