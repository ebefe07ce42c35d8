"""Lamina's network server: the wire protocol of PROTOCOL.md over TCP, and the SQS gateway.

Where things live:

- ``server`` is the trio server (accept, the applier with group commit, the deadline timer,
  shutdown); ``connection`` one connection's reader and writer; ``waiters`` the waiting
  receives; ``dispatch`` the op table; ``keys`` the keys file; ``metrics`` and ``logs``
  observability; ``config`` and ``run`` the ``lamina serve`` command; ``sqs`` the
  SQS-compatible HTTP gateway.
- The sans-IO codec both sides share is ``lamina.wire``; the clients are ``lamina.client``
  (``client``, ``lease``, ``operations``, ``protocol`` and ``framing`` here are deprecated
  aliases of them, kept for one release).

Nothing is imported here, so ``import lamina.server.config`` stays cheap.
"""
