"""The simulator laws' scenarios (random SCOTs, subscriptions, publications and a seed), the
laws' simulation of one, its exactly-once check, and a drawn topology change: shared by
tests/test_sim*.py and tests/test_covering_laws.py; and fig2 settled with forty
subscriptions, which tests/test_node*.py drive."""

from __future__ import annotations

import random

from hypothesis import strategies as st
from laws import scots

from octopis.filters.language import Predicate, Subscription
from octopis.matching import ReferenceMatcher
from octopis.sim import LatencyModel, Simulator
from octopis.topology import Scot, build_preset

predicates = st.one_of(
    st.builds(
        Predicate,
        st.just("x"),
        st.sampled_from(["<", ">", "=", "<>", "<=", ">="]),
        st.integers(0, 9),
    ),
    st.builds(
        Predicate, st.just("sym"), st.sampled_from(["eq", "neq"]), st.sampled_from(["A", "B", "C"])
    ),
)
subscriptions = st.builds(
    lambda ps: Subscription(tuple(ps)), st.lists(predicates, min_size=1, max_size=2)
)
publications = st.fixed_dictionaries(
    {"x": st.integers(0, 9), "sym": st.sampled_from(["A", "B", "C"])}
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Scot, list, list, int]:
    scot = draw(scots())
    brokers = st.sampled_from(sorted(scot.brokers))
    subs = draw(st.lists(st.tuples(brokers, subscriptions), min_size=1, max_size=8))
    pubs = draw(st.lists(st.tuples(brokers, publications), min_size=1, max_size=8))
    return scot, subs, pubs, draw(st.integers(0, 2**16))


JITTERY = LatencyModel(0.001, 0.004)
"""The laws' latencies: jitter large against the base, so paths race."""


def simulate(
    scot: Scot,
    mode: str,
    subs: list,
    pubs: list,
    seed: int,
    latency: LatencyModel = JITTERY,
    **kwargs,
) -> Simulator:
    """The paper's SBP (covering off, unless ``kwargs`` say otherwise): these laws count
    its messages and entries."""
    kwargs.setdefault("covering", "off")
    sim = Simulator(
        scot, mode, seed=seed, latency=latency, oracle_factory=ReferenceMatcher, **kwargs
    )
    for i, (broker, subscription) in enumerate(subs):
        sim.subscribe(f"S{i}", broker, subscription)
    sim.run()
    for broker, publication in pubs:
        sim.publish(f"P{broker}", broker, publication)
    sim.run()
    fired = {key for core in sim.cores.values() for key, n in core.stats.items() if n}
    assert not {key for key in fired if key.split(".")[0] in FAILURE_MACHINERY}
    return sim


FAILURE_MACHINERY = ("tunnel", "dedup", "custody", "undeliverable", "dnr_detour")
"""Stats that only failures may move: without one, tunnels and dedup never fire."""


def exactly_once(report: dict) -> None:
    assert "failures" not in report
    assert report["duplicates"] == 0
    assert report["lost"] == 0
    assert report["unexpected"] == 0
    assert report["delivered"] == report["expected_deliveries"]


def changed_scot(scot: Scot, data: st.DataObject) -> tuple[str, Scot, str]:
    """A change valid for ``scot`` (drawn), the new version, and for a removal the broker
    each leaving one's subscribers go to ('' for additions)."""
    from octopis.topology_change import add_cluster, add_region, remove_cluster, remove_region

    kinds = ["add-cluster", "add-region"]
    if scot.clusters > 1:
        kinds.append("remove-cluster")
    leaves = sorted(x for x in scot.acyclic if scot.acyclic.degree(x) == 1)
    if leaves:
        kinds.append("remove-region")
    kind = data.draw(st.sampled_from(kinds))
    if kind == "add-cluster":
        return kind, add_cluster(scot), ""
    if kind == "add-region":
        return kind, add_region(scot, "new", data.draw(st.sampled_from(scot.regions))), ""
    if kind == "remove-cluster":
        return kind, remove_cluster(scot, scot.clusters - 1), "cluster 0"
    leaf = data.draw(st.sampled_from(leaves))
    return kind, remove_region(scot, leaf), next(iter(scot.acyclic[leaf]))


def fig2_settled(mode: str, seed: int = 3) -> Simulator:
    """fig2 in ``mode`` (covering off) with forty subscribers of ``[x,<,9]`` at brokers
    drawn with ``seed``, run until their subscriptions have spread."""
    scot = build_preset("fig2")
    sim = Simulator(
        scot,
        mode,
        seed=seed,
        latency=LatencyModel(0.001, 0.002),
        oracle_factory=ReferenceMatcher,
        covering="off",
    )
    rng = random.Random(seed)
    for i in range(40):
        sim.subscribe(
            f"S{i}", rng.choice(sorted(scot.brokers)), Subscription((Predicate("x", "<", 9),))
        )
    sim.run()
    return sim
