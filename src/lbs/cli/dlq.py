"""``lbs dlq list|show|replay|purge SERVICE``: the dead letters still in a service's dead-letter stream.

The ``lbs`` app mounts :data:`app` (``app.add_typer(dlq.app, name="dlq")``).
The library side is :class:`lbs.deadletters.DeadLetters`; what a replay
writes is described there. Exit codes are those of ``lbs status``
(:mod:`lbs.cli._common`): 0 done, 1 a failure (Redis, a service that is not there: neither its
load-balancer stream nor its dead-letter stream exists, or ``show`` of a letter
that is not there), 2 a wrong command line, 3 done in part (a letter refused
or not found, a purge not confirmed), 78 an invalid setting (the URL).
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .._streamids import NOT_AN_ID, bad_ids
from ..deadletters import DeadLetter, DeadLetters, Replay, letter_time_ms
from ..status import require_service
from ._common import (
    EXIT_FAILURE,
    EXIT_INCOMPLETE,
    EXIT_USAGE,
    ServiceArgument,
    UrlOption,
    check_service,
    duration,
    err_console,
    fail,
    run,
)

__all__ = ["app"]

app = typer.Typer(
    help="The dead letters of a service (in `{SERVICE-input}:dlq`): list, show, replay into the load-balancer "
    "stream, purge.",
    no_args_is_help=True,
)

IdsArgument = Annotated[
    list[str] | None,
    typer.Argument(
        help="Dead-letter ids (`MILLISECONDS-SEQUENCE`), as `lbs dlq list` shows them.",
        show_default=False,
        metavar="ID",
    ),
]
ReasonOption = Annotated[
    str | None,
    typer.Option(
        "--reason",
        metavar="SUBSTRING",
        help="Only letters whose reason contains SUBSTRING (case-insensitive).",
    ),
]
AllOption = Annotated[
    bool, typer.Option("--all", help="Every letter (with --reason: every letter matching it).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _selection(
    command: str, ids: list[str] | None, reason: str | None, every: bool
) -> list[str] | None:
    """The explicit ids (or None); exits 2 when the command line does not say which letters."""
    if ids and every:
        fail(command, "give dead-letter ids or --all, not both", EXIT_USAGE)
    if not ids and reason is None and not every:
        fail(command, "say which letters: their ids, --reason SUBSTRING, or --all", EXIT_USAGE)
    if reason is not None and not reason:
        fail(command, "--reason needs a non-empty SUBSTRING", EXIT_USAGE)
    bad = bad_ids(ids or ())
    if bad:
        fail(command, f"{NOT_AN_ID}: {', '.join(bad)}", EXIT_USAGE)
    return list(ids) if ids else None


def _stream_name(letter: DeadLetter) -> str:
    """The data stream's name from the letter's lbs-input, or "" when it does not decode."""
    import lbs

    name, _, _ = lbs.try_decode_input(letter.lbs_input)
    return name or ""


def _subject(letter: DeadLetter) -> Text:
    """What the letter is about: its data stream, ``key <k>`` for a keyed message, or "(malformed)"."""
    if letter.key:
        return Text(f"key {letter.key}")
    name = _stream_name(letter)
    return Text(name) if name else Text("(malformed)", style="red")


# --------------------------------------------------------------------- list ---


@app.command("list")
def list_letters(
    service: ServiceArgument,
    url: UrlOption,
    limit: Annotated[
        int, typer.Option("--limit", "-l", min=0, metavar="N", help="Show at most N letters.")
    ] = 20,
    reason: ReasonOption = None,
    json_out: JsonOption = False,
) -> None:
    """List the newest dead letters, newest first: id, age, data stream (or a keyed message's key), consumer,
    retries, reason."""
    check_service("dlq list", service)

    async def work() -> tuple[list[DeadLetter], int, int]:
        await require_service(url, service, dead_letters=True)
        async with DeadLetters(url, service) as dlq:
            letters = await dlq.list(limit, reason)
            return letters, await dlq.count(), await dlq.server_time_ms()

    letters, total, now = run("dlq list", work, url)
    if json_out:
        sys.stdout.write(
            json.dumps(
                [
                    {**x.to_dict(), "stream": _stream_name(x), "age_ms": now - letter_time_ms(x.id)}
                    for x in letters
                ]
            )
            + "\n"
        )
        return
    console = Console()
    if not letters:
        console.print(
            f"No dead letters{' matching ' + repr(reason) if reason else ''} ({total:,} in the stream).",
            markup=False,
            highlight=False,
        )
        return
    table = Table(
        title=f"dead letters of {service}: {len(letters):,} shown of {total:,}",
        title_justify="left",
        pad_edge=False,
    )
    table.add_column("id", no_wrap=True)
    table.add_column("age", justify="right", no_wrap=True)
    table.add_column("stream / key", overflow="ellipsis", max_width=30)
    table.add_column("consumer", overflow="ellipsis", max_width=30)
    table.add_column("retries", justify="right")
    table.add_column("reason", overflow="fold")
    for x in letters:
        table.add_row(
            x.id,
            duration(now - letter_time_ms(x.id)),
            _subject(x),
            x.consumer,
            str(x.retry_count),
            x.reason,
        )
    console.print(table)


# --------------------------------------------------------------------- show ---


@app.command("show")
def show(
    service: ServiceArgument,
    letter_id: Annotated[
        str, typer.Argument(metavar="ID", help="The dead letter's id.", show_default=False)
    ],
    url: UrlOption,
    json_out: JsonOption = False,
) -> None:
    """Show one dead letter with all its fields (exit code 1 if the stream does not hold it)."""
    check_service("dlq show", service)
    _selection("dlq show", [letter_id], None, False)

    async def work() -> tuple[DeadLetter | None, int, str]:
        await require_service(url, service, dead_letters=True)
        async with DeadLetters(url, service) as dlq:
            return await dlq.get(letter_id), await dlq.server_time_ms(), dlq.key

    letter, now, key = run("dlq show", work, url)
    if letter is None:
        fail("dlq show", f"no dead letter {letter_id} in {key}", EXIT_FAILURE)
    if json_out:
        sys.stdout.write(
            json.dumps(
                {
                    **letter.to_dict(),
                    "stream": _stream_name(letter),
                    "age_ms": now - letter_time_ms(letter.id),
                }
            )
            + "\n"
        )
        return
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for name, value in letter.fields.items():
        table.add_row(name, _pretty(value))
    Console().print(
        Panel(
            table,
            title=f"dead letter {letter.id} of {service}",
            title_align="left",
            subtitle=f"written {duration(now - letter_time_ms(letter.id))} ago",
            subtitle_align="left",
        )
    )


def _pretty(value: str) -> Text:
    """A field value; JSON (lbs-input) indented when it parses."""
    if value[:1] in "{[":
        try:
            return Text(json.dumps(json.loads(value), indent=2, ensure_ascii=False))
        except ValueError:
            pass
    return Text(value)


# ------------------------------------------------------------------- replay ---


@app.command("replay")
def replay(
    service: ServiceArgument,
    url: UrlOption,
    letter_ids: IdsArgument = None,
    reason: ReasonOption = None,
    every: AllOption = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replay letters whose `lbs-input` a consumer would refuse, too (they come back as dead "
            "letters).",
        ),
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON array, one object per letter.")
    ] = False,
) -> None:
    """Put dead letters back into the load-balancer stream as fresh assignments, oldest first.

    Each keeps its fields (`lbs-input` with its Info) and `_original_id`,
    gets its full retries again (`_retry_count` 0) and a record of where it
    came from (`_replayed_from`, `_last_reason`, `_replay_count`); it leaves
    the dead-letter stream in the same MULTI/EXEC. Letters whose `lbs-input`
    is malformed are refused unless --force. Exit code 0 when every selected letter was
    replayed, 3 when some were refused or not found.
    """
    check_service("dlq replay", service)
    ids = _selection("dlq replay", letter_ids, reason, every)

    async def work() -> tuple[list[Replay], str]:
        await require_service(url, service, dead_letters=True)
        async with DeadLetters(url, service) as dlq:
            return await dlq.replay(ids, reason=reason, all=every, force=force), dlq.stream

    results, stream = run("dlq replay", work, url)
    if json_out:
        sys.stdout.write(json.dumps([r.to_dict() for r in results]) + "\n")
    else:
        _report_replay(results, stream, reason)
    if any(r.outcome != "replayed" for r in results):
        raise typer.Exit(EXIT_INCOMPLETE)


def _report_replay(results: list[Replay], stream: str, reason: str | None) -> None:
    console = Console()
    replayed = [r for r in results if r.outcome == "replayed"]
    if not results:
        console.print(
            f"No dead letters{' matching ' + repr(reason) if reason else ''}: nothing replayed.",
            markup=False,
            highlight=False,
        )
        return
    console.print(
        f"Replayed {len(replayed):,} dead letter{'s' * (len(replayed) != 1)} into {stream}.",
        markup=False,
        highlight=False,
    )
    for r in results:
        if r.outcome == "malformed":
            console.print(
                Text(f"  {r.letter_id}  refused: ", style="red")
                + Text(f"its lbs-input is malformed ({r.detail}); --force replays it anyway")
            )
        elif r.outcome == "missing":
            console.print(
                Text(f"  {r.letter_id}  not found", style="red")
                + Text(" (not in the dead-letter stream: replayed, purged or forwarded already?)")
            )
        elif len(replayed) <= 20:
            console.print(
                Text(f"  {r.letter_id} -> {r.entry_id}  ")
                + Text(r.stream or "(malformed, forced)", style="dim")
            )


# -------------------------------------------------------------------- purge ---


@app.command("purge")
def purge(
    service: ServiceArgument,
    url: UrlOption,
    letter_ids: IdsArgument = None,
    reason: ReasonOption = None,
    every: AllOption = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete dead letters, after confirming how many (unless --yes).

    Letters written after the count was shown are left alone. Exit code 0
    when they were deleted, 3 when the answer was no (nothing deleted) or
    some of the given ids were not found.
    """
    check_service("dlq purge", service)
    ids = _selection("dlq purge", letter_ids, reason, every)

    async def count() -> tuple[int, str, str]:
        await require_service(url, service, dead_letters=True)
        async with DeadLetters(url, service) as dlq:
            n, newest = await dlq.matching(ids, reason=reason, all=every)
            return n, newest, dlq.key

    n, newest, key = run("dlq purge", count, url)
    missing = len(ids) - n if ids else 0
    console = Console()
    if n == 0:
        console.print(
            f"No dead letters match in {key}: nothing deleted.", markup=False, highlight=False
        )
        raise typer.Exit(EXIT_INCOMPLETE if missing else 0)
    if not yes and not _confirm(
        f"Delete {n:,} dead letter{'s' * (n != 1)} of {service} from {key}?"
    ):
        err_console.print("Nothing deleted.", markup=False, highlight=False)
        raise typer.Exit(EXIT_INCOMPLETE)

    async def delete() -> int:
        async with DeadLetters(url, service) as dlq:
            return await dlq.purge(ids, reason=reason, all=every, until=newest)

    deleted = run("dlq purge", delete, url)
    console.print(
        f"Deleted {deleted:,} dead letter{'s' * (deleted != 1)} from {key}.",
        markup=False,
        highlight=False,
    )
    if missing:
        console.print(
            f"{missing} of the given ids were not in the stream.", markup=False, highlight=False
        )
        raise typer.Exit(EXIT_INCOMPLETE)


def _confirm(question: str) -> bool:
    """Ask; no answer (end of input, Ctrl-C, Ctrl-D) is a no."""
    try:
        return typer.confirm(question, default=False)
    except (typer.Abort, KeyboardInterrupt, EOFError):
        return False
