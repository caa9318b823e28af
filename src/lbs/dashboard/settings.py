"""What one ``lbs dashboard`` serves and how: the services, the Redis URL, the bind address, whether
actions (replay, purge) are on, the token that guards it and the live refresh."""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from dataclasses import dataclass, field

from .. import _keys
from .._urlmask import mask_url
from ..config import Config
from ..exceptions import ConfigurationError

__all__ = ["DashboardSettings", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def session_key(token: str) -> str:
    """The key that signs session cookies, derived from the operator's token (one-way: the cookie
    key never reveals the token)."""
    return hashlib.sha256(b"lbs-dashboard-session\0" + token.encode()).hexdigest()


@dataclass(frozen=True)
class DashboardSettings:
    """One dashboard: checked when made (a bad setting raises :class:`lbs.ConfigurationError`).

    ``services`` are service names as the workers were given them; with ``shards`` above 1 each is
    shown as its shards (``orders.0~j`` ...: :func:`lbs.shard_services`), the overview with each
    shard's slot and master and the legacy shards that still exist. A ``token`` guards every page and action (a login form
    sets a signed session cookie; scripts send ``Authorization: Bearer TOKEN``); ``actions`` without
    a token gets a fresh one (:attr:`token_generated`). A host that is not loopback needs a token.
    """

    url: str
    services: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8787
    actions: bool = False
    token: str | None = None
    #: Seconds between two live snapshots (one Redis read per interval, shared by every open page).
    refresh: float = 2.0
    shards: int = 1
    #: Field prefix and dead-letter stream of the services (the workers' ``Config``).
    config: Config = field(default_factory=Config)
    #: Signs the session cookie. Default: derived from a token given by the operator, so every
    #: replica with that token accepts the others' sessions and a restart logs nobody out (a new
    #: token does); fresh per process with a generated token or none.
    secret_key: str = field(default="", repr=False)
    token_generated: bool = False

    def __post_init__(self) -> None:
        if not self.secret_key:
            if self.token and not self.token_generated:
                key = session_key(self.token)
            else:
                key = secrets.token_urlsafe(32)
            object.__setattr__(self, "secret_key", key)
        if not self.services:
            raise ConfigurationError("name at least one service")
        for service in self.services:
            _keys.validate_service(service)
        _keys.check_shards(self.shards)
        if not self.refresh > 0:
            raise ConfigurationError(f"refresh must be > 0 seconds, got {self.refresh!r}")
        if self.token is not None and len(self.token) < 8:
            raise ConfigurationError("the token must have at least 8 characters")
        if not is_loopback(self.host) and not self.token:
            raise ConfigurationError(
                f"binding {self.host} (not loopback) serves the fleet's data to the network: "
                "give a token (--token or LBS_DASHBOARD_TOKEN)"
            )

    @classmethod
    def make(
        cls, url: str, services: list[str] | tuple[str, ...], **kw: object
    ) -> DashboardSettings:
        """Settings with a token generated when actions are on and none was given."""
        if kw.get("actions") and not kw.get("token"):
            kw["token"] = secrets.token_urlsafe(18)
            kw["token_generated"] = True
        return cls(url, tuple(services), **kw)  # type: ignore[arg-type]

    @property
    def shown_services(self) -> tuple[str, ...]:
        """Every service the pages show: each of :attr:`services`, or each of its shards."""
        return tuple(s for svc in self.services for s in _keys.shard_services(svc, self.shards))

    @property
    def masked_url(self) -> str:
        """The Redis URL fit to show: its password replaced by ``***``."""
        return mask_url(self.url)

    @property
    def guarded(self) -> bool:
        """Whether every page needs the token."""
        return bool(self.token)
