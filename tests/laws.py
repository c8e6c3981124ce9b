"""Hypothesis profiles for the routing laws: ``dev`` (default, quick) and ``ci`` (what
``.ci/run`` uses: more examples, larger SCOTs). Pick one with ``HYPOTHESIS_PROFILE``."""

from __future__ import annotations

import os

import networkx as nx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from octopis.topology import Scot, build_scot

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
settings.register_profile(
    "dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile(PROFILE)

MAX_REGIONS, MAX_CLUSTERS = (20, 6) if PROFILE == "ci" else (7, 4)
"""Largest SCOT the strategies draw: regions (tree vertices) × clusters."""


@st.composite
def scots(
    draw: st.DrawFn, max_vertices: int = MAX_REGIONS, max_clusters: int = MAX_CLUSTERS
) -> Scot:
    """A SCOT of a random tree (up to ``max_vertices`` regions) and 2..``max_clusters``."""
    n = draw(st.integers(1, max_vertices))
    tree = nx.Graph()
    tree.add_nodes_from(f"r{i}" for i in range(n))
    for i in range(1, n):
        tree.add_edge(f"r{i}", f"r{draw(st.integers(0, i - 1))}")
    return build_scot(tree, draw(st.integers(2, max_clusters)))
