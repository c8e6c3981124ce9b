"""The custody rule of a peer link (``octopis.core.custody``, DESIGN §7), sans-IO: what is
kept, what an acknowledgement settles and prunes, the limit, what a link-down gives back,
and the receiver's side (what it acknowledges, and when a heartbeat is due). The broker
process and the simulator play the same script in ``test_links.py``."""

from __future__ import annotations

from collections import Counter

import pytest

from octopis.core.custody import (
    FIRST,
    NOW,
    STALE,
    TAKEN,
    Custody,
    PublishReceipt,
    acknowledge_every,
    acknowledgement,
    ask,
    counts_for,
    heartbeat_due,
    owed,
    resent,
    resent_taken,
    settle_receipts,
    take,
    took,
)
from octopis.core.messages import ProtocolError
from octopis.core.neighbours import Neighbour, Phase


def _numbers(entries: list) -> list[int]:
    return [number for number, _, _ in entries]


def test_notifications_are_kept_numbered_and_settled_into_the_retained_window() -> None:
    """Routing messages are numbered, notifications kept; an acknowledgement settles what
    it counts into the retained window, which keeps ``retain`` seconds (as of the latest
    acknowledgement) and at most ``retain_limit``, the oldest evicted and counted."""
    custody = Custody(limit=10, retain=1.0, retain_limit=2)
    for at, kept in ((0.0, True), (0.1, False), (0.2, True), (0.3, True), (0.4, True)):
        custody.sent(f"m{at}", at, kept)
    assert custody.numbered == 5 and _numbers(custody.unacked) == [1, 3, 4, 5]
    assert not custody.settles(0) and custody.settles(1) and not custody.prunes(0.5)
    custody.acknowledge(4, 0.5)
    assert _numbers(custody.unacked) == [5]
    assert _numbers(custody.retained) == [3, 4] and custody.evicted == 1
    assert not custody.settles(4) and not custody.prunes(1.1)  # none a second old yet
    assert custody.prunes(1.25)  # m0.2 is older than a second then
    custody.acknowledge(4, 1.25)
    assert _numbers(custody.retained) == [4] and custody.evicted == 1
    assert custody.take_back() == ["m0.3", "m0.4"]
    assert not custody.unacked and not custody.retained and custody.numbered == 5
    custody.greeted()
    assert custody.numbered == 0


def test_other_routing_messages_are_pending_until_acknowledged_and_sent_again() -> None:
    """Routing messages other than notifications are pending until an acknowledgement
    counts them, never retained; a link-down gives back only notifications, a heal
    sends the pending ones again (they stay pending), and the receiver takes those past
    its count and ends with the sender's; a restarted receiver's are given up to the
    node. With custody off nothing is pending."""
    custody = Custody(limit=10, retain=5.0, retain_limit=10)
    for name, kept in (("n1", True), ("s2", False), ("s3", False), ("n4", True), ("s5", False)):
        custody.sent(name, 0.0, kept)
    assert custody.pending == [(2, "s2"), (3, "s3"), (5, "s5")]
    assert custody.settles(2) and not custody.settles(0)
    custody.acknowledge(2, 0.1)
    assert custody.pending == [(3, "s3"), (5, "s5")] and _numbers(custody.retained) == [1]
    assert custody.take_back() == ["n1", "n4"]  # the detection: notifications only
    assert custody.resend() == (5, [(3, "s3"), (5, "s5")]) and len(custody.pending) == 2
    record = Neighbour(received=3)  # s3 arrived before the connection died
    assert resent(record, 5, [3, 5]) == [False, True] and record.received == 5
    custody.acknowledge(5, 0.2)
    assert not custody.pending and not custody.retained
    custody.sent("s6", 0.3, False)
    assert custody.give_up() == ["s6"] and not custody.pending
    off = Custody(limit=0)
    off.sent("s1", 0.0, False)
    assert not off.pending and off.resend() == (1, [])


RESENT_TAKEN = ((["s5"], 1, 0), 5)
"""(taken, counted ``links.resent_dropped``, counted ``stale_frames``), then the count
of what was taken from the sender."""
RESENT_STALE = (([], 0, 2), 3)


@pytest.mark.parametrize(
    ("phase", "up", "expected"),
    [
        (Phase.SYNCED, True, RESENT_TAKEN),
        (Phase.SYNCING, True, RESENT_TAKEN),
        (Phase.SYNCED, False, RESENT_STALE),
        (Phase.HANDSHAKING, True, RESENT_STALE),
        (Phase.NEW, False, RESENT_STALE),
    ],
)
def test_a_resent_from_a_sender_that_is_not_reachable_is_stale(
    phase: Phase, up: bool, expected: tuple[tuple[list[str], int, int], int]
) -> None:
    """Both shells take a RESENT through ``resent_taken``: from a reachable sender (up,
    its handshake named us) the messages past the count are taken and the rest counted
    dropped; from any other (down, or of a session not with us), all are stale and the
    count stays."""
    record, counts = Neighbour(phase=phase, up=up, received=3), Counter({"stale_frames": 1})
    taken, _ = resent_taken(record, 5, [(3, "s3"), (5, "s5")], counts)
    got = (taken, counts["links.resent_dropped"], counts["stale_frames"] - 1)
    assert (got, record.received) == expected


def test_a_resent_is_acknowledged_at_once_only_when_something_is_owed() -> None:
    """After a RESENT the receiver acknowledges at once when anything is owed (its count
    settles what the cut left unacknowledged on the sender), and not when the RESENT
    only repeats what it took and acknowledged."""
    record = Neighbour(phase=Phase.SYNCED, up=True, received=3, acked=3)
    assert resent_taken(record, 3, [(3, "s3")], Counter()) == ([], False)
    assert resent_taken(record, 5, [(5, "s5")], Counter()) == (["s5"], True)


@pytest.mark.parametrize(
    ("phase", "up"),
    [(Phase.SYNCED, False), (Phase.HANDSHAKING, True), (Phase.NEW, True), (Phase.NEW, False)],
)
def test_routing_messages_from_a_sender_that_is_not_reachable_are_stale(
    phase: Phase, up: bool
) -> None:
    """Both shells take routing messages through ``take``: from a sender that is down, or
    whose handshake has not named us (frames queued for an earlier process of ours), they
    are stale, counted ``stale_frames``, and change no count of what was taken."""
    record, counts = Neighbour(phase=phase, up=up, received=3, acked=3), Counter[str]()
    assert take(record, 2, counts) == STALE
    assert (record.received, record.acked, counts) == (3, 3, {"stale_frames": 2})


@pytest.mark.parametrize("phase", [Phase.SYNCING, Phase.SYNCED])
def test_routing_messages_from_a_reachable_sender_are_acknowledged_later_unless_asked(
    phase: Phase,
) -> None:
    """From a reachable sender they are taken and counted. Nobody waits on them: the
    first since the last acknowledgement says so (acknowledged within ``ack_delay``),
    later ones do not, until the count is acknowledged again. Asked (an ASK came ahead),
    or with ``every`` owed, they are acknowledged at once, and the ask is answered; so is
    every routing message that is not a notification."""
    record, counts = Neighbour(phase=phase, up=True), Counter[str]()
    assert take(record, 2, counts, every=8) == FIRST and record.received == 2
    assert take(record, 1, counts, every=8) == TAKEN and record.received == 3
    ask(record)
    assert take(record, 1, counts, every=8) == NOW and not record.asked
    acknowledgement(record, withheld=False)
    assert take(record, 1, counts, every=8) == FIRST and record.received == 5
    assert take(record, 6, counts, every=8) == TAKEN
    assert take(record, 1, counts, every=8) == NOW and record.received == 12
    acknowledgement(record, withheld=False)
    assert take(record, 8, counts, every=8) == NOW and not counts
    acknowledgement(record, withheld=False)
    assert take(record, 1, counts, every=1) == NOW  # every run at once
    acknowledgement(record, withheld=False)
    assert take(record, 1, counts, every=8, notifications=False) == NOW  # a subscription


@pytest.mark.parametrize(
    ("every", "custody_limit", "expected"),
    [(64, 10_000, 64), (64, 50, 25), (64, 3, 1), (64, 1, 1), (8, 0, 8), (1, 100, 1)],
)
def test_a_receiver_acknowledges_at_once_before_a_sender_runs_out_of_room(
    every: int, custody_limit: int, expected: int
) -> None:
    """Both shells ask ``acknowledge_every``: ``ack_every``, but at most half the custody
    limit (a sender with room for 50 would otherwise stop and wait out ``ack_delay``);
    without custody, ``ack_every`` itself."""
    assert acknowledge_every(every, custody_limit) == expected


def test_an_acknowledgement_counts_only_for_the_incarnation_it_names() -> None:
    """Both shells ask ``counts_for`` whether an acknowledgement settles a sender's
    custody: only one naming the process that runs now (an earlier one's count numbered
    frames of a session that ended)."""
    assert counts_for(7, 7)
    assert not counts_for(6, 7) and not counts_for(0, 7)


@pytest.mark.parametrize(
    ("received", "numbered", "numbers"),
    [(4, 3, []), (0, 5, [3, 2]), (0, 5, [3, 3]), (0, 5, [6]), (0, 5, [0])],
)
def test_a_resend_that_goes_back_or_past_its_count_is_refused(
    received: int, numbered: int, numbers: list[int]
) -> None:
    """A RESENT whose count is below what the receiver took, or whose numbers do not
    rise from 1 to at most the count, breaks the protocol (nothing is taken)."""
    record = Neighbour(received=received)
    with pytest.raises(ProtocolError):
        resent(record, numbered, numbers)
    assert record.received == received


def test_the_limit_stops_the_link_and_zero_turns_custody_off() -> None:
    """With ``limit`` entries unacknowledged there is no room (the shell stops the link
    and counts it); an acknowledgement that frees room says the link was full. A limit
    of 0 keeps nothing and never stops."""
    custody = Custody(limit=2)
    custody.sent("a", 0.0, True)
    custody.sent("b", 0.0, True)
    assert custody.full and custody.room() == 0
    custody.stopped()
    custody.stopped()  # the link waits on: the same stop
    assert custody.stops == 1
    assert custody.acknowledge(1, 0.1) is True and custody.room() == 1
    assert custody.acknowledge(1, 0.2) is False
    custody.sent("c", 0.3, True)
    custody.stopped()  # full again after sending: a new stop
    assert custody.stops == 2
    assert custody.take_back() == ["b", "c"]  # retain 0: the settled one is not retained
    off = Custody(limit=0)
    off.sent("a", 0.0, True)
    assert not off.keeps and not off.unacked and not off.full and off.numbered == 1


def test_pending_messages_count_toward_the_limit() -> None:
    """Subscription messages pending (sent, not yet acknowledged) take room as kept
    notifications do: a receiver that withholds its acknowledgements stops the link at
    ``limit`` whatever the link sends, and the relink check sees them carried."""
    custody = Custody(limit=3)
    custody.sent("s1", 0.0, False)
    custody.sent("n2", 0.0, True)
    assert custody.room() == 1 and not custody.full and len(custody) == 2
    custody.sent("s3", 0.0, False)
    assert custody.full and custody.room() == 0 and len(custody) == 3
    assert custody.acknowledge(1, 0.1) is True and custody.room() == 1  # s1 settled
    assert [copy for _, copy in custody.pending] == ["s3"]


@pytest.mark.parametrize("settings", [(-1, 0.0, 0), (1, -0.5, 0), (1, 0.0, -1)])
def test_negative_settings_are_refused(settings: tuple[int, float, int]) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        Custody(*settings)


def test_the_receiver_counts_what_it_owes_unless_withheld() -> None:
    """``took`` says whether a run is the first since the last acknowledgement;
    backpressure repeats the count last acknowledged; a heartbeat is due with anything
    owed, or after a heartbeat interval of silence with nothing about to leave."""
    record = Neighbour()
    assert took(record, 3) is True and owed(record)
    assert took(record, 2) is False
    assert acknowledgement(record, withheld=True) == 0 and owed(record)
    assert acknowledgement(record, withheld=False) == 5 and not owed(record)
    assert heartbeat_due(Neighbour(received=1), 0.0, 0.2, sending=True)
    assert not heartbeat_due(record, 0.1, 0.2, sending=False)
    assert not heartbeat_due(record, 0.3, 0.2, sending=True)
    assert heartbeat_due(record, 0.3, 0.2, sending=False)


def test_a_settled_copy_holds_its_publishers_receipt_and_keeps_the_bare_copy() -> None:
    """The one rule both shells settle by (a process's frames, the simulator's copies):
    each acknowledged copy that carries a receipt counts as held, and its entry keeps the
    copy without it; the receipt answers once its last copy is held."""
    answered: list[int] = []
    receipt = PublishReceipt(lambda: answered.append(1))
    receipt.keep()
    receipt.keep()
    entries = [(1, 0.5, ("n1", receipt)), (2, 0.6, ("n2", None)), (3, 0.7, ("n3", receipt))]
    settled = settle_receipts(entries, lambda copy: copy[1], lambda copy: (copy[0], None))
    assert settled == 2 and answered == [1]
    assert entries == [(1, 0.5, ("n1", None)), (2, 0.6, ("n2", None)), (3, 0.7, ("n3", None))]
    assert settle_receipts(entries, lambda copy: copy[1], lambda copy: copy) == 0
