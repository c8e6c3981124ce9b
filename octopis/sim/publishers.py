"""The simulator's publishers failing over as the SDK's do (DESIGN §4, §7).

A publication is unanswered from when its publisher sends it until its broker confirms it
(its :class:`~octopis.core.custody.PublishReceipt` answers: the store's copy committed and
every copy kept in custody acknowledged, :meth:`RetentionStores.receipt`) or refuses it.
When its broker dies, the publisher hears it no more: once the SDK's heartbeat watch
judges it silent (:func:`~octopis.client_policy.silence.silence_noticed`) it
leaves it along its list in the client policy's order
(:func:`~octopis.client_policy.failover.failover_tries`, the simulator's subscribers'
:meth:`~octopis.sim.replaying.SubscriberFailover._connect`), and at the first broker that
answers it sends again every publication still unanswered, in the order first sent,
with its sequence number and stamp (the SDK's rule,
:class:`~octopis.client_policy.failover.Unanswered`); what it publishes meanwhile waits
with them. A publication sent to a dead broker is unanswered too, never lost for that.
The brokers' edge dedup (:mod:`octopis.core.dedup`) keeps once what reached a
subscriber's host before the death and again after the resend; the ledger expects each
publication once, when a broker first accepts it (:meth:`PublisherFailover.accepted`).

With advertisements on, publishers do not fail over (:attr:`PublisherFailover.follows`).

A paused broker's publishers hear it no more either: one still paused when a publisher's
watch judges it silent is left the same way (:meth:`PublisherFailover.unheard`), while
what its publishers sent it waits in its socket and is taken at its resume
(:mod:`octopis.sim.pauses`), so a publication may enter at both brokers, as on processes.

The simulated publishers publish without waiting (the SDK's ``wait=False``, flushed):
no publish timeout gives a publication up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from octopis.accounting import DeliveryLedger
from octopis.client_policy.failover import Unanswered
from octopis.filters.language import Publication
from octopis.sim.clients import Clients
from octopis.sim.failures import FailureState


class Publishing(Protocol):
    """What the publishers read of a simulator and ask it to do."""

    failures: FailureState | None
    advertisements: bool
    clients: Clients
    ledger: DeliveryLedger
    failure_counts: Counter[str]

    @property
    def now(self) -> float:
        """The simulated time."""

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at ``when``."""

    def publish(
        self, publisher: str, broker: str, publication: Publication, seq: int | None = None
    ) -> tuple[str, int]:
        """``publisher`` publishes at ``broker`` now."""

    _failover_tries: Callable[[str, str], Iterator[str | None]]
    """The brokers a client that began at the first broker tries away from the second."""
    _connect: Callable[[Iterator[str | None], Callable[[], bool], Callable[[str], None]], None]
    """Try the brokers as the SDK does while wanted; connected at the first that answers
    (:meth:`SubscriberFailover._connect`)."""
    _noticed: Callable[[str, str, float], float]
    """When a client's connection to a broker silent since then judges it silent."""


class PublisherFailover:
    """The publishers of ``sim``: what each has sent and not had answered, where it is
    connected since it failed over, and its fail-overs. Publications are tracked once
    ``sim`` has failures (before, every one is answered at once)."""

    def __init__(self, sim: Publishing) -> None:
        self.sim = sim
        self.unanswered: dict[str, Unanswered[int, tuple[int, Publication, float]]] = {}
        """Per publisher, its publications sent and not answered, by sequence number:
        each with its publisher's stamp when first sent (sent again, it keeps it)."""
        self.accepted_keys: set[tuple[str, int]] = set()
        """Unanswered publications some broker accepted (the ledger expects them)."""
        self.entered: dict[tuple[str, int], float] = {}
        """Publications first accepted when sent again after a fail-over, each with when:
        they entered the overlay then, not when stamped (a subscriber that failed over
        meanwhile gets them live, not from its replay)."""
        self.first: dict[str, str] = {}
        """The broker each publisher that failed over first published at (its list's)."""
        self.connected: dict[str, str] = {}
        """Where each publisher that failed over is connected now."""
        self.leaving: dict[str, str] = {}
        """Publishers failing over, each with the broker it leaves: what they publish
        waits for the broker they reach."""

    def broker_of(self, publisher: str, broker: str) -> str:
        """Where ``publisher``, which publishes at ``broker``, sends: the broker it
        failed over to, if it did."""
        return self.connected.get(publisher, broker)

    def sent(self, publisher: str, seq: int, publication: Publication) -> bool:
        """``publisher`` sends publication ``seq`` now: it is unanswered until its broker
        answers (tracked with failures). Returns whether it waits instead, its publisher
        failing over (sent with the rest at the broker it reaches). Tracked only with
        failures, and without advertisements: see :attr:`follows`."""
        if not self.follows:
            return False
        first = (seq, publication, self.sim.clients.stamp(publisher))
        self.unanswered.setdefault(publisher, Unanswered()).sent(seq, first)
        return publisher in self.leaving

    @property
    def follows(self) -> bool:
        """Whether the publishers fail over and send again (with failures, and without
        advertisements: a publication sent again at a broker that the subscriptions its
        publisher's new advertisement draws have not reached yet goes to no one, on
        processes too, so publishers fail over only where that cannot happen)."""
        return self.sim.failures is not None and not self.sim.advertisements

    def published_at(self, publisher: str, seq: int) -> float:
        """The stamp of ``publisher``'s publication ``seq``: the one it was first sent
        with, if unanswered (the SDK sends the same request again), else its clock now."""
        waiting = self.unanswered.get(publisher)
        first = waiting.get(seq) if waiting is not None else None
        return first[2] if first is not None else self.sim.clients.stamp(publisher)

    def answered(self, key: tuple[str, int]) -> None:
        """Publication ``key`` was confirmed or refused to its publisher (its receipt
        answered, :meth:`RetentionStores.receipt`, or its broker refused it at once)."""
        waiting = self.unanswered.get(key[0])
        if waiting is not None and waiting.answered(key[1]) is not None:
            self.accepted_keys.discard(key)

    def accepted(self, publisher: str, seq: int, publication: Publication) -> None:
        """A broker accepted publication ``seq``: the ledger expects it, the first time
        only (a publication sent again after a fail-over was accepted before, perhaps)."""
        key = (publisher, seq)
        if key in self.accepted_keys:
            return
        if seq in self.unanswered.get(publisher, ()):
            self.accepted_keys.add(key)
        self.sim.ledger.published(publisher, seq, publication)

    def connected_to(self, broker: str) -> list[str]:
        """The publishers (those tracked, :attr:`unanswered`) connected to ``broker``."""
        home = self.sim.clients.home
        return [p for p in sorted(self.unanswered) if home.get(p) == broker]

    def died(self, broker: str) -> None:
        """``broker`` died now: each publisher connected to it hears it no more and
        fails over once its watch judges the broker silent."""
        for publisher in self.connected_to(broker):
            self.silent(publisher, broker)

    def unheard(self, publisher: str, broker: str) -> None:
        """``publisher``'s watch judges ``broker`` (paused) silent: it leaves it now
        (:meth:`_leave`), unless it is failing over already."""
        if self.follows and publisher not in self.leaving:
            self.leaving[publisher] = broker
            self._leave(publisher, broker)

    def silent(self, publisher: str, broker: str) -> bool:
        """``publisher`` sent to ``broker``, dead: unless it is failing over already, it
        leaves ``broker`` when the SDK's watch judges it silent from now
        (:meth:`~octopis.sim.replaying.SubscriberFailover._noticed`, :meth:`_leave`).
        False if it does not (the publishers do not fail over, :attr:`follows`)."""
        if not self.follows:
            return False
        if publisher not in self.leaving:
            self.leaving[publisher] = broker
            noticed = self.sim._noticed(publisher, broker, self.sim.now)
            self.sim.at(noticed, self._leave, publisher, broker)
        return True

    def _leave(self, publisher: str, old: str) -> None:
        """``publisher`` heard nothing from ``old`` for its liveness: it tries its list as
        the SDK does (the list of the broker it first published at)."""
        sim = self.sim
        first = self.first.get(publisher, old)
        sim._connect(
            sim._failover_tries(first, old),
            lambda: self.leaving.get(publisher) == old,
            lambda new: self._failed_over(publisher, old, new),
        )

    def _failed_over(self, publisher: str, old: str, new: str) -> None:
        """``publisher`` is connected at ``new``: it sends again what is unanswered
        (:meth:`Unanswered.resend`), each with its sequence number and stamp."""
        sim = self.sim
        del self.leaving[publisher]
        self.first.setdefault(publisher, old)
        sim.clients.home[publisher] = self.connected[publisher] = new
        sim.failure_counts["publishers_failed_over"] += 1
        ledger = sim.ledger
        for seq, publication, _ in self.unanswered[publisher].resend():
            sim.failure_counts["publications_resent"] += 1
            first_time = ledger.notifications
            sim.publish(publisher, new, publication, seq)
            if ledger.notifications > first_time:  # no broker had accepted it before
                self.entered[(publisher, seq)] = sim.now
