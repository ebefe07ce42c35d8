"""Lamina's network server: the wire protocol of PROTOCOL.md over TCP, and the SQS gateway.

Where things live:

- ``server`` is the server's lifetime (listen, accept, the timers, shutdown); ``applier`` the
  one task that calls the engine (inbox, group commit, WAL syncer, serving waiters, long
  work); ``ports`` the narrow interfaces between them and ``connection`` (one connection's
  reader and writer) or the SQS gateway's bridge; ``waiters`` the waiting receives;
  ``dispatch`` the op table; ``bugs`` where a bug becomes ``InternalError``; ``keyring`` the
  keys file (API keys); ``metrics`` and ``logs`` observability; ``config`` and ``run`` the
  ``lamina serve`` command; ``sqs`` the SQS-compatible HTTP gateway.
- The sans-IO codec both sides share is ``lamina.wire``; the clients are ``lamina.client``
  (``client``, ``lease``, ``operations``, ``protocol`` and ``framing`` here are deprecated
  aliases of them, kept for one release).

Nothing is imported here, so ``import lamina.server.config`` stays cheap.
"""
