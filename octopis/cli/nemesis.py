"""``octopis nemesis``: seeded faults on the brokers' own nodes in the simulator, checked
(``octopis.nemesis.scenarios``)."""

from __future__ import annotations

import argparse
import json
import sys

from octopis.cli.errors import UsageError


def configure(command: str, p: argparse.ArgumentParser) -> None:
    """Give ``nemesis`` its description and arguments."""
    from octopis.nemesis.scenarios import FAULT_KINDS, PRESETS

    p.description = (
        "Draw a scenario from SEED (topology, routing mode, covering, advertisements, "
        f"subscribers, publications and faults: {', '.join(FAULT_KINDS)}), run it on the "
        "brokers' own nodes in the simulator and check the whole history: every subscriber "
        "gets each publication it asked for exactly once, or the loss is counted with its "
        "reason or reported to it as a gap; each publication confirmed to its publisher "
        "stays in its broker's store unless the store names the loss and why. The same "
        "seed replays the same run exactly. "
        "Exit status 1 when a seed fails; with --shrink the shortest failing history is "
        "printed."
    )
    p.add_argument("seed", type=int, help="the seed to run (the first one with --seeds)")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="run N seeds from SEED on and tabulate faults and verdicts (default 1)",
    )
    p.add_argument(
        "--preset",
        action="append",
        choices=PRESETS,
        help="topologies to draw from (repeat; default fig2)",
    )
    p.add_argument(
        "--max-faults", type=int, default=3, metavar="K", help="faults per run, 1 to K (default 3)"
    )
    p.add_argument(
        "--shrink",
        action="store_true",
        help="for a failing seed, drop faults, subscribers and publications while it still fails",
    )
    p.add_argument("--json", action="store_true", help="print the verdict or table as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run one seed (history, counts, problems) or a sweep (table); 1 if any failed."""
    from octopis.nemesis.scenarios import draw, shrink, sweep
    from octopis.nemesis.scenarios import run as run_scenario

    if args.seeds < 1 or args.max_faults < 1:
        raise UsageError("--seeds and --max-faults must be at least 1")
    presets = tuple(args.preset or ("fig2",))
    if args.seeds > 1:
        table = sweep(
            range(args.seed, args.seed + args.seeds), presets=presets, max_faults=args.max_faults
        )
        if args.json:
            print(json.dumps(table))
        else:
            faults = ", ".join(f"{k} {n}" for k, n in table["faults"].items())
            print(f"{table['runs']} seeds, {table['passed']} passed; faults injected: {faults}")
            print(
                f"expected {table['expected']}, delivered {table['delivered']}, duplicated "
                f"{table['duplicated']}, lost {table['lost']} (of them silent "
                f"{table['silent']}), refused {table['refused']}, subscribers with a "
                f"reported gap {table['gaps']}"
            )
            stores = table["stores"]
            print(
                f"stores: confirmed {stores.get('confirmed', 0)}, refused "
                f"{stores.get('refused', 0)}, lost (named) {stores.get('store_lost', 0)}"
            )
            if table["failing"]:
                print(f"failing seeds: {' '.join(map(str, table['failing'][:50]))}")
        return 1 if table["failing"] else 0
    scenario = draw(args.seed, presets=presets, max_faults=args.max_faults)
    verdict = run_scenario(scenario)
    shrunk = shrink(scenario) if args.shrink and not verdict.passed else None
    if args.json:
        out = {
            k: getattr(verdict, k)
            for k in ("expected", "delivered", "duplicated", "lost", "silent", "gaps", "refused",
                      "stores", "losses", "problems")
        }  # fmt: skip
        out |= {"seed": args.seed, "passed": verdict.passed, "history": scenario.describe()}
        if shrunk is not None:
            out["shrunk"] = shrunk.describe()
        print(json.dumps(out))
    else:
        print(scenario.describe())
        print(
            f"{'PASS' if verdict.passed else 'FAIL'}  expected {verdict.expected}, delivered "
            f"{verdict.delivered}, duplicated {verdict.duplicated}, lost {verdict.lost} "
            f"(silent {verdict.silent}), refused {verdict.refused}, gaps reported {verdict.gaps}"
        )
        for loss in verdict.losses:
            print(f"  store loss: {loss}")
        for problem in verdict.problems:
            print(f"  problem: {problem}", file=sys.stderr)
        if shrunk is not None:
            print("shortest failing history:")
            print(shrunk.describe())
    return 0 if verdict.passed else 1
