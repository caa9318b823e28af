"""``redis+sentinel://`` URLs: a client of the master a set of Redis Sentinels names.

The form is the one several Redis clients accept (redis-py itself has no Sentinel URL)::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db][?option=value...]
    rediss+sentinel://...     (TLS to the Sentinels and the master)

The hosts are the Sentinels (port 26379 when left out; IPv6 in brackets, ``[::1]:26379``),
``service_name`` the master's name in their ``sentinel monitor`` line, ``db`` its database (0). The
URL's user and password are the **master's** (AUTH on every connection to it, as in ``redis://``);
Sentinels that want a password of their own (``requirepass`` in sentinel.conf) get
``?sentinel_password=`` (and ``?sentinel_username=`` for an ACL user). Every other option is
redis-py's, as in ``redis://`` (``socket_timeout``, ``ssl_ca_certs``, ...), for the master's
connections; the ``socket_*`` and TLS ones are used for the Sentinels' too. A Sentinel that does
not answer is not tried again (redis-py's default would, with seconds of back-off, before asking
the next one: the usual case when a node dies with its master and its Sentinel), and the Sentinels'
socket timeouts are :data:`SENTINEL_TIMEOUT` unless the URL sets them.

The client is ``redis.asyncio.sentinel.Sentinel(...).master_for(service_name)``: its pool asks the
Sentinels for the master's address each time it opens a connection, so a connection that dropped
(the master died) or was told READONLY (it is a replica now) is opened again on the new master.
Closing it closes the Sentinels' clients too. :func:`sentinel_client_sync` builds the synchronous
twin (the Spark source).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError as SyncMasterNotFoundError
from redis.sentinel import Sentinel as SyncSentinel

from ..exceptions import ConfigurationError

__all__ = [
    "FORM",
    "SENTINEL_PORT",
    "SentinelUrl",
    "is_sentinel_url",
    "parse_sentinel_url",
    "sentinel_client",
    "sentinel_client_sync",
]

#: The URL's form, for error messages and docs.
FORM = "redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]"
#: A Sentinel's port when a host of the URL names none.
SENTINEL_PORT = 26379
#: The Sentinels' connect and reply timeouts (seconds) unless the URL's socket_* options say.
SENTINEL_TIMEOUT = 2.0
_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
#: Options of the URL that are the Sentinels' own, not the master's.
_SENTINEL_OPTIONS = {"sentinel_password": "password", "sentinel_username": "username"}


def is_sentinel_url(url: str) -> bool:
    """Whether ``url``'s scheme is ``redis+sentinel://`` or ``rediss+sentinel://`` (any case)."""
    return url[:19].lower().startswith(_SCHEMES)


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed ``redis+sentinel://`` URL: where the Sentinels are, the master's name and the
    keyword arguments of the master's connections and of the Sentinels'."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    master: dict[str, Any] = field(default_factory=dict)
    sentinel: dict[str, Any] = field(default_factory=dict)

    @property
    def db(self) -> int:
        return int(self.master.get("db", 0) or 0)


def _bad(url: str, why: str) -> ConfigurationError:
    # The caller (resolve_client) masks the password in what it shows; here the URL is not quoted.
    return ConfigurationError(f"{why}; a Sentinel URL reads {FORM} (rediss+sentinel:// for TLS)")


def _host(part: str, url: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` -> (host, port)."""
    if part.startswith("["):
        host, sep, rest = part[1:].partition("]")
        if not sep or not host or (rest and not rest.startswith(":")):
            raise _bad(url, f"cannot read the Sentinel address {part!r}")
        port_text = rest[1:] if rest else ""
    else:
        if part.count(":") > 1:
            raise _bad(url, f"the IPv6 Sentinel address {part!r} needs brackets: [{part}]")
        host, _, port_text = part.partition(":")
    if not host:
        raise _bad(url, f"a Sentinel address has no host: {part!r}")
    if not port_text:
        return host, SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _bad(url, f"the Sentinel port in {part!r} is not a port number")
    return host, int(port_text)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Read a ``redis+sentinel://`` URL (see the module); a URL that does not fit raises
    :class:`lbs.ConfigurationError` naming the expected form. No connection is made."""
    if not is_sentinel_url(url):
        raise _bad(url, "not a redis+sentinel:// or rediss+sentinel:// URL")
    scheme, _, rest = url.partition("://")
    tls = scheme.lower().startswith("rediss")
    rest, _, _fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts = netloc
    parts = [p.strip() for p in hosts.split(",")]
    if not hosts or any(not p for p in parts):
        raise _bad(url, "no Sentinel host:port")
    sentinels = tuple(_host(p, url) for p in parts)
    segments = path.split("/") if path else []
    if not segments or not segments[0]:
        raise _bad(url, "no service name (the master's name in the Sentinels' 'sentinel monitor')")
    if len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
        raise _bad(url, f"after the service name only a database number may follow, got /{path}")
    service, db = unquote(segments[0]), segments[1] if len(segments) == 2 else "0"

    options = parse_qsl(query, keep_blank_values=True)
    own = {_SENTINEL_OPTIONS[k.lower()]: v for k, v in options if k.lower() in _SENTINEL_OPTIONS}
    rest_options = [(k, v) for k, v in options if k.lower() not in _SENTINEL_OPTIONS]
    # redis-py reads (and checks) the master's options as it would for redis:// (rediss://).
    plain = f"{'rediss' if tls else 'redis'}://localhost/{db}"
    if rest_options:
        plain += "?" + urlencode(rest_options)
    try:
        master: dict[str, Any] = dict(parse_url(plain))
    except ValueError as exc:
        raise _bad(url, str(exc)) from None
    for k in ("host", "port", "connection_class"):
        master.pop(k, None)
    if at:
        user, colon, password = userinfo.partition(":")
        if user:
            master["username"] = unquote(user)
        if colon and password:
            master["password"] = unquote(password)
    if tls:
        master["ssl"] = True  # SentinelConnectionPool: SentinelManagedSSLConnection
    # The Sentinels: the socket and TLS settings of the master's, their own user and password.
    sentinel = {k: v for k, v in master.items() if k.startswith(("socket_", "ssl"))}
    sentinel.setdefault("socket_timeout", SENTINEL_TIMEOUT)
    sentinel.setdefault("socket_connect_timeout", SENTINEL_TIMEOUT)
    sentinel.update({k: unquote(v) for k, v in own.items() if v})
    return SentinelUrl(sentinels, service, master, sentinel)


def _to_front(sentinels: list[Any], sentinel: Any) -> None:
    """Move ``sentinel`` (by identity) to the front of ``sentinels``, the order the next
    discovery asks them in."""
    for i, each in enumerate(sentinels):
        if each is sentinel:
            sentinels.insert(0, sentinels.pop(i))
            return


def _master_address(sentinels: Any, state: Any, service: str) -> tuple[str, int] | None:
    """The master's address in ``state`` (a Sentinel's SENTINEL MASTERS entry for ``service``), or
    None when that Sentinel does not see it up (redis-py's ``check_master_state``)."""
    if not state or not sentinels.check_master_state(state, service):
        return None
    forced = sentinels._force_master_ip
    return (forced if forced is not None else state["ip"]), state["port"]


def _not_found(service: str, errors: list[str]) -> str:
    """redis-py's MasterNotFoundError message."""
    return f"No master found for {service!r}" + (f" : {', '.join(errors)}" if errors else "")


class _Sentinels(Sentinel):
    """redis-py's ``Sentinel`` whose master discovery holds when several run at once (every
    connection the master's pool opens while the master is away runs one).

    redis-py's ``discover_master`` walks the live list of the Sentinels' clients across awaits and
    then swaps the one that answered with the first *by the index it had* when it was asked: two
    discoveries at once (one moved it first) put one client in the list twice and drop another, which
    no discovery asks again and no ``aclose()`` closes (its connections were left to the garbage
    collector: "unclosed Connection" after a failover). This one asks them in the order the list had
    when it started and moves the one that answered to the front by identity; the rest, its error
    included, is redis-py's."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[str] = []
        for sentinel in list(self.sentinels):
            try:
                masters: Any = await sentinel.sentinel_masters()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                errors.append(f"{sentinel} - {exc!r}")
                continue
            address = _master_address(self, masters.get(service_name), service_name)
            if address is not None:
                _to_front(self.sentinels, sentinel)
                return address
        raise MasterNotFoundError(_not_found(service_name, errors))


class _SyncSentinels(SyncSentinel):
    """The synchronous :class:`_Sentinels` (threads sharing a client discover at once too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._order_lock = threading.Lock()

    def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[str] = []
        with self._order_lock:
            order = list(self.sentinels)
        for sentinel in order:
            try:
                masters: Any = sentinel.sentinel_masters()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                errors.append(f"{sentinel} - {exc!r}")
                continue
            address = _master_address(self, masters.get(service_name), service_name)
            if address is not None:
                with self._order_lock:
                    _to_front(self.sentinels, sentinel)
                return address
        raise SyncMasterNotFoundError(_not_found(service_name, errors))


class SentinelMaster(aioredis.Redis):
    """A client of the master named by a ``redis+sentinel://`` URL (``master_for``); closing it also
    closes the Sentinels' clients (it owns them)."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        try:
            await super().aclose(close_connection_pool)
        finally:
            if manager is not None:
                await manager.aclose()


class SyncSentinelMaster(redis.Redis):
    """The synchronous :class:`SentinelMaster`."""

    def close(self) -> None:
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        try:
            super().close()
        finally:
            for client in getattr(manager, "sentinels", ()):
                client.close()


def sentinel_client(url: str) -> aioredis.Redis:
    """A ``redis.asyncio`` client of the master ``url`` names (no I/O; the first command asks the
    Sentinels). The caller closes it (``aclose``), which closes the Sentinels' clients too."""
    parsed = parse_sentinel_url(url)
    once = {"retry": AsyncRetry(NoBackoff(), 0)}  # a silent Sentinel: ask the next one at once
    manager = _Sentinels(list(parsed.sentinels), sentinel_kwargs={**parsed.sentinel, **once})  # type: ignore[no-untyped-call]
    client = manager.master_for(parsed.service, redis_class=SentinelMaster, **parsed.master)
    # Make a connection now (no I/O) so that an option it does not take fails here.
    client.connection_pool.make_connection()
    return client  # type: ignore[no-any-return]


def sentinel_client_sync(url: str, **overrides: Any) -> redis.Redis:
    """The synchronous twin of :func:`sentinel_client` (``overrides``: the master's username,
    password, TLS files, as the Spark source's options give them)."""
    parsed = parse_sentinel_url(url)
    once = {"retry": Retry(NoBackoff(), 0)}
    manager = _SyncSentinels(list(parsed.sentinels), sentinel_kwargs={**parsed.sentinel, **once})
    master = {**parsed.master, **overrides}
    return manager.master_for(parsed.service, redis_class=SyncSentinelMaster, **master)  # type: ignore[no-untyped-call,no-any-return]
