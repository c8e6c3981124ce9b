"""Subscribers that fail over, and the replay that gives them what they missed
(DESIGN §7, §11), in the simulator: the SDK's and the brokers' part, in simulated time.

- Every broker keeps what its own publishers published (its store survives its death,
  as the process's file does; :class:`~octopis.sim.stores.RetentionStores`), from the
  first scheduled failure on (nothing else reads it).
- A subscriber whose host dies notices it when its connection's heartbeat watch does
  (the SDK's, :mod:`octopis.client_policy.silence`: ``liveness`` and up to a heartbeat
  interval later, at the connection's own ticks), moves to the first broker of its
  fail-over list that is not dead (same cluster first), subscribes there again and asks
  for a replay: after the last publication it got from each publisher, or since it first
  subscribed.
- The replay runs by :mod:`octopis.core.replay`'s rules, the broker process's: it goes
  on SBP's paths behind the new subscriptions, each store answers, a part behind a
  neighbour that is down is reported silent and answers late if that neighbour comes
  back. While the answer comes, the subscriber holds its live deliveries at the SDK's
  seam (:class:`~octopis.client_policy.Seam`), and joins both there as the SDK does
  (:func:`~octopis.client_policy.join_at_seam`): what its record of recent deliveries
  (:class:`~octopis.client_policy.RecentDeliveries`) has seen is dropped, the rest
  delivered in publisher order; a late part drops too what was delivered since its
  replay (:class:`~octopis.client_policy.LateAnswers`). That side of the subscriber,
  its record and its seam, is :class:`~octopis.sim.seams.ReplaySeams`.
- A subscriber's own connection may fail (:meth:`SubscriberFailover.fail_client`): its
  host lives on and delivers into the void until it drops the silent client at the tick
  its node's rule names (:class:`~octopis.core.sessions.Liveness`, the process's) and
  withdraws its subscriptions; the subscriber fails over and replays as above.
- What a subscriber's replays left silent and never answered is its reported gap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from octopis.client_policy import Seam, each_once
from octopis.client_policy.failover import failover_tries
from octopis.client_policy.silence import heartbeat_interval, phase_of, silence_noticed
from octopis.core import Forward
from octopis.core.durable import Durables
from octopis.core.node import BrokerNode
from octopis.core.replay import (
    ExpireAt,
    QueryStore,
    ReplayAction,
    ReplayDeliver,
    ReplayDone,
    ReplayRounds,
    replay_request,
)
from octopis.defaults import CLIENT_LIVENESS
from octopis.filters.language import Subscription
from octopis.sim.stores import RetentionStores


class SubscriberFailover:
    """The :class:`~octopis.sim.engine.Simulator`'s subscribers failing over and their
    replays (a mixin beside its event loop, :class:`~octopis.sim.failures.FailureEvents`
    and :class:`~octopis.sim.seams.ReplaySeams`, which joins the answers it asks for)."""

    def _init_failover(self) -> None:
        self.retention = RetentionStores(self.failure_counts)
        """Each broker's retention store."""
        self.stores = self.retention.kept
        self.published = self.retention.published
        """Each broker's publishers' publications it routed (kept by its store or not)."""
        self.replay_rounds: dict[str, ReplayRounds] = {}
        self.failed_over: set[str] = set()
        """Subscribers that moved to another broker because theirs died."""
        self.first_home: dict[str, str] = {}
        """Where each subscriber that failed over was first attached."""
        self.outages: dict[str, list[tuple[float, float]]] = {}
        """Per subscriber that failed over: (its host died, it had subscribed again) — what
        was published in between only a replay can give it."""
        self.replay_counts: Counter[str] = Counter()
        self._replays = 0
        self.historic_received: dict[str, list[tuple[str, int]]] = {}
        """Per historic query (its req_id), the publications answered to it, in order."""
        self.historic_done: set[str] = set()
        """Historic queries whose round ended (its host told the asker it is done)."""
        self.restarts_pending = 0
        """Broker restarts scheduled and not yet come (a subscriber with every broker
        dead keeps trying while one is to come back)."""
        self.cut_clients: dict[tuple[str, str], float] = {}
        """(subscriber, broker) connections that failed → when: deliveries on them are
        lost. One is forgotten when its subscriber connects to that broker anew (a new
        connection, as a process's client key is: :meth:`_failed_over`)."""
        self.lost_answers: dict[tuple[str, str], int] = {}
        """Per (subscriber, broker) whose connection failed: the replay requests asked by
        its last failure (``broker/n``, ``n`` up to this), whose answers go over the
        failed connection (:meth:`~octopis.sim.seams.ReplaySeams._answer_lost`)."""
        self.stranded: set[str] = set()
        """Subscribers whose fail-over tries ended (:meth:`_stranded`)."""
        self.replay_on_failover = True
        """Whether a subscriber that failed over asks for a replay (the SDK's default)."""
        self.lingering: set[tuple[str, str]] = set()
        """(client, broker) sessions a client left at a fail-over and keeps for its linger
        (:meth:`~octopis.sim.pauses.PausedBrokers._left`), until its bye."""
        self.left_at_replay: dict[str, str] = {}
        """Per subscriber whose fail-over's replay is under way, the broker it left: the
        SDK keeps that session until its linger after the replay ends
        (:meth:`~octopis.sim.pauses.PausedBrokers._left`, from :meth:`_end_seam`)."""

    def _rounds(self, broker: str) -> ReplayRounds:
        """``broker``'s replay rounds (made at its first request), whose requests go on
        where the node says (:meth:`BrokerNode.replay_targets`, by its view of links)."""
        rounds = self.replay_rounds.get(broker)
        if rounds is None:
            rounds = self.replay_rounds[broker] = ReplayRounds(
                broker,
                lambda src, state: self.nodes[broker].replay_targets(
                    src, state, self._view(broker).down
                ),
            )
        return rounds

    # -- events --------------------------------------------------------------------------

    def _noticed(self, client: str, broker: str, silent_from: float) -> float:
        """When ``client``'s connection to ``broker``, which has answered nothing since
        ``silent_from``, judges it silent: the SDK's heartbeat watch
        (:func:`~octopis.client_policy.silence.silence_noticed`), its ticks at the
        connection's own phase (:func:`~octopis.client_policy.silence.phase_of`)."""
        interval = heartbeat_interval()
        ticks_at = phase_of(f"{client}@{broker}", self.seed, interval)
        return silence_noticed(silent_from, ticks_at, interval)

    def _hosts_died(self, broker: str) -> None:
        """``broker`` died: its subscribers notice by the SDK's watch (:meth:`_noticed`);
        its replay rounds die with it (its store does not)."""
        self.replay_rounds.pop(broker, None)
        self._hosts_silent(broker, self._fail_over)

    def _hosts_silent(self, broker: str, notice: Callable[[str, str, float], None]) -> None:
        """``broker`` falls silent now: each of its subscribers notices it when the SDK's
        watch says (:meth:`_noticed`), ``notice(subscriber, broker, since)``."""
        for subscriber, home in list(self._home.items()):
            if home == broker and subscriber in self.clients.subscriptions_of:
                noticed = self._noticed(subscriber, broker, self.now)
                self.at(noticed, notice, subscriber, broker, self.now)

    def fail_client(self, subscriber: str, at: float) -> None:
        """At ``at``, ``subscriber``'s connection to its broker fails for good: the broker
        delivers into the void until it drops the client, silent past its timeout
        (:meth:`_clients_silent`), and withdraws its subscriptions; the subscriber fails
        over when the SDK's watch judges the broker silent (:meth:`_noticed`) and replays."""
        self._failure_state()
        self.at(at, self._client_cut, subscriber)

    def _client_cut(self, subscriber: str) -> None:
        host = self._home.get(subscriber)
        if host is None or subscriber not in self.clients.subscriptions_of:
            return
        cut = self.cut_clients.setdefault((subscriber, host), self.now)  # failed already?
        self.lost_answers[(subscriber, host)] = self._replays
        self.failure_counts["clients_cut"] += 1
        noticed = self._noticed(subscriber, host, self.now)
        self.at(noticed, self._fail_over, subscriber, host, self.now)
        self.nodes[host].client_liveness.heard(subscriber, cut)  # and never again
        self._watch_clients(host)

    def _watch_clients(self, host: str) -> None:
        """``host`` judges its clients' silence at the tick one falls due (:meth:`Liveness.due`)."""
        node = self.nodes[host]
        due = node.client_liveness.due()
        if due is not None:
            self.at(due, self._clients_silent, host, node, due)

    def _clients_silent(self, host: str, node: BrokerNode, due: float) -> None:
        """``host``'s tick at ``due`` drops whom its ``node`` finds silent; nothing if that
        node died (its clients with it) or another tick is due (a resume's, a drop's)."""
        liveness = node.client_liveness
        if self._dead(host) or self.nodes[host] is not node or liveness.due() != due:
            return
        if not self._asleep(host, self._clients_silent, host, node, due):
            self._drop_silent(host, liveness.silent(self.now, caught_up=True))

    def _drop_silent(self, host: str, silent: list[str]) -> None:
        """``host`` drops its ``silent`` clients (what the node withdraws goes; nothing of
        one connected here anew since, as :meth:`_said_bye`), then watches the others."""
        liveness = self.nodes[host].client_liveness
        for subscriber in silent:
            heard = liveness.forget(subscriber)
            if (subscriber, host) in self.cut_clients:
                self._client_gone(host, subscriber, heard)
                self.failure_counts["clients_dropped"] += 1
        self._watch_clients(host)

    def _client_gone(self, host: str, client: str, heard: float) -> None:
        """``host`` forgets its client ``client``, last heard at ``heard``: the node
        decides what is withdrawn (:meth:`BrokerNode.client_gone`) and whether its
        durable records are written at once, as the process's."""
        gone = self.nodes[host].client_gone(client, heard, self._durables(host))
        for sub_id in gone.withdrawn:
            self.subscriber_of.pop(sub_id, None)
        if gone.save:
            self._durable_write(host)
        self._dispatch(host, gone.actions)

    def _durables(self, broker: str) -> Durables | None:
        """``broker``'s durable records (None: this run keeps none)."""
        return None

    def _durable_write(self, broker: str) -> None:
        """``broker`` writes its durable records (this run keeps none)."""

    def _fail_over(self, subscriber: str, old: str, died: float) -> None:
        """``subscriber`` leaves silent ``old`` along its list in the SDK's order
        (:meth:`_connect`; the list begins at the broker it first subscribed at, and
        ``old`` itself comes last, it may have restarted)."""
        if self._home.get(subscriber) != old or self.failures is None:
            return
        first = self.first_home.get(subscriber, old)
        self._connect(
            self._then(self._failover_tries(first, old), lambda: self._stranded(subscriber)),
            lambda: self._home.get(subscriber) == old,
            lambda new: self._failed_over(subscriber, old, new, died),
        )

    @staticmethod
    def _then(tries: Iterator[str | None], ended: Callable[[], None]) -> Iterator[str | None]:
        """``tries``, and ``ended()`` once they end."""
        yield from tries
        ended()

    def _stranded(self, subscriber: str) -> None:
        """``subscriber``'s tries ended (every broker of its list gone for good): the
        replay it waits for, if any, is never answered (its host is among them), so its
        wait ends as the SDK's does past its timeout, with no answer: what its seam held
        is delivered, and every broker is in its gap (:meth:`_end_seam`). Without one it
        ends the run cut off since its connection failed, and knows it: what was published
        since, its lost brokers alone could give it, so every broker is its gap
        (``subscribers_stranded``)."""
        if subscriber not in self.stranded:
            self.stranded.add(subscriber)
            self.failure_counts["subscribers_stranded"] += 1
        if subscriber in self.seams:
            self.replay_counts["cut_short"] += 1
            self._end_seam(subscriber, self.scot.brokers)
        else:
            self.replay_gaps[subscriber] = set(self.scot.brokers)

    def _failover_tries(self, first: str, old: str) -> Iterator[str | None]:
        """The SDK's tries (:func:`~octopis.client_policy.failover.failover_tries`) away from
        ``old`` along the broker list of a client that began at ``first`` (the topology's
        fail-over list of ``first``, after it); they end once every broker of that list
        is :meth:`_gone_for_good`."""
        return failover_tries([first, *self.scot.failover_order(first)], old, self._gone_for_good)

    def _gone_for_good(self, broker: str) -> bool:
        """Whether ``broker`` is dead and no restart is to come (what a process never
        knows, and a simulated client's tries end on)."""
        return self._dead(broker) and not self.restarts_pending

    def _connect(
        self,
        tries: Iterator[str | None],
        wanted: Callable[[], bool],
        connected: Callable[[str], None],
    ) -> None:
        """A client fails over as the SDK does (``Failover.run``): it tries the brokers
        ``tries`` gives, and learns that one is dead only by its silence,
        :data:`CLIENT_LIVENESS` after the hello (a paused one may answer at its resume,
        :meth:`_hello`); past the last it waits as long and
        starts over (one may have come back during the round), until the tries end
        (every broker of its list gone for good, :meth:`_failover_tries`). Nothing
        happens once the client no longer ``wanted`` to; ``connected(broker)`` is called
        at the first broker that answers."""
        if not wanted():
            return
        broker = next(tries, "")  # "": the tries ended
        if not broker:  # none answered: round again, unless the tries ended
            self.failure_counts["failover.no_live_broker"] += 1
            if broker == "":
                return
        elif not self._dead(broker) and self._hello(broker, tries, wanted, connected):
            return
        self.at(self.now + CLIENT_LIVENESS, self._connect, tries, wanted, connected)

    def _failed_over(self, subscriber: str, old: str, new: str, died: float) -> None:
        """``subscriber``, which left silent ``old``, is connected at ``new``: it
        subscribes again and asks for a replay behind its subscriptions."""
        self.first_home.setdefault(subscriber, old)
        self.outages.setdefault(subscriber, []).append((died, self.now))
        self._home[subscriber] = new
        self.cut_clients.pop((subscriber, new), None)  # a new connection, not the failed one
        self.failed_over.add(subscriber)
        self.record_of(subscriber)
        # What the SDK has taken: not what a replay cut short still holds at its seam
        # (it delivers that once the replay ends, after this one has asked).
        replaying = self._replaying(subscriber)
        replaying.subscribed(self.clients.first_subscribed[subscriber])
        since, after = replaying.failed_over(died)
        # A replay under way is cut short: its part joins now, its answer never comes here
        # (the SDK's "no answer"; a late echo names the stores that answered).
        if subscriber in self.seams:
            self.replay_counts["cut_short"] += 1
        self._end_seam(subscriber, self.scot.brokers)
        self.failure_counts["subscribers_failed_over"] += 1
        for subscription in self.clients.subscriptions_of[subscriber]:
            self._dispatch(new, self.clients.session_subscribe(subscriber, new, subscription)[1])
        if not self.replay_on_failover:
            self._left(subscriber, old)  # the SDK keeps the session it left for its linger
            return
        self.left_at_replay[subscriber] = old  # ... from when its replay ends
        self._replays += 1
        req_id = f"{new}/{self._replays}"
        self.seams[subscriber] = Seam(self.seam_limit, replay=req_id)
        texts = [s.to_text() for s in self.clients.subscriptions_of[subscriber]]
        request = replay_request(req_id, new, texts, sorted(since), after)
        self.replay_counts["requests"] += 1
        self._carry_out_replay(new, self._rounds(new).start(request, self.now, subscriber))

    def historic(
        self, asker: str, broker: str, subscription: Subscription, after: float, until: float
    ) -> str:
        """``asker``, a client of ``broker``, asks now for what was published in ``[after,
        until)`` matching ``subscription`` (a historic subscription, DESIGN §11): the
        answers go to :attr:`historic_received` under the returned req_id; a store that
        stays silent is reported to ``asker`` (:attr:`replay_gaps`)."""
        self._replays += 1
        req_id = f"{broker}/{self._replays}"
        self.historic_received[req_id] = []
        text = subscription.to_text()
        request = replay_request(req_id, broker, [text], (), after, historic=True, until=until)
        self.replay_counts["historic"] += 1
        self._carry_out_replay(broker, self._rounds(broker).start(request, self.now, asker))
        return req_id

    def _replay_message(self, broker: str, src: str, message: Any) -> None:
        self._carry_out_replay(broker, self._rounds(broker).receive(src, message, self.now))

    def _replay_link_down(self, broker: str, neighbour: str) -> None:
        rounds = self.replay_rounds.get(broker)
        if rounds is not None:
            self._carry_out_replay(broker, rounds.link_down(neighbour))

    def _replay_expire(self, broker: str) -> None:
        rounds = self.replay_rounds.get(broker)
        live = rounds is not None and self.failures is not None and not self._dead(broker)
        if live and not self._asleep(broker, self._replay_expire, broker):
            self._carry_out_replay(broker, rounds.expire(self.now))  # type: ignore[union-attr]

    def _carry_out_replay(self, broker: str, actions: list[ReplayAction]) -> None:
        for action in actions:
            if type(action) is Forward:
                self._dispatch(broker, [action])
            elif type(action) is ExpireAt:
                self.at(action.deadline, self._replay_expire, broker)
            elif type(action) is QueryStore:
                request = action.request
                pages, gaps, truncated = self.retention.pages(broker, request)
                rounds = self._rounds(broker)
                for page in pages[:-1]:
                    self._carry_out_replay(broker, rounds.part(request.req_id, page))
                self._carry_out_replay(
                    broker, rounds.stored(request.req_id, pages[-1], gaps, truncated=truncated)
                )
            elif type(action) is ReplayDeliver:
                subscriber = action.requester
                historic = self.historic_received.get(action.req_id)
                if historic is not None:  # taken as the SDK takes it
                    answer = [*historic, *((n.publisher, n.seq) for n in action.notifications)]
                    historic[:] = each_once(answer, lambda key: key)
                    continue
                self.replay_counts["replayed"] += len(action.notifications)
                self._replayed(subscriber, action.req_id, action.notifications)
            elif type(action) is ReplayDone:
                subscriber = action.requester
                if action.req_id in self.historic_received:
                    self.historic_done.add(action.req_id)
                self._replay_ended(subscriber, action.req_id, action.echo)
                self.replay_counts["late" if action.late else "done"] += 1
