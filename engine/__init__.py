"""Lamina's storage engine: queues with cloud-queue semantics on a segmented log in RocksDB.

No sockets, no trio: usable embedded, in-process. See ``Engine``.
"""

from .clock import FakeClock, wall_clock_ms
from .engine import Engine
from .errors import (
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
from .records import Message
from .storememory import MemoryBounds, MemoryUsage
from .store import DataDirectoryError
from .results import (
    Delivery,
    Grant,
    PeekPage,
    Peeked,
    QueueInfo,
    QueuePage,
    Redriven,
    Rewound,
    Sent,
    TagInfo,
    VisibilityChanged,
)

__all__ = [
    "AccessDenied", "DataDirectoryError", "Delivery", "Engine", "FakeClock", "Grant", "InternalError",
    "InvalidArgument", "MemoryBounds", "MemoryUsage", "PeekPage", "Peeked", "Redriven", "Rewound", "TagInfo",
    "InvalidQueueName", "InvalidReceipt", "InvalidRedrivePolicy", "LaminaError", "Message",
    "MessageNotFound", "MessageTooLarge", "NoDeadLetterQueue", "ProtocolError",
    "QueueAlreadyExists", "QueueFull", "QueueInfo", "QueueNotFound", "QueuePage",
    "RewindDisabled", "RewindOutOfRange", "Sent", "StaleReceipt", "TagAlreadyExists",
    "TagNotFound", "TooManyQueues", "TooManyTags", "Unauthorized", "Unavailable",
    "UnknownOperation", "VisibilityChanged", "wall_clock_ms",
]
