"""Lamina's Python client: ``from lamina.client import Client, AsyncClient, message``.

    with Client.connect("127.0.0.1", 7766) as client:
        client.create_queue("orders")
        client.send("orders", [b"hello", message("urgent", priority=1)])
        for delivery in client.receive("orders", max=10, wait=5):
            client.delete("orders", [delivery])

- :class:`Client` (blocking, thread-safe) and :class:`AsyncClient` (trio) have the same methods,
  one per operation of PROTOCOL.md §5 (``operations.py``);
- :class:`LeaseKeeper` / :class:`AsyncLeaseKeeper` keep leases alive while work runs
  (``lease.py``; ``Client.process`` is the whole worker loop);
- results: :class:`Delivery`, :class:`Peeked`, :class:`ServerInfo` decoded here, the others the
  engine's own (``Sent``, ``QueueInfo``, ...), re-exported;
- errors: one tree rooted at :class:`LaminaError` — one class per wire error code, and the
  connection errors under :class:`LaminaConnectionError` (drawn in ``errors.py``).
"""

from lamina.engine.errors import (
    AccessDenied,
    InternalError,
    InvalidArgument,
    InvalidQueueName,
    InvalidReceipt,
    InvalidRedrivePolicy,
    LaminaError,
    MessageNotFound,
    MessageTooLarge,
    NoDeadLetterQueue,
    ProtocolError,
    QueueAlreadyExists,
    QueueFull,
    QueueNotFound,
    RewindDisabled,
    RewindOutOfRange,
    StaleReceipt,
    TagAlreadyExists,
    TagNotFound,
    TooManyQueues,
    TooManyTags,
    Unauthorized,
    Unavailable,
    UnknownOperation,
)
from lamina.engine.results import (
    Grant,
    PeekPage,
    QueueInfo,
    QueuePage,
    Redriven,
    Rewound,
    Sent,
    TagInfo,
    VisibilityChanged,
)
from lamina.wire.protocol import DEFAULT_PORT

from .async_client import AsyncClient
from .client import Client
from .errors import (
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    ConnectTimeout,
    LaminaConnectionError,
    ServerProtocolViolation,
)
from .lease import AsyncLeaseKeeper, LeaseKeeper
from .operations import Delivery, Peeked, ServerInfo, message

__all__ = [
    # clients and what they take
    "DEFAULT_PORT", "AsyncClient", "Client", "message",
    # lease keeping
    "AsyncLeaseKeeper", "LeaseKeeper",
    # results
    "Delivery", "Grant", "PeekPage", "Peeked", "QueueInfo", "QueuePage", "Redriven", "Rewound",
    "Sent", "ServerInfo", "TagInfo", "VisibilityChanged",
    # errors: the connection's
    "ConnectFailed", "ConnectTimeout", "ConnectionClosed", "ConnectionLost",
    "LaminaConnectionError", "ServerProtocolViolation",
    # errors: the server's answers, one per wire code (PROTOCOL.md §6)
    "AccessDenied", "InternalError", "InvalidArgument", "InvalidQueueName", "InvalidReceipt",
    "InvalidRedrivePolicy", "LaminaError", "MessageNotFound", "MessageTooLarge",
    "NoDeadLetterQueue", "ProtocolError", "QueueAlreadyExists", "QueueFull", "QueueNotFound",
    "RewindDisabled", "RewindOutOfRange", "StaleReceipt", "TagAlreadyExists", "TagNotFound",
    "TooManyQueues", "TooManyTags", "Unauthorized", "Unavailable", "UnknownOperation",
]
