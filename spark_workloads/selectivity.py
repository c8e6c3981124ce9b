"""Measuring subscription selectivity with Spark, in the JVM, over a whole publication set.

A subscription's selectivity is the fraction of the publications it matches (paper §7.1:
2%). Subscriptions are grouped by *signature*, the sequence of their (attribute, operator)
pairs; a signature's subscriptions differ only in their constants. Each group becomes a
small table (one row per subscription, one column per constant) joined with the
publications on the conjunction of the predicates written as Spark column expressions; the
matches of all groups are counted per subscription in one aggregation. Equality predicates
(``eq``, ``=``) become join keys, so ``[symbol,eq,'MSFT'],[close,<,27.5]`` is a hash join
on the symbol; the rest are evaluated pair by pair in generated JVM code. No Python runs
per publication.

The semantics are those of :meth:`octopis.filters.Subscription.matches`: every predicate
must hold; a predicate on an attribute the publications lack, a numeric operator on a string
attribute and a string operator on a numeric one never hold; ``isPresent`` always holds for
the attributes the publications carry (none is null).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from octopis.filters import IS_PRESENT, STRING_OPERATORS, Subscription

_COMPARE: Mapping[str, Callable[[Column, Column], Column]] = {
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "neq": lambda a, b: a != b,
    "str-lt": lambda a, b: a < b,
    "str-le": lambda a, b: a <= b,
    "str-gt": lambda a, b: a > b,
    "str-ge": lambda a, b: a >= b,
    "str-prefix": lambda a, b: a.startswith(b),
    "str-postfix": lambda a, b: a.endswith(b),
    "str-contains": lambda a, b: a.contains(b),
}


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
    spark = publications.sparkSession
    columns = {f.name: (f"a{i}", pa.types.is_string(f.type)) for i, f in enumerate(attributes)}
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for sid, subscription in enumerate(subscriptions):
        signature = tuple((p.attr, p.op) for p in subscription.predicates)
        groups.setdefault(signature, []).append(sid)
    matched: list[DataFrame] = []
    for signature, sids in groups.items():
        condition: Column | None = F.lit(True)
        constants: dict[str, pa.Array] = {"sid": pa.array(sids, pa.int64())}
        for k, (attr, op) in enumerate(signature):
            if op == IS_PRESENT:
                if attr not in columns:
                    condition = None
                    break
                continue
            name, is_string = columns.get(attr, (None, False))
            if name is None or (op in STRING_OPERATORS) != is_string:
                condition = None
                break
            values = [subscriptions[s].predicates[k].value for s in sids]
            kind = pa.string() if op in STRING_OPERATORS else pa.float64()
            constants[f"k{k}"] = pa.array(values, kind)
            condition = condition & _COMPARE[op](F.col(name), F.col(f"k{k}"))
        if condition is None:
            continue
        table = spark.createDataFrame(pa.table(constants))
        matched.append(publications.join(F.broadcast(table), condition).select("sid"))
    counts = np.zeros(len(subscriptions), dtype=np.int64)
    if matched:
        union = matched[0]
        for frame in matched[1:]:
            union = union.unionAll(frame)
        for row in union.groupBy("sid").count().collect():
            counts[row["sid"]] = row["count"]
    return counts
