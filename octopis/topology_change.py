"""A SCOT grown or shrunk by its natural unit (issue 18, DESIGN §9): one more or one fewer
cluster (a copy of the tree, one broker per region) or region (a tree vertex, one broker
per cluster).

Each operation returns a new topology version that is the SCOT of the new shape built
afresh (:func:`~octopis.topology.build_scot`: labels, broker types, link kinds and
neighbour lists), except that every broker the old version has keeps its endpoints and
host. A new broker runs where its nearest old broker runs (same address and host name) on
ports after the highest the old version uses, so no running broker has to move.

The index property of paper §3.2 labels the clusters 0..n−1 (a DNR cluster bit vector has
a bit per cluster), so a cluster joins as n and only the last one, n−1, can leave: any
other would rename a whole cluster of running brokers. Likewise the tree stays a tree: a
region joins as a leaf, and only a leaf can leave.

A running broker learns a new version through its own view of it alone
(:class:`RelinkView`, what ``octopis scale`` sends and the control RPC's ``relink``
takes: one declaration for both ends); a leaving broker's subscribers go to its
:func:`refuges` in turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec

from octopis.topology import (
    PORTS_PER_BROKER,
    BrokerInfo,
    Neighbour,
    Scot,
    TopologyError,
    build_scot,
)

if TYPE_CHECKING:  # a broker process relinks without a graph library (its start)
    import networkx as nx


def add_cluster(scot: Scot) -> Scot:
    """The SCOT with cluster ``n`` added: one broker per region, iCOLs to every cluster's
    broker of its region, the tree's aCOLs inside the new cluster."""
    return _reshape(scot, scot.acyclic, scot.clusters + 1)


def remove_cluster(scot: Scot, index: int) -> Scot:
    """The SCOT without cluster ``index``, which must be the last (``n − 1``)."""
    last = scot.clusters - 1
    if scot.clusters == 1:
        raise TopologyError(f"{scot.name} has one cluster: removing it leaves no SCOT")
    if index != last:
        what = f"cluster {index}" if 0 <= index < last else f"there is no cluster {index}"
        raise TopologyError(
            f"{what}: clusters are labelled 0..{last} (the index property, paper §3.2), so "
            f"only the last, {last}, can leave without renaming a cluster of running brokers"
        )
    return _reshape(scot, scot.acyclic, last)


def add_region(scot: Scot, name: str, attach_to: str) -> Scot:
    """The SCOT with region ``name`` added as a leaf of the tree at region ``attach_to``:
    one broker per cluster, each linked to ``attach_to``'s broker of its cluster and to
    the new region's brokers of the other clusters."""
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise TopologyError(
            f"region name {name!r} must be a non-empty label without ':' or surrounding spaces"
        )
    if name in scot.acyclic:
        raise TopologyError(f"{scot.name} has a region {name!r} already")
    if attach_to not in scot.acyclic:
        raise TopologyError(
            f"{scot.name} has no region {attach_to!r} to attach {name!r} to "
            f"(regions: {', '.join(scot.regions)})"
        )
    tree = scot.acyclic.copy()
    tree.add_edge(attach_to, name)
    return _reshape(scot, tree, scot.clusters)


def remove_region(scot: Scot, name: str) -> Scot:
    """The SCOT without region ``name``, which must be a leaf of the tree."""
    tree = scot.acyclic
    if name not in tree:
        raise TopologyError(f"{scot.name} has no region {name!r} (regions: {', '.join(tree)})")
    if tree.number_of_nodes() == 1:
        raise TopologyError(f"{name!r} is {scot.name}'s only region: removing it leaves no SCOT")
    if tree.degree(name) > 1:
        raise TopologyError(
            f"region {name!r} is not a leaf (it links {', '.join(sorted(tree[name]))}): "
            "removing it would split the tree; remove the leaves beyond it first"
        )
    smaller = tree.copy()
    smaller.remove_node(name)
    return _reshape(scot, smaller, scot.clusters)


def changed_brokers(old: Scot, new: Scot) -> tuple[list[str], list[str], list[str]]:
    """(added, removed, relinked): brokers only ``new`` has, brokers only ``old`` has, and
    brokers of both whose neighbours changed (they must be told of their new links)."""
    added = [b for b in new.brokers if b not in old.brokers]
    removed = [b for b in old.brokers if b not in new.brokers]
    lost = changed_links(old, new)
    return added, removed, [b for b in new.brokers if b in lost]


def changed_links(old: Scot, new: Scot) -> dict[str, set[str]]:
    """Each broker of ``old`` whose neighbours change in ``new`` (one that stays is
    relinked; a new cluster count changes every broker's), with the neighbours it loses:
    a broker that leaves loses them all."""
    kept = {b: set(new.graph[b]) for b in new.brokers if b in old.brokers}
    return {
        broker: set(old.graph[broker]) - kept.get(broker, set())
        for broker in old.brokers
        if kept.get(broker) != set(old.graph[broker])
    }


def refuges(old: Scot, new: Scot) -> dict[str, list[str]]:
    """For each broker ``new`` lacks, where its subscribers go: the brokers of its region
    in the remaining clusters (a cluster leaves), or the broker of the same cluster in
    the region it is attached to (a region leaves: a leaf has one tree neighbour).
    :class:`TopologyError` if a leaving broker has none."""
    found: dict[str, list[str]] = {}
    for broker_id in (b for b in old.brokers if b not in new.brokers):
        broker = old.brokers[broker_id]
        if broker.region in new.acyclic:
            found[broker_id] = [
                b.id
                for b in new.brokers.values()
                if b.region == broker.region and b.cluster != broker.cluster
            ]
        else:
            parent = next(iter(old.acyclic[broker.region]))
            found[broker_id] = [
                b.id
                for b in new.brokers.values()
                if (b.region, b.cluster) == (parent, broker.cluster)
            ]
        if not found[broker_id]:
            raise TopologyError(f"no broker of {new.name} can take {broker_id}'s subscribers")
    return found


def refuse_stranded_publishers(attached: Iterable[tuple[str, str]]) -> None:
    """:class:`TopologyError` naming the publishers of ``attached`` (``(publisher,
    broker)`` pairs at leaving brokers), if any: a publisher cannot be told to move, so
    a change that would strand one is refused before anything moves (``octopis scale``
    and the simulator's shrink)."""
    publishers = sorted(f"{c} at {b}" for c, b in attached)
    if publishers:
        raise TopologyError(
            f"publishers are attached to leaving brokers: {', '.join(publishers[:5])}; a "
            "publisher cannot be told to move: connect it to a broker that stays first"
        )


def refuge_turns(old: Scot, new: Scot) -> Callable[[str], str]:
    """``refuge(broker)``: where the next subscriber of a broker ``new`` lacks moves, its
    :func:`refuges` in turn (one rule for ``octopis scale`` and the simulator's shrink)."""
    turns = {b: itertools.cycle(found) for b, found in refuges(old, new).items()}
    return lambda broker: next(turns[broker])


def _reshape(old: Scot, acyclic: nx.Graph, clusters: int) -> Scot:
    """The SCOT of the new shape built afresh, old brokers' endpoints and hosts kept."""
    fresh = build_scot(acyclic, clusters, name=old.name)
    port = _highest_port(old) + 1
    brokers: dict[str, BrokerInfo] = {}
    for bid, broker in fresh.brokers.items():
        kept = old.brokers.get(bid)
        if kept is None:
            brokers[bid] = _placed(broker, _nearest_old(old, broker), port)
            port += PORTS_PER_BROKER
        else:
            brokers[bid] = replace(
                broker,
                endpoint=kept.endpoint,
                client_endpoint=kept.client_endpoint,
                control_endpoint=kept.control_endpoint,
                metrics_endpoint=kept.metrics_endpoint,
                host=kept.host,
            )
    if port - 1 > 65535:
        raise TopologyError(f"{old.name} has no free ports left for the new brokers")
    fresh.brokers = brokers
    return fresh


def _highest_port(scot: Scot) -> int:
    ports = [
        urlsplit(endpoint).port or 0
        for b in scot.brokers.values()
        for endpoint in (b.endpoint, b.client_endpoint, b.control_endpoint, b.metrics_endpoint)
        if endpoint
    ]
    return max(ports)


def _nearest_old(old: Scot, broker: BrokerInfo) -> BrokerInfo:
    """The old broker a new one runs beside: its region's broker of the nearest cluster
    (a new cluster), or its cluster's broker of the region it hangs from (a new region)."""
    if broker.region in old.acyclic:
        cluster = min(range(old.clusters), key=lambda c: abs(c - broker.cluster))
        return old.broker(broker.region, cluster)
    (attach_to,) = (n.region for n in broker.neighbours if n.cluster == broker.cluster)
    return old.broker(attach_to, broker.cluster)


def _placed(broker: BrokerInfo, beside: BrokerInfo, port: int) -> BrokerInfo:
    """``broker`` on ``beside``'s address and host, on four ports from ``port``."""
    address = urlsplit(beside.endpoint).hostname
    return replace(
        broker,
        endpoint=f"tcp://{address}:{port}",
        client_endpoint=f"tcp://{address}:{port + 1}",
        control_endpoint=f"tcp://{address}:{port + 2}",
        metrics_endpoint=f"http://{address}:{port + 3}/metrics",
        host=beside.host,
    )


class NeighbourLink(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One neighbour in a new view: its labels (as in a topology file), the endpoint of
    its peer input and its CurveZMQ public key (Z85; empty when the overlay runs
    insecure)."""

    neighbour: Neighbour
    endpoint: str
    key: str = ""


class RelinkView(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A broker's view in a new topology version."""

    clusters: int
    neighbours: list[NeighbourLink]


def decode_view(data: object, secure: bool) -> RelinkView:
    """``data`` (the RPC's argument) as a :class:`RelinkView`; :class:`ValueError` naming
    the problem if it is not one: a missing or mistyped field, no cluster, no neighbour,
    a neighbour named twice, an endpoint that is not ``tcp://HOST:PORT``, or
    (``secure``) a neighbour without a Z85 public key. Once it passes, opening the
    links cannot fail on it."""
    try:
        view = msgspec.convert(data, RelinkView)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a relink view: {exc}") from None
    if view.clusters < 1:
        raise ValueError(f"a relink view needs at least one cluster, not {view.clusters}")
    if not view.neighbours:
        raise ValueError("a relink view names no neighbour: a broker of a SCOT keeps one")
    ids = [n.neighbour.id for n in view.neighbours]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ValueError(f"a relink view names {', '.join(twice)} twice")
    for link in view.neighbours:
        n = link.neighbour
        address = urlsplit(link.endpoint)
        try:
            port = address.port
        except ValueError:
            port = None
        if address.scheme != "tcp" or not address.hostname or port is None or port < 1:
            raise ValueError(f"neighbour {n.id}: endpoint {link.endpoint!r} is not tcp://HOST:PORT")
        if not 0 <= n.cluster < view.clusters:
            raise ValueError(f"neighbour {n.id}: no cluster {n.cluster} of {view.clusters}")
        if secure and not _z85_key(link.key):
            raise ValueError(f"neighbour {n.id}: a secure overlay needs its Z85 public key")
    return view


def _z85_key(text: str) -> bool:
    """Whether ``text`` is a CurveZMQ public key in Z85 (40 characters, 32 bytes)."""
    from zmq.utils import z85  # only a broker decodes a view: the simulator needs no zmq

    try:
        return len(text) == 40 and len(z85.decode(text.encode())) == 32
    except (ValueError, KeyError, TypeError):
        return False


def relink_view(scot: Scot, broker_id: str, keys: Callable[[str], str] | None) -> RelinkView:
    """Broker ``broker_id``'s view in ``scot`` as ``relink`` takes it: the cluster count
    and each neighbour's labels, peer endpoint and public key (``keys(broker)``, Z85;
    empty when insecure)."""
    return RelinkView(
        scot.clusters,
        [
            NeighbourLink(n, scot.brokers[n.id].endpoint, keys(n.id) if keys is not None else "")
            for n in scot.brokers[broker_id].neighbours
        ],
    )
