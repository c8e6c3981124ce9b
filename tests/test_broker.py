"""The broker object in-process (octopis.transport.broker): what happens when one of its
serving loops fails; the log formats of a broker process. Process-level routing is in
tests/test_cluster.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from octopis.cluster.launcher import broker_command, find_free_base_port
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


def test_the_brokers_lst_orders_as_its_settings_say(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``[lst] order = "bluedove"`` reaches the LST DNR routes with (and its stats rows)."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    broker = Broker(scot, "b:0", "dnr", BrokerSettings(order="bluedove"), keys=None)

    async def report_the_order() -> None:
        rows = broker.lst.snapshot().values()
        assert rows and all("processing_time" in row for row in rows)
        raise RuntimeError(f"LST order {broker.lst.order}")

    monkeypatch.setattr(broker, "_tick_loop", report_the_order)
    with pytest.raises(BrokerFailure, match="task 'lst' ended: RuntimeError"):
        asyncio.run(asyncio.wait_for(broker.serve(), timeout=30))
    assert "LST order bluedove" in caplog.text


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_broker_logs_name_the_broker_and_component(tmp_path: Path, log_format: str) -> None:
    """``octopis-broker --log-format json`` writes one JSON object per line (time, level,
    broker, logger, message); text lines carry the same broker id and logger."""
    scot = build_preset("fig2", base_port=find_free_base_port(18))
    path = tmp_path / "fig2.json"
    path.write_text(json.dumps(scot.to_json()))
    command = broker_command(path, "b:0", "dnr", log_level="INFO", log_format=log_format)
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if "serving" in line:
                break
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert process.returncode == 0 and lines and "serving" in lines[-1], lines
    if log_format == "json":
        entries = [json.loads(line) for line in lines]
        assert all(e["broker"] == "b:0" and e["logger"].startswith("octopis") for e in entries)
        assert {"time", "level", "message"} <= entries[-1].keys()
        assert entries[-1]["time"].endswith("Z") and entries[-1]["level"] == "INFO"
    else:
        assert all(" b:0 octopis." in line for line in lines), lines
