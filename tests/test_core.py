"""Routing core: hand-worked examples on the paper's fig2 SCOT, LST rules, bad messages."""

from __future__ import annotations

import math

import pytest
from bitarray import frozenbitarray

from octopis.core import (
    Deliver,
    Forward,
    NoCongestion,
    Notification,
    ProtocolError,
    Subscribe,
    SubState,
    Unsubscribe,
    make_broker,
)
from octopis.core._records import new_pair
from octopis.core.codec import decode_peer, encode_peer
from octopis.core.lst import LinkStatusTable, congestion_element
from octopis.core.messages import forward_copy
from octopis.failure_schedule import Failure
from octopis.filters.language import parse_publication, parse_subscription
from octopis.sim import FreeLinks, InjectedCongestion, LatencyModel, Simulator
from octopis.topology import build_preset

FIG2 = build_preset("fig2")
ANY_STOCK = parse_subscription("[class,eq,'STOCK']")
QUOTE = parse_publication("[class,'STOCK'],[symbol,'AAPL'],[close,64.18]")


def test_two_step_sbp_on_fig2() -> None:
    """S1 at B(a,0): PRIMARY through cluster 0, SECONDARY one hop into clusters 1 and 2."""
    sent: list[tuple[str, str, SubState]] = []
    sim = Simulator(FIG2, "snr", on_forward=lambda s, d, m: sent.append((s, d, m.state)))
    sub_id = sim.subscribe("S1", "a:0", ANY_STOCK)
    sim.run()
    assert len(sent) == 17  # N - 1
    primary = {(s, d) for s, d, st in sent if st is SubState.PRIMARY}
    assert primary == {
        ("a:0", "b:0"),
        ("b:0", "c:0"),
        ("c:0", "d:0"),
        ("c:0", "e:0"),
        ("e:0", "f:0"),
    }
    secondary = {(s, d) for s, d, st in sent if st is SubState.SECONDARY}
    assert secondary == {(f"{r}:0", f"{r}:{k}") for r in "abcdef" for k in (1, 2)}
    for core in sim.cores.values():
        entry = core.table.entries[sub_id]
        assert entry.cbv == frozenbitarray("100")
    assert sim.cores["a:2"].table.entries[sub_id].last_hop == "a:0"
    assert sim.cores["f:0"].table.entries[sub_id].last_hop == "e:0"
    assert sim.cores["f:1"].table.entries[sub_id].hops == 5  # diam(G_A) + 1
    assert sim.cores["a:0"].table.entries[sub_id].last_hop == "S1"


def test_receivers_of_one_message_object_share_one_entry() -> None:
    """Brokers storing the same message object from the same neighbour share one immutable
    entry (how a 10 M-entry simulation fits in memory, issue 16); another sender, or a
    decoded copy of the message (each broker process decodes its own), makes a new one."""
    cores = {b: make_broker(FIG2, b, "snr") for b in ("a:1", "a:2", "b:1")}
    cbv = frozenbitarray("100")
    message = Subscribe("a:0#1", "a:0", ANY_STOCK, SubState.SECONDARY, cbv, 0.0, 1)
    for broker in ("a:1", "a:2"):
        assert cores[broker].receive("a:0", message, NoCongestion()) == []
    first, second = (cores[b].table.entries["a:0#1"] for b in ("a:1", "a:2"))
    assert first is second and (first.last_hop, first.hops, first.cluster) == ("a:0", 1, 0)
    cores["b:1"].receive("b:0", message, NoCongestion())  # as if b:0 had sent this object
    third = cores["b:1"].table.entries["a:0#1"]
    assert third is not first and third.last_hop == "b:0"
    decoded = decode_peer(encode_peer("a:0", message))[1]
    assert decoded == message and decoded.stored is None
    cores["a:1"].table.remove("a:0#1")
    cores["a:1"].receive("a:0", decoded, NoCongestion())
    assert cores["a:1"].table.entries["a:0#1"] is not first
    assert cores["a:1"].table.entries["a:0#1"] == first


def test_a_simulation_stores_few_entry_objects() -> None:
    """On fig2 every broker holds the subscription, in 11 entry objects: the host's own,
    one per PRIMARY message (c:0's reaches d:0 and e:0) and one per SECONDARY message
    (each broker of cluster 0 sends one object to both its iCOL neighbours)."""
    sim = Simulator(FIG2, "snr")
    sub_id = sim.subscribe("S1", "a:0", ANY_STOCK)
    sim.run()
    entries = [core.table.entries[sub_id] for core in sim.cores.values()]
    assert len(entries) == 18 and len({id(e) for e in entries}) == 1 + 4 + 6


def _fig7_sim(overloaded: list[tuple[str, str]], loads: dict | None = None):
    sent: list[tuple[str, str, str | None]] = []

    def record(src: str, dst: str, message: object) -> None:
        if isinstance(message, Notification):
            sent.append((src, dst, message.cbv.to01() if message.cbv is not None else None))

    links = InjectedCongestion(overloaded, FIG2, fixed_loads=loads or {})
    sim = Simulator(FIG2, "dnr", links=links, on_forward=record, latency=LatencyModel(0.001, 0.0))
    return sim, sent


def _subscribe(sim: Simulator, placement: dict[str, str]) -> None:
    for subscriber, broker in placement.items():
        sim.subscribe(subscriber, broker, ANY_STOCK)
    sim.run()


def test_dnr_case_1_fig7b() -> None:
    """Fig. 7(b): B(b,2)→B(b,0) overloaded; the CBV {C0} rides the free iCOL to B(b,1)."""
    sim, sent = _fig7_sim([("b:2", "b:0")])
    _subscribe(sim, {"S1": "a:0", "S2": "c:1", "S3": "d:1", "S4": "a:2"})
    sim.publish("P", "b:2", QUOTE)
    sim.run()
    assert sorted(sent) == sorted(
        [
            ("b:2", "b:1", "100"),
            ("b:2", "a:2", None),
            ("b:1", "b:0", None),
            ("b:1", "c:1", None),
            ("c:1", "d:1", None),
            ("b:0", "a:0", None),
        ]
    )  # 6 messages as with SNR; S1's path b2-b1-b0-a0 is one broker longer
    report = sim.report()
    assert (report["dnr_case_1"], report["dnr_case_2"], report["dnr_case_3"]) == (1, 0, 0)
    assert report["dnr_kept_off"] == 1
    assert (report["lost"], report["duplicates"], report["delivered"]) == (0, 0, 4)


def test_dnr_case_2_fig7c() -> None:
    """Fig. 7(c): both target iCOLs overloaded; the CBV {C0,C1} rides the least-loaded aCOL."""
    sim, sent = _fig7_sim(
        [("b:2", "b:0"), ("b:2", "b:1")], loads={("b:2", "c:2"): (0.5, 0), ("b:2", "a:2"): (0.9, 3)}
    )
    _subscribe(sim, {"S1": "c:0", "S2": "c:1", "S3": "a:2", "S4": "c:2"})
    sim.publish("P", "b:2", QUOTE)
    sim.run()
    assert sorted(sent) == sorted(
        [
            ("b:2", "a:2", None),
            ("b:2", "c:2", "110"),
            ("c:2", "c:0", None),
            ("c:2", "c:1", None),
        ]
    )  # 4 messages where SNR sends 6
    report = sim.report()
    assert (report["dnr_case_1"], report["dnr_case_2"], report["dnr_case_3"]) == (0, 1, 0)
    assert (report["lost"], report["duplicates"], report["delivered"]) == (0, 0, 4)


def test_dnr_case_3_fig7d() -> None:
    """Fig. 7(d): every target link overloaded; the CBV goes on the least-loaded iCOL,
    then Case II at B(b,1), then Case III onto the overloaded B(c,1)→B(c,0)."""
    overloaded = [("b:2", "b:0"), ("b:2", "b:1"), ("b:1", "b:0"), ("c:1", "c:0")]
    sim, sent = _fig7_sim(overloaded, loads={("b:2", "b:1"): (1.5, 12), ("b:2", "b:0"): (3.0, 40)})
    _subscribe(sim, {"S1": "a:0", "S2": "c:1"})
    sim.publish("P", "b:2", QUOTE)
    sim.run()
    assert sorted(sent) == sorted(
        [
            ("b:2", "b:1", "100"),
            ("b:1", "c:1", "100"),
            ("c:1", "c:0", None),
            ("c:0", "b:0", None),
            ("b:0", "a:0", None),
        ]
    )  # S1's path b2-b1-c1-c0-b0-a0 has 3 more brokers than SNR's b2-b0-a0
    report = sim.report()
    assert (report["dnr_case_1"], report["dnr_case_2"], report["dnr_case_3"]) == (0, 1, 2)
    assert (report["lost"], report["duplicates"], report["delivered"]) == (0, 0, 2)


def test_dnr_without_congestion_sends_what_snr_sends() -> None:
    placement = {"S1": "a:0", "S2": "c:1", "S3": "d:1", "S4": "a:2", "S5": "f:0"}
    runs = {}
    for mode in ("snr", "dnr"):
        sent: list = []
        sim = Simulator(
            FIG2,
            mode,
            on_forward=lambda s, d, m, out=sent: out.append(
                (s, d, type(m).__name__, getattr(m, "cbv", None))
            ),
        )
        _subscribe(sim, placement)
        sim.publish("P", "b:2", QUOTE)
        sim.run()
        runs[mode] = sorted(map(str, sent))
    assert runs["snr"] == runs["dnr"]


def test_bid_splits_destination_list_and_intermediates_do_not_match() -> None:
    sim = Simulator(FIG2, "bid", latency=LatencyModel(0.001, 0.0))
    _subscribe(sim, {"S1": "f:2", "S2": "f:1", "S3": "a:0"})
    sim.publish("P", "a:0", QUOTE)
    sim.run()
    report = sim.report()
    assert (report["expected_deliveries"], report["delivered"], report["lost"]) == (3, 3, 0)
    # the publisher's host and the two remote destinations match; nobody else does
    assert report["matching_operations"] == 3
    assert report["sbp_messages"] == 3 * (2 * 33 - 17)


def test_bid_drops_a_subscription_that_comes_after_its_withdrawal() -> None:
    """Flooding sends a subscription and its withdrawal by paths of their own: a copy of
    the subscription held for a link that was down comes after the withdrawal. Taken
    again it would flood again, its withdrawal behind it, round the graph's cycles for
    ever (nemesis seed 85, BID, a partition). The withdrawn id is remembered instead,
    and a withdrawal that comes first still floods on."""
    core = make_broker(FIG2, "c:0", "bid")
    first, second = sorted(FIG2.graph["c:0"])[:2]
    late = Subscribe("b:0#7", "b:0", ANY_STOCK, SubState.PRIMARY, None, 0.0)
    onward = core.receive(first, Unsubscribe("b:0#7", SubState.PRIMARY), NoCongestion())
    assert {a.link for a in onward} == set(FIG2.graph["c:0"]) - {first}
    assert core.receive(second, late, NoCongestion()) == []
    assert "b:0#7" not in core.table and core.stats["sbp_after_withdrawal"] == 1
    assert core.receive(second, Unsubscribe("b:0#7", SubState.PRIMARY), NoCongestion()) == []
    # taken before its withdrawal: removed by it, and a late copy is dropped as well
    core.receive(first, Subscribe("b:0#8", "b:0", ANY_STOCK, SubState.PRIMARY, None, 0.0),
                 NoCongestion())  # fmt: skip
    core.receive(first, Unsubscribe("b:0#8", SubState.PRIMARY), NoCongestion())
    again = Subscribe("b:0#8", "b:0", ANY_STOCK, SubState.PRIMARY, None, 0.0)
    assert core.receive(second, again, NoCongestion()) == []
    assert "b:0#8" not in core.table


def test_bid_withdrawal_during_a_partition_ends() -> None:
    """The same on the simulator: a subscription made and withdrawn while a link is cut
    (its frames held for the link until it heals) floods once each way, and ends."""
    sim = Simulator(FIG2, "bid", seed=3, latency=LatencyModel(0.001, 0.002))
    sim.fail(Failure(("e:0", "f:0"), 0.0, 4.7), 0.0)
    made: list[str] = []
    sim.at(3.8, lambda: made.append(sim.subscribe("S", "c:1", ANY_STOCK)))
    sim.at(3.9, lambda: sim.unsubscribe(made[0]))
    sim.run(until=60.0)
    assert sim.events.pending() == 0  # the flood ended
    assert all(made[0] not in core.table for core in sim.cores.values())
    assert sum(core.stats["sbp_after_withdrawal"] for core in sim.cores.values()) >= 1


def test_unsubscribe_takes_the_same_two_steps() -> None:
    sent: list[tuple[str, str]] = []
    sim = Simulator(
        FIG2,
        "snr",
        on_forward=lambda s, d, m: sent.append((s, d)) if isinstance(m, Unsubscribe) else None,
    )
    sub_id = sim.subscribe("S1", "c:1", ANY_STOCK)
    sim.run()
    sim.unsubscribe(sub_id)
    sim.run()
    assert len(sent) == 17
    assert all(sub_id not in core.table for core in sim.cores.values())


def _sub(core, sub_id: str, state: SubState, bits: str) -> Subscribe:
    return Subscribe(sub_id, "x", ANY_STOCK, state, frozenbitarray(bits), 0.0)


def test_core_rejects_messages_that_break_the_protocol() -> None:
    """The paper's SBP (covering off): an unknown withdrawal is an error; under covering
    it is counted instead (tests/test_covering_laws.py)."""
    core = make_broker(FIG2, "b:0", "snr", covering="off")
    free = NoCongestion()
    with pytest.raises(ProtocolError, match="no link to d:0"):
        core.receive("d:0", _sub(core, "s#1", SubState.PRIMARY, "100"), free)
    with pytest.raises(ProtocolError, match="PRIMARY subscription"):
        core.receive("b:1", _sub(core, "s#1", SubState.PRIMARY, "010"), free)
    with pytest.raises(ProtocolError, match="does not come from host cluster"):
        core.receive("b:1", _sub(core, "s#1", SubState.SECONDARY, "001"), free)
    with pytest.raises(ProtocolError, match="exactly one bit set, of one of our 3 clusters"):
        core.receive("a:0", _sub(core, "s#1", SubState.PRIMARY, "110"), free)
    with pytest.raises(ProtocolError, match="of one of our 3 clusters"):
        core.receive("a:0", _sub(core, "s#1", SubState.PRIMARY, "0001"), free)
    with pytest.raises(ProtocolError, match="CBV bit 0 is invalid at cluster 0"):
        core.receive("a:0", Notification("P", 1, 0.0, QUOTE, cbv=frozenbitarray("100")), free)
    with pytest.raises(ProtocolError, match="no such entry"):
        core.receive("a:0", Unsubscribe("s#9", SubState.PRIMARY), free)
    assert len(core.table) == 0
    assert core.receive("a:0", _sub(core, "s#1", SubState.PRIMARY, "100"), free)
    assert core.receive("a:0", _sub(core, "s#2", SubState.PRIMARY, "1000"), free)  # sent at 4
    assert len(core.table.entries["s#2"].cbv) == 3 and core.stats["sbp.cbv_resized"] == 1
    with pytest.raises(ProtocolError, match="already stored"):
        core.receive("a:0", _sub(core, "s#1", SubState.PRIMARY, "100"), free)
    assert len(core.table) == 2


def test_dnr_rejects_a_cbv_naming_its_own_cluster() -> None:
    core = make_broker(FIG2, "b:0", "dnr")
    n = Notification("P", 1, 0.0, QUOTE, cbv=frozenbitarray("100"))
    with pytest.raises(ProtocolError, match="CBV bit 0 is invalid at cluster 0"):
        core.receive("b:1", n, NoCongestion())


def test_local_delivery_once_per_subscriber() -> None:
    core = make_broker(FIG2, "a:0", "snr")
    core.subscribe("S1", ANY_STOCK, 0.0)
    core.subscribe("S1", parse_subscription("[close,>,10]"), 0.0)
    out = core.publish(Notification("P", 1, 0.0, QUOTE), NoCongestion())
    assert [a for a in out if isinstance(a, Deliver)] == [
        Deliver("S1", Notification("P", 1, 0.0, QUOTE))
    ]
    assert not [a for a in out if isinstance(a, Forward)]  # nobody elsewhere subscribed


@pytest.mark.parametrize("mode", ["snr", "dnr", "bid"])
def test_edge_dedup_tells_a_publisher_started_again_from_its_earlier_self(mode: str) -> None:
    """DESIGN §7: a repeat of (publisher, seq) within one publisher session is absorbed
    and counted; the same name and seq from a new session (a publisher process started
    again, numbering from 1 again) is a new notification and is delivered."""
    core = make_broker(FIG2, "a:0", mode)
    core.subscribe("S1", ANY_STOCK, 0.0)
    first = Notification("P", 1, 0.0, QUOTE, session=11)

    def delivered(n: Notification) -> int:
        return sum(isinstance(a, Deliver) for a in core.publish(n, NoCongestion()))

    assert delivered(first) == 1
    assert delivered(first) == 0
    assert core.stats["dedup.absorbed"] == 1
    assert delivered(first._replace(session=12)) == 1
    assert core.stats["dedup.absorbed"] == 1


@pytest.mark.parametrize("mode", ["snr", "dnr"])
def test_a_missing_share_is_routed_toward_until_it_arrives(mode: str) -> None:
    """DESIGN §7: a restarted broker without a neighbour's resync share sends that side
    every copy (primary: from elsewhere; secondary: local publications only), and stops
    once the share is in; a share is whole only when no other primary share is missing."""
    core = make_broker(FIG2, "c:0", mode)
    free = NoCongestion()

    def targets(src: str | None) -> set[str]:
        n = Notification("P", 1, 0.0, QUOTE)
        out = core.publish(n, free) if src is None else core.receive(src, n, free)
        return {a.link for a in out if isinstance(a, Forward)}

    assert targets(None) == targets("b:0") == set()
    core.expect_shares({"e:0", "c:2"})
    assert core.missing_shares == {"e:0", "c:2"}
    assert targets(None) == {"e:0", "c:2"}
    assert targets("b:0") == {"e:0"}
    assert targets("e:0") == set()
    assert not core.share_complete("b:0") and core.share_complete("e:0")
    core.share_received("e:0")
    assert targets(None) == {"c:2"} and targets("b:0") == set()
    assert core.share_complete("b:0")
    core.share_received("c:2")
    assert not core.missing_shares and targets(None) == set()
    with pytest.raises(ProtocolError, match="no neighbours"):
        core.expect_shares({"a:0"})


def test_congestion_element_eq3() -> None:
    assert congestion_element(10, 5) == 2.0
    assert congestion_element(3, 0) == math.inf
    assert congestion_element(0, 0) == 1.0
    assert congestion_element(4, 8) == 0.5


def test_link_status_table_windows_and_overload() -> None:
    lst = LinkStatusTable(["x", "y"], window=0.05, queue_threshold=3)
    for t in (0.00, 0.01, 0.02, 0.03):
        lst.enqueued("x", t)
    lst.sent("x", 0.04)
    assert lst.load("x") == (1.0, 3)  # window still open: CE of the last closed one
    assert lst.overloaded("x")  # queue length 3 ≥ Q
    lst.sent("x", 0.045)
    assert not lst.overloaded("x")  # queue 2 < Q and CE 1
    lst.advance(0.05)
    assert lst.load("x") == (2.0, 2)  # window [0, 0.05): 4 in, 2 out
    assert lst.overloaded("x")  # queue > 0 and CE > 1
    lst.sent("x", 0.06)
    lst.sent("x", 0.07)
    lst.advance(0.10)
    assert lst.load("x") == (0.0, 0) and not lst.overloaded("x")
    lst.advance(0.31)  # idle windows: CE back to 1
    assert lst.load("x") == (1.0, 0)
    assert lst.snapshot()["y"] == {
        "n_in": 0,
        "n_out": 0,
        "ce": 1.0,
        "queue_length": 0,
        "overloaded": False,
        "down": False,
    }
    lst.enqueued("y", 0.32)
    lst.advance(0.40)
    assert lst.load("y") == (math.inf, 1) and lst.overloaded("y")


def test_lst_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="window must be positive"):
        LinkStatusTable(["x"], window=0)
    with pytest.raises(ValueError, match="threshold Q must be ≥ 1"):
        LinkStatusTable(["x"], queue_threshold=0)


class DownLinks(FreeLinks):
    """Free links, except that the given directed links are held down (DESIGN §7)."""

    def __init__(self, down: set[tuple[str, str]]) -> None:
        self.down_links = down

    def view(self, broker: str, now: float) -> _DownView:
        return _DownView(broker, self.down_links)


class _DownView(NoCongestion):
    def __init__(self, broker: str, down: set[tuple[str, str]]) -> None:
        self.broker, self.down_links = broker, down

    def down(self, link: str) -> bool:
        return (self.broker, link) in self.down_links


def _notifications_into(record: list[tuple[str, str]]):
    def on_forward(src: str, dst: str, message: object) -> None:
        if isinstance(message, Notification):
            record.append((src, dst))

    return on_forward


def _everyone_subscribes(sim: Simulator) -> None:
    for broker in FIG2.brokers:
        sim.subscribe(f"S@{broker}", broker, ANY_STOCK)
    sim.run()


@pytest.mark.parametrize("mode", ["dnr", "snr"])
@pytest.mark.parametrize("kind", ["iCOL", "aCOL"])
def test_routes_around_each_down_link_exactly_once(kind: str, mode: str) -> None:
    """Every directed link of ``kind`` of fig2 down in turn, every broker publishing, so
    every subscriber still gets each notification exactly once, in DNR and in SNR (a
    failure is not congestion, DESIGN §7). A down iCOL is never used and nothing is
    counted undeliverable: its cluster's bit rides a CBV on another copy. For a down
    aCOL, the broker keeps its own deliveries: it leaves the common case's plain copies
    to ``spread``'s rules, and the copy goes around the square."""
    links = [(u, v) for u, v, k in FIG2.graph.edges(data="link") if k == kind]
    for u, v in [*links, *((v, u) for u, v in links)]:
        used: list[tuple[str, str]] = []
        sim = Simulator(FIG2, mode, links=DownLinks({(u, v)}), on_forward=_notifications_into(used))
        _everyone_subscribes(sim)
        for broker in FIG2.brokers:
            sim.publish(f"P@{broker}", broker, QUOTE)
        sim.run()
        report = sim.report()
        assert (u, v) not in used
        assert report["delivered"] == report["expected_deliveries"] == 18 * 18
        assert report["lost"] == report["duplicates"] == 0
        stats = [c.stats for c in sim.cores.values()]
        assert not any(k.startswith("undeliverable") and n for s in stats for k, n in s.items())
        if kind == "iCOL":
            cbv = "snr.cbv_detour" if mode == "snr" else "dnr_case_1"
            assert sum(s[cbv] for s in stats) > 0
        else:
            assert sum(s["tunnel.started"] for s in stats) > 0


def test_dnr_with_every_icol_of_the_host_down_carries_the_bits_on_an_acol() -> None:
    down = {("b:0", "b:1"), ("b:0", "b:2")}
    sim = Simulator(FIG2, "dnr", links=DownLinks(down))
    _everyone_subscribes(sim)
    sim.publish("P", "b:0", QUOTE)
    sim.run()
    report = sim.report()
    assert report["lost"] == report["duplicates"] == 0
    assert sim.cores["b:0"].stats["dnr_case_2"] == 1


def test_a_stale_rehost_note_is_ignored_and_counted() -> None:
    """A REHOST that finds its entry turned elsewhere (a later move adopted it here while
    the note was on its way, as hypothesis found in CI) changes nothing: it is counted as
    ``rehost.stale``, not a protocol error; a current note records the host."""
    import networkx as nx

    from octopis.core import Rehost
    from octopis.topology import build_scot

    scot = build_scot(nx.path_graph(["r0", "r1", "r2"]), 3)
    # adopting inside a cluster: the paper's SBP, covering off
    r0 = make_broker(scot, "r0:2", "snr", covering="off")
    r1 = make_broker(scot, "r1:2", "snr", covering="off")
    sub_id, actions = r1.subscribe("S", parse_subscription("[x,<,1]"), 0.0)
    subscribe = next(a.message for a in actions if a.link == "r0:2")
    r0.receive("r1:2", subscribe, NoCongestion())
    r0.receive("r1:2", Rehost(sub_id, "r2:2"), NoCongestion())
    assert r0.table.entries[sub_id].host == "r2:2"
    r0.adopt("S", sub_id)  # the subscriber moves on to r0:2 before the next note arrives
    assert r0.receive("r1:2", Rehost(sub_id, "r1:2"), NoCongestion()) == []
    entry = r0.table.entries[sub_id]
    assert entry.local and entry.host == "r0:2" and r0.stats["rehost.stale"] == 1


def test_a_relink_forgets_the_shares_a_leaving_neighbour_owed() -> None:
    """A broker still waiting for resync shares when a neighbour leaves (issue 18) stops
    waiting for that one's (it will not come) and keeps waiting for the others'."""
    from octopis.topology_change import remove_region

    scot = build_preset("fig2")
    core = make_broker(scot, "e:0", "dnr")
    neighbours = {n.id for n in scot.brokers["e:0"].neighbours}
    core.expect_shares(neighbours)
    smaller = remove_region(scot, "f")  # fig2's f is a leaf next to e
    core.relink(smaller.brokers["e:0"], smaller.clusters)
    assert core.missing_shares == neighbours - {"f:0"}
    assert "f:0" not in core.cluster_of


def test_a_forward_copy_is_the_forward_its_fields_make() -> None:
    """The C-built action equals and reads like the NamedTuple's own; a type that is not
    a tuple is refused."""
    n = Notification("p", 1, 0.0, {"x": 1})
    copy = forward_copy("c:0", n)
    assert type(copy) is Forward
    assert copy == Forward("c:0", n)
    assert (copy.link, copy.message) == ("c:0", n)
    with pytest.raises(TypeError, match="not a tuple type"):
        new_pair(dict, "c:0", n)


@pytest.mark.parametrize("mode", ["snr", "dnr", "bid"])
def test_counts_hold_the_matching_steps_and_copies_of_the_hot_path(mode: str) -> None:
    """The two per-notification counts live apart from ``stats`` (issue 16) and show in
    ``counts()`` with every other count, as the broker's stats and the simulator's report
    read them."""
    sim = Simulator(FIG2, mode)
    _subscribe(sim, {"S1": "f:2", "S2": "a:0"})
    core = sim.cores["a:0"]
    core.stats["an.event"] += 2
    before = core.counts()
    actions = core.publish(Notification("P", 1, 0.0, QUOTE), NoCongestion())
    after = core.counts()
    copies = [a for a in actions if isinstance(a, Forward)]
    assert copies and any(isinstance(a, Deliver) for a in actions)
    assert after["matching"] - before["matching"] == 1
    assert after["sent.notification"] - before["sent.notification"] == len(copies)
    assert after["an.event"] == 2 and after["no.such.event"] == 0
