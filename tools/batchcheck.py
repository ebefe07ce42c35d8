"""The lease batch rows of one lane of a tag, checked for ``lamina inspect verify``
(``engine/leasebatch.py``): each decodes, its key names its last seq, its seqs ascend, the
rows' seq ranges are disjoint, and its entries above ``gone_seq`` name log rows of the lane."""

from __future__ import annotations

import struct
from typing import Iterator

from lamina.engine import keys, leasebatch
from lamina.engine.state import ENDED_DELETED, LEASED, QueueState
from lamina.engine.store import Store

#: (check, where, detail, seqs the detail names)
Finding = tuple[str, str, str, list[int]]


def batch_findings(store: Store, q: QueueState, tag_id: int, tag_name: str, lane: int,
                   counted: list[int]) -> Iterator[Finding]:
    """Damage found in the lane's batch rows; ``counted[0]`` grows by the entries read."""
    below = -1  # the last seq of the previous row
    for key, value in Store.items(store.leasebatches,
                                  *keys.batch_lane_bounds(q.id, tag_id, lane)):
        last = keys.batch_key_decode(key)[3]
        where = f"tag {tag_name!r} lane {lane} lease batch ending at seq {last}"
        try:
            _, _, seqs, _, batch = leasebatch.decode(key, value)
        except struct.error as exc:
            yield "lease.decode", where, str(exc), []
            continue
        counted[0] += len(seqs)
        if not seqs or seqs[-1] != last or seqs != sorted(set(seqs)) or \
                len(value) != leasebatch.row_size(len(seqs)) or \
                not set(batch.states) <= {LEASED, ENDED_DELETED}:
            yield "lease.decode", where, "entries out of order, or bad states", []
            continue
        if seqs[0] <= below:
            yield ("lease.batch_overlap", where,
                   f"its seqs from {seqs[0]} overlap the previous row's (up to {below})", [])
        below = last
        missing = [seq for seq in seqs if seq >= q.gone_seq
                   and store.log.get(keys.log_key(q.id, lane, seq)) is None]
        if missing:
            yield "lease.message", where, f"no log row in lane {lane} for seqs", missing
