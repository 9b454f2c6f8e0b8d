"""The KV link's ports (sim/disagg/link.py): each prefill engine sends over its own port
and each decode engine receives over its own, a transfer moving at bandwidth / the
transfers on its busier port. Hand-computed with the power-of-two step, latency and
bandwidth of tests/test_disagg.py, every sum exact."""

from __future__ import annotations

import simpy

from sim.disagg.link import KVLink
from sim.disagg.link_spec import LinkSpec
from tests.conftest import make_requests
from tests.test_disagg import BANDWIDTH, LATENCY, STEP, col, disagg

#: Each request's KV: 512 prompt tokens x 1024 B.
B = 512 * 1024


def test_transfers_between_different_pairs_each_have_their_ports() -> None:
    # 2P2D: both prefills end at S on P0 and P1, round-robin sends them to D0 and D1;
    # no port is shared, so each ends at S + LATENCY + B / bandwidth (one link shared
    # by both would take 2B / bandwidth).
    r = disagg(make_requests([2, 2], prompt=512), num_prefill=2, num_decode=2)
    assert list(r.request_table["prefill_replica"]) == [0, 1]
    assert list(r.request_table["decode_replica"]) == [0, 1]
    assert col(r, "kv_transfer_time_s") == [LATENCY + B / BANDWIDTH] * 2
    assert col(r, "ttft_s") == [STEP + LATENCY + B / BANDWIDTH + STEP] * 2
    link = r.summary["disagg"]["link"]
    assert link["bytes_moved"] == 2 * B
    # Each of the four ports carried B over the run.
    each = B / (BANDWIDTH * r.summary["duration_s"])
    assert link["port_utilization"] == {"prefill": [each, each], "decode": [each, each]}
    assert link["utilization"] == each


def test_two_transfers_from_one_prefill_engine_share_its_port() -> None:
    # 1P2D: one prefill step serves both; they go to D0 and D1 but leave by P0's port
    # together: each ends at S + LATENCY + 2B / bandwidth.
    r = disagg(make_requests([2, 2], prompt=512), num_prefill=1, num_decode=2)
    assert list(r.request_table["decode_replica"]) == [0, 1]
    assert col(r, "kv_transfer_time_s") == [LATENCY + 2 * B / BANDWIDTH] * 2
    ports = r.summary["disagg"]["link"]["port_utilization"]
    capacity = BANDWIDTH * r.summary["duration_s"]
    assert ports == {"prefill": [2 * B / capacity], "decode": [B / capacity] * 2}


def test_two_prefill_engines_sending_to_one_decode_engine_share_its_port() -> None:
    # 2P1D: prefilled on P0 and P1 at S, both enter D0's port together: each ends at
    # S + LATENCY + 2B / bandwidth.
    r = disagg(make_requests([2, 2], prompt=512), num_prefill=2, num_decode=1)
    assert list(r.request_table["prefill_replica"]) == [0, 1]
    assert col(r, "kv_transfer_time_s") == [LATENCY + 2 * B / BANDWIDTH] * 2


def test_a_transfer_moves_at_its_busier_ports_share() -> None:
    # P0 sends to D0, D1 and D2 (3 on its port) while P1 sends to D0 (2 on D0's port),
    # 6 bytes each at 1 B/s, no latency. P0's three move at 1/3 B/s, P1's at 1/2 B/s:
    # P1's ends at 12 s, when P0's have 2 bytes left. D0 then has one transfer but P0
    # still three, so they keep 1/3 B/s and end at 18 s (D0's freed half is not handed
    # on: equal shares, not max-min).
    env = simpy.Environment()
    link = KVLink(env, LinkSpec("unit", 1.0, 0.0), num_prefill=2, num_decode=3)
    ended: dict[str, float] = {}
    for name, p, d in (("p0d0", 0, 0), ("p0d1", 0, 1), ("p0d2", 0, 2), ("p1d0", 1, 0)):
        link.start(6.0, lambda now, name=name: ended.__setitem__(name, now),
                   prefill=p, decode=d)
    assert link.earliest_delivery() == 12.0
    env.run()
    assert ended == {"p1d0": 12.0, "p0d0": 18.0, "p0d1": 18.0, "p0d2": 18.0}
    assert link.bytes_sent == [18.0, 6.0] and link.bytes_received == [12.0, 6.0, 6.0]
