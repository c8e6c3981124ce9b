"""The filter languages, one module per job: :mod:`~octopis.filters.limits` (the sizes
accepted), :mod:`~octopis.filters.language` (PADRES subscriptions and publications),
:mod:`~octopis.filters.composite` (composite subscriptions) and
:mod:`~octopis.filters.covering` (covering and intersection)."""
