"""Routers: which replica of a cluster gets each request (sim.interface.Router), built by
name (``ROUTERS``, ``make_router``) and injected into ``sim.cluster.simulate_cluster`` as
a batching policy is into the engine. Each decides at the request's arrival time from the
replicas' state then (sim.interface.ReplicaView); the cluster owns the mechanism (inboxes,
routing instants, records).

Ties always go to the replica routed to least so far, then the lowest index, so a run is
deterministic.

- ``round-robin``: request i goes to replica i mod N, whatever their state.
- ``least-outstanding``: fewest requests routed and not yet finished or rejected.
- ``least-kv``: lowest KV load = (blocks in use + blocks the prompts routed but not yet
  started will need) / usable blocks, i.e. the engine's KV-usage gauge plus what the
  router knows it has queued there.
- ``cache-aware`` (needs a prefix cache): the SGLang model gateway's ``cache_aware``
  policy, reading each replica's cache itself: least-outstanding while the load is
  imbalanced (the busiest and the idlest replica differ by more than
  BALANCE_ABS_THRESHOLD outstanding requests and by more than BALANCE_REL_THRESHOLD
  times), else the replica whose cache holds the longest prefix of the prompt when that
  covers more than CACHE_THRESHOLD of it, else least-kv. The thresholds are the values
  the SGLang model gateway (SMG) documents for its cache_aware policy
  (docs/getting-started/load-balancing.md).
- ``cache-aware-approx``: the SGLang router's ``cache_aware`` as it ships (sgl-router
  ``CacheAwarePolicy::select_worker``, src/policies/cache_aware.rs), with its approximate
  tree (policies/router_tree.py) of the prompts it routed instead of the caches
  themselves: the same load guard (routing by load inserts the prompt too), else the
  replica holding the longest routed prefix when that covers more than CACHE_THRESHOLD
  of the prompt, else the replica whose tree is smallest; the prompt is then recorded
  under the chosen replica. Needs no cache to run (it decides where prefixes would be).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from policies.router_tree import ApproxPrefixTree, prompt_path
from sim.interface import ReplicaView, Router
from sim.kv.prefix_content import Segments, segments_of
from sim.request import Request

#: SMG's cache_aware defaults: a cached prefix counts when it covers more than 0.3 of the
#: prompt; the load is imbalanced past a gap of 64 outstanding requests and 1.5x.
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5


def _by_load(r: ReplicaView) -> tuple[int, int, int]:
    return (r.outstanding, r.num_routed, r.index)


def least_outstanding(replicas: Sequence[ReplicaView]) -> int:
    """The replica with the fewest outstanding requests (ties: fewest routed, then index)."""
    return min(replicas, key=_by_load).index


def least_kv(replicas: Sequence[ReplicaView]) -> int:
    """The replica with the lowest KV load (ties: fewest outstanding, routed, index)."""
    return min(replicas, key=lambda r: (r.kv_load(), r.outstanding, r.num_routed,
                                        r.index)).index


def imbalanced(replicas: Sequence[ReplicaView]) -> bool:
    """The cache-aware routers' load guard: outstanding requests of the busiest and the
    idlest replica differ by more than BALANCE_ABS_THRESHOLD and BALANCE_REL_THRESHOLD
    times."""
    loads = [r.outstanding for r in replicas]
    hi, lo = max(loads), min(loads)
    return hi - lo > BALANCE_ABS_THRESHOLD and hi > BALANCE_REL_THRESHOLD * lo


def check_prefix_cache(router: str, has_prefix_cache: bool) -> None:
    """Raise ValueError naming ``router`` when it routes by the replicas' prefix caches
    (cache-aware) and they have none (``has_prefix_cache`` False)."""
    if router == CacheAwareRouter.name and not has_prefix_cache:
        raise ValueError(f"router {router} needs a prefix cache (prefix_cache block or "
                         "radix)")


class RoundRobinRouter:
    """Request i to replica i mod N (i counts every request routed so far; ``start``
    resets it): whatever the replicas' state, so it may route ahead (state_free)."""

    name: ClassVar[str] = "round-robin"
    state_free: ClassVar[bool] = True

    def __init__(self) -> None:
        self._num_routed = 0

    def start(self, replicas: Sequence[ReplicaView]) -> None:
        self._num_routed = 0

    def choose(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        i = self._num_routed % len(replicas)
        self._num_routed += 1
        return i


class LeastOutstandingRouter:
    """The replica with the fewest requests routed and not yet finished or rejected."""

    name: ClassVar[str] = "least-outstanding"

    def choose(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        return least_outstanding(replicas)


class LeastKVRouter:
    """The replica with the lowest KV load (ReplicaView.kv_load)."""

    name: ClassVar[str] = "least-kv"

    def choose(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        return least_kv(replicas)


class CacheAwareRouter:
    """SMG's ``cache_aware`` reading each replica's prefix cache (module docstring).
    ``start`` raises ValueError naming the router when a replica has no prefix cache."""

    name: ClassVar[str] = "cache-aware"

    def start(self, replicas: Sequence[ReplicaView]) -> None:
        check_prefix_cache(self.name, all(r.has_prefix_cache for r in replicas))

    def choose(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        if imbalanced(replicas):
            return least_outstanding(replicas)
        hits = [r.prefix_hit_tokens(request) for r in replicas]
        best = min(replicas, key=lambda r: (-hits[r.index], r.outstanding, r.num_routed,
                                            r.index)).index
        if hits[best] > CACHE_THRESHOLD * request.num_prompt_tokens:
            return best
        return least_kv(replicas)


class CacheAwareApproxRouter:
    """sgl-router's ``cache_aware`` over its approximate tree of routed prompts (module
    docstring): by load when imbalanced, else by the tree's longest match above
    CACHE_THRESHOLD (its holder's path refreshed either way), else the smallest tree; the
    prompt is inserted under the replica chosen. ``prompt_segments``: a request's prompt
    as segments (default: its ``prompt_segments``, else a segment of its own). ``start``
    gives it an empty tree, one tenant per replica."""

    name: ClassVar[str] = "cache-aware-approx"

    def __init__(self, prompt_segments: Callable[[Request], Segments] | None = None) -> None:
        self._segments = prompt_segments or segments_of
        self._tree: ApproxPrefixTree | None = None

    def start(self, replicas: Sequence[ReplicaView]) -> None:
        self._tree = ApproxPrefixTree(len(replicas))

    def choose(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        tree = self._tree
        assert tree is not None, "the cluster calls start(replicas) before routing"
        # Eviction rounds with no insert between them change nothing, so running the
        # rounds due only when a request is routed leaves the same tree.
        tree.evict_due(now)
        path = prompt_path(self._segments(request))
        if imbalanced(replicas):
            chosen = least_outstanding(replicas)
        else:
            matched, holders, depth = tree.match(path)
            holder = min((replicas[t] for t in holders), key=_by_load, default=None)
            if holder is not None:
                tree.touch(path[:depth], holder.index)
            if holder is not None and matched > CACHE_THRESHOLD * request.num_prompt_tokens:
                chosen = holder.index
            else:
                size = tree.size_tokens
                chosen = min(replicas, key=lambda r: (size[r.index], r.outstanding,
                                                      r.num_routed, r.index)).index
        tree.insert(path, chosen)
        return chosen


ROUTERS: dict[str, type] = {cls.name: cls for cls in (
    RoundRobinRouter, LeastOutstandingRouter, LeastKVRouter, CacheAwareRouter,
    CacheAwareApproxRouter)}


def make_router(name: str,
                prompt_segments: Callable[[Request], Segments] | None = None) -> Router:
    """A fresh router named ``name`` (ROUTERS). ``prompt_segments``: each request's prompt
    as segments, for the router that reads prompts (cache-aware-approx; see
    CacheAwareApproxRouter). Raises ValueError naming router for an unknown name."""
    if name not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {name!r}")
    if name == CacheAwareApproxRouter.name:
        return CacheAwareApproxRouter(prompt_segments)
    router: Router = ROUTERS[name]()
    return router
