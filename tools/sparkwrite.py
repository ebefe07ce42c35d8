"""Writes of the ``lamina`` Spark source (``spark.py``): each partition sends its rows in
batches through a Lamina server."""

from __future__ import annotations

from argparse import ArgumentTypeError
from dataclasses import dataclass
from typing import Any, Iterator

from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from .cmdvalues import parse_server
from .sparkscan import int_option


# -- writer -----------------------------------------------------------------------------------

@dataclass
class LaminaCommit(WriterCommitMessage):
    sent: int


class LaminaWriter(DataSourceWriter):
    """Sends each partition's rows through ``lamina.client.Client``."""

    def __init__(self, options: Any, schema: StructType):
        server = options.get("server")
        queue = options.get("queue")
        if not server or not queue:
            raise ValueError('writing to lamina needs .option("server", "host:port") and '
                             '.option("queue", name)')
        try:
            self.host, self.port = parse_server(server)
        except ArgumentTypeError as exc:
            raise ValueError(f"option server: {exc}") from None
        self.queue = queue
        self.key, self.secret = options.get("key"), options.get("secret")
        self.tls = str(options.get("tls", "false")).lower() == "true"
        self.batch_size = int_option(options, "batchSize", 500, 1, 1000)
        names = set(schema.names)
        if "body" not in names:
            raise ValueError("writing to lamina needs a body column")
        self.columns = [name for name in ("attributes", "priority", "topic", "delay")
                        if name in names]

    def write(self, iterator: Iterator[Any]) -> LaminaCommit:
        from lamina.client import Client, message
        batch_bytes_limit = 1 << 20
        sent = 0
        with Client.connect(self.host, self.port, key=self.key, secret=self.secret,
                            tls=self.tls) as client:
            batch: list[Any] = []
            size = 0

            def flush() -> None:
                nonlocal sent, size
                results = client.send(self.queue, batch)
                refused = [r for r in results if isinstance(r, Exception)]
                if refused:
                    raise RuntimeError(f"lamina refused {len(refused)} of {len(batch)} "
                                       f"messages for {self.queue!r}: {refused[0]}")
                sent += len(batch)
                batch.clear()
                size = 0

            for row in iterator:
                body = row["body"]
                if isinstance(body, (bytearray, memoryview)):
                    body = bytes(body)
                extra = {name: row[name] for name in self.columns}
                attributes = extra.get("attributes")
                batch.append(message(body, attributes=dict(attributes) if attributes else None,
                                     topic=extra.get("topic"), priority=extra.get("priority"),
                                     delay=extra.get("delay")))
                size += len(body) + 64
                if len(batch) >= self.batch_size or size >= batch_bytes_limit:
                    flush()
            if batch:
                flush()
        return LaminaCommit(sent)
