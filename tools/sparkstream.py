"""Streaming reads of the ``lamina`` Spark source (``spark.py``): offsets are each queue's
next seq, and a micro-batch reads the seqs between two offsets, one partition per segment."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from .snapshot import Snapshot
from .sparkscan import (
    LaminaPartition,
    ReadOptions,
    SegmentGone,
    freeze_worker_heap,
    int_option,
    read_partition,
    segment_partitions,
)


# -- streaming ----------------------------------------------------------------------------------

class LaminaStreamReader(DataSourceStreamReader):
    """Offsets: ``{queue name: {"id": queue id, "seq": next seq}}`` (module docstring)."""

    def __init__(self, options: Any, schema: StructType):
        self.options = ReadOptions.parse(options)
        if self.options.since_ms is not None or self.options.until_ms is not None:
            raise ValueError("since/until apply to batch reads; a stream starts from "
                             "startingOffsets")
        self.schema = schema
        self.starting = str(options.get("startingOffsets", "earliest")).lower()
        if self.starting not in ("earliest", "latest"):
            raise ValueError('startingOffsets is "earliest" or "latest"')
        self.max_per_trigger = int_option(options, "maxMessagesPerTrigger", None, 1)
        self.fail_on_data_loss = str(options.get("failOnDataLoss", "true")).lower() != "false"
        self._snapshot: Snapshot | None = None

    def _view(self) -> Snapshot:
        if self._snapshot is None:
            self._snapshot = Snapshot(self.options.path)
        else:
            self._snapshot.refresh()
        return self._snapshot

    def _queues(self, snapshot: Snapshot) -> list[Any]:
        return [snapshot.queue(self.options.queue)] if self.options.queue else \
            snapshot.queues()

    def initialOffset(self) -> dict:
        snapshot = self._view()
        now = snapshot.now()
        return {q.name: {"id": q.id, "seq": q.next_seq if self.starting == "latest"
                         else snapshot.retained_from(q, now)}
                for q in self._queues(snapshot)}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        snapshot = self._view()
        budget = self.max_per_trigger
        if limit is not None and type(limit).__name__ == "ReadMaxRows":
            budget = limit.max_rows
        elif limit is not None and type(limit).__name__ == "ReadAllAvailable":
            budget = None
        latest: dict[str, Any] = {}
        for q in self._queues(snapshot):
            begin = self._start_seq(snapshot, q, (start or {}).get(q.name))
            end = q.next_seq
            if budget is not None:
                end = min(end, begin + budget)
                budget -= max(end - begin, 0)
            latest[q.name] = {"id": q.id, "seq": max(end, begin)}
        return latest

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        if self.max_per_trigger:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def _start_seq(self, snapshot: Snapshot, q: Any, offset: dict | None) -> int:
        if offset is None or offset.get("id") != q.id:  # a new (or re-created) queue
            return snapshot.retained_from(q, snapshot.now()) if self.starting == "earliest" \
                else q.next_seq
        return int(offset["seq"])

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        snapshot = self._view()
        now = snapshot.now()
        partitions: list[InputPartition] = []
        for name, position in end.items():
            q = snapshot.queue_by_id(position["id"])
            if q is None:
                continue
            first = self._start_seq(snapshot, q, start.get(name))
            retained = snapshot.retained_from(q, now)
            if first < retained:
                if self.fail_on_data_loss and q.segments and first < q.segments[0].first_seq:
                    raise SegmentGone(
                        f"queue {name!r}: seqs {first}..{q.segments[0].first_seq - 1} were "
                        "reclaimed before this stream read them (failOnDataLoss=false skips)")
                first = retained
            partitions.extend(segment_partitions(q, first, int(position["seq"]),
                                                  self.options.tag, now,
                                                  must_exist=self.fail_on_data_loss))
        return partitions

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, LaminaPartition)
        freeze_worker_heap()
        return read_partition(self.options.path, partition, self.schema)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._snapshot is not None:
            self._snapshot.close()
            self._snapshot = None
