"""``octopis``'s one grammar: every command that acts on a running overlay takes the same
``--run-dir`` or ``--topology``/``--keys``/``--insecure`` with the same meaning; help that
names no issue; ``--version``; a command imports only what it uses; errors that say
what to do next; shell completion; and the commands one after another on an overlay
``octopis up`` started in a run directory of its own."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import networkx as nx
import psutil
import pytest

from octopis import __version__
from octopis.cli.main import COMMANDS, build_parser, chosen_command, main
from octopis.cluster.launcher import find_free_base_port, stop_pids
from octopis.overlay import STATE_FILE
from octopis.topology import build_preset, build_scot, complete_factor

OVERLAY_OPTIONS = {"--run-dir": "DIR", "--topology": "FILE", "--keys": "DIR", "--insecure": None}
OCTOPIS = [sys.executable, "-m", "octopis.cli.main"]
STARTS_NO_OVERLAY = {"sim", "nemesis", "run", "up"}
"""Commands that do not act on a running overlay (``up`` and ``run`` start one; ``sim`` and
``nemesis`` run the simulator)."""


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator:
    """``(command words, parser)`` of every command that runs (``balance plan``, ...)."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
        return
    for name, sub in subparsers[0].choices.items():
        yield from _leaves(sub, (*path, name))


def _help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_every_command_on_a_running_overlay_takes_the_same_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its --help (as `octopis X --help` builds it) lists --run-dir, --topology, --keys and
    --insecure; the options are the same objects' copies everywhere: same metavar, default
    and help."""
    leaves = dict(_leaves(build_parser()))
    on_overlay = [words for words in leaves if words[0] not in STARTS_NO_OVERLAY]
    assert {w[0] for w in on_overlay} == set(COMMANDS) - STARTS_NO_OVERLAY
    assert len(on_overlay) == 12  # down status restart monitor sub pub, 2 balance, 4 scale
    seen: dict[str, set[tuple]] = {option: set() for option in OVERLAY_OPTIONS}
    for words in on_overlay:
        text = _help(capsys, list(words))
        for option, metavar in OVERLAY_OPTIONS.items():
            listed = f"{option} {metavar}" if metavar else option
            assert listed in text, (words, option)
        for action in leaves[words]._actions:
            for option in set(action.option_strings) & set(OVERLAY_OPTIONS):
                seen[option].add((action.metavar, action.default, action.help))
    assert all(len(kinds) <= 2 for kinds in seen.values())  # the monitor notes keys unused
    assert len(seen["--run-dir"]) == len(seen["--topology"]) == 1
    assert "--run-dir DIR" in _help(capsys, ["up", "t.json"])


def test_help_names_no_issue_and_octopis_tells_its_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    texts = [parser.format_help()] + [p.format_help() for _, p in _leaves(parser)]
    for text in texts:
        assert not re.search(r"\bissues? *#?\d|#\d+", text, re.IGNORECASE), text
    assert 'eval "$(register-python-argcomplete octopis)"' in " ".join(texts[0].split())
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"octopis {__version__}"


def test_every_option_of_every_command_says_what_it_does() -> None:
    """Each ``add_argument`` of the commands (``octopis``, ``octopis-broker``,
    ``octopis-topology``), the benchmarks and the Spark jobs has a ``help``: ``--help``
    explains every option, not only some."""
    root = Path(__file__).resolve().parent.parent
    files = [
        *sorted((root / "octopis/cli").glob("*.py")),
        *sorted((root / "bench").glob("*.py")),
        *sorted((root / "spark_workloads").glob("*.py")),
    ]
    silent = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
                and not any(k.arg == "help" for k in node.keywords)
            ):
                silent.append(f"{path.relative_to(root)}:{node.lineno}")
    assert len(files) > 30 and not silent, silent


@pytest.mark.parametrize("argv", [["status", "--help"], ["sub", "--help"], ["--help"]])
def test_a_command_imports_only_what_it_uses(argv: list[str]) -> None:
    """Asking a command for its help loads neither the SDK, the simulator, ZeroMQ, asyncio
    nor the graph and table libraries (the measured start-up is in bench/RESULTS.md)."""
    code = (
        "import json, sys\n"
        "from octopis.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(done.stderr))
    heavy = {"networkx", "pyarrow", "zmq", "asyncio", "aiozmq", "psutil", "msgspec"}
    assert not {m.split(".")[0] for m in loaded} & heavy
    assert not {m for m in loaded if m.startswith(("octopis.client", "octopis.sim"))}
    assert "octopis.topology" not in loaded
    assert argv[0] == "--help" or f"usage: octopis {argv[0]}" in done.stdout


def test_the_command_word_is_found_past_global_options() -> None:
    assert chosen_command(["--log-level", "DEBUG", "status", "--help"]) == "status"
    assert chosen_command(["--log-format=json", "sub", "x"]) == "sub"
    assert chosen_command(["--help"]) is None
    assert chosen_command(["stat"]) is None


def test_errors_say_what_to_do_next(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No overlay where one is looked for, a broker the topology lacks, keys given with a
    run directory, a command that needs what `octopis up` recorded given a topology:
    each is one line, exit status 2, naming the way on. Nothing is started."""
    topology = tmp_path / "fig2.json"
    topology.write_text(json.dumps(build_preset("fig2").to_json()))
    nowhere = tmp_path / "nowhere"
    for argv, message in (
        (["status", "--run-dir", str(nowhere)], f"no overlay in {nowhere}: start one with "),
        (["down", "--run-dir", str(nowhere)], f"`octopis up TOPOLOGY.json --run-dir {nowhere}`"),
        (["pub", "--run-dir", str(nowhere), "--broker", "a:0", "[x,1]"], "no overlay in"),
        (
            ["sub", "--topology", str(topology), "--broker", "zz:9", "[x,>,1.0]"],
            "topology fig2 has no broker 'zz:9'; it has a:0, b:0,",
        ),
        (
            ["status", "--keys", str(tmp_path)],
            "--keys and --insecure go with --topology",
        ),
        (["restart", "a:0", "--topology", str(topology)], "name the overlay by --run-dir DIR"),
        (["scale", "add-cluster", "--topology", str(topology)], "by --run-dir DIR"),
        (["monitor", "--topology", str(tmp_path / "none.json")], "no topology file"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("octopis: error: ") and message in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("line", "offered"),
    [
        ("octopis sta", "status"),
        ("octopis status --ru", "--run-dir"),
        ("octopis --log-level INFO sub --broker a:0 --top", "--topology"),
        ("octopis balance pl", "plan"),
    ],
)
def test_shell_completion_offers_commands_and_their_options(
    tmp_path: Path, line: str, offered: str
) -> None:
    out = tmp_path / "completions"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    code = "from octopis.cli.main import main; main()"
    subprocess.run([sys.executable, "-c", code], env=env, timeout=60, check=True)
    assert offered in [word.strip() for word in out.read_text().split("\013")]


def _octopis(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*OCTOPIS, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _status(run_dir: Path) -> dict:
    done = _octopis("status", "--run-dir", str(run_dir), "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _until(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_every_command_works_on_an_overlay_in_a_run_directory_of_its_own(tmp_path: Path) -> None:
    """`octopis up t.json --run-dir X` (2 regions × 2 clusters, keys on), then `sub`, `pub`,
    `status`, `restart`, `balance plan`, `scale add-cluster`, `monitor` and `down`, each
    with `--run-dir X`: the subscriber gets the publication, the restarted broker is
    ready, the overlay grows to 6 brokers, the monitor draws them, and down forgets them.
    `status` and `down` also take the overlay by --topology and --keys: down then asks
    every broker to stop over its control RPC, and they do."""
    scot = build_scot(
        nx.path_graph(["a", "b"]), complete_factor(2), name="pair", base_port=find_free_base_port(6)
    )
    topology = tmp_path / "t.json"
    topology.write_text(json.dumps(scot.to_json()))
    run_dir = tmp_path / "X"
    x = ["--run-dir", str(run_dir)]
    up = _octopis("up", str(topology), *x, "--mode", "snr")
    assert up.returncode == 0, up.stderr
    sub = subprocess.Popen(
        [*OCTOPIS, "sub", *x, "--broker", "b:1", "[class,eq,'STOCK']", "--count", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "subscribed" in json.loads(sub.stdout.readline())
        _until(lambda: _status(run_dir)["a:0"]["routing_table_size"] == 1, "the broadcast", 60)
        pub = _octopis("pub", *x, "--broker", "a:0", "[class,'STOCK'],[close,27.9]")
        assert pub.returncode == 0 and json.loads(pub.stdout) == {"published": 1}, pub.stderr
        got = json.loads(sub.stdout.readline())
        assert got["seq"] == 1 and got["publication"] == {"class": "STOCK", "close": 27.9}
        assert sub.wait(timeout=30) == 0, sub.stderr.read()

        keys = ["--topology", str(topology), "--keys", str(run_dir / "keys")]
        by_file = _octopis("status", *keys, "--broker", "b:0")
        assert by_file.returncode == 0 and "b:0" in by_file.stdout, by_file.stderr
        restart = _octopis("restart", "b:0", *x)
        assert restart.returncode == 0 and "b:0 restarted" in restart.stdout, restart.stderr
        plan = _octopis("balance", "plan", *x)
        assert plan.returncode == 0 and "plan ldm: 0 moves" in plan.stdout, plan.stderr
        grown = _octopis("scale", "add-cluster", *x)
        assert grown.returncode == 0 and "added a:2, b:2" in grown.stdout, grown.stderr
        assert len(_status(run_dir)) == 6

        port = find_free_base_port(1)
        monitor = subprocess.Popen(
            [*OCTOPIS, "monitor", *x, "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            drawn: list[dict] = []

            def draws() -> bool:
                try:
                    with urllib.request.urlopen(f"{url}/topology", timeout=2) as answer:
                        drawn.append(json.loads(answer.read()))
                except OSError:
                    return False
                return True

            _until(draws, "the monitor", 60)
            assert len(drawn[-1]["brokers"]) == 6
        finally:
            monitor.terminate()
            monitor.wait(timeout=30)

        state = json.loads((run_dir / STATE_FILE).read_text())
        grown_keys = ["--topology", state["topology"], "--keys", str(run_dir / "keys")]
        asked = _octopis("down", *grown_keys)
        assert asked.returncode == 0, asked.stderr
        assert "asked 6 brokers of pair to stop: 6 will" in asked.stdout
        _until(lambda: not any(map(_alive, state["pids"].values())), "the brokers' exit", 60)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
        down = _octopis("down", *x)
        if (run_dir / STATE_FILE).exists():  # down failed: stop what it would have
            stop_pids(json.loads((run_dir / STATE_FILE).read_text())["pids"])
    assert down.returncode == 0 and "stopped 6 brokers" in down.stdout, down.stderr
    assert not (run_dir / STATE_FILE).exists()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
