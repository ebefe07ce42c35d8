"""The client's connection errors: a subtree of Lamina's one error tree.

    LaminaError (lamina.engine.errors)  anything Lamina reports; ``.code`` is the wire code
    ├── <one class per PROTOCOL §6 code>   raised for a request the server refused (an
    │                                      unknown code arrives as LaminaError itself)
    └── LaminaConnectionError           also a builtin ``ConnectionError``; code
        │                               "ConnectionError" (never sent on the wire)
        ├── ConnectFailed               could not connect, or TLS failed
        │   └── ConnectTimeout          no greeting (or auth answer) within ``timeout``
        ├── ConnectionLost              the connection broke, or the server closed it
        ├── ConnectionClosed            this client closed it (``close()``, the block ended)
        └── ServerProtocolViolation     the server's bytes broke the protocol

A request in flight when the connection ended may or may not have taken effect (unlike
``Unavailable``, which means it did not). Neither client reconnects on its own.
"""

from __future__ import annotations

from lamina.engine.errors import LaminaError

__all__ = ["ConnectFailed", "ConnectTimeout", "ConnectionClosed", "ConnectionLost",
           "LaminaConnectionError", "ServerProtocolViolation"]


class LaminaConnectionError(LaminaError, ConnectionError):
    """The connection failed or ended; see the module docstring."""

    code = "ConnectionError"


class ConnectFailed(LaminaConnectionError):
    """Could not connect: refused, unreachable, or the TLS handshake failed."""


class ConnectTimeout(ConnectFailed):
    """Connected, but the greeting (or the answer to ``auth``) did not come within ``timeout``."""


class ConnectionLost(LaminaConnectionError):
    """The connection broke, or the server closed it (after its last word, if it said one)."""


class ConnectionClosed(LaminaConnectionError):
    """This client closed the connection; calls made after, or still waiting, fail with it."""


class ServerProtocolViolation(LaminaConnectionError):
    """The server's bytes broke the protocol (PROTOCOL §1–2); the connection is unusable."""
