"""The least any Python server on Lamina's stack spends on W1's request and W2's pair, in
process: the library calls a request cannot do without, glued by as little Python as will
call them, with none of Lamina's own work.

    python -m lamina.bench.floor                  # best and median of 7 rounds, µs
    python -m lamina.bench.floor --rounds 3 --requests 1000 --json

- **W1's request** (a send of 16 bodies of 256 bytes): decode the request frame with cbor2,
  take each body's MD5 (PROTOCOL.md answers it), put 16 rows in one RocksDB ``WriteBatch`` and
  write it through the WAL, encode the answer of 16 ids and digests.
- **W2's pair** (a receive of 16, then their delete): decode the receive, step a RocksDB
  iterator over 16 rows, a keyed BLAKE2b receipt for each (as Lamina's receipts), write one
  lease row, encode the answer with the 16 records; decode the delete, check the 16 receipts,
  write one row, encode its answer.

Left out, because a queue needs them but no floor can price them: validation, ids, leases
and their deadlines, counters, segments, the server's read loop, and sockets (for the cost of
a read and a write over loopback, see ``python -m lamina.bench.echoreads``). A figure here is
a floor, not a target: Lamina does all of this and more, and Redis's server CPU a message
(``lamina bench --against redis``) compares with it only as the least Python pays.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import statistics
import tempfile
import time
from typing import Any, Callable

import cbor2
from rocksdict import Options, Rdict, WriteBatch

BODY_BYTES = 256
BATCH = 16


class Floor:
    """A RocksDB store and the two requests' least work on it."""

    def __init__(self, folder: str) -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.db = Rdict(folder, options)
        self.bodies = [(b"%016d" % i).ljust(BODY_BYTES, b"x") for i in range(BATCH)]
        self.send_frame = cbor2.dumps([7, "send", {"queue": "q", "messages": self.bodies}])
        self.receive_frame = cbor2.dumps([8, "receive", {"queue": "q", "max": BATCH}])
        self.keyed = hashlib.blake2b(key=os.urandom(32), digest_size=16)
        self.next_seq = 0

    def send(self) -> None:
        """W1's request."""
        request = cbor2.loads(self.send_frame)
        batch, md5, seq = WriteBatch(raw_mode=True), hashlib.md5, self.next_seq
        results = []
        for body in request[2]["messages"]:
            digest = md5(body).digest()
            batch.put(seq.to_bytes(8, "big"), body + digest)
            results.append([seq, 0, digest])
            seq += 1
        self.db.write(batch)
        self.next_seq = seq
        cbor2.dumps([request[0], None, {"results": results}])

    def receive_and_delete(self, start: int) -> None:
        """W2's pair, from the row at ``start`` (the store holds at least 16 rows from it)."""
        request = cbor2.loads(self.receive_frame)
        it = self.db.iter()
        it.seek(start.to_bytes(8, "big"))
        keyed, receipts, records = self.keyed, [], []
        for _ in range(request[2]["max"]):
            key = it.key()
            mac = keyed.copy()
            mac.update(key)
            receipts.append(key + mac.digest())
            records.append(it.value())
            it.next()
        lease = WriteBatch(raw_mode=True)
        lease.put(b"L" + start.to_bytes(8, "big"), b"".join(receipts))
        self.db.write(lease)
        cbor2.dumps([request[0], None, {"messages": [list(pair) for pair in
                                                     zip(receipts, records)]}])
        delete = cbor2.loads(cbor2.dumps([9, "delete", {"queue": "q", "receipts": receipts}]))
        for receipt in delete[2]["receipts"]:
            mac = keyed.copy()
            mac.update(receipt[:8])
            if not hmac.compare_digest(receipt[8:], mac.digest()):
                raise AssertionError("a receipt of this store failed its check")
        ended = WriteBatch(raw_mode=True)
        ended.put(b"E" + start.to_bytes(8, "big"), b"")
        self.db.write(ended)
        cbor2.dumps([delete[0], None, {"results": [None] * len(receipts)}])

    def close(self) -> None:
        self.db.close()


def _timed(call: Callable[[int], None], requests: int) -> float:
    """CPU µs a call of ``call(i)`` over ``requests`` calls."""
    started = time.process_time_ns()
    for i in range(requests):
        call(i)
    return (time.process_time_ns() - started) / requests / 1e3


def measure(rounds: int, requests: int) -> dict[str, Any]:
    """µs a W1 request and a W2 pair (best and median of ``rounds``), and a message."""
    with tempfile.TemporaryDirectory(prefix="lamina-floor-") as folder:
        floor = Floor(folder)
        try:
            for _ in range(max(requests, 200)):  # rows for the receives, and a warm-up
                floor.send()
            rows = floor.next_seq - BATCH
            w1, w2 = [], []
            for _ in range(rounds):
                w1.append(_timed(lambda i: floor.send(), requests))
                w2.append(_timed(lambda i: floor.receive_and_delete(i * BATCH % rows),
                                 requests))
        finally:
            floor.close()
    return {name: {"best_us": round(min(runs), 2), "median_us": round(statistics.median(runs), 2),
                   "best_us_a_message": round(min(runs) / BATCH, 2),
                   "median_us_a_message": round(statistics.median(runs) / BATCH, 2)}
            for name, runs in (("w1_send16", w1), ("w2_receive16_delete16", w2))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lamina.bench.floor",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--requests", type=int, default=3000,
                        help="requests (W1) and pairs (W2) a round (default 3000)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.requests < 1:
        parser.error("--rounds and --requests must be at least 1")
    figures = measure(args.rounds, args.requests)
    if args.json:
        print(json.dumps(figures))
        return
    print("in process, CPU µs: best / median of the rounds (a message: / 16)")
    for name, figure in figures.items():
        print(f"  {name:24} {figure['best_us']:8.1f} {figure['median_us']:8.1f}   "
              f"a message {figure['best_us_a_message']:5.2f} {figure['median_us_a_message']:5.2f}")


if __name__ == "__main__":
    main()
