"""How both servers of the surface and ``brooq-py dashboard`` listen: the address family of a host,
the accept backlog, the bound socket; here so that neither server module imports the other."""

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


def bound_socket(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """Return a TCP socket listening on (*host*, *port*); raise ``OSError``, the socket closed, if it cannot."""
    sock = socket.socket(family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock
