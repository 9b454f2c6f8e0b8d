"""Scheduling policies: which requests run each step, with how many new tokens.

Policies see Requests, the SchedulerConfig and the KV cache manager's public API; they
never reach into the engine. ``get_policy_class`` resolves a built-in name or a user's
``module:Class``.
"""

from policies.registry import POLICIES, get_policy_class, make_policy

__all__ = ["POLICIES", "get_policy_class", "make_policy"]
