"""Paused brokers in the simulator (DESIGN §7): a process stopped (SIGSTOP, a long GC
pause, a VM hiccup) and resumed, as the broker process lives through it.

- A paused broker runs nothing until it resumes: what reaches it (its neighbours'
  frames, acknowledgements, its clients' requests and publications) waits, in order, as
  in its sockets' buffers; its timers fire late, at the resume. It sends nothing
  meanwhile, so its neighbours hear nothing and each declares it down a detection time
  after the pause began, as any silence (:meth:`Neighbour.silent_past`), routing around
  it and taking back what they kept for it.
- On resume it excuses its own stall by its node's rule
  (:meth:`~octopis.core.neighbours.Neighbours.stalled`), measured as the process's
  liveness tick measures it (:func:`~octopis.core.neighbours.stall` against
  :func:`~octopis.core.neighbours.liveness_tick`: the pause less a tick, nothing for one
  under two ticks): it declares no one down for the time it did not run (a silence
  judgement it owed meanwhile runs as much later), and its clients' tick due meanwhile
  runs late at once (:meth:`Liveness.after_pause`). It takes what waited, in order; then its
  neighbours hear it again, as at a heal: one that declared it down gives back what it
  held for it and sends again what it has no acknowledgement for.
- Its subscribers notice its silence by the SDK's heartbeat watch
  (:mod:`octopis.client_policy.silence`) and fail over, as a connection does
  (``client.connection.Connection``); each keeps the session it left, heartbeating it,
  until the SDK's linger (``defaults.LINGER``) after its replay ended, then says bye
  (``client.left_session.LeftSession``): the broker delivers to it meanwhile what it
  routed late, which the subscriber's record of recent deliveries absorbs when seen
  twice, and then withdraws the subscriptions. A client's hello to a paused broker is
  answered at its resume if that comes within the liveness.
- What its publishers and subscribers ask of it waits, as in its socket, until it
  resumes, and it takes it then. Its publishers notice its silence as its subscribers do
  and fail over, sending again what it has not answered
  (:class:`~octopis.sim.publishers.PublisherFailover`): what waited in its socket may
  then enter the overlay at both brokers, once at each, as on processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from octopis.core.neighbours import liveness_tick, stall
from octopis.defaults import CLIENT_LIVENESS, HEARTBEAT
from octopis.failure_schedule import Failure


class PausedBrokers:
    """The :class:`~octopis.sim.engine.Simulator`'s paused brokers (a mixin beside
    :class:`~octopis.sim.failures.FailureEvents`)."""

    def _pause(self, broker: str, until: float) -> None:
        """``broker`` stops now, to resume at ``until`` (:meth:`_resume`); its neighbours
        hear it no more, its clients neither (:meth:`_clients_hear_nothing`)."""
        state = self.failures
        if broker in state.dead or broker in state.paused:
            return  # a dead process is not paused, nor a paused one twice
        state.paused[broker] = (self.now, until)
        self.failure_counts["brokers_paused"] += 1
        for neighbour in sorted(self.scot.graph[broker]):
            if neighbour not in state.dead and (neighbour, broker) not in state.failed_at:
                self._silence(neighbour, broker)
        self._clients_hear_nothing(broker)

    def _clients_hear_nothing(self, broker: str) -> None:
        """``broker`` stopped now: each of its subscribers and publishers notices its
        silence when its heartbeat watch does (:meth:`_noticed`), and fails over if it
        has not run since."""
        self._hosts_silent(broker, self._host_silent)
        for publisher in self.publishers.connected_to(broker):
            noticed = self._noticed(publisher, broker, self.now)
            self.at(noticed, self._publisher_unheard, publisher, broker, self.now)

    def _asleep(self, broker: str, fn: Callable[..., Any], *args: Any) -> bool:
        """Whether ``broker`` is paused: then ``fn(*args)``, its event (a frame reaching
        it, a request, a timer), waits for its resume."""
        state = self.failures
        if state is None or broker not in state.paused:
            return False
        state.asleep.setdefault(broker, []).append((self.now, fn, args))
        return True

    def _resumes(self, broker: str) -> float | None:
        """When paused ``broker`` resumes (None: it is not paused)."""
        paused = self.failures.paused.get(broker) if self.failures is not None else None
        return None if paused is None else paused[1]

    def _resume(self, broker: str) -> None:
        """``broker`` runs again: it excuses its stall (its node's rule), takes what
        waited for it in order (a silence judgement as late as it did not run), and its
        neighbours hear it again, each link as at a heal (:meth:`_recover`)."""
        state = self.failures
        paused = state.paused.pop(broker, None)
        if paused is None:
            return  # it died meanwhile
        since = paused[0]
        late = self.now - since
        node = self.nodes[broker]
        node.neighbours.stalled(stall(self.now, since, liveness_tick(HEARTBEAT)))
        self._drop_silent(broker, node.client_liveness.after_pause(since, self.now, caught_up=True))
        self._sending_again(broker)
        silences = (self._silent_past, self._one_way_silent)
        for when, fn, args in state.asleep.pop(broker, []):
            if fn in silences:
                self.at(when + late, fn, *args)
            else:
                fn(*args)
        for neighbour in sorted(self.scot.graph[broker]):
            if neighbour not in state.dead:
                self._recover(Failure((broker, neighbour), since, self.now))

    def _paused_dies(self, broker: str) -> None:
        """Paused ``broker`` dies: what waited for it is lost with it, but a heal of one
        of its links, which is the network's, comes."""
        state = self.failures
        if state.paused.pop(broker, None) is None:
            return
        for _, fn, args in state.asleep.pop(broker, []):
            if fn == self._arrive:
                self._lose(*args)
            elif fn == self._recover:
                fn(*args)

    def _paused_since(self, broker: str, since: float) -> bool:
        """Whether ``broker`` has not run since ``since`` (paused still)."""
        paused = self.failures.paused.get(broker)
        return paused is not None and paused[0] <= since

    def _host_silent(self, subscriber: str, broker: str, since: float) -> None:
        """``subscriber``'s SDK has heard nothing from ``broker`` since ``since`` and its
        heartbeat watch judges it silent now: it fails over, if ``broker`` has not run
        since (paused still)."""
        if self._paused_since(broker, since):
            self._fail_over(subscriber, broker, since)

    def _publisher_unheard(self, publisher: str, broker: str, since: float) -> None:
        """``publisher``'s SDK has heard nothing from ``broker`` since ``since`` and its
        heartbeat watch judges it silent now: it fails over
        (:meth:`PublisherFailover.unheard`), if ``broker`` has not run since and it is
        still connected there."""
        if self._paused_since(broker, since) and self.clients.home.get(publisher) == broker:
            self.publishers.unheard(publisher, broker)

    def _hello(
        self,
        broker: str,
        tries: Iterator[str | None],
        wanted: Callable[[], bool],
        connected: Callable[[str], None],
    ) -> bool:
        """A client's hello to live ``broker``: answered now if it runs (``connected``),
        or at its resume if that comes within the SDK's liveness (:meth:`_answered`);
        False if it stays silent past that (the client tries on)."""
        resumes = self._resumes(broker)
        if resumes is None:
            connected(broker)
            return True
        deadline = self.now + CLIENT_LIVENESS
        if resumes > deadline:
            return False
        self.at(resumes, self._answered, tries, wanted, connected, broker, deadline)
        return True

    def _answered(
        self,
        tries: Iterator[str | None],
        wanted: Callable[[], bool],
        connected: Callable[[str], None],
        broker: str,
        deadline: float,
    ) -> None:
        """Paused ``broker`` was to resume before the hello's ``deadline``: if it runs
        now, it answers (connected, if the client still ``wanted`` to); else (it died,
        or stalls again) the client tries on at the deadline."""
        if self._dead(broker) or self._resumes(broker) is not None:
            self.at(deadline, self._connect, tries, wanted, connected)
        elif wanted():
            connected(broker)

    def _left(self, subscriber: str, old: str) -> None:
        """``subscriber`` re-subscribed away from ``old``: if ``old`` lives and their
        connection does, the SDK keeps that session for its linger, then says bye
        (:meth:`_said_bye`)."""
        if not self._dead(old) and (subscriber, old) not in self.cut_clients:
            self.lingering.add((subscriber, old))
            self.at(self.now + self._linger, self._said_bye, subscriber, old)

    def _sessions_abandoned(self, client: str) -> None:
        """``client``'s process ended now: the sessions it kept at brokers it left (and
        the one its replay under way would have let linger) are closed unsaid, as a
        connection cut (:meth:`_client_gone` once each broker finds it silent); what
        they deliver meanwhile goes into the void."""
        left = {old for c, old in self.lingering if c == client}
        if (pending := self.left_at_replay.pop(client, None)) is not None:
            left.add(pending)
        for old in sorted(left):
            self.lingering.discard((client, old))
            if self._dead(old) or self._home.get(client) == old:
                continue
            self.cut_clients.setdefault((client, old), self.now)
            self.nodes[old].client_liveness.heard(client, self.now)  # and never again
            self._watch_clients(old)

    def _said_bye(self, subscriber: str, old: str) -> None:
        """``subscriber``'s bye reaches ``old``: what the node withdraws goes
        (:meth:`_client_gone`), unless it is back at ``old``, ``old`` died, or the
        client's process ended first (:meth:`_sessions_abandoned`)."""
        if self._asleep(old, self._said_bye, subscriber, old):
            return
        self.lingering.discard((subscriber, old))
        if self._home.get(subscriber) == old or self._dead(old):
            return
        if (subscriber, old) in self.cut_clients:
            return
        self._client_gone(old, subscriber, self.now)
        self.failure_counts["clients_left"] += 1
