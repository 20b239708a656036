"""How both servers of the surface listen: the address family of a host and the accept backlog.

Shared by ``server`` (the stdlib WSGI server) and ``asgi`` (uvicorn), and by the
``dashboard`` command, so neither server module imports the other.
"""

from __future__ import annotations

import socket

# Connections the kernel queues before they are accepted. socketserver's default of 5 drops the
# handshakes of a burst (200 scrapes at once): those clients waited a minute on SYN retransmits.
LISTEN_BACKLOG = 1024


def family(host: str) -> socket.AddressFamily:
    """Return the address family to bind *host* with."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return socket.AF_INET6 if ":" in host else socket.AF_INET
    return infos[0][0] if infos else socket.AF_INET
