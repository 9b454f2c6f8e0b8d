"""Every decision: scheduling policies (which requests run each step, with how many new
tokens) and routers (which replica of a cluster gets each request).

Policies see Requests, the SchedulerConfig and the KV cache manager's public API; routers
see a read-only view of each replica (sim.interface); neither reaches into the engine.
``get_policy_class`` resolves a built-in name or a user's ``module:Class``;
``make_router`` builds a router by name (policies/routers.py).
"""

from policies.registry import POLICIES, get_policy_class, make_policy
from policies.routers import ROUTERS, make_router

__all__ = ["POLICIES", "ROUTERS", "get_policy_class", "make_policy", "make_router"]
