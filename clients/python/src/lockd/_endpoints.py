"""Where a client connects and how: the endpoint list (argument or ``LOCKD_ENDPOINTS``) and the
TLS files (arguments or ``LOCKD_CA`` / ``LOCKD_CERT`` / ``LOCKD_KEY``).

Owns parsing and checking only; it dials nothing. Every mistake is an
:class:`lockd.InvalidArgument` naming what is wrong, raised before any connection is made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from lockd.errors import InvalidArgument

#: Environment variable with the endpoints when none are passed (comma-separated).
ENV_ENDPOINTS = "LOCKD_ENDPOINTS"
#: Environment variable with the PEM file of the CA that signed the servers' certificates.
ENV_CA = "LOCKD_CA"
#: Environment variable with the PEM file of this client's certificate (mutual TLS).
ENV_CERT = "LOCKD_CERT"
#: Environment variable with the PEM file of this client's private key (mutual TLS).
ENV_KEY = "LOCKD_KEY"

#: Most endpoints a client keeps. Hints add the leaders they name; a cluster has three to seven
#: nodes, so a longer list only grows from a bug or a hostile server.
ENDPOINTS_MAX = 64

_PORT_MAX = 65535


@dataclass(frozen=True)
class Endpoint:
    """One parsed endpoint: ``host:port`` and whether its spelling asked for TLS (``https://``),
    for plaintext (``http://``) or left it open (no scheme)."""

    addr: str
    scheme: Optional[str]


def parse_endpoint(raw: str) -> Endpoint:
    """``host:port`` from ``host:port``, ``http://host:port`` or ``https://host:port`` (a
    trailing ``/`` is allowed; an IPv6 host goes in brackets). Raises
    :class:`lockd.InvalidArgument` naming anything else."""
    if not isinstance(raw, str):
        raise InvalidArgument(f"endpoint {raw!r} is not a string")
    text = raw.strip()
    scheme: Optional[str] = None
    for prefix in ("http://", "https://"):
        if text.startswith(prefix):
            scheme = prefix[:-3]
            text = text[len(prefix):]
            break
    text = text.rstrip("/")
    if not text:
        raise InvalidArgument("endpoint must not be blank")
    if "://" in text or "/" in text or any(c.isspace() for c in text):
        raise InvalidArgument(f"endpoint {raw!r} is not host:port or http(s)://host:port")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= _PORT_MAX:
        raise InvalidArgument(f"endpoint {raw!r} is not host:port (a port 1-{_PORT_MAX} is required)")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise InvalidArgument(f"endpoint {raw!r}: an IPv6 host must be written in brackets")
    return Endpoint(addr=f"{host}:{int(port)}", scheme=scheme)


def parse_endpoints(endpoints: Union[Sequence[str], str, None]) -> List[Endpoint]:
    """The endpoints of ``endpoints`` — a list, or one comma-separated string — or, when it is
    ``None``, of ``LOCKD_ENDPOINTS``. Duplicates collapse. Raises
    :class:`lockd.InvalidArgument` for an empty list, a malformed entry, more than
    :data:`ENDPOINTS_MAX` entries, or a mix of ``http://`` and ``https://``."""
    if endpoints is None:
        endpoints = os.environ.get(ENV_ENDPOINTS, "")
        if not endpoints.strip():
            raise InvalidArgument(
                f"no endpoints given and {ENV_ENDPOINTS} is not set; pass host:port of a node"
            )
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    parsed: List[Endpoint] = []
    for item in items:
        if isinstance(item, str) and not item.strip() and isinstance(endpoints, str):
            continue  # "a:1,b:2," — a trailing comma in an environment variable is harmless.
        endpoint = parse_endpoint(item)
        if any(p.addr == endpoint.addr for p in parsed):
            continue
        parsed.append(endpoint)
    if not parsed:
        raise InvalidArgument("no endpoints given; pass at least one host:port")
    if len(parsed) > ENDPOINTS_MAX:
        raise InvalidArgument(f"more than {ENDPOINTS_MAX} endpoints")
    schemes = {p.scheme for p in parsed if p.scheme is not None}
    if len(schemes) > 1:
        raise InvalidArgument("endpoints mix http:// and https://; a client uses one or the other")
    return parsed


@dataclass(frozen=True)
class Tls:
    """The PEM bytes of a TLS configuration: the CA to trust (``None``: the system's roots) and
    an optional client certificate and key."""

    ca: Optional[bytes]
    cert: Optional[bytes]
    key: Optional[bytes]


def _read_pem(what: str, path: Optional[str], env: str) -> Optional[bytes]:
    if path is None:
        path = os.environ.get(env) or None
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as err:
        raise InvalidArgument(f"cannot read the {what} file {path!r} ({env}): {err}") from err


def tls_config(
    endpoints: Sequence[Endpoint],
    ca: Optional[str],
    cert: Optional[str],
    key: Optional[str],
) -> Optional[Tls]:
    """The TLS configuration to use, or ``None`` for plaintext. Each file comes from its argument
    or else its environment variable. TLS is used when an endpoint says ``https://`` or any file
    is given; ``http://`` endpoints with TLS files, or a certificate without its key (or the
    reverse), raise :class:`lockd.InvalidArgument`."""
    ca_pem = _read_pem("CA", ca, ENV_CA)
    cert_pem = _read_pem("certificate", cert, ENV_CERT)
    key_pem = _read_pem("key", key, ENV_KEY)
    if (cert_pem is None) != (key_pem is None):
        raise InvalidArgument(
            f"a client certificate needs its key and a key its certificate "
            f"(cert/{ENV_CERT} and key/{ENV_KEY} go together)"
        )
    wants_tls = any(e.scheme == "https" for e in endpoints)
    has_files = ca_pem is not None or cert_pem is not None
    if has_files and any(e.scheme == "http" for e in endpoints):
        raise InvalidArgument("TLS files are given but the endpoints say http://; use https://")
    if not wants_tls and not has_files:
        return None
    return Tls(ca=ca_pem, cert=cert_pem, key=key_pem)
