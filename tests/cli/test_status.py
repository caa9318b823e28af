"""``lbs status`` / :func:`lbs.status.collect_status` and ``lbs claim``, on real servers (8.x and 7.0)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys
from lbs.status import collect_status
from lbs.testing import abandon

from _helpers import client, eventually, produce, take

# rr is a fixture.
from _pty import app_argv, flat, invoke, rr, watched  # noqa: F401

pytestmark = pytest.mark.integration


async def kill(c: lbs.Client) -> None:
    """A started client ends as a crash would (lbs.testing.abandon): its locks and marker lapse."""
    await abandon(c)


async def consumer_state(url: str, service: str, name: str) -> str:
    st = await collect_status(url, service)
    return next((c.state for c in st.consumers if c.name == name), "")


class Scene:
    """A service whose janitor dead-lettered two malformed entries and left the group (a clean close with
    nothing pending), a departed consumer (gone without closing, nothing held), a live consumer holding two
    streams (one handed back once with a retry), a dead one holding one, and three entries waiting."""

    def __init__(self, url: str, service: str) -> None:
        self.url, self.service = url, service
        self.ids: dict[str, str] = {}

    async def __aenter__(self) -> Scene:
        url, service = self.url, self.service
        r = aioredis.Redis.from_url(url)
        lbs_key = _keys.input_stream(service)
        await r.xgroup_create(lbs_key, _keys.group_name(service), id="0", mkstream=True)
        await r.xadd(lbs_key, {"lbs-input": "{not json"})
        await r.xadd(lbs_key, {"lbs-input": '{"Info":{}}'})
        janitor = client(url, service, "janitor", recovery=False)
        await janitor.start()
        await eventually(lambda: _len_is(r, _keys.dead_letter_stream(service), 2))
        await janitor.close()
        await r.xgroup_createconsumer(lbs_key, _keys.group_name(service), "redis-consumer-gone")
        for name, entry_id in zip("abcdef", await produce(url, service, *"abcdef")):
            self.ids[name] = entry_id
        # Nobody recovers here (recovery=False everywhere): the dead consumer's stream stays where it is.
        self.live = client(url, service, "live", recovery=False, max_streams=2, retry_delay=0.0)
        await self.live.start()
        assert sorted(n.stream for n in await take(self.live, 2)) == ["a", "b"]
        self.dying = client(url, service, "dying", recovery=False, max_streams=1, lock_ttl=0.5)
        await self.dying.start()
        assert [n.stream for n in await take(self.dying, 1)] == ["c"]
        await kill(self.dying)
        # a comes back as a fresh entry with a retry counted; the live consumer takes d in its place.
        self.ids["a'"] = await self.live.hand_back("a", count_retry=True, reason="test")
        assert [n.stream for n in await take(self.live, 1)] == ["d"]
        await eventually(lambda: _is(consumer_state(url, service, self.dying.id), "dead"))
        await r.aclose()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.live.close()
        await self.dying.close()  # does nothing more: it is dead


async def _len_is(r: aioredis.Redis, key: str, n: int) -> bool:
    return bool(await r.xlen(key) == n)


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


# -------------------------------------------------------------- collect_status ---


async def test_collect_status_counts_exactly(any_server: Any, service: str) -> None:
    async with Scene(any_server.url, service) as scene:
        st = await collect_status(any_server.url, service)
        ids = scene.ids
        assert st.exists and st.group_exists
        # Valkey by its own version, not the Redis one it answers as
        assert f"{st.server_name} {st.server_version}" == any_server.name
        assert (st.length, st.backlog, st.pending) == (6, 3, 3)  # b, c, d pending; e, f, a' waiting
        assert st.backlog_exact and st.backlog_method in ("lag", "counted")
        assert st.oldest_waiting is not None and st.oldest_waiting.id == ids["e"]
        assert st.oldest_waiting.age_ms >= 0
        assert st.oldest_pending is not None
        assert (st.oldest_pending.id, st.oldest_pending.consumer) == (ids["b"], scene.live.id)
        assert st.oldest_pending.deliveries == 1
        assert st.requeued.to_dict() == {
            "looked_at": 3,
            "complete": True,
            "requeued": 1,
            "retried": 1,
            "replayed": 0,
        }
        by_name = {c.name: c for c in st.consumers}
        assert set(by_name) == {
            scene.live.id,
            scene.dying.id,
            "redis-consumer-gone",
        }  # the janitor left
        live, dying, gone = (
            by_name[scene.live.id],
            by_name[scene.dying.id],
            by_name["redis-consumer-gone"],
        )
        assert (live.state, live.pending) == ("alive", 2)
        assert live.deadline_ms is not None and live.deadline_ms > 0
        assert live.lease_ttl_ms is not None and live.lease_ttl_ms > 0
        assert (dying.state, dying.pending, dying.lease_ttl_ms) == ("dead", 1, None)
        assert dying.deadline_ms is not None and dying.deadline_ms <= 0
        assert (gone.state, gone.pending, gone.lease_ttl_ms) == ("departed", 0, None)
        assert [c.name for c in st.consumers] == [
            scene.live.id,
            scene.dying.id,
            "redis-consumer-gone",
        ]
        # What each holds, with the token it holds it under (a dead holder's too: its records stay
        # until recovery takes its streams) and age.
        assert [(h.stream, h.entry_id) for h in live.held] == [("b", ids["b"]), ("d", ids["d"])]
        assert all(h.token is not None and h.token > 0 and h.age_ms >= 0 for h in live.held)
        assert [h.stream for h in dying.held] == ["c"]
        assert dying.held[0].token is not None and dying.held[0].token > 0
        assert gone.held == ()
        assert (st.count("alive"), st.count("late"), st.count("dead"), st.count("departed")) == (
            1,
            0,
            1,
            1,
        )
        if any_server.version >= (7, 2):
            assert live.inactive_ms is not None
        else:
            assert live.inactive_ms is None
        assert st.dead_letter_stream == _keys.dead_letter_stream(service) and st.dead_letters == 2
        assert st.reasons_over == 2 and sorted(r.count for r in st.reasons) == [1, 1]
        assert all(r.reason for r in st.reasons)
        assert st.delayed is None and st.notes == ()


async def test_json_output_is_the_status(any_server: Any, service: str) -> None:
    async with Scene(any_server.url, service):
        expected = (await collect_status(any_server.url, service)).to_dict()
        result = await invoke("status", service, "--url", any_server.url, "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert set(got) == set(expected)
    # Everything but the clocks (ages, idle times, deadlines, TTLs move between the two reads).
    moving = {"time_ms", "oldest_waiting", "oldest_pending", "consumers"}
    assert {k: v for k, v in got.items() if k not in moving} == {
        k: v for k, v in expected.items() if k not in moving
    }
    assert [(c["name"], c["state"], c["pending"]) for c in got["consumers"]] == [
        (c["name"], c["state"], c["pending"]) for c in expected["consumers"]
    ]
    assert got["oldest_pending"]["id"] == expected["oldest_pending"]["id"]
    assert got["consumer_states"] == {"alive": 1, "late": 0, "dead": 1, "departed": 1}


async def test_the_screen_names_what_matters(redis_server: Any, service: str) -> None:
    async with Scene(redis_server.url, service) as scene:
        result = await invoke("status", service, "--url", redis_server.url)
    assert result.exit_code == 0, result.output
    screen = flat(result.stdout)
    for text in (
        f"lbs status {service}",
        "6 entries",
        "3 waiting",
        "3 pending",
        "1 alive",
        "1 dead",
        "1 departed",
        scene.live.id,
        scene.dying.id,
        "1 of all 3 waiting",
        "dead letters",
    ):
        assert text in screen, (text, screen)
    assert "redis-consumer-gone" not in screen  # departed consumers are counted, not listed
    assert "b (token" in screen and "c (token" in screen  # what each consumer holds


async def test_a_parked_entry_that_is_never_due_is_counted_not_a_crash(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    """promote-4.lua scores an entry it cannot move +inf (never due): status counts it, with no next
    due time (it raised OverflowError, and the dashboard's home page with it)."""
    await produce(redis_server.url, service, "a")
    await r.xadd(_keys.delayed_stream(service), {"junk": "x"}, id="5-1")
    await r.zadd(_keys.due_key(service), {"5-1": float("inf")})
    st = await collect_status(r, service)
    assert st.delayed is not None and st.delayed.parked == 1 and st.delayed.next_due_ms is None
    result = await invoke("status", service, "--url", redis_server.url)
    assert result.exit_code == 0 and "parked" in result.stdout


async def test_a_missing_service_says_so(any_server: Any, service: str) -> None:
    st = await collect_status(any_server.url, service)
    assert not st.exists and (st.length, st.backlog, st.pending, st.consumers) == (0, 0, 0, ())
    assert st.backlog_method == "none"
    result = await invoke("status", service, "--url", any_server.url)
    assert result.exit_code == 1 and result.stdout == ""
    assert f"no service {service!r} on {any_server.url}" in flat(result.stderr)
    result = await invoke("status", service, "--url", any_server.url, "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["exists"] is False


async def test_a_stream_without_a_group_is_all_backlog(
    rr: aioredis.Redis, any_server: Any, service: str
) -> None:
    for _ in range(4):
        await rr.xadd(
            _keys.input_stream(service), {"lbs-input": '{"DataStreamName":"x","Info":{}}'}
        )
    st = await collect_status(any_server.url, service)
    assert (st.exists, st.group_exists, st.length, st.backlog, st.backlog_method) == (
        True,
        False,
        4,
        4,
        "no group",
    )
    assert st.pending == 0 and st.consumers == ()


@pytest.mark.parametrize("role", ["stream", "dlq", "consumers"])
async def test_a_key_of_the_wrong_type_is_named(
    rr: aioredis.Redis, any_server: Any, service: str, role: str
) -> None:
    key = {
        "stream": _keys.input_stream(service),
        "dlq": _keys.dead_letter_stream(service),
        "consumers": _keys.consumers_key(service),
    }[role]
    await rr.set(key, "oops")
    with pytest.raises(lbs.RedisOperationError, match=f"LBSKEY {key} holds a string, not the "):
        await collect_status(any_server.url, service)
    result = await invoke("status", service, "--url", any_server.url)
    assert result.exit_code == 1
    assert f"LBSKEY {key} holds a string" in flat(result.stderr)
    assert "Traceback" not in result.output


async def test_parked_retries_are_counted(
    rr: aioredis.Redis, any_server: Any, service: str
) -> None:
    await produce(any_server.url, service, "x")
    parked = await rr.xadd(
        _keys.delayed_stream(service), {"lbs-input": '{"DataStreamName":"y","Info":{}}'}
    )
    seconds, micros = await rr.time()
    await rr.zadd(_keys.due_key(service), {parked: seconds * 1000 + micros // 1000 + 60_000})
    st = await collect_status(any_server.url, service)
    assert st.delayed is not None
    assert (st.delayed.parked, st.delayed.scheduled) == (1, 1)
    assert st.delayed.next_due_ms is not None and 50_000 < st.delayed.next_due_ms <= 60_000


async def test_the_backlog_is_exact_whatever_was_deleted(
    rr: aioredis.Redis, any_server: Any, service: str
) -> None:
    """Random adds, reads, finishes (ack + delete, as done-n.lua) and deletions of waiting entries; after each
    step a backlog said to be exact is the number of entries after the group's last-delivered id, whichever
    way it was obtained (Redis's lag is nil after most of these steps, and wrong after some before 7.4)."""
    stream, group = _keys.input_stream(service), _keys.group_name(service)
    await rr.xgroup_create(stream, group, id="0", mkstream=True)
    rng = random.Random(18)
    methods: dict[int, set[str]] = {200: set(), 3: set(), 1: set()}
    for step in range(100):
        op = rng.choice(["add", "add", "add", "read", "read", "finish", "finish", "delete waiting"])
        if op == "add":
            for _ in range(rng.randint(1, 3)):
                await rr.xadd(stream, {"lbs-input": f'{{"DataStreamName":"s{step}","Info":{{}}}}'})
        elif op == "read":
            await rr.xreadgroup(
                group, rng.choice(["c1", "c2"]), {stream: ">"}, count=rng.randint(1, 3)
            )
        else:
            pending = [
                p["message_id"] for p in await rr.xpending_range(stream, group, "-", "+", 100)
            ]
            (last,) = [g["last-delivered-id"].decode() for g in await rr.xinfo_groups(stream)]
            waiting = [e[0] for e in await rr.xrange(stream, "(" + last, "+")]
            pool = pending if op == "finish" else waiting
            if pool:
                victim = rng.choice(pool)
                if op == "finish":
                    await rr.xack(stream, group, victim)
                await rr.xdel(stream, victim)
        (last,) = [g["last-delivered-id"].decode() for g in await rr.xinfo_groups(stream)]
        truth = len(await rr.xrange(stream, "(" + last, "+"))
        for sample in methods:
            st = await collect_status(rr, service, sample=sample)
            methods[sample].add(st.backlog_method)
            if sample == 200:
                assert st.backlog_exact and st.backlog_method == "counted"
            if st.backlog_exact:
                assert st.backlog == truth, (step, op, sample, st.backlog_method)
            assert st.pending == len(await rr.xpending_range(stream, group, "-", "+", 1000))
    assert methods[200] == {"counted"}
    assert "counted" in methods[3] and "lag" in methods[1] | methods[3]


async def test_status_on_a_cluster(redis_cluster: Any, service: str) -> None:
    url = "redis+cluster://" + redis_cluster.url.split("://", 1)[1]
    await produce(url, service, "a", "b")
    st = await collect_status(url, service)
    assert (st.exists, st.length, st.backlog, st.backlog_method) == (True, 2, 2, "no group")
    assert st.node and st.node in {f"{h}:{p}" for h, p in redis_cluster.startup_nodes}
    result = await invoke("status", service, "--url", url, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["backlog"] == 2
    # claim and dlq find the slot's owner too.
    result = await invoke("claim", service, "1-0", "--url", url)
    assert result.exit_code == 0 and "not pending" in result.stdout
    cluster = redis_cluster.client()
    try:
        cluster.xadd(
            _keys.dead_letter_stream(service),
            {"lbs-input": '{"DataStreamName":"c","Info":{}}', "_reason": "r"},
        )
    finally:
        cluster.close()
    result = await invoke("dlq", "replay", service, "--all", "--url", url)
    assert result.exit_code == 0 and "Replayed 1 dead letter" in result.stdout
    assert (await collect_status(url, service)).requeued.replayed == 1


# --------------------------------------------------------------------- --watch ---


async def test_watch_redraws_until_ctrl_c(any_server: Any, service: str) -> None:
    await produce(any_server.url, service, "a")
    title = f"lbs status {service}"
    screen, code = await watched(
        app_argv("status", service, "--url", any_server.url, "--watch", "--interval", "0.2"),
        lambda s: s.count(title) >= 2,
    )
    assert "1 entries: 1 waiting" in screen
    assert code == 0


async def test_watch_with_json_prints_one_document_per_line(
    redis_server: Any, service: str
) -> None:
    await produce(redis_server.url, service, "a")
    screen, code = await watched(
        app_argv("status", service, "--url", redis_server.url, "--watch", "-n", "0.1", "--json"),
        lambda s: s.count('"service"') >= 3,
    )
    docs = [json.loads(line) for line in screen.splitlines() if line.startswith("{")][:3]
    assert [d["backlog"] for d in docs] == [1, 1, 1] and code == 0


def _lbs_has(command: str) -> bool:
    try:
        from lbs.cli import app
    except ImportError:
        return False
    return any(c.name == command for c in app.registered_commands)


@pytest.mark.skipif(
    not _lbs_has("status"), reason="`lbs status` is not registered in lbs.cli's app yet"
)
async def test_python_m_lbs_status(redis_server: Any, service: str) -> None:
    await produce(redis_server.url, service, "a", "b")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lbs",
        "status",
        service,
        "--json",
        env={**_env(), "LBS_URL": redis_server.url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    assert json.loads(out)["backlog"] == 2
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lbs",
        "status",
        service + "-none",
        "--url",
        redis_server.url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1 and b"no service" in err and not out


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "LBS_URL"}


# ----------------------------------------------------------------------- claim ---


async def test_claim_requeues_only_what_lost_its_holder(
    rr: aioredis.Redis, any_server: Any, service: str
) -> None:
    url = any_server.url
    ids = dict(zip("abc", await produce(url, service, "a", "b", "c")))
    dying = client(url, service, "dying", recovery=False, max_streams=2, lock_ttl=0.5)
    await dying.start()
    assert sorted(n.stream for n in await take(dying, 2)) == ["a", "b"]
    live = client(url, service, "live", recovery=False, max_streams=1)
    await live.start()
    try:
        assert [n.stream for n in await take(live, 1)] == ["c"]
        await kill(dying)
        await eventually(lambda: _is(rr.exists(_keys.lease_key(service, dying.id)), 0))
        result = await invoke("claim", service, ids["a"], ids["c"], "1-0", "--url", url, "--json")
        assert result.exit_code == 3, result.output
        got = {d["entry_id"]: d for d in json.loads(result.stdout)}
        assert got[ids["a"]]["outcome"] == "requeued" and "(retry 1)" in got[ids["a"]]["detail"]
        assert got[ids["c"]]["outcome"] == "held" and live.id in got[ids["c"]]["detail"]
        assert got["1-0"]["outcome"] == "not pending"
        (fresh,) = [
            e for e in await rr.xrange(_keys.input_stream(service)) if e[1].get(b"_original_id")
        ]
        assert fresh[1][b"_original_id"].decode() == ids["a"] and fresh[1][b"_retry_count"] == b"1"
        # Past --max-retries the claim dead-letters it; and an id with nothing to do exits 0.
        result = await invoke("claim", service, ids["b"], "--url", url, "--max-retries", "0")
        assert result.exit_code == 0, result.output
        assert "dead-lettered" in result.stdout
        (letter,) = await rr.xrange(_keys.dead_letter_stream(service))
        assert letter[1][b"_failed_id"].decode() == ids["b"]
        result = await invoke("claim", service, ids["a"], "--url", url)
        assert result.exit_code == 0 and "not pending" in result.stdout
        assert await live.done_stream("c") is lbs.DoneStatus.DONE
    finally:
        await live.close()
        await dying.close()  # does nothing more: it is dead


async def test_claim_refuses_what_is_not_an_entry_id(redis_server: Any, service: str) -> None:
    result = await invoke("claim", service, "12", "abc-1", "--url", redis_server.url)
    assert result.exit_code == 2 and "not a stream id" in result.output


async def test_status_of_a_service_name_with_braces_is_a_usage_error(redis_server: Any) -> None:
    result = await invoke("status", "a{b}", "--url", redis_server.url)
    assert result.exit_code == 2 and "must not contain" in result.stderr


async def test_a_bad_url_is_a_setting_error(service: str) -> None:
    result = await invoke("status", service, "--url", "http://nowhere")
    assert result.exit_code == 78 and "invalid Redis URL" in result.stderr


async def test_an_unreachable_redis_is_a_failure(service: str) -> None:
    from lbs.embedded import free_port

    result = await invoke("status", service, "--url", f"redis://127.0.0.1:{free_port()}")
    assert result.exit_code == 1 and "lbs status: error:" in flat(result.stderr)
    assert "Traceback" not in result.output


async def test_registrations_waiting_for_their_holder_are_shown(
    any_server: Any, service: str
) -> None:
    first, second, third = await produce(any_server.url, service, "a", "a", "b")
    c = client(any_server.url, service, "holder", recovery=False)
    await c.start()
    try:
        assert sorted(n.stream for n in await take(c, 2)) == ["a", "b"]
        st = await collect_status(any_server.url, service)
        assert st.names_waiting == 1
        assert [w.to_dict() for w in st.waiting_names] == [
            {"name": "a", "holder": first, "back": False, "waiting": 1}
        ]
        assert (
            st.pending == 2 and st.backlog == 0
        )  # the waiter is neither delivered-and-held nor backlog
        result = await invoke("status", service, "--url", any_server.url)
        assert result.exit_code == 0, result.output
        assert (
            f"1 data stream with registrations waiting for their holder: a (1 after {first})"
            in flat(result.stdout)
        ), flat(result.stdout)
        got = json.loads(
            (await invoke("status", service, "--url", any_server.url, "--json")).stdout
        )
        assert got["names_waiting"] == 1 and got["waiting_names"][0]["holder"] == first
        # Done with the holder: its last waiter is put back, and no name waits any more.
        assert await c.done_stream("a", first) == lbs.DoneStatus.DONE
        assert (await collect_status(any_server.url, service)).names_waiting == 0
    finally:
        await c.close()
    assert second != first and third
