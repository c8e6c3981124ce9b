"""``octopis sub`` and ``octopis pub``: a subscriber and a publisher from a shell, one
JSON line per notification or publication."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from octopis.cli.errors import UsageError
from octopis.cli.options import add_overlay_options, keys_of


def _sub(sub: argparse.ArgumentParser) -> None:
    sub.description = "Print each matching notification as a JSON line."
    _client_options(sub)
    sub.add_argument(
        "filter",
        help="subscription, e.g. \"[class,eq,'STOCK'],[close,>,20]\", or a composite one, e.g. "
        "\"{[class,eq,'TRADE'],[symbol,eq,$S]} & {[class,eq,'QUOTE'],[symbol,eq,$S]} within 5s\" "
        "(one JSON line per match, with its parts)",
    )
    sub.add_argument("--count", type=int, metavar="N", help="exit after N notifications")
    sub.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="exit after this long without a notification",
    )
    sub.add_argument(
        "--durable",
        metavar="NAME",
        help="a durable subscription: it outlives this command; started again with the same "
        "NAME (and --name, which defaults to NAME), at any broker, it first prints what was "
        "published meanwhile, exactly once, then live notifications (within retention and "
        "[durable] keep)",
    )
    sub.add_argument(
        "--end",
        action="store_true",
        help="with --durable: end the durable subscription (unsubscribe) and exit",
    )
    sub.add_argument(
        "--since",
        metavar="TIME",
        help="first print the retained notifications published since TIME, then live ones: "
        "'all', a duration ago (90s, 10m, 2h, 1d) or an ISO 8601 time (2026-11-27T10:00Z)",
    )
    sub.add_argument(
        "--until",
        metavar="TIME",
        help="with --since: only those published before TIME, then exit (a historic "
        "subscription); same forms as --since, and 'now'",
    )
    sub.set_defaults(func=cmd_sub)


def _pub(pub: argparse.ArgumentParser) -> None:
    pub.description = (
        "Publish each PUBLICATION argument, or each line of "
        "standard input when none is given (PADRES syntax)."
    )
    _client_options(pub)
    pub.add_argument(
        "publications",
        nargs="*",
        metavar="PUBLICATION",
        help="e.g. \"[class,'STOCK'],[symbol,'MSFT'],[close,27.9]\"",
    )
    pub.set_defaults(func=cmd_pub)


def _client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--broker",
        required=True,
        metavar="ID",
        help="broker to attach to (the others of the overlay, its cluster first, if it fails)",
    )
    p.add_argument("--name", help="client name (default: a unique one)")
    add_overlay_options(p)


PARSERS = {"sub": _sub, "pub": _pub}
"""Each command of this module → what adds its description and arguments."""


def configure(command: str, parser: argparse.ArgumentParser) -> None:
    """Give ``command``'s parser its description and arguments."""
    PARSERS[command](parser)


def _endpoint(args: argparse.Namespace) -> tuple[list[str], Any]:
    """The client endpoint of ``--broker`` followed by those it fails over to, and the
    keys to reach them (:func:`octopis.client.locate`)."""
    from octopis.client import locate

    where = {"run_dir": args.run_dir} if args.topology is None else {"topology": args.topology}
    return locate(args.broker, keys=keys_of(args), **where)


def cmd_sub(args: argparse.Namespace) -> int:
    """``octopis sub``: a JSON line per notification; a historic, hybrid or durable
    subscription's ``subscribed`` line (or, with ``--until``, its last line) carries its
    ``history``: whether the answer from the past is complete, and what is missing."""
    import asyncio
    import dataclasses

    from octopis.client import Subscriber
    from octopis.client.composite import CompositeNotification
    from octopis.client.replay import parse_time
    from octopis.client.streams import EndOfHistory
    from octopis.filters.composite import Composite, as_filter

    subscription = as_filter(args.filter)
    if isinstance(subscription, Composite) and (args.durable or args.since or args.until):
        raise UsageError("a composite subscription is live only: no --durable, --since, --until")
    if args.until is not None and args.since is None:
        raise UsageError("--until needs --since: the window of the past is [since, until)")
    if args.durable is not None and args.since is not None:
        raise UsageError("--durable starts where it left off: leave out --since")
    if args.end and args.durable is None:
        raise UsageError("--end ends a durable subscription: give its --durable NAME")
    try:
        since = parse_time(args.since) if args.since is not None else None
        until = parse_time(args.until) if args.until is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    endpoint, keys = _endpoint(args)
    name = args.name or args.durable or f"sub-{time.time_ns()}"

    def line(n: Any) -> str:
        if isinstance(n, CompositeNotification):
            return json.dumps(
                {
                    "composite": [
                        {"publisher": r.publisher, "seq": r.seq, "publication": r.publication}
                        for r in n.parts
                    ],
                    "roles": [list(roles) for roles in n.roles],
                    **({"dropped": n.dropped} if n.dropped else {}),
                }
            )
        return json.dumps(
            {
                "publisher": n.publisher,
                "seq": n.seq,
                "delay": n.received_at - n.published_at,
                "publication": n.publication,
                **({"replayed": True} if n.replayed else {}),
            }
        )

    async def go() -> None:
        sub = await Subscriber.connect(endpoint, name, keys=keys)
        stream = await sub.subscribe(subscription, durable=args.durable, since=since, until=until)
        history = dataclasses.asdict(stream.history) if stream.history is not None else None
        head = {"subscribed": stream.sub_id, **({"history": history} if history else {})}
        if args.end:
            await sub.unsubscribe(stream)
            print(json.dumps({**head, "ended": args.durable}), flush=True)
            await sub.close()
            return
        print(json.dumps(head), flush=True)
        seen = 0
        try:
            while args.count is None or seen < args.count:
                try:
                    n = await stream.get(args.timeout)
                except (TimeoutError, EndOfHistory):
                    break
                seen += 1
                print(line(n), flush=True)
        finally:
            if args.durable is None and until is None:
                await sub.unsubscribe(stream)
            await sub.close()

    asyncio.run(go())
    return 0


def cmd_pub(args: argparse.Namespace) -> int:
    """``octopis pub``."""
    import asyncio

    from octopis.client import Publisher
    from octopis.filters.language import parse_publication

    lines = args.publications or [line for line in sys.stdin if line.strip()]
    publications = [parse_publication(line) for line in lines]
    endpoint, keys = _endpoint(args)

    async def go() -> None:
        pub = await Publisher.connect(endpoint, args.name or f"pub-{time.time_ns()}", keys=keys)
        try:
            for publication in publications:
                seq = await pub.publish(publication)
                print(json.dumps({"published": seq}), flush=True)
        finally:
            await pub.close()

    asyncio.run(go())
    return 0
