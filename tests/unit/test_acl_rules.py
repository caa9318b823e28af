"""Reading the rule an ACL denial asks for out of Redis's NOPERM replies (lbs._redis.acl)."""

from __future__ import annotations

import pytest
from redis.exceptions import NoPermissionError, ResponseError

from lbs import RedisOperationError
from lbs._redis.acl import denied_rule


@pytest.mark.parametrize(
    "exc, rule",
    [
        (NoPermissionError("User u has no permissions to run the 'xlen' command"), "+xlen"),
        (
            ResponseError("NOPERM User u has no permissions to run the 'xinfo|groups' command"),
            "+xinfo|groups",
        ),
        (
            ResponseError(
                "NOPERM lbs commit-1: the ACL does not allow ZADD {s-input}:idfloor GT 0 ms"
            ),
            "+zadd",
        ),
        (NoPermissionError("No permissions to access a key"), "~<the service's key patterns>"),
        (
            NoPermissionError("No permissions to access a channel"),
            "&<the service's keyspace channel>",
        ),
        (
            RedisOperationError(
                "count", NoPermissionError("User u has no permissions to run the 'xlen' command")
            ),
            "+xlen",
        ),
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), None),
        (RedisOperationError("count", ResponseError("ERR no such key")), None),
        (ValueError("NOPERM-looking text in another error"), None),
    ],
)
def test_the_rule_a_denial_asks_for(exc: BaseException, rule: str | None) -> None:
    assert denied_rule(exc) == rule
