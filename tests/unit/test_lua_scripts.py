"""Lua scripts: file names carry the key count their headers document (``n``: a variable count of
keys or arguments); each has one builder and one caller."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import lbs
from _lbscore import CommandBatch
from lbs._redis import scripts

LUA = Path(scripts.__file__).parent / "lua"
SRC = Path(scripts.__file__).parents[1]
NAMES = [s.name for s in scripts.SCRIPTS]


def _header(name: str) -> str:
    return (LUA / f"{name}.lua").read_text().split("]]", 1)[0]


@pytest.mark.parametrize("name", NAMES)
def test_header_matches_the_file_name(name: str) -> None:
    header = _header(name)
    assert header.startswith("--[["), "each script opens with a header comment"
    assert "Output" in header and ("ARGV[1]" in header or "No ARGV" in header)
    count = name.rsplit("-", 1)[1]
    keys = re.findall(r"KEYS\[(\d+)(?:\.\.[^\]]*)?\]", header)
    if count == "n":
        # done-n and extend-n kept their names under the lease (issue 44): two and three keys now,
        # their arguments varying with the entries.
        assert re.search(r"(?:KEYS|ARGV)\[\d+\.\.", header), "a variable count is a range"
    else:
        assert max(map(int, keys)) == int(count)


def test_every_script_file_is_registered() -> None:
    """Scripts are named <name>-<keys>.lua; a shared part (``_fence.lua``) is only ever included."""
    assert sorted(p.stem for p in LUA.glob("*.lua") if not p.stem.startswith("_")) == sorted(NAMES)


@pytest.mark.parametrize(
    ("part", "users"),
    [
        ("_fence", {"read-3", "fence-1"}),
        ("_names", {"done-n", "release-1", "names-1", "requeue-6", "promote-4"}),
        ("_acl", {"publish-1", "fetch-1", "commit-1", "promote-4"}),
        ("_keyed", {"fetch-1", "commit-1"}),
        ("_publish", {"publish-1", "promote-4"}),
        (
            "_checks",
            set(NAMES) - {"done-n", "release-1", "names-1", "fence-1", "leave-3", "fetch-1"},
        ),
        ("_time", set(NAMES) - {"fetch-1", "leave-3", "read-3"}),
    ],
)
def test_an_include_is_replaced_by_the_shared_part(part: str, users: set[str]) -> None:
    text = (LUA / f"{part}.lua").read_text().rstrip("\n")
    including = [
        s for s in scripts.SCRIPTS if f"--#include {part}\n" in (LUA / f"{s.name}.lua").read_text()
    ]
    assert {s.name for s in including} == users
    for s in including:
        assert text in s.source and not re.search(r"^--#include", s.source, re.MULTILINE)


def _args(build: object) -> list[bytes]:
    """The arguments of the one command ``build(batch)`` writes (decoded from its RESP)."""
    b = CommandBatch()
    build(b)  # type: ignore[operator]
    raw = b.getvalue()
    parts = raw.split(b"\r\n")
    assert parts[0].startswith(b"*") and len(b) == 1
    return [parts[i] for i in range(2, 2 * int(parts[0][1:]) + 1, 2)]


_FIXED = {
    "read-3": lambda b: scripts.read(b, "s", "f", "{s}:lease:me", "g", "me", 10, "x", "t"),
    "promote-4": lambda b: scripts.promote(
        b, "z", "p", "s", "w", batch=100, group="g", key_prefix="{s}:"
    ),
    "reap-3": lambda b: scripts.reap(
        b,
        "c",
        "s",
        "r",
        group="g",
        lease_prefix="{s}:lease:",
        batch=10,
        stall_ms=1000,
        grace_ms=1000,
        tokens_prefix="{s}:tokens:",
    ),
    "leave-3": lambda b: scripts.leave(
        b, "k", "s", "c", instance="nonce", group="g", consumer="me", tokens_prefix="{s}:tokens:"
    ),
}


@pytest.mark.parametrize("name", sorted(_FIXED))
def test_a_builder_writes_what_the_header_documents(name: str) -> None:
    """EVALSHA <sha of the file> <keys from the name> KEYS... ARGV... with as many ARGV as the header lists."""
    args = _args(_FIXED[name])
    script = next(s for s in scripts.SCRIPTS if s.name == name)
    assert args[0] == b"EVALSHA" and args[1].decode() == script.sha
    assert int(args[2]) == script.numkeys
    # Another script's argument named in passing ("read-3.lua's ARGV[5]") is not this one's.
    documented = max(int(n) for n in re.findall(r"(?<!'s )ARGV\[(\d+)\]", _header(name)))
    assert len(args) - 3 - int(args[2]) == documented


def test_requeue_writes_its_options_once_and_five_args_per_entry_then_its_fields() -> None:
    """ARGV[1] the packed switches (the header's eleven, in its order), ARGV[2..8] per call (the
    header's last fixed ARGV is 8), then per entry: id, reason, jitter, name, n and n field pairs."""
    options = scripts.requeue_options(
        group="g",
        max_retries=3,
        retry_field="_r",
        original_field="_o",
        consumer="mé",
        dead_letter_on=True,
        field_prefix="_",
        key_prefix="{s}:",
    )
    assert json.loads(options) == ["g", 3, "_r", "_o", "mé", 1, "_", "", "", "{s}:", 0]
    header = _header("requeue-6")
    assert len(re.findall(r"^ {13}\[(\d+)\]", header, re.MULTILINE)) == 11
    args = _args(
        lambda b: scripts.requeue(
            b,
            "s",
            "d",
            "l",
            "p",
            "z",
            "q",
            options=options,
            mode="owned",
            value="v",
            count_retry=True,
            force_dead_letter=False,
            delay=scripts.RetryDelay(1000, 300_000),
            entries=[
                scripts.RequeueEntry("1-1", "why", 0.75),
                scripts.RequeueEntry("2-2", "", 1.0, "name", ("k", "v")),
            ],
        )
    )
    assert args[1].decode() == scripts.REQUEUE.sha and args[2] == b"6"
    fixed = max(int(n) for n in re.findall(r"ARGV\[(\d+)\](?!…)", header))
    assert fixed == 8 and args[9] == options.encode()
    assert args[9 + fixed :] == [
        *(b"1-1", b"why", b"0.75", b"", b"0"),
        *(b"2-2", b"", b"1.0", b"name", b"1", b"k", b"v"),
    ]


def test_done_writes_the_lease_and_args_per_entry() -> None:
    """KEYS the LBS and our lease; the names go as their holder keys ("" for an entry without one),
    built by the core."""
    args = _args(
        lambda b: scripts.done(
            b, "s", "{s}:lease:me", ["1-1", "2-2"], ["a", "b"], "g", "me", "x", "{s}:", True, False
        )
    )
    assert args[1].decode() == scripts.DONE.sha
    assert args[2:] == [
        b"2",
        b"s",
        b"{s}:lease:me",
        b"g",
        b"1",
        b"0",
        b"{s}:",
        b"me",
        b"x",
        b"0",
        b"1-1",
        b"2-2",
        b"{s}:name:a",
        b"{s}:name:b",
    ]


def test_done_writes_an_empty_name_as_an_empty_argument_and_names_as_they_are_without_a_prefix() -> (
    None
):
    with_prefix = _args(
        lambda b: scripts.done(
            b, "s", "l", ["1-1", "2-2"], ["a", ""], "g", "me", "x", "{s}:", True, False
        )
    )
    assert with_prefix[-2:] == [b"{s}:name:a", b""]
    without = _args(
        lambda b: scripts.done(b, "s", "l", ["1-1"], ["a"], "g", "me", "x", "", True, False)
    )
    assert without[-1:] == [b"a"]


def test_done_codes_reads_one_digit_per_entry() -> None:
    assert scripts.done_codes(b"1253") == [1, 2, 5, 3]
    assert scripts.done_codes(b"") == []
    with pytest.raises(TypeError):
        scripts.done_codes([1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        scripts.done_codes(b"1x")


#: How the code names each script's builder.
_CALLS = {
    "read-3": "scripts.read(",
    "extend-n": "beat.extend(",
    "done-n": "scripts.done(",
    "release-1": "scripts.release(",
    "names-1": "reads.names(",
    "fence-1": "reads.floor(",
    "requeue-6": "scripts.requeue(",
    "promote-4": "scripts.promote(",
    "reap-3": "scripts.reap(",
    "leave-3": "scripts.leave(",
    "publish-1": "scripts.publish_args(",
    "fetch-1": "scripts.fetch(",
    "commit-1": "scripts.commit(",
}
#: Scripts called from outside the consumer: where from.
_OUTSIDE = {"publish-1": "publisher.py"}


@pytest.mark.parametrize("name", NAMES)
def test_every_script_has_exactly_one_caller_module(name: str) -> None:
    callers = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.name != "scripts.py" and _CALLS[name] in p.read_text()
    )
    assert len(callers) == 1, callers
    assert callers[0] == _OUTSIDE[name] if name in _OUTSIDE else callers[0].startswith("_consumer/")


def test_done_beside_a_go_fleet_sets_the_go_flag_and_puts_the_go_lock_keys_last() -> None:
    args = _args(
        lambda b: scripts.done(
            b,
            "s",
            "{s}:lease:me",
            ["1-1", "2-2"],
            ["a", "b"],
            "g",
            "me",
            "x",
            "{s}:",
            True,
            False,
            ["a<MUTEX_KEY_SEP>1-1", "b<MUTEX_KEY_SEP>2-2"],
        )
    )
    assert args[2:] == [
        b"2",
        b"s",
        b"{s}:lease:me",
        b"g",
        b"1",
        b"0",
        b"{s}:",
        b"me",
        b"x",
        b"1",
        b"1-1",
        b"2-2",
        b"{s}:name:a",
        b"{s}:name:b",
        b"a<MUTEX_KEY_SEP>1-1",
        b"b<MUTEX_KEY_SEP>2-2",
    ]


def test_requeue_replies_reads_each_entry_and_fails_only_a_misshapen_one() -> None:
    replies = scripts.requeue_replies(
        [
            [1, b"2-2", b'{"DataStreamName":"a","Info":{}}', 3],
            [4, b"3-3", b"not json", 1, 1500],
            [0, b"lock"],
            [9, b"what"],
            [1],
        ]
    )
    assert replies[:3] == [
        scripts.Requeued(scripts.RequeueCode.REQUEUED, "2-2", "a", 3),
        scripts.Requeued(scripts.RequeueCode.PARKED, "3-3", "", 1, 1500),
        scripts.Requeued(scripts.RequeueCode.SKIPPED, "lock"),
    ]
    assert all(isinstance(r, lbs.InternalError) for r in replies[3:])


def test_reap_reply_matches_holders_to_the_entries_they_held() -> None:
    found = [[b"dead-1", b"dead-2"], [b"dead-1", b"1700000000123", b"dead-2", b"17e11"]]
    # Each gone entry's holder, in their order, then each holder's deadline.
    reaped = scripts.reap_reply([[b"1-0", b"2-0"], 1500, b"1700000000999", *found])
    assert reaped.held == {"1-0": ("dead-1", "1700000000123"), "2-0": ("dead-2", "1700000000000")}
    assert (reaped.next_due, reaped.stamp) == (1.5, b"1700000000999")
    # The idle reply (nothing due, the index empty): no holders.
    assert scripts.reap_reply([[], -1, b"1"]) == scripts.Reaped({}, None, b"1")
    with pytest.raises(ValueError):
        scripts.reap_reply([[], -1])


def test_promote_and_leave_replies_are_read_by_their_readers() -> None:
    assert scripts.promote_reply([3, 1, 250, 0, 2]) == scripts.Promoted(3, 1, 0.25, 0, 2)
    assert scripts.promote_reply([0, 0, -1, 0, 0]).next_due is None
    assert scripts.leave_reply([1, 0]) == scripts.Left(True, 0)
    for bad in ([1, 2, 3], [1]):
        with pytest.raises(ValueError):
            scripts.promote_reply(bad)
        with pytest.raises(ValueError):
            scripts.leave_reply(bad)
