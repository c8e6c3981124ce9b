"""OctopiS: content-based publish/subscribe on a Structured Cyclic Overlay Topology.

Layers (see DESIGN.md): ``topology`` (SCOT builder), ``filters`` and ``matching``
(subscription language, Cython matcher), ``core`` (sans-IO routing: SBP, SNR, DNR, BID),
``sim`` (in-memory simulator), ``transport`` (ZeroMQ broker process), ``client`` (SDK),
``cluster`` (local launcher, ``octopis run``).
"""

__version__ = "0.1.0"
