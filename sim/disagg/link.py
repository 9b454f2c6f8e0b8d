"""The KV-transfer fabric between a prefill pool and a decode pool: ``KVLink``, the
transfers over the engines' ports as events of the run's SimPy environment (a port's
figures: sim/disagg/link_spec.py).

Every engine has its own port (a NIC, as each GPU of a DGX H100 has its own ConnectX-7),
all of the spec's bandwidth and latency; a transfer leaves its prefill engine's port and
enters its decode engine's. It waits out the latency, then moves its bytes at the
smaller of its two ports' equal shares: with ``n_send`` transfers on its prefill
engine's port and ``n_receive`` on its decode engine's, at bandwidth / max(n_send,
n_receive); the rates are recomputed whenever a transfer joins or leaves. One transfer
alone takes latency + B / bandwidth; two equal ones that join together take latency +
2B / bandwidth when they share a port (same prefill engine, or same decode engine), and
latency + B / bandwidth when they do not (different pairs: 2P2D). With one prefill and
one decode engine every transfer shares both ports: processor sharing on one link.

The equal shares are not max-min fair: a port whose transfers are held back by their
other ports leaves that bandwidth unused rather than handing it to the rest (a slight
overstatement of transfer times when one port is busier than the other). The rule
keeps one property the decode engines' fast path needs: a join only lowers other
transfers' rates and an end only raises them, so no transfer ends before the present
rates say until the next join or end (``earliest_delivery``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from sim.disagg.link_spec import LinkSpec

#: Bytes left that count as none: float rounding of a shared finish time.
_DONE_BYTES = 1e-3


class _UrgentEvent(simpy.events.Event):
    """A timeout processed before the ordinary events of its instant (SimPy's URGENT
    priority): a transfer that ends at the instant a decode step ends is in the decode
    engine's inbox before that engine plans its next step, whatever order SimPy gives
    simultaneous events, as the engine's fast path assumes."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, simpy.events.URGENT, delay)


@dataclass(slots=True, eq=False)
class _Transfer:
    num_bytes: float
    remaining: float
    on_done: Callable[[float], None]
    prefill: int  # the sending engine's port
    decode: int  # the receiving engine's port


class KVLink:
    """Transfers over ``num_prefill`` sending ports and ``num_decode`` receiving ports
    (module docstring), with the totals summary.json reports: ``bytes_moved``,
    ``num_transfers``, and each port's bytes (``bytes_sent`` by prefill engine,
    ``bytes_received`` by decode engine)."""

    def __init__(self, env: simpy.Environment, spec: LinkSpec, num_prefill: int = 1,
                 num_decode: int = 1) -> None:
        self.env = env
        self.spec = spec
        self._active: list[_Transfer] = []
        self._on_send = [0] * num_prefill  # transfers moving bytes, by port
        self._on_receive = [0] * num_decode
        self._joining: list[float] = []  # times transfers in their latency join the link
        self._updated = 0.0  # when the active transfers' remaining bytes were last advanced
        self._finish_at: float | None = None
        self._generation = 0  # a recomputation makes earlier finish timers stale
        self.bytes_moved = 0.0
        self.num_transfers = 0
        self.bytes_sent = [0.0] * num_prefill
        self.bytes_received = [0.0] * num_decode

    def start(self, num_bytes: float, on_done: Callable[[float], None], *,
              prefill: int = 0, decode: int = 0) -> None:
        """Start a transfer of ``num_bytes`` (>= 0) now from prefill engine ``prefill``'s
        port to decode engine ``decode``'s; ``on_done(now)`` is called when its last byte
        has arrived."""
        self.num_transfers += 1
        self.bytes_moved += num_bytes
        self.bytes_sent[prefill] += num_bytes
        self.bytes_received[decode] += num_bytes
        transfer = _Transfer(num_bytes, num_bytes, on_done, prefill, decode)
        latency = self.spec.latency_s
        if latency > 0:
            join_at = self.env.now + latency
            self._joining.append(join_at)
            _UrgentEvent(self.env, latency).callbacks.append(
                lambda _e: self._join(transfer, join_at))
        else:
            self._join(transfer, None)

    def earliest_delivery(self) -> float | None:
        """A lower bound on the time (s) the next transfer now under way ends (a join
        only delays the others' ends, and the first end is among the times: module
        docstring), or None when none is under way."""
        times = list(self._joining)
        if self._finish_at is not None:
            times.append(self._finish_at)
        return min(times) if times else None

    def _join(self, transfer: _Transfer, join_at: float | None) -> None:
        if join_at is not None:
            self._joining.remove(join_at)
        if math.isinf(self.spec.bandwidth_bytes_per_s) or transfer.num_bytes == 0:
            transfer.on_done(self.env.now)
            return
        self._advance()
        self._active.append(transfer)
        self._on_send[transfer.prefill] += 1
        self._on_receive[transfer.decode] += 1
        self._reschedule()

    def _sharing(self, t: _Transfer) -> int:
        """How many transfers share ``t``'s busier port (its rate is bandwidth / that)."""
        return max(self._on_send[t.prefill], self._on_receive[t.decode])

    def _advance(self) -> None:
        """Move every active transfer's bytes on to now at its present rate."""
        now = self.env.now
        elapsed = now - self._updated
        self._updated = now
        if elapsed > 0:
            bandwidth = self.spec.bandwidth_bytes_per_s
            for t in self._active:
                t.remaining -= elapsed * bandwidth / self._sharing(t)

    def _reschedule(self) -> None:
        """Set the timer at the next finish under the present rates."""
        self._generation += 1
        if not self._active:
            self._finish_at = None
            return
        bandwidth = self.spec.bandwidth_bytes_per_s
        delay = min(max(t.remaining, 0.0) / (bandwidth / self._sharing(t))
                    for t in self._active)
        self._finish_at = self.env.now + delay
        generation = self._generation
        _UrgentEvent(self.env, delay).callbacks.append(
            lambda _e: self._on_finish(generation))

    def _on_finish(self, generation: int) -> None:
        if generation != self._generation:
            return  # a join or finish since recomputed the times
        self._advance()
        now, bandwidth = self.env.now, self.spec.bandwidth_bytes_per_s
        # Done: no byte left to speak of, or so few that the clock cannot tell their end
        # from now (a later timer would fire at this same instant, forever).
        done = [t for t in self._active if t.remaining <= _DONE_BYTES
                or now + t.remaining / (bandwidth / self._sharing(t)) <= now]
        self._active = [t for t in self._active if t not in done]
        for t in done:
            self._on_send[t.prefill] -= 1
            self._on_receive[t.decode] -= 1
        self._reschedule()
        for t in done:
            t.on_done(self.env.now)
