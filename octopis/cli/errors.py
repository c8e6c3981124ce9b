"""The exceptions that mean bad user input (exit status 2 with a one-line message) or a
failed run (status 1), looked up among the modules a command has imported: an exception
of a module never imported cannot have been raised, and a command imports only what it
uses."""

from __future__ import annotations

import sys


class UsageError(ValueError):
    """A command-line option combination or value that cannot work."""


USER_ERRORS: dict[str, tuple[str, ...]] = {
    "octopis.filters.language": ("FilterError",),
    "octopis.topology": ("TopologyError",),
    "octopis.workload": ("WorkloadError",),
    "octopis.settings": ("ConfigError",),
    "octopis.client.errors": ("BrokerError",),
    "octopis.overlay": ("OverlayError",),
    "octopis.keys": ("KeysError",),
}
"""Module → its exceptions that mean bad user input."""
FAILURES: dict[str, tuple[str, ...]] = {
    "octopis.cluster.launcher": ("ClusterError",),
    "octopis.balance.observe": ("BalanceError",),
    "octopis.client.errors": ("ConnectError",),
}
"""Module → its exceptions that mean the run itself failed (a broker died or does not
answer)."""


def loaded(table: dict[str, tuple[str, ...]]) -> tuple[type[BaseException], ...]:
    """The exception classes of ``table`` whose modules are imported."""
    return tuple(
        getattr(sys.modules[module], name)
        for module, names in table.items()
        if module in sys.modules
        for name in names
    )


def user_errors() -> tuple[type[BaseException], ...]:
    """The bad-input exceptions a command run so far may have raised."""
    return (UsageError, *loaded(USER_ERRORS))


def failures() -> tuple[type[BaseException], ...]:
    """The failed-run exceptions a command run so far may have raised."""
    return loaded(FAILURES)
