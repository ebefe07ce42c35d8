"""Lamina's network server: the wire protocol of PROTOCOL.md over TCP.

``framing`` cuts and strictly decodes frames; ``protocol`` is the sans-IO connection state
(events in, bytes out) shared by the server and clients. Nothing in either touches a socket.
"""
