"""A running broker's part in a topology change (DESIGN §9): its new view as the
control RPC's ``relink`` hands it over (:class:`~octopis.topology_change.RelinkView`: its
neighbours with their peer endpoints and public keys, and the number of clusters),
checked before anything changes. A broker never reads the new topology file: it learns
only its own neighbours."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from octopis.topology_change import decode_view

if TYPE_CHECKING:
    from octopis.transport.broker import Broker

log = logging.getLogger("octopis.broker")


def relink(broker: Broker, data: object) -> dict[str, Any]:
    """``broker`` takes its view in a new topology version (DESIGN §9) from the control
    RPC (:func:`decode_view`): links to neighbours that
    joined open (down until their handshake; a new broker is filled by resync as a
    restarted one is), links to neighbours that leave close, and the core takes the new
    neighbours and cluster count. Refused with :class:`ValueError`, nothing changed,
    if the view is malformed, or if the node refuses it (:meth:`BrokerNode.relink`,
    :func:`~octopis.core.relinking.refuse_relink`: BID, DNR with advertisements, a
    leaving link that still carries routing frames, :meth:`PeerOutput.carrying`, or a
    core that still routes over one)."""
    view = decode_view(data, secure=broker.curve is not None)
    info = replace(broker.info, neighbours=tuple(n.neighbour for n in view.neighbours))
    old = {n.id for n in broker.info.neighbours}
    added = [n for n in view.neighbours if n.neighbour.id not in old]
    removed = sorted(old - {n.id for n in info.neighbours})
    now = broker.loop.time()
    dropped = broker.node.relink(info, view.clusters, now, broker.peers.output.carrying)
    if dropped:  # held while a leaving neighbour was down: a failure during the change
        log.warning("%s: %d messages held for neighbours that left dropped", broker.id, dropped)
    broker.info = info
    for neighbour in removed:
        task, link = broker.tasks.pop(f"link {neighbour}"), broker.peers.remove(neighbour)
        task.add_done_callback(lambda _, link=link: link.socket.close(linger=0))
        task.cancel()
        del broker.neighbour_endpoints[neighbour]
        if broker.curve is not None:
            broker.peer_keys.discard(broker.curve.neighbours.pop(neighbour))
    for link in added:
        name = link.neighbour.id
        broker.neighbour_endpoints[name] = link.endpoint
        if broker.curve is not None:
            broker.curve.neighbours[name] = link.key.encode()
            broker.peer_keys.add(link.key.encode())
        broker.start_task(f"link {name}", broker.peers.add(name, link.endpoint, now))
    broker.counters["relinks"] += 1
    log.info(
        "%s relinked: %d clusters, neighbours added %s, removed %s",
        broker.id,
        view.clusters,
        ", ".join(n.neighbour.id for n in added) or "none",
        ", ".join(removed) or "none",
    )
    return {
        "added": [n.neighbour.id for n in added],
        "removed": removed,
        "clusters": view.clusters,
    }
