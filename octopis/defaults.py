"""Defaults that more than one layer reads, each defined once here (DESIGN §2): the
broker's settings (``octopis.settings``), the SDK and the simulator take them from this
module, so a simulated broker or client behaves as a real one does by default."""

from __future__ import annotations

CLIENT_LIVENESS = 1.5
"""Seconds of its broker's silence after which an SDK connection fails over."""
LINGER = 10.0
"""Seconds an SDK connection keeps the session it left (a fail-over, a move across
clusters) after its clients are subscribed at the new broker: copies routed by the old
subscription still arrive meanwhile and are dropped as repeats (the simulator's clients
alike)."""
CLIENT_TIMEOUT = 10.0
"""Seconds of a client's silence after which its broker drops it and withdraws its
subscriptions (``[clients] timeout``)."""
MOVE_TIMEOUT = 30.0
"""Seconds a client told to move its subscriptions away has to move them; the order
lapses after that and the client stays subscribed at its broker (``[clients]
move_timeout``)."""
HEARTBEAT = 0.2
"""Seconds of silence on a link before it carries a heartbeat, and with it the count of
what its sender took from the receiver (``[links] heartbeat``; the simulator's links
alike)."""
DOWN_AFTER = 1.0
"""Seconds of a neighbour's silence after which a broker takes it for down
(``[links] down_after``; the simulator's failure detection)."""
TCP_ABORT_AFTER = 3.0
"""A peer link's TCP connection with data unacknowledged for this many times
``links.down_after`` (3 s by default) is aborted and made again (``TCP_MAXRT``,
``transport.links.tcp_abort_ms``): the neighbour is declared down, and the notifications
in custody taken back, before a connection dies with frames in it (DESIGN §7), even when
the cut is one way: the talker then hears its neighbour fall silent only once that one
has declared it down, and declares it down ~2 ``down_after`` and two liveness ticks
after the cut (at 2 ``down_after`` the abort came first, nemesis seed 1512); the other
routing frames it carried are sent again at the heal (``OutputLink.resent``). Until
then TCP keeps what it carries, and the simulator's cut links too."""
RETAIN = 1.0
"""Seconds a broker keeps acknowledged notifications after sending them, for re-routing
after a failure (``[links] retain``; the simulator's senders alike)."""
REFUSE_FOR = 1.0
"""Seconds a broker refuses new publications after its retention store's disk refused
a commit (the simulator's stores alike)."""
RETAIN_LIMIT = 10_000
"""Acknowledged notifications a broker keeps per neighbour for :data:`RETAIN` seconds at
most (``[links] retain_limit``; the simulator's senders alike); the oldest go first,
counted."""
CUSTODY_LIMIT = 10_000
"""Messages a broker holds per neighbour, in custody or held for its return
(``[links] custody_limit``)."""
QUEUE_LIMIT = 10_000
"""Frames waiting on one link to a neighbour past which a broker withholds its
acknowledgements from its other neighbours (``[links] queue_limit``; the simulator's
brokers alike, :class:`~octopis.core.pressure.Backpressure`)."""
ACK_INTERVAL = 0.05
"""Seconds between a broker's looks at the acknowledgements backpressure withholds
(``[links] ack_interval``; the simulator's brokers alike)."""
ACK_DELAY = 0.01
"""Seconds within which a broker acknowledges notifications whose sender asked for no
acknowledgement at once (``[links] ack_delay``; the simulator's brokers alike)."""
ACK_EVERY = 64
"""Routing frames a broker takes from one neighbour past which it acknowledges them at
once rather than within :data:`ACK_DELAY` (``[links] ack_every``; the simulator's
brokers alike; 1: every run at once)."""
DELIVERIES_LIMIT = 10_000
"""Deliveries waiting for ``[clients] capacity`` past which a broker holds back every
neighbour and refuses local publications (``[clients] queue_limit``)."""
MEMORY_BUDGET_MB = 256
"""RSS, in MB, past which a broker holds its neighbours back (``[memory] budget_mb``)."""
PUBLICATION_HOLD = 10_000
"""Local publications a broker holds while it resyncs after its start
(``[clients] hold_limit``); past it publishers are refused."""
SUBSCRIPTIONS_PER_CLIENT = 10_000
"""Subscriptions one client may hold at one broker (``[limits]
subscriptions_per_client``); one more is refused."""
REPLAY_ROUNDS = 1000
"""Replay requests one broker takes part in at once (``[retention] replay_rounds``)."""
COMPOSITE_HELD = 10_000
"""Publications the join of one composite subscription keeps (``[composite]
max_held``)."""
COMPOSITE_LATENESS = 5.0
"""Seconds a publication may take to a composite's host and still be joined
(``[composite] lateness``)."""
DRAIN_TIMEOUT = 30.0
"""Seconds a workload run waits without a delivery before it stops waiting
(``octopis run --drain-timeout``)."""
BODY_BYTES = 65_536
"""Bytes of one publication's opaque body a broker accepts (``[clients] body_bytes``);
a longer one is refused."""
SELECTOR_SUBSCRIPTIONS = 16
"""PADRES subscriptions one STOMP selector may become (``[stomp]
selector_subscriptions``)."""
ANSWER_MAX = 100_000
"""Publications one retention store answers to one replay request at most (``[retention]
answer_max``; the simulator's stores alike); past it the answer says it was cut."""
ANSWER_BYTES = 64 * 2**20
"""Encoded bytes one retention store answers to one replay request at most
(``[retention] answer_bytes``; the simulator keeps no encoded bodies, so its stores are
cut by :data:`ANSWER_MAX` only)."""
PAGE_ROWS = 512
"""Kept rows a retention store reads per page of a replay answer; each page goes toward
the requester at once (:meth:`~octopis.core.replay.ReplayRounds.part`), and the
process's loop serves live traffic between pages (the simulator's stores page alike)."""
REPLAY_BUDGET = 3.0
"""Seconds the host of a replay waits for every broker's answer (``[retention]
replay_budget``)."""
HISTORIC_BUDGET = 30.0
"""Seconds the host of a historic, hybrid or durable subscription's answer waits for
every broker's answer (``[retention] historic_budget``)."""
LOOKBACK = 30.0
"""Seconds before its broker went silent (or its client was last heard) from which a
replay asks for what a subscriber may have missed: a publication published earlier
that it did not get was not lost to the fail-over (it would have been in flight for
longer than any custody window)."""
CLOCK_SKEW = 1.0
"""Seconds a publisher's clock may run behind a subscriber's: a replay that starts where
the subscriber first subscribed (its clock) reaches this much earlier, since it is
compared with the publishers' stamps; a publication published up to this long before the
subscription may come with the replay."""
REORDER = 2 * (DOWN_AFTER + RETAIN)
"""Seconds a copy may arrive after later publications of its publisher were taken: one
taken back from custody at a failure's detection is routed again up to ``retain`` +
``down_after`` after it was sent, and this allows for one more detection on its detour.
A replay asks, of each publisher, from the last publication taken this long before the
broker went silent (:class:`~octopis.client_policy.FromPoints`)."""
PUBLISHERS_KNOWN = 10_000
"""(publisher, session) pairs whose last sequence number a subscriber or a durable
record remembers; a forgotten one is asked for by time instead."""
DELIVERIES_HORIZON = 30.0
"""Seconds an application's record of recent deliveries remembers each (a copy that
comes later through another connection is not recognised as a repeat)."""
DELIVERIES_KNOWN = 262_144
"""Deliveries that record remembers at most (the oldest forgotten first, counted)."""
LOAD_WINDOW = 10
"""Seconds of a broker's load analysis's sliding window (``[load] window``): the window
its load report covers, in a process and in the simulator's balancer (DESIGN §9)."""
DURABLE_KEEP = 3600.0
"""Seconds a durable subscription's record waits for its client (``[durable] keep``)."""
DURABLE_MAX = 10_000
"""Durable subscription records one broker keeps (``[durable] max``)."""
BUFFER = 10_000
"""Deliveries a subscriber holds before it stops reading (the SDK's ``buffer``), and a
seam holds live while its replay's answer comes (the simulator's subscribers alike)."""
LATE_KEPT = 10_000
"""Deliveries a subscriber remembers per replay that waits for late answers (beyond it,
the record of recent deliveries still drops repeats)."""
LATE_WAITING = 16
"""Replays of one subscriber that wait for late answers with their memory of
deliveries; an older one forgets it."""
