def test_a_server_is_named_by_what_it_is() -> None:
    """Valkey reports redis_version 7.2.4 (what it is compatible with) beside its own: it is named Valkey."""
    from lbs._redis.connection import server_name

    assert server_name({"redis_version": "8.6.3", "run_id": "x"}) == ("Redis", "8.6.3")
    assert server_name(
        {"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "9.0.1"}
    ) == ("Valkey", "9.0.1")
    assert server_name({"redis_version": "7.2.4", "server_name": "valkey"}) == (
        "Redis",
        "7.2.4",
    )  # no version
