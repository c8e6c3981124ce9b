"""In-memory simulator: the routing cores wired by simulated links (DESIGN §2)."""

from octopis.sim.congestion import FreeLinks, InjectedCongestion, LinkModel, TimedLinks
from octopis.sim.engine import Simulator
from octopis.sim.network import LatencyModel

__all__ = [
    "FreeLinks",
    "InjectedCongestion",
    "LatencyModel",
    "LinkModel",
    "Simulator",
    "TimedLinks",
]
