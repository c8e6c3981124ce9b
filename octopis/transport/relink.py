"""A running broker's part in a topology change (issue 18, DESIGN §9): its new view as the
control RPC's ``relink`` hands it over — its neighbours with their peer endpoints and
public keys, and the number of clusters — checked before anything changes. A broker never
reads the new topology file: it learns only its own neighbours."""

from __future__ import annotations

from urllib.parse import urlsplit

import msgspec
from zmq.utils import z85

from octopis.topology import Neighbour


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
    try:
        return len(text) == 40 and len(z85.decode(text.encode())) == 32
    except (ValueError, KeyError, TypeError):
        return False
