"""Policy names -> classes, and loading a user's ``module:Class``."""

from __future__ import annotations

import importlib

from policies.base import Policy
from policies.chunked import ChunkedPolicy
from policies.static import StaticPolicy
from sim.config import SchedulerConfig
from sim.kv_cache import KVCacheManager

POLICIES: dict[str, type] = {
    ChunkedPolicy.name: ChunkedPolicy,
    StaticPolicy.name: StaticPolicy,
}


def get_policy_class(name: str) -> type:
    """A built-in policy by name, or ``module:Class`` from the user's code.

    Raises ValueError naming the known policies, or the module/class that failed to load.
    """
    if name in POLICIES:
        return POLICIES[name]
    if ":" in name:
        mod_name, _, cls_name = name.partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            raise ValueError(f"policy {name!r}: cannot import module {mod_name!r} ({e})") from e
        cls = getattr(mod, cls_name, None)
        if cls is None:
            raise ValueError(f"policy {name!r}: module {mod_name!r} has no {cls_name!r}")
        return cls
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)} or module:Class")


def make_policy(name: str, config: SchedulerConfig, kv: KVCacheManager) -> Policy:
    """Build a policy and check it implements the Policy protocol."""
    policy = get_policy_class(name)(config, kv)
    if not isinstance(policy, Policy):
        raise ValueError(f"policy {name!r} does not implement the Policy protocol")
    return policy
