"""What a read costs the server before any of Lamina's code runs: bare echo servers over
loopback, each in a process of its own, driven alternately by one client that sleeps on its
sockets (blocking ``recv``), server CPU read from /proc/PID/task/*/schedstat.

    python -m lamina.bench.echoreads                        # 1 connection, then 4
    python -m lamina.bench.echoreads --connections 4 --rounds 12 --requests 10000
    python -m lamina.bench.echoreads --servers bare,task,lamina,redis --connections 1

The servers (each reads with ``os.read`` and answers with ``os.write``, as Lamina's plain-TCP
connections do):

- ``task``: a trio task a connection, ``trio.lowlevel.wait_readable`` on its socket before
  each read once a read has emptied it (Lamina's ``Connection._socket_reads``);
- ``epoll``: one trio task owning a level-triggered ``select.epoll`` where every connection is
  registered once; it waits with ``wait_readable`` on the epoll's own fd, then ``poll(0)``,
  and answers every ready connection inline;
- ``bare``: a plain ``select.epoll`` loop without trio (the floor).

Beside them, for scale, real servers answering their cheapest request (``--servers`` picks
them too; neither runs by default):

- ``lamina``: a ``lamina serve`` of this tree (a fresh temporary directory, busy polling off, as
  the echo servers do not poll) answering PROTOCOL.md's ``ping``;
- ``redis``: a private ``redis-server`` (found on PATH, no persistence) answering ``PING``.

With ``--connections N`` the client sends one request on each connection, then reads the N
answers (N requests in flight, as W1's producers); ``--think-us`` makes the client spin that
long before each round, so the server idles between requests as it does behind a slow client.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from typing import Callable

import cbor2

from .placement import Cpus, cpus_option, pin_process, pinned
from .spawn import cpu_seconds

CHUNK_BYTES = 65536
REQUEST = b"x" * 24
SERVERS = ("task", "epoll", "bare")
PEERS = ("lamina", "redis")
_PING_ITEM = cbor2.dumps([1, "ping", {}])
LAMINA_PING = len(_PING_ITEM).to_bytes(4, "big") + _PING_ITEM  # id 1 again: each is answered
REDIS_PING = b"*1\r\n$4\r\nPING\r\n"


def _accepted(sock: socket.socket) -> socket.socket:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _echo_once(fd: int) -> bool:
    """Read what ``fd`` holds and write it back; False at EOF."""
    try:
        data = os.read(fd, CHUNK_BYTES)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if data:
        os.write(fd, data)
    return bool(data)


def serve_task(listener: socket.socket) -> None:
    import trio

    async def connection(sock: socket.socket) -> None:
        fd = sock.fileno()
        wait_readable = trio.lowlevel.wait_readable
        with sock:
            while True:
                await wait_readable(fd)
                if not _echo_once(fd):
                    return

    async def main() -> None:
        listening = trio.socket.from_stdlib_socket(listener)
        async with trio.open_nursery() as nursery:
            while True:
                sock, _ = await listening.accept()
                nursery.start_soon(connection, _accepted(socket.socket(fileno=sock.detach())))

    trio.run(main)


def serve_epoll(listener: socket.socket) -> None:
    import trio

    ep = select.epoll()
    socks: dict[int, socket.socket] = {}

    async def reader() -> None:
        epoll_fd, poll, wait_readable = ep.fileno(), ep.poll, trio.lowlevel.wait_readable
        while True:
            await wait_readable(epoll_fd)
            for fd, _ in poll(0):
                if not _echo_once(fd):
                    ep.unregister(fd)
                    socks.pop(fd).close()

    async def main() -> None:
        listening = trio.socket.from_stdlib_socket(listener)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            while True:
                sock, _ = await listening.accept()
                plain = _accepted(socket.socket(fileno=sock.detach()))
                socks[plain.fileno()] = plain
                ep.register(plain.fileno(), select.EPOLLIN)

    trio.run(main)


def serve_bare(listener: socket.socket) -> None:
    ep = select.epoll()
    listener.setblocking(False)
    listen_fd = listener.fileno()
    ep.register(listen_fd, select.EPOLLIN)
    socks: dict[int, socket.socket] = {}
    while True:
        for fd, _ in ep.poll():
            if fd == listen_fd:
                sock = _accepted(listener.accept()[0])
                socks[sock.fileno()] = sock
                ep.register(sock.fileno(), select.EPOLLIN)
            elif not _echo_once(fd):
                ep.unregister(fd)
                socks.pop(fd).close()


SERVE: dict[str, Callable[[socket.socket], None]] = {
    "task": serve_task, "epoll": serve_epoll, "bare": serve_bare}


def _read_exactly(conn: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return data


def _read_frame(conn: socket.socket) -> None:
    """One Lamina frame: a 4-byte length, then that many bytes."""
    _read_exactly(conn, int.from_bytes(_read_exactly(conn, 4), "big"))


class _Exchange:
    """What a round trip sends to one kind of server and how it reads the answer."""

    def __init__(self, request: bytes, read_answer: Callable[[socket.socket], object]) -> None:
        self.request, self.read_answer = request, read_answer


EXCHANGES = {
    "echo": _Exchange(REQUEST, lambda conn: _read_exactly(conn, len(REQUEST))),
    "lamina": _Exchange(LAMINA_PING, _read_frame),
    "redis": _Exchange(REDIS_PING, lambda conn: _read_exactly(conn, len(b"+PONG\r\n"))),
}


def _round_trips(conns: list[socket.socket], rounds: int, think_s: float,
                 exchange: _Exchange) -> None:
    clock = time.perf_counter
    request, read_answer = exchange.request, exchange.read_answer
    for _ in range(rounds):
        if think_s:
            until = clock() + think_s
            while clock() < until:
                pass
        for conn in conns:
            conn.sendall(request)
        for conn in conns:
            read_answer(conn)


class _Started:
    """A server of ``measure``'s: its pid, its address and how to stop it."""

    def __init__(self, pid: int, port: int, stop: Callable[[], object]) -> None:
        self.pid, self.port, self.stop = pid, port, stop


def _start(name: str) -> _Started:
    if name == "lamina":
        from .spawn import SpawnedServer

        lamina = SpawnedServer.start(extra_args=("--busy-poll-us", "0"))
        return _Started(lamina.pid, lamina.port, lamina.stop)
    if name == "redis":
        from .peers.redis import RedisServer

        redis = RedisServer.start(fsync=False)
        return _Started(redis.pid, redis.port, redis.stop)
    proc = subprocess.Popen([sys.executable, "-m", "lamina.bench.echoreads", "--serve", name],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None

    def stop() -> None:
        proc.kill()
        proc.wait()

    return _Started(proc.pid, int(proc.stdout.readline()), stop)


def measure(servers: list[str], connections: int, rounds: int, requests: int,
            think_us: float, server_cpus: Cpus | None = None
            ) -> dict[str, list[tuple[float, float]]]:
    """(server CPU µs a request, requests a second) a round, for each server (each placed on
    ``server_cpus`` when given)."""
    started: dict[str, _Started] = {}
    conns: dict[str, list[socket.socket]] = {}
    exchanges = {name: EXCHANGES.get(name, EXCHANGES["echo"]) for name in servers}
    try:
        for name in servers:
            server = started[name] = _start(name)
            if server_cpus is not None:
                pin_process(server.pid, server_cpus)
            conns[name] = [socket.create_connection(("127.0.0.1", server.port))
                           for _ in range(connections)]
            for conn in conns[name]:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if name == "lamina":
                    _read_frame(conn)  # the greeting
            _round_trips(conns[name], 500, 0.0, exchanges[name])
        per_round = max(1, requests // connections)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
        for round_no in range(rounds):
            for name in servers if round_no % 2 == 0 else servers[::-1]:
                pid = started[name].pid
                cpu_s, start_s = cpu_seconds(pid), time.perf_counter()
                _round_trips(conns[name], per_round, think_us / 1e6, exchanges[name])
                elapsed_s = time.perf_counter() - start_s
                done = per_round * connections
                results[name].append(
                    ((cpu_seconds(pid) - cpu_s) * 1e6 / done, done / elapsed_s))
        return results
    finally:
        for name_conns in conns.values():
            for conn in name_conns:
                conn.close()
        for server in started.values():
            server.stop()


def report(results: dict[str, list[tuple[float, float]]], connections: int,
           think_us: float) -> str:
    lines = [f"{connections} connection(s), client think {think_us:g} µs; "
             "server CPU µs a request (min / median / max), requests a second (median)"]
    for name, rounds in results.items():
        cpus = [cpu for cpu, _ in rounds]
        rate = statistics.median(rate for _, rate in rounds)
        lines.append(f"  {name:6} {min(cpus):6.1f} {statistics.median(cpus):6.1f} "
                     f"{max(cpus):6.1f}   {rate:9,.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from lamina.tools.cmdvalues import parse_count

    parser = argparse.ArgumentParser(prog="python -m lamina.bench.echoreads",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help="which servers, comma-separated: task, epoll, bare, lamina, "
                        "redis (default: the three echo servers)")
    parser.add_argument("--connections", type=parse_count, action="append",
                        help="connections, each with a request in flight (default: 1, then 4)")
    parser.add_argument("--rounds", type=parse_count, default=12,
                        help="alternated rounds (default 12)")
    parser.add_argument("--requests", type=parse_count, default=20000,
                        help="requests a round (default 20000)")
    parser.add_argument("--think-us", type=float, default=0.0,
                        help="client spins this long before each round trip (default 0)")
    parser.add_argument("--server-cpus", type=cpus_option, metavar="LIST",
                        help="run every server on these CPUs, e.g. 1 (default: where the "
                        "scheduler puts them)")
    parser.add_argument("--client-cpus", type=cpus_option, metavar="LIST",
                        help="run the client on these CPUs, e.g. 0 (default: where the "
                        "scheduler puts it)")
    args = parser.parse_args(argv)
    if args.serve:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        print(listener.getsockname()[1], flush=True)
        SERVE[args.serve](listener)
        return
    servers = [name for name in args.servers.split(",") if name]
    unknown = [name for name in servers if name not in SERVERS + PEERS]
    if unknown:
        parser.error(f"--servers: unknown {', '.join(unknown)} "
                     f"(known: {', '.join(SERVERS + PEERS)})")
    with pinned(args.client_cpus):
        for connections in args.connections or [1, 4]:
            results = measure(servers, connections, args.rounds, args.requests, args.think_us,
                              args.server_cpus)
            print(report(results, connections, args.think_us), flush=True)


if __name__ == "__main__":
    main()
