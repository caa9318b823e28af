"""A ``redis`` URL lbs cannot use is a ConfigurationError naming it, with the password masked."""

from __future__ import annotations

import pytest

import lbs


@pytest.mark.parametrize(
    "url, shown",
    [
        ("not-a-url", "'not-a-url'"),
        ("http://x", "'http://x'"),
        ("", "''"),
        ("redis://127.0.0.1:notaport", "notaport"),
        ("redis://127.0.0.1:6379?socket_timeout=abc", "socket_timeout"),
        (
            "redis://127.0.0.1:6379?no_such_option=1",
            "no_such_option",
        ),  # plain: fails here, not at first use
        ("redis+cluster://127.0.0.1:6379?no_such_option=1", "no_such_option"),
        ("redis://[::1", "Invalid IPv6"),
    ],
)
@pytest.mark.parametrize(
    "make",
    [
        lambda url: lbs.Producer(url, "svc"),
        lambda url: lbs.Client(url, "svc", consumer_id="c", load_entrypoint_plugins=False),
    ],
)
def test_a_bad_url_is_a_configuration_error(url: str, shown: str, make: object) -> None:
    with pytest.raises(lbs.ConfigurationError, match="invalid Redis URL") as info:
        make(url)  # type: ignore[operator]
    assert shown in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "url, secret, masked",
    [
        (
            "redis://user:hunter2pw@127.0.0.1:notaport",
            "hunter2pw",
            "redis://user:***@127.0.0.1:notaport",
        ),
        ("redis://:hunter2pw@127.0.0.1:hunter2pw", "hunter2pw", "redis://:***@127.0.0.1:"),
        ("http://:hunter2pw@x", "hunter2pw", "http://:***@x"),
        ("redis://127.0.0.1?password=hunter2pw&socket_timeout=x", "hunter2pw", "password=***&"),
        ("user:hunter2pw@x", "hunter2pw", "user:***@x"),
    ],
)
def test_the_password_is_masked(url: str, secret: str, masked: str) -> None:
    with pytest.raises(lbs.ConfigurationError) as info:
        lbs.Producer(url, "svc")
    assert secret not in str(info.value) and masked in str(info.value)
    assert (
        info.value.__cause__ is None and info.value.__suppress_context__
    )  # redis-py's error could show it


def test_a_good_url_opens_no_connection() -> None:
    producer = lbs.Producer(
        "redis://127.0.0.1:1/0?socket_timeout=2", "svc"
    )  # nothing listens on port 1
    assert producer.stream == "svc-input"


def test_cluster_must_be_a_bool_or_a_cluster_mode() -> None:
    with pytest.raises(
        lbs.ConfigurationError, match=r"cluster must be a bool or an lbs\.ClusterMode, got 'oss'"
    ):
        lbs.Producer("redis://127.0.0.1:1", "svc", cluster="oss")  # type: ignore[arg-type]
