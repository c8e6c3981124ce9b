"""``octopis-broker``: run one SCOT node as a broker process."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from octopis.cli import LOG_FORMATS, run_cli
from octopis.core import MODES
from octopis.gateway.credentials import CredentialsError
from octopis.keys import Keys, KeysError
from octopis.settings import BrokerSettings, ConfigError, load_settings
from octopis.topology import Scot, TopologyError, load_topology
from octopis.transport.retention import RetentionError

if TYPE_CHECKING:
    from octopis.transport.broker import Gateway


class UnknownBroker(ValueError):
    """The ``--id`` names no broker of the topology."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``octopis-broker``."""
    p = argparse.ArgumentParser(
        prog="octopis-broker",
        description="Run one OctopiS broker: binds its endpoints from the topology file, "
        "connects to its neighbours only, routes with snr, dnr or bid, serves clients and a "
        "control RPC. Stops cleanly on SIGTERM/SIGINT. Exit status 2 on bad input.",
    )
    p.add_argument(
        "--topology",
        required=True,
        type=Path,
        metavar="FILE",
        help="topology JSON from `octopis-topology build`",
    )
    p.add_argument("--id", required=True, metavar="ID", help="this broker's id, e.g. vi:0")
    p.add_argument("--mode", default="snr", choices=MODES, help="routing mode (default snr)")
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="settings TOML: [lst] window, queue_threshold, order (ce or bluedove); "
        "[links] sndhwm, "
        "capacity, capacities; [clients] sndhwm",
    )
    security = p.add_mutually_exclusive_group(required=True)
    security.add_argument(
        "--keys",
        type=Path,
        metavar="DIR",
        help="keys directory (`octopis-topology keys`, or <run-dir>/keys of `octopis up`): "
        "CurveZMQ on every socket; peers need a broker key of the topology, clients an "
        "allowed client key, the control RPC the admin key",
    )
    security.add_argument(
        "--insecure",
        action="store_true",
        help="no authentication or encryption: anyone who reaches the ports may publish, "
        "subscribe and shut the broker down (said at start)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="where the broker keeps what its own publishers published, for replay to "
        "subscribers that failed over or were away (<DIR>/<id>.retention.sqlite, bounded "
        "by [retention] max_bytes and max_age); without it retention is off and a replay "
        "reports this broker's part as a gap",
    )
    p.add_argument(
        "--stomp",
        action="store_true",
        help="also serve STOMP clients (TCP and WebSocket) on the broker's stomp endpoints of "
        "the topology; with --keys, CONNECT needs a login of <keys>/stomp-credentials.json "
        "(`octopis-topology stomp-user`)",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging verbosity (default INFO)",
    )
    p.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text lines, or one JSON object per line (time, level, broker, logger, message)",
    )
    p.set_defaults(func=cmd_broker)
    return p


def cmd_broker(args: argparse.Namespace) -> int:
    """Validate the inputs, then serve until stopped."""
    from octopis.transport.serving import BrokerFailure

    scot = load_topology(args.topology)
    if args.id not in scot.brokers:
        raise UnknownBroker(f"topology {scot.name} has no broker {args.id!r}")
    settings = load_settings(args.config)
    keys = None if args.insecure else Keys(args.keys)
    gateway = None
    if args.stomp:
        from octopis.gateway import stomp_gateway

        gateway = stomp_gateway(scot.brokers[args.id], None if args.insecure else args.keys)
    try:
        asyncio.run(run_broker(scot, args.id, args.mode, settings, keys, args.data_dir, gateway))
    except zmq.ZMQError as exc:
        logging.getLogger("octopis.broker").error("cannot serve %s: %s", args.id, exc)
        return 1
    except BrokerFailure:
        return 1  # already logged with its traceback
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``octopis-broker``."""
    return run_cli(
        build_parser(),
        argv,
        errors=(
            TopologyError,
            ConfigError,
            UnknownBroker,
            KeysError,
            RetentionError,
            CredentialsError,
        ),
    )


async def run_broker(
    scot: Scot,
    broker_id: str,
    mode: str,
    settings: BrokerSettings,
    keys: Keys | None,
    data_dir: Path | None = None,
    gateway: Gateway | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT or an RPC ``shutdown``; ``keys`` None runs insecure.
    The cyclic collector passes over the young generation every ``memory.gc_young``
    allocations, and what exists once the broker is built (modules, topology) is frozen
    out of its passes."""
    from octopis.transport.broker import Broker
    from octopis.transport.serving import serve

    gc.set_threshold(settings.memory.gc_young, *gc.get_threshold()[1:])
    broker = Broker(scot, broker_id, mode, settings, keys, data_dir)
    gc.freeze()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, broker.stop)
    await serve(broker, gateway)


if __name__ == "__main__":
    sys.exit(main())
