"""Dead letters as a backend receives them, and the backend's protocol (hook ``lbs_dead_letter_backend``).

The re-queue script writes dead letters to the service's dead-letter stream
atomically with taking them out of circulation; that stream is what makes
"nothing lost" true. A backend (hook ``lbs_dead_letter_backend``) forwards
them further: a JSON-lines file, another Redis, a database. The forwarder
deletes a dead letter from the stream only after the backend's ``write``
returned (confirmed); a write that raises leaves the batch in the stream,
and it is written again later. Delivery to the backend is therefore
at-least-once: a crash between a confirmed write and the delete writes that
batch again, so a backend that must not see duplicates keys on
:attr:`DeadLetter.id`.

Every client with a backend forwards, in the consumer group
``<service>-dlq-forwarders`` on the dead-letter stream (each letter goes to
one forwarder; a forwarder first retries its own unconfirmed letters, and
takes over those another forwarder left unconfirmed for
``Config.dead_letter_claim_idle`` seconds). The forwarding task is
lbs._consumer.forwarder.

:class:`DeadLetters` is the operator's side (``lbs dlq``): list, show,
replay and purge the letters still in the stream. A replay puts a letter
back into the load-balancer stream as a fresh assignment with its full
retries again: its fields (``lbs-input`` and any others) are kept, the
retry count is 0, ``<prefix>original_id`` is kept (the entry's first id;
``<prefix>failed_id`` when the letter has none), and the letter's own fields
(``<prefix>reason``, ``<prefix>consumer``, ``<prefix>failed_id``,
``<prefix>key`` and ``<prefix>traceback``) give way
to a record of where it came from: ``<prefix>replayed_from`` (the letter's
id), ``<prefix>last_reason`` (its reason) and ``<prefix>replay_count``
(replays of this assignment so far, this one included). The prefix is
``Config.field_prefix``, ``_`` by default. Each letter moves in one
MULTI/EXEC (XADD to the LBS, XDEL from the dead-letter stream, and XACK in
the forwarders' group when there is one), under WATCH of the dead-letter
stream, so a letter another replay (or a purge, or a forwarder) took
meanwhile is not replayed twice.

A keyed message's letter (``run_keyed()`` skipped it: it carries
``<prefix>key``) is published again to its key instead, as
:class:`lbs.Publisher` does (``publish-1.lua`` in the same MULTI/EXEC: the
message is appended to the key's data stream, after the messages published
since, and the key registered unless it is already): its fields, with the
same replay record and without the letter's own.
"""

from __future__ import annotations

from .letters import DeadLetter, DeadLetterBackend, letter_time_ms
from .operations import DeadLetters
from .replay import REPLAY_FIELDS, Replay

__all__ = [
    "REPLAY_FIELDS",
    "DeadLetter",
    "DeadLetterBackend",
    "DeadLetters",
    "Replay",
    "letter_time_ms",
]
