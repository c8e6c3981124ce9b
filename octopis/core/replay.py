"""Replay of retained publications across the overlay (DESIGN §7, §11): sans-IO rules.

A subscriber that failed over, or whose broker restarted, asks its new host for what it
may have missed: a :class:`Replay` naming its filters, the last sequence number it got
from each (publisher, session) it knows, and a time from which the publications of any
other publisher count. The host sends it right behind the subscriptions it has just made
again, and it travels like them (SBP, paper §5): PRIMARY along the host cluster's tree,
SECONDARY over every iCOL of that cluster, where it stops; BID's tree floods it once.
Links are FIFO, so at every broker the new subscription is in the table before the
replay arrives: what a publisher there published before that is in the broker's store,
what it publishes after is routed live, and nothing falls between (the seam).

Each broker asks its own store (the shell does the I/O and reports with
:meth:`ReplayRounds.stored`), sends the matching publications toward the broker it got
the request from (:class:`ReplayData`, filtered where they are stored) and, once every
neighbour it passed the request to has echoed, went down, or stayed silent past the
round's budget (counted from the request, or from the last data that came through),
echoes what its part of the overlay answered (:class:`ReplayEcho`): the brokers whose
stores answered, those without a store, the neighbours never heard from (down, or
silent: the subscription does not reach past them either, so their part is a gap) and
the retention gaps. Data goes ahead of its echo on the same FIFO link, so when the
host's last echo is in every answer has come (the echo algorithm), and the host hands
the requester a :class:`ReplayDone`.

The same request answers a historic or hybrid subscription (a time window
``[after, until)``, bounded per store by ``answer_max`` publications and ``answer_bytes``
bytes; a store that cut its answer is named in the echo's ``truncated``), and, with
``claim`` set, finds a durable subscription's record wherever it is kept (DESIGN §11): a
broker holding it hands it over in its echo (``claimed``) and forgets it.

Nothing here reads a clock or does I/O: the shell passes ``now`` and says which of the
SBP targets are up (:data:`Targets`). The rounds decide the rest: when the shell calls
:meth:`ReplayRounds.expire` (:class:`ExpireAt`), whether it asks its store
(:class:`QueryStore`) or its durable records (:class:`ClaimRecord`, answered by
:meth:`octopis.core.durable.Durables.answer_claim`), on a broker without a store the
unstored answer itself, and at the host which client the answers go to (the
``requester`` of :class:`ReplayDeliver` and :class:`ReplayDone`; none is made for a
request nobody at this host is answered for: none asked, or it was forgotten).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from math import inf
from typing import NamedTuple

from octopis.core.messages import Forward, Notification, SubState
from octopis.defaults import HISTORIC_BUDGET, REPLAY_BUDGET, REPLAY_ROUNDS
from octopis.filters.language import parse_subscription

BUDGET_SHRINK = 0.75
"""A broker passes the request on with this share of its own budget, so that a child
gives up on a silent neighbour (and echoes) before its parent gives up on the child."""
DATA_BATCH = 64
"""Publications per :class:`ReplayData` message."""


def check_replay_filters(filters: Iterable[str]) -> tuple[str, ...]:
    """A replay's ``filters`` (DESIGN §11), each parsed in turn: returned as a tuple, or
    :class:`~octopis.filters.language.FilterError` names the first that does not parse
    and nothing starts. The one rule for a client's replay request (the broker process
    refuses it with that message) and a neighbour's REPLAY (:mod:`octopis.core.codec`
    refuses the frame, naming the sender and the same message). How many filters each may
    carry is its wire declaration's: a client names at least one, a claim none."""
    filters = tuple(filters)
    for text in filters:
        parse_subscription(text)
    return filters


@dataclass(frozen=True, slots=True)
class Replay:
    """A subscriber's request for what it may have missed (see the module's text).

    Publications published at or after ``after`` count: of a (publisher, session) in
    ``since`` (``(publisher, session, seq)``) those with a higher ``seq``, of any other
    all; none published at or after ``until``. ``budget`` is how many seconds the
    receiver may wait for its own neighbours' echoes; ``state`` is its SBP step (PRIMARY
    goes on, SECONDARY stops). Each store answers at most ``answer_max`` publications and
    ``answer_bytes`` encoded bytes (0: the store's own bound). A ``claim``
    (:func:`octopis.core.durable.claim_of`) asks for a durable subscription's record instead of
    publications."""

    req_id: str
    host: str
    filters: tuple[str, ...]
    since: tuple[tuple[str, int, int], ...]
    after: float
    budget: float
    state: SubState = SubState.PRIMARY
    until: float = inf
    answer_max: int = 0
    answer_bytes: int = 0
    claim: str = ""


class Budgets(NamedTuple):
    """Seconds the host of a request waits for every broker's answer (``[retention]``
    ``replay_budget`` and ``historic_budget``; the section itself serves)."""

    replay_budget: float = REPLAY_BUDGET
    historic_budget: float = HISTORIC_BUDGET


DEFAULT_BUDGETS = Budgets()
"""The budgets a broker has by default (the simulator's brokers')."""


def replay_request(
    req_id: str,
    host: str,
    filters: Iterable[str],
    since: Iterable[tuple[str, int, int]],
    after: float,
    budgets: Budgets = DEFAULT_BUDGETS,
    *,
    historic: bool = False,
    claim: str = "",
    until: float = inf,
    answer_max: int = 0,
    answer_bytes: int = 0,
) -> Replay:
    """The request ``host`` starts for a client (DESIGN §11): a window of the past
    (``historic``: a historic, hybrid or durable subscription's) and a durable record's
    ``claim`` wait the historic budget, a fail-over's replay the replay budget."""
    budget = budgets.historic_budget if historic or claim else budgets.replay_budget
    return Replay(
        req_id,
        host,
        tuple(filters),
        tuple(since),
        after,
        budget,
        until=until,
        answer_max=answer_max,
        answer_bytes=answer_bytes,
        claim=claim,
    )


@dataclass(frozen=True, slots=True)
class ReplayData:
    """Publications a store answered for request ``req_id``, on their way to its host."""

    req_id: str
    notifications: tuple[Notification, ...]


Gap = tuple[str, int, int, int]
"""``(publisher, session, first seq, last seq)`` that retention no longer held when the
request came: some of them may have matched."""


class Claimed(NamedTuple):
    """A durable subscription's record handed over by the broker that kept it: its
    filters, the last sequence delivered of each (publisher, session) its client
    acknowledged, the time from which any other publisher's publications are owed, and
    when the record was last updated (the freshest of several wins)."""

    broker: str
    filters: tuple[str, ...]
    since: tuple[tuple[str, int, int], ...]
    after: float
    updated: float


@dataclass(frozen=True, slots=True)
class ReplayEcho:
    """A broker's answer to its parent for request ``req_id``: ``seen`` (it had the
    request already from another neighbour: nothing below it is the parent's), or the
    summary of its part of the overlay: brokers whose stores answered, brokers without a
    store (retention off), neighbours that never echoed (``silent``: down, or past the
    budget; whatever only they would have reached is unknown), retention gaps, and the
    number of publications sent; the stores that cut their answer at its bounds
    (``truncated``) and the durable records handed over (``claimed``)."""

    req_id: str
    seen: bool = False
    answered: tuple[str, ...] = ()
    unstored: tuple[str, ...] = ()
    silent: tuple[str, ...] = ()
    gaps: tuple[Gap, ...] = ()
    published: int = 0
    truncated: tuple[str, ...] = ()
    claimed: tuple[Claimed, ...] = ()


ReplayMessage = Replay | ReplayData | ReplayEcho
REPLAY_MESSAGES = (Replay, ReplayData, ReplayEcho)
"""The peer messages a node's :class:`ReplayRounds` take (a shell hands them there, not
to the routing core)."""


class ExpireAt(NamedTuple):
    """Call :meth:`ReplayRounds.expire` at ``deadline`` (the shell's clock; a round taken
    waits its request's budget for its neighbours' echoes)."""

    deadline: float


class QueryStore(NamedTuple):
    """Ask this broker's store for ``request``; report with :meth:`ReplayRounds.stored`."""

    request: Replay


class ClaimRecord(NamedTuple):
    """Look for the durable record ``request`` claims among this broker's records: the
    shell has :meth:`octopis.core.durable.Durables.answer_claim` answer it."""

    request: Replay


class ReplayDeliver(NamedTuple):
    """At the host: hand ``notifications`` answered for ``req_id`` to ``requester`` (the
    shell's key of the client that asked, :meth:`ReplayRounds.requester`); ``claim``:
    the request looked for a durable record (its client's process reads the answer as a
    claim's)."""

    req_id: str
    notifications: tuple[Notification, ...]
    requester: str
    claim: bool = False


class ReplayDone(NamedTuple):
    """At the host: request ``req_id`` is complete; ``echo`` sums up the whole overlay.
    ``late``: an echo of a part that was silent when the request completed and answered
    once it was reachable again (a neighbour restarted and took the request with the
    subscriptions held for it); its data came as late :class:`ReplayDeliver` ones. The
    summary goes to ``requester``, as :class:`ReplayDeliver`'s answers do (``claim``
    alike)."""

    req_id: str
    echo: ReplayEcho
    requester: str
    late: bool = False
    claim: bool = False


ReplayAction = Forward | ExpireAt | QueryStore | ClaimRecord | ReplayDeliver | ReplayDone

Targets = Callable[
    [str | None, SubState], tuple[list[tuple[str, SubState]], list[tuple[str, SubState]]]
]
"""``targets(src, state)``: where a subscription in ``state`` from ``src`` (None: a local
one) goes on from this broker, with the state each neighbour gets, split into the live
neighbours and those that are down (:func:`sbp_targets` gives the SBP ones)."""


def sbp_targets(
    primary: tuple[str, ...] | list[str], secondary: list[str], src: str | None, state: SubState
) -> list[tuple[str, SubState]]:
    """SBP's next hops (paper §5): from a local subscriber or a PRIMARY message, PRIMARY
    to every primary neighbour but ``src`` and SECONDARY to every secondary one; a
    SECONDARY message stops. BID passes its tree links as ``primary``, no ``secondary``."""
    if state is SubState.SECONDARY and src is not None:
        return []
    out = [(n, SubState.PRIMARY) for n in primary if n != src]
    return out + [(n, SubState.SECONDARY) for n in secondary]


@dataclass(slots=True)
class _Round:
    request: Replay
    parent: str | None
    waiting: set[str]
    deadline: float
    stored: bool = False
    answered: list[str] = field(default_factory=list)
    unstored: list[str] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    published: int = 0
    truncated: list[str] = field(default_factory=list)
    claimed: list[Claimed] = field(default_factory=list)
    parent_lost: bool = False
    """The link to ``parent`` went down while this round was open: answers sent up may
    have been dropped with it (:meth:`ReplayRounds.link_down`)."""


def _lost_up(echo: ReplayEcho) -> ReplayEcho:
    """``echo`` from a part whose answers toward the host may have been dropped on a link
    that went down: the stores it names as answered count as silent (a gap reported,
    never a loss claimed answered)."""
    return replace(echo, answered=(), silent=(*echo.answered, *echo.silent))


class ReplayRounds:
    """The replay requests one broker takes part in (at most ``limit`` at once; the oldest
    is ended early, its missing echoes reported as silent, past it) and those it finished
    (remembered, up to ``limit``, to answer a repeated copy with a seen echo).
    ``targets`` says where a request goes on (:data:`Targets`); without a store
    (``has_store`` False: retention is off here) a request is answered at once as
    unstored, and a claim's echo names this broker unstored too."""

    def __init__(
        self, broker_id: str, targets: Targets, limit: int = REPLAY_ROUNDS, has_store: bool = True
    ) -> None:
        if limit < 1:
            raise ValueError("replay rounds need a positive limit")
        self.id = broker_id
        self.targets = targets
        self.limit = limit
        self.has_store = has_store
        self.rounds: OrderedDict[str, _Round] = OrderedDict()
        self.finished: OrderedDict[str, str | None] = OrderedDict()
        """Requests completed here → the neighbour they came from (None at the host):
        late answers of a part that was silent still find their way back."""
        self.lost_up: set[str] = set()
        """Finished requests (of :attr:`finished`) whose parent's link went down since:
        late answers passed on may have been dropped with it."""
        self.stats: dict[str, int] = {"replay.rounds": 0, "replay.ended_early": 0}
        self.requesters: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        """Requests started here → who asked (the shell's key) and whether a claim, the
        latest ``limit``."""
        self.late_passed: OrderedDict[tuple, None] = OrderedDict()
        """Late answers passed on toward their host (at most ``16 × limit``): one that
        comes round again is dropped. Parents can form a cycle: a broker that restarted
        takes a request handed to it again from another neighbour than its predecessor's
        parent, and a late answer would go round that cycle for ever."""

    def start(
        self, request: Replay, now: float, requester: str | None = None
    ) -> list[ReplayAction]:
        """The host starts ``request`` (a new ``req_id``; sent behind the subscriptions
        it has just made) for ``requester`` (the shell's key of the client that asked,
        named by :meth:`requester` until ``limit`` later requests started here)."""
        if requester is not None:
            self.requesters[request.req_id] = (requester, bool(request.claim))
            while len(self.requesters) > self.limit:
                self.requesters.popitem(last=False)
        return self._take(request, None, now)

    def requester(self, req_id: str) -> str | None:
        """Who asked for ``req_id`` at this host (None: nobody, or forgotten)."""
        asked = self.requesters.get(req_id)
        return asked[0] if asked is not None else None

    def receive(self, src: str, message: ReplayMessage, now: float) -> list[ReplayAction]:
        """A replay message from neighbour ``src``."""
        if type(message) is Replay:
            if message.req_id in self.rounds or message.req_id in self.finished:
                return [Forward(src, ReplayEcho(message.req_id, seen=True))]
            return self._take(message, src, now)
        round_ = self.rounds.get(message.req_id)
        if round_ is None:
            return self._late(message)
        if type(message) is ReplayData:
            # Data is progress: a part still answering (a large answer, page by page) is
            # waited for its budget from its last page, not from the request.
            round_.deadline = max(round_.deadline, now + round_.request.budget)
            if round_.parent is None:
                return self._deliver(message.req_id, message.notifications)
            return [Forward(round_.parent, message)]
        if src in round_.silent and not message.seen:  # reported silent, answered after all
            round_.silent.remove(src)
        elif src in round_.waiting:
            round_.waiting.discard(src)
        else:
            return []
        if not message.seen:
            round_.answered += message.answered
            round_.unstored += message.unstored
            round_.silent += message.silent
            round_.gaps += message.gaps
            round_.published += message.published
            round_.truncated += message.truncated
            round_.claimed += message.claimed
        return self._echo_if_complete(message.req_id, round_)

    def _late(self, message: ReplayData | ReplayEcho) -> list[ReplayAction]:
        """An answer for a request completed here: passed on toward the host, which
        delivers it late; unknown requests (forgotten past ``limit``) are counted."""
        if message.req_id not in self.finished:
            self.stats["replay.unknown"] = self.stats.get("replay.unknown", 0) + 1
            return []
        if type(message) is ReplayEcho:
            parts = (message.answered, message.unstored, message.silent)
            passed: tuple = (message.req_id, message.seen, message.published, *map(tuple, parts))
        else:
            first = message.notifications[0] if message.notifications else None
            passed = (message.req_id, len(message.notifications), first and first.key)
        if passed in self.late_passed:
            self.stats["replay.late_looped"] = self.stats.get("replay.late_looped", 0) + 1
            return []
        self.late_passed[passed] = None
        if len(self.late_passed) > 16 * self.limit:
            self.late_passed.popitem(last=False)
        self.stats["replay.late"] = self.stats.get("replay.late", 0) + 1
        parent = self.finished[message.req_id]
        if type(message) is ReplayEcho and message.req_id in self.lost_up:
            message = _lost_up(message)
        if parent is not None:
            return [Forward(parent, message)]
        if type(message) is ReplayData:
            return self._deliver(message.req_id, message.notifications)
        if message.seen:
            return []
        return self._done(message.req_id, message, True)

    def part(self, req_id: str, notifications: list[Notification]) -> list[ReplayAction]:
        """A page of this broker's answer to ``req_id`` (its store answers page by page,
        the last one with :meth:`stored`): sent toward the host at once."""
        round_ = self.rounds.get(req_id)
        if round_ is None:
            return []
        round_.published += len(notifications)
        out: list[ReplayAction] = []
        for i in range(0, len(notifications), DATA_BATCH):
            batch = tuple(notifications[i : i + DATA_BATCH])
            if round_.parent is None:
                out += self._deliver(req_id, batch)
            else:
                out.append(Forward(round_.parent, ReplayData(req_id, batch)))
        return out

    def stored(
        self,
        req_id: str,
        notifications: list[Notification],
        gaps: list[Gap],
        *,
        truncated: bool = False,
        claimed: tuple[Claimed, ...] = (),
    ) -> list[ReplayAction]:
        """This broker's store answered ``req_id`` with ``notifications`` (in publisher
        order; the last page if :meth:`part` sent others) and ``gaps`` (none, without a
        store); ``truncated``: the answer stopped at the request's bounds; ``claimed``:
        the durable record a claim found here."""
        round_ = self.rounds.get(req_id)
        if round_ is None:
            return []
        out = self.part(req_id, notifications)
        round_.stored = True
        (round_.answered if self.has_store else round_.unstored).append(self.id)
        round_.gaps += gaps
        if truncated:
            round_.truncated.append(self.id)
        round_.claimed += claimed
        return out + self._echo_if_complete(req_id, round_)

    def link_down(self, neighbour: str) -> list[ReplayAction]:
        """``neighbour`` is down: no round waits for its echo any longer. Answers sent
        toward it may have been dropped with its link (the node drops replay answers
        that do not reach a neighbour): a round or finished request whose parent it is
        reports the stores below it silent, not answered, in the echoes it sends or
        passes on after (:func:`_lost_up`); its parent has reported it silent, and a late
        echo that said those stores answered would withdraw that gap."""
        out: list[ReplayAction] = []
        self.lost_up.update(r for r, parent in self.finished.items() if parent == neighbour)
        for req_id, round_ in list(self.rounds.items()):
            if round_.parent == neighbour:
                round_.parent_lost = True
            if neighbour in round_.waiting:
                round_.waiting.discard(neighbour)
                round_.silent.append(neighbour)
                out += self._echo_if_complete(req_id, round_)
        return out

    def expire(self, now: float) -> list[ReplayAction]:
        """Rounds past their budget echo with the neighbours still missing as silent;
        then, if a round still waits for echoes, :meth:`expire` is asked for again when
        the next one runs out of budget (:class:`ExpireAt`, last: data that came through
        may have moved that deadline past the one this call was asked for)."""
        out: list[ReplayAction] = []
        for req_id, round_ in list(self.rounds.items()):
            if now >= round_.deadline and round_.stored:
                round_.silent += sorted(round_.waiting)
                round_.waiting.clear()
                out += self._echo_if_complete(req_id, round_)
        deadline = min((r.deadline for r in self.rounds.values() if r.stored), default=None)
        if deadline is not None:
            out.append(ExpireAt(deadline))
        return out

    def answering(self, req_id: str) -> bool:
        """Whether this broker still takes part in ``req_id`` (a store answering page by
        page stops once the round ended early: too many rounds at once)."""
        return req_id in self.rounds

    def toward(self, req_id: str) -> str | None:
        """The neighbour the answers to ``req_id`` go to (None: this broker is its host,
        or the round is over)."""
        round_ = self.rounds.get(req_id)
        return round_.parent if round_ is not None else None

    def _deliver(self, req_id: str, notifications: tuple[Notification, ...]) -> list[ReplayAction]:
        """At the host: ``notifications`` for ``req_id``, to its requester (none: nobody
        is answered, none asked or it is forgotten)."""
        asked = self.requesters.get(req_id)
        return [] if asked is None else [ReplayDeliver(req_id, notifications, *asked)]

    def _done(self, req_id: str, echo: ReplayEcho, late: bool) -> list[ReplayAction]:
        """At the host: ``req_id`` is complete (``late``: an echo after it was), to its
        requester (none: nobody is answered)."""
        asked = self.requesters.get(req_id)
        return [] if asked is None else [ReplayDone(req_id, echo, asked[0], late, asked[1])]

    def _take(self, request: Replay, parent: str | None, now: float) -> list[ReplayAction]:
        out: list[ReplayAction] = []
        if len(self.rounds) >= self.limit:
            old_id, old = next(iter(self.rounds.items()))
            self.stats["replay.ended_early"] += 1
            old.silent += sorted(old.waiting)
            old.waiting.clear()
            old.stored = True
            out += self._echo_if_complete(old_id, old)
        self.stats["replay.rounds"] += 1
        live, down = self.targets(parent, request.state)
        deadline = now + request.budget
        self.rounds[request.req_id] = _Round(
            request, parent, {n for n, _ in live}, deadline, silent=[n for n, _ in down]
        )
        budget = request.budget * BUDGET_SHRINK
        out += [Forward(n, replace(request, budget=budget, state=state)) for n, state in live]
        # A neighbour that is down is reported silent at once, but gets the request too:
        # it waits with the subscriptions held for it and is answered late, if ever.
        out += [Forward(n, replace(request, budget=budget, state=s)) for n, s in down]
        out.append(ExpireAt(deadline))
        if request.claim:
            out.append(ClaimRecord(request))
        elif self.has_store:
            out.append(QueryStore(request))
        else:
            out += self.stored(request.req_id, [], [])
        return out

    def _echo_if_complete(self, req_id: str, round_: _Round) -> list[ReplayAction]:
        if round_.waiting or not round_.stored:
            return []
        del self.rounds[req_id]
        self.finished[req_id] = round_.parent
        if round_.parent_lost:
            self.lost_up.add(req_id)
        while len(self.finished) > self.limit:
            self.lost_up.discard(self.finished.popitem(last=False)[0])
        echo = ReplayEcho(
            req_id,
            answered=tuple(round_.answered),
            unstored=tuple(round_.unstored),
            silent=tuple(round_.silent),
            gaps=tuple(round_.gaps),
            published=round_.published,
            truncated=tuple(round_.truncated),
            claimed=tuple(round_.claimed),
        )
        if round_.parent is None:
            heard = set(echo.answered) | set(echo.unstored)
            silent = tuple(dict.fromkeys(b for b in echo.silent if b not in heard))
            return self._done(req_id, replace(echo, silent=silent), False)
        return [Forward(round_.parent, _lost_up(echo) if round_.parent_lost else echo)]
