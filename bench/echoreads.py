"""What a read costs the server before any of Lamina's code runs: bare echo servers over
loopback, each in a process of its own, driven alternately by one client that sleeps on its
sockets (blocking ``recv``), server CPU read from /proc/PID/task/*/schedstat.

    python -m lamina.bench.echoreads                        # 1 connection, then 4
    python -m lamina.bench.echoreads --connections 4 --rounds 12 --requests 10000

The servers (each reads with ``os.read`` and answers with ``os.write``, as Lamina's plain-TCP
connections do):

- ``task``: a trio task a connection, ``trio.lowlevel.wait_readable`` on its socket before
  each read once a read has emptied it (Lamina's ``Connection._socket_reads``);
- ``epoll``: one trio task owning a level-triggered ``select.epoll`` where every connection is
  registered once; it waits with ``wait_readable`` on the epoll's own fd, then ``poll(0)``,
  and answers every ready connection inline;
- ``bare``: a plain ``select.epoll`` loop without trio (the floor).

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

CHUNK_BYTES = 65536
REQUEST = b"x" * 24
SERVERS = ("task", "epoll", "bare")


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


def server_cpu_ns(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def _round_trips(conns: list[socket.socket], rounds: int, think_s: float) -> None:
    clock = time.perf_counter
    for _ in range(rounds):
        if think_s:
            until = clock() + think_s
            while clock() < until:
                pass
        for conn in conns:
            conn.sendall(REQUEST)
        for conn in conns:
            got = 0
            while got < len(REQUEST):
                got += len(conn.recv(4096))


def measure(servers: list[str], connections: int, rounds: int, requests: int,
            think_us: float) -> dict[str, list[tuple[float, float]]]:
    """(server CPU µs a request, requests a second) a round, for each server."""
    procs: dict[str, subprocess.Popen[str]] = {}
    conns: dict[str, list[socket.socket]] = {}
    try:
        for name in servers:
            proc = subprocess.Popen([sys.executable, "-m", "lamina.bench.echoreads", "--serve",
                                     name], stdout=subprocess.PIPE, text=True)
            procs[name] = proc
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            conns[name] = [socket.create_connection(("127.0.0.1", port))
                           for _ in range(connections)]
            for conn in conns[name]:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _round_trips(conns[name], 500, 0.0)
        per_round = max(1, requests // connections)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
        for round_no in range(rounds):
            for name in servers if round_no % 2 == 0 else servers[::-1]:
                cpu_ns, start_s = server_cpu_ns(procs[name].pid), time.perf_counter()
                _round_trips(conns[name], per_round, think_us / 1e6)
                elapsed_s = time.perf_counter() - start_s
                done = per_round * connections
                results[name].append(
                    ((server_cpu_ns(procs[name].pid) - cpu_ns) / 1e3 / done, done / elapsed_s))
        return results
    finally:
        for name_conns in conns.values():
            for conn in name_conns:
                conn.close()
        for proc in procs.values():
            proc.kill()
            proc.wait()


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
    parser = argparse.ArgumentParser(prog="python -m lamina.bench.echoreads",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help="which servers, comma-separated (default: all three)")
    parser.add_argument("--connections", type=int, action="append",
                        help="connections, each with a request in flight (default: 1, then 4)")
    parser.add_argument("--rounds", type=int, default=12, help="alternated rounds (default 12)")
    parser.add_argument("--requests", type=int, default=20000,
                        help="requests a round (default 20000)")
    parser.add_argument("--think-us", type=float, default=0.0,
                        help="client spins this long before each round trip (default 0)")
    args = parser.parse_args(argv)
    if args.serve:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        print(listener.getsockname()[1], flush=True)
        SERVE[args.serve](listener)
        return
    servers = [name for name in args.servers.split(",") if name]
    unknown = [name for name in servers if name not in SERVERS]
    if unknown:
        parser.error(f"--servers: unknown {', '.join(unknown)} (known: {', '.join(SERVERS)})")
    for connections in args.connections or [1, 4]:
        results = measure(servers, connections, args.rounds, args.requests, args.think_us)
        print(report(results, connections, args.think_us), flush=True)


if __name__ == "__main__":
    main()
