"""``redis+sentinel://`` URLs: what is parsed out of them, what is refused (naming the form), what
is masked, and the clients made from them (no server: nothing connects until the first command)."""

from __future__ import annotations

import pytest
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.sentinel import SentinelConnectionPool as SyncSentinelConnectionPool

import lbs
from lbs._redis.connection import resolve_client
from lbs._redis.sentinel import (
    FORM,
    SENTINEL_TIMEOUT,
    SentinelMaster,
    SyncSentinelMaster,
    is_sentinel_url,
    parse_sentinel_url,
)
from lbs._urlmask import mask_secrets, mask_url


def test_hosts_ports_service_and_db() -> None:
    u = parse_sentinel_url("redis+sentinel://s1:26380,s2,[::1]:26381,[fe80::1]/orders-master/3")
    assert u.sentinels == (("s1", 26380), ("s2", 26379), ("::1", 26381), ("fe80::1", 26379))
    assert u.service == "orders-master" and u.db == 3
    assert "password" not in u.master and "password" not in u.sentinel
    assert parse_sentinel_url("redis+sentinel://h:1/m").db == 0


def test_the_urls_password_is_the_masters_and_sentinel_password_the_sentinels() -> None:
    u = parse_sentinel_url(
        "redis+sentinel://app:p%40ss@h:1/m?sentinel_password=sp&socket_timeout=2.5"
    )
    assert (u.master["username"], u.master["password"]) == ("app", "p@ss")
    # socket_* shared (the connect timeout SENTINEL_TIMEOUT unless given), not AUTH
    assert u.sentinel == {"password": "sp", "socket_timeout": 2.5, "socket_connect_timeout": 2.0}
    assert u.master["socket_timeout"] == 2.5 and "sentinel_password" not in u.master
    only_password = parse_sentinel_url("redis+sentinel://:pw@h:1/m")
    assert only_password.master["password"] == "pw" and "username" not in only_password.master
    acl = parse_sentinel_url("redis+sentinel://h:1/m?sentinel_username=watch&sentinel_password=x")
    assert (acl.sentinel["username"], acl.sentinel["password"]) == ("watch", "x")
    assert acl.sentinel["socket_timeout"] == SENTINEL_TIMEOUT


def test_rediss_means_tls_to_the_master_and_the_sentinels() -> None:
    u = parse_sentinel_url("rediss+sentinel://h:1/m?ssl_cert_reqs=none")
    assert u.master["ssl"] is True and u.sentinel["ssl"] is True
    assert u.master["ssl_cert_reqs"] == u.sentinel["ssl_cert_reqs"] == "none"
    assert is_sentinel_url("REDISS+SENTINEL://h/m") and not is_sentinel_url("redis://h:1")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://h1:26379", "no service name"),
        ("redis+sentinel://h1:26379,h2:26379/", "no service name"),
        ("redis+sentinel:///m", "no Sentinel host:port"),
        ("redis+sentinel://h1,,h2/m", "no Sentinel host:port"),
        ("redis+sentinel://::1/m", "needs brackets: [::1]"),
        ("redis+sentinel://[::1/m", "cannot read the Sentinel address"),
        ("redis+sentinel://h:0/m", "not a port number"),
        ("redis+sentinel://h:x/m", "not a port number"),
        ("redis+sentinel://h/m/x", "only a database number"),
        ("redis+sentinel://h/m/1/2", "only a database number"),
    ],
)
def test_a_url_that_does_not_fit_names_the_form(url: str, why: str) -> None:
    with pytest.raises(lbs.ConfigurationError) as info:
        parse_sentinel_url(url)
    assert why in str(info.value) and FORM in str(info.value)
    with pytest.raises(lbs.ConfigurationError) as info:  # the library's entry point says the same
        resolve_client(url)
    assert why in str(info.value) and url in str(info.value)


def test_an_unknown_option_and_a_cluster_are_refused_with_the_password_masked() -> None:
    with pytest.raises(lbs.ConfigurationError) as info:
        resolve_client("redis+sentinel://:hunter22@h:1/m?sentinel_password=s3cret1&bogus=1")
    text = str(info.value)
    assert "bogus" in text and "hunter22" not in text and "s3cret1" not in text
    with pytest.raises(lbs.ConfigurationError, match="one master, not a cluster"):
        resolve_client("redis+sentinel://h:1/m", cluster=True)


def test_masking() -> None:
    url = (
        "redis+sentinel://app:hunter22@s1:1,[::1]:2/m/0?sentinel_password=s3cret1&socket_timeout=1"
    )
    assert mask_url(url) == (
        "redis+sentinel://app:***@s1:1,[::1]:2/m/0?sentinel_password=***&socket_timeout=1"
    )
    assert mask_secrets(url, "AUTH hunter22 then s3cret1") == "AUTH *** then ***"
    assert mask_url("rediss+sentinel://:pw@h/m") == "rediss+sentinel://:***@h/m"


async def test_resolve_client_opens_a_master_for_client_lbs_owns() -> None:
    client, owned = resolve_client("redis+sentinel://:pw@h1:1,h2:2/orders/2")
    try:
        assert owned and isinstance(client, SentinelMaster)
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "orders"
        assert pool.connection_kwargs["db"] == 2 and pool.connection_kwargs["password"] == "pw"
        sentinels = pool.sentinel_manager.sentinels
        assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [1, 2]
        # A Sentinel that does not answer is not retried: the next one is asked at once.
        assert all(s.get_retry().get_retries() == 0 for s in sentinels)
    finally:
        await client.aclose()  # closes the Sentinels' clients too; no I/O was ever done


def test_spark_options_take_a_sentinel_url() -> None:
    # The unit matrix (scripts/matrix.sh) has no pyspark: lbs.spark needs the [spark] extra.
    pytest.importorskip("pyspark", reason="lbs.spark needs pyspark (the [spark] extra)")
    from lbs.spark._options import Connection

    with pytest.raises(lbs.ConfigurationError, match="one master, not a cluster"):
        Connection.parse({"url": "redis+sentinel://h:1/m", "cluster": "oss"})
    conn = Connection.parse(
        {"url": "redis+sentinel://:inurl@h:1/m/1?sentinel_password=s3cret1", "password": "opt"}
    )
    assert not conn.cluster and "s3cret1" not in repr(conn) and "inurl" not in repr(conn)
    client = conn.client()
    try:
        assert isinstance(client, SyncSentinelMaster)
        pool = client.connection_pool
        assert isinstance(pool, SyncSentinelConnectionPool) and pool.service_name == "m"
        assert pool.connection_kwargs["password"] == "opt"  # the option wins over the URL's
        assert pool.connection_kwargs["db"] == 1
    finally:
        client.close()
    with pytest.raises(lbs.ConfigurationError, match="no service name"):
        Connection.parse({"url": "redis+sentinel://h:1"})
