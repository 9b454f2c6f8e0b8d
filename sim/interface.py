"""The seams between the engine core and what plugs into it: every Protocol the engine,
the cluster and the KV pool call on a policy, a router or a cost model, declared here once
and checked at construction with ``isinstance`` (never found with ``getattr``). Policies
and routers import these, never the engine."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from sim.request import Request

if TYPE_CHECKING:
    from sim.batch import BatchPlan, SteadyDecode
    from sim.decode_group import DecodeGroup

# -- scheduling: what the engine calls on a batching policy --


@runtime_checkable
class Scheduler(Protocol):
    """The engine's view of a batching policy (policies/base.py's ``Policy`` adds a name
    and documents the contract): requests in at arrival, one BatchPlan per step, the
    finished requests back after it."""

    def add_request(self, request: Request) -> None: ...

    def schedule(self, now: float) -> BatchPlan: ...

    def on_step_end(self, done: list[Request], now: float) -> list[Request]: ...

    def has_unfinished_requests(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    def stuck_request(self) -> Request | None: ...


@runtime_checkable
class Refuser(Protocol):
    """Optional: a policy that knows requests it can never serve (checked at arrival,
    after the engine's own guard)."""

    def rejection_reason(self, request: Request) -> str | None:
        """Why ``request`` can never be served (it is rejected with this reason), or None."""
        ...


@runtime_checkable
class SteadyDecoder(Protocol):
    """Optional, a fast-path promise (see ``declares``): the steps ahead are a steady
    decode (sim/batch.py's SteadyDecode), which the engine may advance as one run
    (sim/fastpath.py) without calling schedule() or on_step_end() for each step."""

    def steady_decode(self, now: float) -> SteadyDecode | None:
        """The promise for the steps starting at ``now`` (s), or None (plan step by step)."""
        ...


@runtime_checkable
class GroupDecoder(Protocol):
    """Optional, a fast-path promise (see ``declares``): the policy keeps its steadily
    decoding requests at the head of running in the DecodeGroup the engine hands it
    (sim/decode_group.py) and plans them through it."""

    def attach_decode_group(self, group: DecodeGroup) -> None: ...


@runtime_checkable
class StepCounter(Protocol):
    """Optional: a policy that counts its decode steps, told how many a fast-path run
    advanced at once (its schedule() was not called for them)."""

    def advance(self, num_steps: int) -> None: ...


def declares(policy: object, hook: str) -> bool:
    """Whether ``policy``'s class makes the fast-path promise ``hook`` (``steady_decode``
    or ``attach_decode_group``; a router's ``state_free``) for the code it runs. The
    promise speaks for the class that defines the hook (its owner) and the classes it
    inherits: in a run the engine
    calls neither schedule() nor on_step_end() for each step, so any method a subclass
    redefines (schedule(), or a helper it calls such as ``_schedule_waiting`` or
    ``allocate``) may break it. A class in the policy's MRO outside the owner's that
    defines any method other than dunders (``__init__``) so withdraws the promise: the
    policy runs step by step until that class defines the hook in its own body. Plain
    class attributes (a ``name``) keep it. False for a hook that is missing or set on
    the instance only."""
    mro = type(policy).__mro__
    owner = next((k for k in mro if hook in vars(k)), None)
    if owner is None:
        return False
    inherited = owner.__mro__
    return not any(_defines_method(k) for k in mro if k not in inherited)


def _defines_method(cls: type) -> bool:
    """Whether ``cls``'s own body defines a method (or property) other than a dunder."""
    return any(not (name.startswith("__") and name.endswith("__"))
               and (callable(value) or isinstance(value, (staticmethod, classmethod, property)))
               for name, value in vars(cls).items())


# -- the engine's other optional seams: an arrival source, a cost model --


@runtime_checkable
class RoutedArrivals(Protocol):
    """Optional: an arrival source fed by a router (the cluster's inbox, sim/cluster.py),
    which routes at instants of its own; the engine's fast-path runs end before them."""

    def next_routing_time(self) -> float | None:
        """The router's next routing instant (s) that reads this engine's state (every
        step of a run ends before it), or None when there is none."""
        ...

    def next_routed_arrival_time(self) -> float | None:
        """Arrival time (s) of the next request this engine will pop, when the router
        has chosen it ahead (StateFreeRouter), else of the next one in its inbox: a
        run stops before the step that would see it, as before a single engine's
        arrival. None when none is known."""
        ...


@runtime_checkable
class BulkDecodePricer(Protocol):
    """Optional: a cost model that prices a run of decode-only steps in one call,
    bit-identical to its step_time of each step's BatchShape (calibration/roofline.py)."""

    def decode_run_times(self, num_decode_seqs: int, num_sampled_seqs: int,
                         decode_context_tokens: int, growth: int, num_steps: int,
                         start: float = 0.0, until: float = math.inf) -> list[float]:
        """step_time of ``num_steps`` decode-only shapes whose decode_context_tokens start
        at ``decode_context_tokens`` and grow by ``growth`` a step; with ``until``, stops
        before the first step after the first that would start at or after ``until``
        (s) when the first starts at ``start`` (s) and the steps run back to back."""
        ...

@runtime_checkable
class BulkChunkPricer(Protocol):
    """Optional: a cost model that prices a chunk run's steps (the decode group beside one
    request's prefill chunks, sim/chunk_run.py) in one call, bit-identical to its
    step_time of each step's ``sim.batch.chunk_shape`` (calibration/roofline.py)."""

    def chunk_run_times(self, num_tokens: int, has_output: bool, computed: int,
                        chunks: Sequence[int], num_group_decodes: int,
                        group_context_tokens: int, growth: int, start: float = 0.0,
                        until: float = math.inf) -> list[float]:
        """step_time of chunk_shape(num_tokens, has_output, c_j, n_j, num_group_decodes,
        group_context_tokens + j * growth) for each chunk n_j, c_j the computed tokens
        before it (``computed`` before the first); ``until`` (s) stops as
        BulkDecodePricer.decode_run_times stops."""
        ...

# -- routing: what the cluster calls on a router --

# A router sees each replica through this read-only view, and says where a request goes
# by the view's index; the cluster (sim/cluster.py) owns inboxes and routing instants.


@runtime_checkable
class ReplicaView(Protocol):
    """What a router may read of one replica, at the routing instant."""

    @property
    def index(self) -> int:
        """The replica's position in the cluster (0-based): what ``choose`` returns."""
        ...

    @property
    def outstanding(self) -> int:
        """Requests routed here and not yet finished or rejected."""
        ...

    @property
    def num_routed(self) -> int:
        """Requests routed here so far."""
        ...

    @property
    def has_prefix_cache(self) -> bool:
        """Whether the replica's KV pool is a prefix cache (prefix_hit_tokens reads it)."""
        ...

    def kv_load(self) -> float:
        """(blocks in use + prompt blocks of requests routed here and not yet started) /
        usable blocks."""
        ...

    def prefix_hit_tokens(self, request: Request) -> int:
        """Tokens of ``request``'s prompt the replica's prefix cache holds now (0 without
        a cache), recording nothing for it."""
        ...


@runtime_checkable
class Router(Protocol):
    """Which replica gets each request (policies/routers.py holds the built-in ones)."""

    def choose(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        """The index of the replica ``request`` goes to, called once per request at its
        arrival time ``now`` (s), in arrival order; the router may record the choice."""
        ...


@runtime_checkable
class StateFreeRouter(Protocol):
    """Optional, a promise (see ``declares``): the router's choice for a request depends
    only on the requests routed before it, in arrival order, never on the replicas'
    state nor on ``now``. The cluster may then call ``choose`` ahead of the request's
    arrival (with ``now`` = its arrival time; the replica still receives it at that
    time), so each replica's fast-path runs end only before the arrivals routed to it,
    not at every routing instant (sim/cluster.py). True promises it; a subclass that
    redefines a method withdraws it."""

    state_free: ClassVar[bool]


@runtime_checkable
class RouterStart(Protocol):
    """Optional: a router that prepares for the cluster's replicas before the first
    ``choose`` (builds per-replica state, refuses replicas it cannot route over by
    raising ValueError)."""

    def start(self, replicas: Sequence[ReplicaView]) -> None:
        ...
