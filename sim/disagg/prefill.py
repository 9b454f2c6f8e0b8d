"""The prefill pool's pieces around servesim's engines: the split of arrivals between
the pools (``SplitSource``: conditional disaggregation), each prefill engine's step clock
(``StepClock``, which bounds when the pool can next hand a request over) and its policy's
view while finished prefills hold blocks (``HeldBlocksPolicy``).

A prefill engine serves a copy of each request with max_tokens 1, as vLLM's disaggregated
prefill does (its proxy sends the prefill instance the request with max_tokens 1 and
kv_transfer_params do_remote_decode: it runs the prompt, samples one token and keeps the
prompt's blocks until the decode instance has read them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.batch import BatchPlan, BatchShape
from sim.cost_model import CostModel
from sim.interface import Refuser, ReplicaView, Router, RouterStart, Scheduler
from sim.request import Request
from sim.source import ArrivalSource

#: Called with (request, now) for a request that stays on the decode pool (its prompt is
#: shorter than the threshold): prefilled there, no transfer.
LocalHook = Callable[[Request, float], None]


class SplitSource:
    """The prefill pool's arrival source over the run's ``source``: each request whose
    prompt has at least ``min_prompt_tokens`` tokens arrives as its prefill copy
    (max_tokens 1); a shorter one goes to ``local(request, now)`` at its arrival time
    (NVIDIA Dynamo's conditional disaggregation: a prompt too short to be worth a
    transfer is prefilled by the decode worker itself)."""

    __slots__ = ("_local", "_min", "_source", "max_tokens", "num_prefill")

    def __init__(self, source: ArrivalSource, min_prompt_tokens: int, local: LocalHook) -> None:
        self._source = source
        self._min = min_prompt_tokens
        self._local = local
        self.num_prefill = 0  # prefill copies handed out so far
        # The client's max_tokens of each request in the prefill pool, by workload index
        # (its copy there has 1); taken back when it leaves.
        self.max_tokens: dict[int, int] = {}

    def next_arrival_time(self) -> float | None:
        return self._source.next_arrival_time()

    def pop_arrived(self, now: float) -> list[Request]:
        out: list[Request] = []
        for req in self._source.pop_arrived(now):
            if req.num_prompt_tokens < self._min:
                self._local(req, req.arrival_time)
            else:
                self.max_tokens[req.index] = req.max_tokens
                out.append(prefill_copy(req))
        self.num_prefill += len(out)
        return out


def prefill_copy(req: Request) -> Request:
    """The request a prefill engine serves: ``req`` with max_tokens 1."""
    return Request(req.request_id, req.arrival_time, req.num_prompt_tokens, req.output_len,
                   1, req.priority, req.index)


class StepClock:
    """A prefill engine's cost model wrapped to note when its step under way ends
    (``busy_until``, s; None between steps), so the decode engines' fast-path runs end
    before any hand-over the step may make. ``step_time`` is called as the step starts;
    ``step_ended`` (the engine's step observer) clears it."""

    __slots__ = ("_clock", "_model", "busy_until")

    def __init__(self, model: CostModel, clock: Callable[[], float]) -> None:
        self._model = model
        self._clock = clock
        self.busy_until: float | None = None

    def step_time(self, shape: BatchShape) -> float:
        dt = self._model.step_time(shape)
        self.busy_until = self._clock() + dt
        return dt

    def step_ended(self, _plan: BatchPlan, _start: float, _end: float) -> None:
        self.busy_until = None


class HeldBlocksPolicy:
    """A prefill engine's policy as the engine sees it: the same, except that it reports
    no unfinished work while ``holding()`` (finished prefills of this engine hold blocks
    until their transfer is read): a plan that admits nothing then is a wait for those
    blocks, which the engine spends idle on its wake event (fired when they are freed),
    not a stuck scheduler."""

    __slots__ = ("_holding", "_policy", "_refuse")

    def __init__(self, policy: Scheduler, holding: Callable[[], bool]) -> None:
        self._policy = policy
        self._holding = holding
        self._refuse = policy.rejection_reason if isinstance(policy, Refuser) else None

    def add_request(self, request: Request) -> None:
        self._policy.add_request(request)

    def schedule(self, now: float) -> BatchPlan:
        return self._policy.schedule(now)

    def on_step_end(self, done: list[Request], now: float) -> list[Request]:
        return self._policy.on_step_end(done, now)

    def has_unfinished_requests(self) -> bool:
        return self._policy.has_unfinished_requests() and not self._holding()

    def unfinished(self) -> bool:
        """Whether the policy itself has unfinished work (held blocks or not)."""
        return self._policy.has_unfinished_requests()

    @property
    def num_waiting(self) -> int:
        return self._policy.num_waiting

    def stuck_request(self) -> Request | None:
        return self._policy.stuck_request()

    def rejection_reason(self, request: Request) -> str | None:
        return self._refuse(request) if self._refuse is not None else None


class AtArrival:
    """``router`` asked only at each request's arrival (sim/cluster.py's Dispatcher
    routes ahead for a state-free router; the split of arrivals happens as they are
    popped, so the prefill pool never routes ahead)."""

    __slots__ = ("_router",)

    def __init__(self, router: Router) -> None:
        self._router = router

    def choose(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        return self._router.choose(request, replicas, now)

    def start(self, replicas: Sequence[ReplicaView]) -> None:
        if isinstance(self._router, RouterStart):
            self._router.start(replicas)
