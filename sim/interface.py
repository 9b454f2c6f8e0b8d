"""The seams between the engine core and what plugs into it: every Protocol the engine,
the cluster and the KV pool call on a policy, a router or a cost model, declared here once
and checked at construction with ``isinstance`` (never found with ``getattr``). Policies
and routers import these, never the engine."""

from __future__ import annotations

# -- scheduling: what the engine calls on a batching policy --

# -- routing: what the cluster calls on a router --
