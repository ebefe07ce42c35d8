"""Helpers shared by the test packages.

- ``servers``: servers over real loopback sockets (in the test's trio run, in a thread, or as a
  ``lamina serve`` process), keys, certificates and raw connections;
- ``fixtures``: the pytest fixtures built on them and the hook running ``async def`` tests under
  trio (a conftest imports them with ``from tests.support.fixtures import *``);
- ``sqs``: SQS-gateway servers and boto3 clients;
- ``stores``: data directories built offline for the tools' tests.
"""
