"""The ``lamina`` PySpark (4.x) data source: batch and streaming reads straight from a data
directory's RocksDB, and writes through a server (DESIGN.md §6).

    from lamina.tools.spark import register
    register(spark)
    df = (spark.read.format("lamina").option("path", "lamina-data").option("queue", "orders")
          .load())
    df.groupBy("priority").count().show()

    (df.select("body", "attributes").write.format("lamina")
       .option("server", "127.0.0.1:7766").option("queue", "copy").mode("append").save())

Spark's Python workers must run the driver's interpreter: set ``PYSPARK_PYTHON`` (and
``PYSPARK_DRIVER_PYTHON``) to ``sys.executable`` before the session starts.

**Read options**: ``path`` (the data directory, required; executors must see it), ``queue``
(omitted: every queue), ``since`` / ``until`` (production time, ms or ISO-8601: ``since <=
enqueue_time < until``), ``tag`` (adds a ``state`` column: the message's state for that tag, as
``lamina inspect dump --tag`` derives it, evaluated at planning time; null for a queue without
that tag). Streaming adds ``startingOffsets`` (``earliest``, the default, or ``latest``),
``maxMessagesPerTrigger`` (at least 1; default no limit) and ``failOnDataLoss`` (default
true).

**Rows** are the messages the engine retains at planning time: from ``gone_seq`` (raised by
retention as the engine's next operation would) to ``next_seq``; rows below it that wait for
their segment to be reclaimed are not shown (``lamina inspect dump`` shows them). Columns
(``SCHEMA``): ``queue``, ``seq``, ``id``, ``enqueue_time`` (UTC timestamp), ``priority``,
``topic``, ``attributes`` (map<string,string>: text as is, bytes as standard base64, numbers and
booleans as JSON text), ``body`` (text bodies as their UTF-8 bytes), ``md5``, ``segment`` (the
first seq of the message's segment).

**Partitions**: one per segment, its seq range fixed at planning and cut to the time options and
to pushed-down filters; each partition is read on an executor straight from RocksDB through that
process's own read-only instance (``Snapshot``: opened once and reopened only when it cannot
see the whole planned range; DESIGN.md §6 says "secondary", tools/snapshot.py says why not), so
reads run beside a live server and never see past the planned range. A partition always
returns every seq of its range (seqs are dense): a segment reclaimed between planning and
reading fails the task loudly (``SegmentGone``) instead of returning fewer rows.

**Filter pushdown** (Spark >= 4.1, ``spark.sql.python.filterPushdown.enabled``): comparisons on
``enqueue_time``, ``seq`` and ``segment`` and equality / IN on ``queue`` are applied exactly by
the source (time ranges become seq ranges through the time index), so they prune partitions.
``register`` turns pushdown on unless told not to; with it off the source plans without it.

**Streaming**: offsets are ``{queue: {"id": queue id, "seq": next seq}}``; ``latestOffset``
catches up with the directory (a running server's), and each micro-batch reads only the seqs
between two offsets, one partition per segment they touch.

**Writes**: ``server`` (``host:port``, required; the port defaults to 7766 as for ``lamina
--server``), ``queue`` (required), optional ``key`` / ``secret`` (authentication), ``tls``
(``true``), ``batchSize`` (messages per request, 1-1000, default 500). An option out of range
is refused, naming it. Columns:
``body`` (binary or string, required), optional ``attributes`` (map), ``priority`` (int),
``topic`` (string), ``delay`` (seconds). Each partition sends its rows in batches through
``lamina.client.Client``; a refused message fails the task. A retried task sends its
partition again (at-least-once).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .sparkscan import (
    SCHEMA,
    LaminaPushdownReader,
    LaminaReader,
    ReadOptions,
    SegmentGone,
    schema_for,
)
from .sparkstream import LaminaStreamReader
from .sparkwrite import LaminaWriter


__all__ = ["LaminaDataSource", "SCHEMA", "SegmentGone", "register"]

# -- the data source ----------------------------------------------------------------------------

class LaminaDataSource(DataSource):
    """Format ``"lamina"``: see the module docstring. This class plans without filter
    pushdown; ``register`` picks ``LaminaPushdownDataSource`` when pushdown is on."""

    reader_class: type[LaminaReader] = LaminaReader

    @classmethod
    def name(cls) -> str:
        return "lamina"

    def schema(self) -> StructType:
        return schema_for(self.options.get("tag"))

    def reader(self, schema: StructType) -> DataSourceReader:
        return self.reader_class(ReadOptions.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LaminaStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("lamina appends messages: use mode('append')")
        return LaminaWriter(self.options, schema)


class LaminaPushdownDataSource(LaminaDataSource):
    reader_class = LaminaPushdownReader


_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, *, filter_pushdown: bool | None = True) -> type[LaminaDataSource]:
    """Register format ``"lamina"`` on ``spark``. ``filter_pushdown``: True turns the
    session's Python filter pushdown on (``spark.sql.python.filterPushdown.enabled``, Spark >=
    4.1) and pushes filters; None follows the session's setting; False never pushes. Spark
    refuses a reader with ``pushFilters`` while the setting is off, hence two classes."""
    if filter_pushdown and _supports_pushdown():
        spark.conf.set(_PUSHDOWN_CONF, "true")
    enabled = False
    if filter_pushdown is not False and _supports_pushdown():
        enabled = str(spark.conf.get(_PUSHDOWN_CONF, "false")).lower() == "true"
    source = LaminaPushdownDataSource if enabled else LaminaDataSource
    spark.dataSource.register(source)
    return source


def _supports_pushdown() -> bool:
    return hasattr(DataSourceReader, "pushFilters")
