"""Hypothesis profiles for the routing laws, and the suite's one thoroughness knob.

Two profiles: ``dev`` (the default: the quick tier and a developer's runs) and ``ci``
(what ``.ci/run`` sets: the full suite). Pick one with ``HYPOTHESIS_PROFILE``. Every size
of a test that is a matter of thoroughness — examples drawn, seeds swept, failures
sampled, workload sizes — is written ``sized(quick, thorough)``: ``dev`` runs the quick
size, ``ci`` the thorough one. Nothing else in the suite reads the profile, so
``grep -n 'sized(' tests/`` lists everything the quick tier does less of."""

from __future__ import annotations

import os
from typing import TypeVar

import networkx as nx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from octopis.topology import Scot, build_scot

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
THOROUGH = PROFILE == "ci"
"""Whether this run is the full suite's (``ci``): the thorough sizes."""

T = TypeVar("T")


def sized(quick: T, thorough: T) -> T:
    """A thoroughness knob: ``thorough`` under the ``ci`` profile, ``quick`` otherwise."""
    return thorough if THOROUGH else quick


settings.register_profile(
    "dev", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile(PROFILE)

MAX_REGIONS, MAX_CLUSTERS = sized((7, 4), (20, 6))
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
