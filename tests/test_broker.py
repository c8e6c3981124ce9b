"""The broker object in-process (octopis.transport.broker): what happens when one of its
serving loops fails. Process-level behaviour is in tests/test_cluster.py."""

from __future__ import annotations

import asyncio

import pytest

from octopis.cluster.launcher import find_free_base_port
from octopis.topology import build_preset
from octopis.transport.broker import Broker, BrokerFailure
from octopis.transport.settings import BrokerSettings


def test_a_failed_serving_loop_shuts_the_broker_down_with_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    broker = Broker(scot, "b:0", "dnr", BrokerSettings(), keys=None)

    async def broken_tick_loop() -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("LST sampling broke")

    monkeypatch.setattr(broker, "_tick_loop", broken_tick_loop)
    with pytest.raises(BrokerFailure, match="task 'lst' ended: RuntimeError"):
        asyncio.run(asyncio.wait_for(broker.serve(), timeout=30))
    assert "LST sampling broke" in caplog.text
