"""The exceptions that mean bad user input (exit status 2 with a one-line message)."""

from octopis.client import BrokerError
from octopis.filters import FilterError
from octopis.topology import TopologyError
from octopis.transport.settings import ConfigError
from octopis.workload import WorkloadError


class UsageError(ValueError):
    """A command-line option combination or value that cannot work."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    FilterError,
    TopologyError,
    WorkloadError,
    UsageError,
    ConfigError,
    BrokerError,
)
