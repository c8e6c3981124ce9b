"""Measuring subscription selectivity with Spark over a whole publication set.

A subscription's selectivity is the fraction of the publications it matches (paper §7.1:
2%). The matching is the brokers' own: each Spark task loads every subscription into the
compiled :class:`octopis.matching.Matcher` once and matches its partition of the
publications (Arrow batches, ``mapInArrow``), so the measured selectivity and the routed
deliveries obey one definition, :meth:`octopis.filters.language.Subscription.matches`. Tasks return
their per-subscription counts, which Spark sums.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from octopis.filters.language import Subscription

_COUNTS = "sid long, matches long"


def publication_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``table`` (one column per attribute, strings or numbers, no nulls) as a DataFrame
    whose columns are named ``a0``, ``a1``, ... (attribute names such as
    ``openClose%Diff`` need no quoting then); :func:`count_matches` maps names back."""
    renamed = table.rename_columns([f"a{i}" for i in range(table.num_columns)])
    return spark.createDataFrame(renamed)


def count_matches(
    publications: DataFrame, attributes: pa.Schema, subscriptions: Sequence[Subscription]
) -> np.ndarray:
    """How many rows of ``publications`` (from :func:`publication_frame` of a table with
    schema ``attributes``) each subscription matches, in the order given."""
    texts = publications.sparkSession.sparkContext.broadcast([s.to_text() for s in subscriptions])
    names = attributes.names

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from octopis.filters.language import parse_subscription
        from octopis.matching import Matcher

        matcher = Matcher()
        for sid, text in enumerate(texts.value):
            matcher.add(sid, parse_subscription(text))
        counts = np.zeros(len(texts.value), dtype=np.int64)
        for batch in batches:
            for keys in matcher.match_many(batch.rename_columns(names).to_pylist()):
                counts[keys] += 1
        sids = np.flatnonzero(counts)
        yield pa.RecordBatch.from_arrays(
            [pa.array(sids, pa.int64()), pa.array(counts[sids], pa.int64())],
            names=["sid", "matches"],
        )

    counts = np.zeros(len(subscriptions), dtype=np.int64)
    try:
        if subscriptions:
            totals = publications.mapInArrow(count, _COUNTS).groupBy("sid").agg(F.sum("matches"))
            for sid, matches in totals.collect():
                counts[sid] = matches
    finally:
        texts.destroy()
    return counts
