"""The port a serving command listens on (`replay --web`, `serve`), checked before anything is
announced: a number outside 1-65535 or a port already taken is one line (a ValueError, which
the command line prints with exit 2), never a banner for a port that is not the one served.

    check_port(port) -> port                       ValueError unless 1 <= port <= 65535
    listen_sockets(host, port) -> [socket, ...]    bound and listening on every address of host

Hand the sockets to the server (aiohttp's run_app(sock=...), uvicorn's Server.serve(sockets=...)):
the port is taken once, here, so no other program can take it between the check and the banner.
"""

from __future__ import annotations

import errno
import socket

from tracer.i18n import _

MAX_PORT = 65535
BACKLOG = 128


def check_port(port: int) -> int:
    if not 1 <= port <= MAX_PORT:
        raise ValueError(
            _("--port {port} is not a port number: choose one from 1 to {max} (e.g. 8000)").format(
                port=port, max=MAX_PORT
            )
        )
    return port


def listen_sockets(host: str, port: int) -> list[socket.socket]:
    """A listening socket on each address host names (localhost: 127.0.0.1 and ::1 where IPv6 is
    on). An address this machine lacks is skipped; a port in use anywhere is a ValueError."""
    check_port(port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(_("cannot listen on {host}: {error}").format(host=host, error=e.strerror)) from None
    addresses = {(family, address): (family, kind, proto) for family, kind, proto, _name, address in infos}
    sockets: list[socket.socket] = []
    for (family, address), (_family, kind, proto) in addresses.items():
        try:
            sockets.append(bound_socket(family, kind, proto, address))
        except OSError as e:
            if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                continue  # e.g. ::1 in a container without IPv6
            for s in sockets:
                s.close()
            raise ValueError(port_problem(host, port, e)) from None
    if not sockets:
        raise ValueError(
            _("cannot listen on {host}:{port}: no address of {host} can be used on this machine").format(
                host=host, port=port
            )
        )
    return sockets


def bound_socket(family: int, kind: int, proto: int, address: tuple) -> socket.socket:
    s = socket.socket(family, kind, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: a port in TIME_WAIT is free
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(address)
        s.listen(BACKLOG)
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


def port_problem(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return _(
            "port {port} on {host} is in use (another server, or an earlier run still going): stop it, or choose "
            "another port with --port N"
        ).format(port=port, host=host)
    if e.errno == errno.EACCES:
        return _(
            "port {port} on {host} needs more rights than this user has: choose one above 1023 with --port N"
        ).format(port=port, host=host)
    return _("cannot listen on {host}:{port}: {error}").format(host=host, port=port, error=e.strerror)
