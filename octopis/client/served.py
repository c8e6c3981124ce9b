"""The named clients one connection serves (DESIGN §4, §9): where each one's deliveries
and notices go, a delivery seen before dropped, and whom to tell when the broker drops
the connection."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from octopis.client.deliveries import NotificationHandler
from octopis.client_policy import RecentDeliveries
from octopis.logs import RateLimitedLog
from octopis.wire import LEFT_AT, unpack
from octopis.wire.client import Notice, delivery_fields


class ServedClients:
    """The clients of one connection: each one's :data:`NotificationHandler`, called once
    per delivery (one ``recent`` remembers is dropped and counted), its notice handler,
    and the callbacks of a drop; ``warn`` writes the repeating warnings."""

    def __init__(self, recent: RecentDeliveries, warn: RateLimitedLog) -> None:
        self.recent = recent
        self.warn = warn
        self.handlers: dict[str, NotificationHandler] = {}
        """Client name → where its deliveries go."""
        self._notices: dict[str, Callable[[Notice], None]] = {}
        self._on_drop: list[Callable[[str], None]] = []
        self.duplicates_absorbed = 0
        """Deliveries dropped as already seen during a fail-over or move."""
        self.unclaimed = 0
        """Deliveries for a client not served here (one that moved on while the broker
        still named it here)."""

    def on_notice(self, name: str, notice: Callable[[Notice], None]) -> None:
        """Call ``notice(message)`` with what the broker tells client ``name`` unasked."""
        self._notices[name] = notice

    def on_dropped(self, notify: Callable[[str], None]) -> None:
        """Call ``notify(reason)`` if the broker drops the connection."""
        self._on_drop.append(notify)

    def leave(self, name: str, notify: Callable[[str], None]) -> NotificationHandler | None:
        """Client ``name`` (told of a drop by ``notify``) is served elsewhere now: no
        more notices or drops for it; returns its handler, left in place (deliveries
        may still come, see :meth:`Connection.forget`)."""
        self._notices.pop(name, None)
        if notify in self._on_drop:
            self._on_drop.remove(notify)
        return self.handlers.get(name)

    def deliver(self, parts: list[bytes]) -> None:
        """A frame of deliveries, ``[names, body, ..., stamp]``: each NOTIFY ``body``
        for the clients ``names``, a repeat dropped (the one loop every delivery takes in
        the SDK, hence the local names)."""
        now = time.time()
        left = LEFT_AT.unpack(parts[-1])[0] if len(parts) % 2 else math.nan
        recent = self.recent
        seen, times, handlers = recent.seen, recent.recent, self.handlers
        for i in range(0, len(parts) - 1, 2):
            body = parts[i + 1]
            publisher, seq, published_at, publication, session, opaque = delivery_fields(body)
            for name in unpack(parts[i]):
                handler = handlers.get(name)
                if handler is None:
                    self.unclaimed += 1
                    continue
                key = (name, publisher, session, seq)
                if key in seen:
                    self.duplicates_absorbed += 1
                    continue
                seen.add(key)
                times.append((now, key))
                size = len(body)
                handler(
                    name,
                    publisher,
                    seq,
                    published_at,
                    publication,
                    now,
                    left,
                    size,
                    session,
                    opaque,
                )
        recent.forget_old(now)

    def notice(self, data: Notice, endpoint: str) -> None:
        """Hand a notice from the broker at ``endpoint`` to its client."""
        notice = self._notices.get(data.client)
        if notice is None:
            self.warn.warning(
                "unknown-client notice",
                "a %s for client %r, unknown at %s",
                type(data).__name__,
                data.client,
                endpoint,
            )
        else:
            notice(data)

    def dropped(self, reason: str) -> None:
        """Tell every client that the broker dropped the connection."""
        for notify in self._on_drop:
            notify(reason)

    def add_counts(self, other: ServedClients) -> None:
        """Count ``other``'s absorbed and unclaimed deliveries here too."""
        self.duplicates_absorbed += other.duplicates_absorbed
        self.unclaimed += other.unclaimed
