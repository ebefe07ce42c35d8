"""Lamina's network server and clients: the wire protocol of PROTOCOL.md over TCP.

Where things live:

- ``framing`` cuts and strictly decodes frames; ``protocol`` is the sans-IO connection state
  (events in, bytes out) shared by the server and clients. Nothing in either touches a socket.
- ``server`` is the server's lifetime (listen, accept, the timers, shutdown); ``applier`` the
  one task that calls the engine (inbox, group commit, WAL syncer, serving waiters, long
  work); ``ports`` the narrow interfaces between them and ``connection`` (one connection's
  reader and writer) or the SQS gateway's bridge; ``waiters`` the waiting receives;
  ``dispatch`` the op table; ``bugs`` where a bug becomes ``InternalError``; ``keyring`` the
  keys file (API keys); ``metrics`` and ``logs`` observability; ``config`` and ``run`` the
  ``lamina serve`` command.
- ``client`` has ``Client`` (blocking) and ``AsyncClient`` (trio), whose methods are written
  once in ``operations``; ``lease`` keeps leases alive while work runs.

Nothing is imported here, so ``import lamina.server.config`` stays cheap.
"""
