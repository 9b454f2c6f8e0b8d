"""Every decision: scheduling policies (which requests run each step, with how many new
tokens) and routers (which replica of a cluster gets each request).

Policies see Requests, the SchedulerConfig and the KV cache manager's public API; routers
see a read-only view of each replica (sim.interface); neither reaches into the engine.
``get_policy_class`` resolves a built-in name or a user's ``module:Class``;
``make_router`` builds a router by name (policies/routers.py). The names below are
imported from their modules when first read, so importing one module of this package
(a run imports its one policy) does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policies.registry import POLICIES, get_policy_class, make_policy
    from policies.routers import ROUTERS, make_router

__all__ = ["POLICIES", "ROUTERS", "get_policy_class", "make_policy", "make_router"]

#: Each public name's module.
_HOMES = {"POLICIES": "policies.registry", "get_policy_class": "policies.registry",
          "make_policy": "policies.registry", "ROUTERS": "policies.routers",
          "make_router": "policies.routers"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
