"""``lamina serve``: its options, as a frozen :class:`ServerConfig`, and their argparse form.

The CLI (``tools/cli.py``) only wires this in::

    serve = commands.add_parser("serve", help=...)
    add_serve_arguments(serve)
    serve.set_defaults(run=lambda args: run_server(config_from_args(args)))

Every check that does not need a socket or a file's contents lives here, so a wrong command
line fails before anything is opened (``ConfigError``, exit code 2).
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from dataclasses import dataclass
from pathlib import Path

from .budget import DEFAULT_MAX_BUFFERED_BYTES
from .busypoll import DEFAULT_BUSY_POLL_US, MAX_BUSY_POLL_US
from lamina.engine.storememory import (
    DEFAULT_BLOCK_CACHE_BYTES,
    DEFAULT_WRITE_BUFFER_BYTES,
    MIN_BLOCK_CACHE_BYTES,
    MIN_WRITE_BUFFER_BYTES,
    MemoryBounds,
)
from lamina.wire.framing import DEFAULT_MAX_FRAME_BYTES, MAX_FRAME_LENGTH, MIN_MAX_FRAME_BYTES
from lamina.wire.protocol import DEFAULT_MAX_INFLIGHT, DEFAULT_MAX_WAITING, DEFAULT_PORT

__all__ = ["ConfigError", "ServerConfig", "add_serve_arguments", "config_from_args",
           "is_loopback"]


DEFAULT_DATA_DIR = Path("./lamina-data")
#: Connections beyond this are closed at once (each costs a socket, two tasks and buffers).
DEFAULT_MAX_CONNECTIONS = 10_000
#: A connection with nothing outstanding and no bytes for this long is closed.
DEFAULT_IDLE_TIMEOUT_S = 300.0
#: PROTOCOL §3: ``auth`` must succeed within 10 s of connecting.
DEFAULT_AUTH_TIMEOUT_S = 10.0
#: The SQS gateway's account id and region: they appear in queue URLs and ARNs.
DEFAULT_SQS_ACCOUNT = "000000000000"
DEFAULT_SQS_REGION = "us-east-1"


class ConfigError(ValueError):
    """The command line or configuration cannot be served as given."""


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only exposes the server to this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``lamina serve`` runs with. Durations in seconds, sizes in bytes."""

    data: Path = DEFAULT_DATA_DIR
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    fsync: bool = False
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_frame: int = DEFAULT_MAX_FRAME_BYTES
    max_queues: int = 10**6
    keys: Path | None = None
    receipt_key: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    insecure: bool = False
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    max_waiting: int = DEFAULT_MAX_WAITING
    #: Bytes all connections together may hold in large partial frames and in answers not
    #: yet sent or still to come (budget.py); reading pauses while it is spent.
    max_buffered: int = DEFAULT_MAX_BUFFERED_BYTES
    #: Poll the sockets rather than sleep for at most this long after the server goes idle,
    #: when the idle gaps measured say it pays (busypoll.py: sparse traffic is not polled for).
    busy_poll_us: int = DEFAULT_BUSY_POLL_US
    #: How often queue-depth gauges are refreshed for /metrics.
    metrics_interval_s: float = 10.0
    #: How long a graceful shutdown waits for clients to take their last responses.
    shutdown_grace_s: float = 10.0
    #: The SQS-compatible HTTP endpoint (server/sqs): off when None.
    sqs_port: int | None = None
    sqs_account: str = DEFAULT_SQS_ACCOUNT
    sqs_region: str = DEFAULT_SQS_REGION
    #: RocksDB's write buffers (all column families together) and its block cache.
    write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES
    block_cache_bytes: int = DEFAULT_BLOCK_CACHE_BYTES

    @property
    def memory(self) -> MemoryBounds:
        """The store's memory bounds."""
        return MemoryBounds(self.write_buffer_bytes, self.block_cache_bytes)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def check(self) -> ServerConfig:
        """Raise ``ConfigError`` for a configuration that must not be served; returns self."""
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port} is not a TCP port")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {self.metrics_port} is not a TCP port")
        if self.sqs_port is not None and not 0 <= self.sqs_port <= 65535:
            raise ConfigError(f"--sqs-port {self.sqs_port} is not a TCP port")
        if not re.fullmatch(r"\d{12}", self.sqs_account):
            raise ConfigError(f"--sqs-account {self.sqs_account!r} is not 12 digits")
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d{1,2}", self.sqs_region):
            raise ConfigError(f"--sqs-region {self.sqs_region!r} is not a region name "
                              "such as us-east-1")
        if not MIN_MAX_FRAME_BYTES <= self.max_frame <= MAX_FRAME_LENGTH:
            raise ConfigError(f"--max-frame must be {MIN_MAX_FRAME_BYTES}..{MAX_FRAME_LENGTH} "
                              "bytes (PROTOCOL.md §1)")
        if self.max_connections < 1 or self.max_queues < 1:
            raise ConfigError("--max-connections and --max-queues must be at least 1")
        if self.max_buffered < 1:
            raise ConfigError("--max-buffered must be at least 1 byte")
        if self.write_buffer_bytes < MIN_WRITE_BUFFER_BYTES:
            raise ConfigError(f"--write-buffer-bytes must be at least {MIN_WRITE_BUFFER_BYTES}")
        if self.block_cache_bytes < MIN_BLOCK_CACHE_BYTES:
            raise ConfigError(f"--block-cache-bytes must be at least {MIN_BLOCK_CACHE_BYTES}")
        if self.max_inflight < 1 or self.max_waiting < 0:
            raise ConfigError("max_inflight must be >= 1 and max_waiting >= 0")
        if not 0 <= self.busy_poll_us <= MAX_BUSY_POLL_US:
            raise ConfigError(f"--busy-poll-us must be 0..{MAX_BUSY_POLL_US}")
        if not 0 < self.idle_timeout_s < math.inf or not 0 < self.auth_timeout_s < math.inf:
            raise ConfigError("--idle-timeout and --auth-timeout must be positive, finite "
                              "numbers of seconds")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        if not is_loopback(self.host) and not self.insecure and (
                self.keys is None or not self.tls):
            raise ConfigError(
                f"refusing to bind non-loopback address {self.host!r} without --keys and "
                "--tls-cert/--tls-key (pass --insecure to do it anyway)")
        if self.metrics_port is not None and not is_loopback(self.metrics_host) \
                and not self.insecure:
            raise ConfigError(f"refusing to serve /metrics on non-loopback address "
                              f"{self.metrics_host!r}: it asks no key (pass --insecure to do "
                              "it anyway)")
        return self


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options of ``lamina serve`` to ``parser`` (a subcommand's parser)."""
    add = parser.add_argument
    add("--data", type=Path, default=DEFAULT_DATA_DIR, metavar="DIR",
        help="data directory, created if missing (default ./lamina-data)")
    add("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, default=DEFAULT_PORT, help="TCP port, 0 for any free port "
        f"(default {DEFAULT_PORT})")
    add("--fsync", action="store_true",
        help="acknowledge only what is synced to disk, so it survives power loss (default "
             "off: what is acknowledged survives a killed server)")
    add("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
        help="connections served at once; more are closed at once; each takes a file "
             f"descriptor (default {DEFAULT_MAX_CONNECTIONS})")
    add("--max-frame", type=int, default=DEFAULT_MAX_FRAME_BYTES, metavar="BYTES",
        help=f"largest frame in either direction, {MIN_MAX_FRAME_BYTES}..{MAX_FRAME_LENGTH} "
             f"(default {DEFAULT_MAX_FRAME_BYTES})")
    add("--max-queues", type=int, default=10**6, metavar="N",
        help="queues the server holds at most (default 1000000)")
    add("--keys", type=Path, metavar="FILE",
        help="TOML keys file; turns authentication on, re-read on SIGHUP (default none: no "
             "authentication)")
    add("--receipt-key", type=Path, metavar="FILE",
        help="receipt signing key file, created if missing (default DATA/receipt.key)")
    add("--tls-cert", type=Path, metavar="FILE",
        help="PEM certificate chain; turns TLS on (default none: plain TCP)")
    add("--tls-key", type=Path, metavar="FILE",
        help="PEM private key for --tls-cert (default none)")
    add("--metrics-port", type=int, metavar="PORT",
        help="serve Prometheus /metrics on this port (default none: off)")
    add("--metrics-host", default="127.0.0.1", metavar="HOST",
        help="the address /metrics listens on; other than loopback it needs --insecure, "
             "since /metrics asks no key (default %(default)s)")
    add("--insecure", action="store_true",
        help="allow a non-loopback address without --keys and TLS (default off)")
    add("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
        help="close connections idle this long; a waiting receive is not idle "
             f"(default {DEFAULT_IDLE_TIMEOUT_S:g})")
    add("--max-buffered", type=int, default=DEFAULT_MAX_BUFFERED_BYTES, metavar="BYTES",
        help="memory all connections together may hold in large partial requests and in "
             "answers not yet taken by their clients; past it, reading pauses until clients "
             "take their answers (default %(default)s)")
    add("--write-buffer-bytes", type=int, default=DEFAULT_WRITE_BUFFER_BYTES, metavar="BYTES",
        help="memory the store may hold in write buffers (recent writes, all together) "
             "before writing them out to its files: more means fewer, larger writes out "
             f"(bytes, at least {MIN_WRITE_BUFFER_BYTES}; default %(default)s)")
    add("--block-cache-bytes", type=int, default=DEFAULT_BLOCK_CACHE_BYTES, metavar="BYTES",
        help="memory the store may hold in its cache of file blocks read, indexes included: "
             "more spares reading them again from the files (bytes, at least "
             f"{MIN_BLOCK_CACHE_BYTES}; default %(default)s)")
    add("--busy-poll-us", type=int, default=DEFAULT_BUSY_POLL_US, metavar="US",
        help="the longest the server polls for the next request once idle, rather than "
             "sleeping: lower round-trip latency for some CPU. It measures how long it stays "
             "idle before each request and polls only when that pays, for the window that "
             "would have cost least (polling is charged its CPU, each wake-up it avoids this "
             "long): round trips are polled for, sparse traffic is not (microseconds, 0: off; "
             "default %(default)s)")
    add("--sqs-port", type=int, metavar="PORT",
        help="also serve the Amazon SQS API (AWS JSON and Query protocols) over HTTP on this "
             "port, on --host, with TLS when --tls-cert is given (default: off)")
    add("--sqs-account", default=DEFAULT_SQS_ACCOUNT, metavar="ID",
        help="account id in SQS queue URLs and ARNs (default %(default)s)")
    add("--sqs-region", default=DEFAULT_SQS_REGION, metavar="REGION",
        help="region in SQS ARNs and request signatures (default %(default)s)")
    add("--auth-timeout", type=float, default=DEFAULT_AUTH_TIMEOUT_S, metavar="SECONDS",
        help=argparse.SUPPRESS)
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The checked ``ServerConfig`` of parsed ``lamina serve`` options."""
    return ServerConfig(
        data=args.data, host=args.host, port=args.port, fsync=args.fsync,
        max_connections=args.max_connections, max_frame=args.max_frame,
        max_queues=args.max_queues, keys=args.keys, receipt_key=args.receipt_key,
        tls_cert=args.tls_cert, tls_key=args.tls_key, metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        insecure=args.insecure, idle_timeout_s=args.idle_timeout,
        auth_timeout_s=args.auth_timeout, busy_poll_us=args.busy_poll_us,
        sqs_port=args.sqs_port, sqs_account=args.sqs_account, sqs_region=args.sqs_region,
        max_buffered=args.max_buffered, write_buffer_bytes=args.write_buffer_bytes,
        block_cache_bytes=args.block_cache_bytes,
    ).check()
