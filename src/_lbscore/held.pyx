# The streams a client holds.
#
# A Held stores what differs per stream (entry id, stream name, Info, retry
# count, fencing token, the run() task) and one pointer to what its client
# shares: the hold's owner ("<consumer id>:<instance nonce>", the lease it is
# held under) and a key prefix. Its value "<token>:<owner>" (what the keyed
# scripts check against the owner's lease) is computed when read, so no
# per-stream string is kept or built for it.
#
# HeldTable indexes Held records by entry id and by stream name. A stream
# held once (the common case) maps to its Held; only a name held several
# times at once maps to a list.

from cpython.unicode cimport PyUnicode_AsUTF8AndSize

# Held.mark: whether its entry id is in the consumer's queued set ({<service>-input}:queued:<consumer>),
# and whether Redis must be told it left it. A dead holder's death counts a retry only against
# entries not in its queued set (requeue-6.lua).
cdef enum:
    MARK_HELD = 0      # in the queued set: waiting for the application, not running
    MARK_WANTED = 1    # the application took it: running, Redis not told yet
    MARK_SENT = 2      # an SREM taking it out of the set is on its way
    MARK_RUNNING = 3   # not in the set: running (a handler's, or delivered so)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE


cdef class _HeldKeys:

    def __cinit__(self, str consumer_id, str lock_prefix):
        self.consumer_id = consumer_id
        self.lock_prefix = lock_prefix
        self.value_suffix = (":" + consumer_id).encode("utf-8")
        self.key_prefix = lock_prefix.encode("utf-8")

    def __reduce__(self):
        return (_HeldKeys, (self.consumer_id, self.lock_prefix))


cdef inline Held _new_held(_HeldKeys keys, str entry_id, str stream, object info,
                           int64_t retry_count, int64_t token, double taken_at=0.0,
                           unsigned char mark=MARK_RUNNING):
    cdef Held h = Held.__new__(Held)
    h.mark = mark
    h.entry_id = entry_id
    h.stream = stream
    # An empty Info (most assignments) costs no dict until someone reads it.
    h.set_info(None if (info is None or (type(info) is dict and not info)) else info)
    h.retry_count = retry_count
    h.token = token
    h.task = None
    h.taken_at = taken_at
    h.set_keys(keys)
    return h


cdef class Held:
    """A stream this client holds: its entry, its lock and the lock's value.

    ``Held(entry_id, stream, info, retry_count, token, value, lock_key)``
    builds one by hand; ``value`` must be ``"<token>:<consumer id>"`` and
    ``lock_key`` must end with ``entry_id`` (they are not stored: ``value``
    and ``lock_key`` are computed from the token, the consumer id and the
    lock key prefix). The client's own records come from its held table.
    """

    def __init__(self, str entry_id, str stream, object info, int64_t retry_count, int64_t token,
                 str value, str lock_key, object task=None):
        cdef str head = f"{token}:"
        if not value.startswith(head):
            raise _data_error(f"lock value {value!r} is not '<token>:<consumer id>' for token {token}")
        if not entry_id or not lock_key.endswith(entry_id):
            raise _data_error(f"lock key {lock_key!r} does not end with entry id {entry_id!r}")
        if info is not None and not isinstance(info, dict):
            raise _data_error(f"info must be a dict, got {type(info).__name__}")
        self.entry_id = entry_id
        self.stream = stream
        self._info = None if not info else info
        self.retry_count = retry_count
        self.token = token
        self.task = task
        self.mark = MARK_RUNNING
        self._keys = _HeldKeys(value[len(head):], lock_key[:len(lock_key) - len(entry_id)])

    @property
    def running(self):
        """Whether the application has it: recovery counts its holder's death as a failed attempt.

        False only while it waits in the notification queue (read by a client
        without ``run()``, not taken yet); :meth:`start` makes it True.
        """
        return self.mark != MARK_HELD

    def start(self):
        """The application took it: it runs from now on. True if Redis has to be told (it was merely held)."""
        if self.mark != MARK_HELD:
            return False
        self.mark = MARK_WANTED
        return True

    @property
    def info(self):
        """The assignment's ``Info`` (a dict; empty when the producer sent none)."""
        if self._info is None:
            self._info = {}
        return self._info

    @property
    def fields(self):
        """The LBS entry's fields as read (a dict of bytes; built when first asked) when it has
        fields beyond ``lbs-input`` and lbs's retry count and original id, such as the W3C trace
        context a producer plugin adds (``traceparent``); else an empty dict (a record made by hand
        or unpickled has none either)."""
        if self._entry is None:
            return {}
        return (<Entry>self._entry).fields

    @property
    def value(self):
        """What the lock key holds while the lock is ours: ``"<token>:<owner>"``.

        The owner is the ``consumer id`` the record was made with; a client's
        own records use ``<consumer id>:<instance>``, so a lock value reads
        ``<token>:<consumer id>:<instance>``.
        """
        return f"{self.token}:{self._keys.consumer_id}"

    @property
    def lock_key(self):
        """The lock's key: ``lock:{<service>-input}:<entry id>``."""
        return self._keys.lock_prefix + self.entry_id

    cdef inline void set_keys(self, _HeldKeys keys) noexcept:
        self._keys = keys

    cdef inline void set_info(self, object info) noexcept:
        self._info = info

    cdef inline bytes lock_value_suffix(self):
        return self._keys.value_suffix

    cdef inline bytes lock_key_prefix(self):
        return self._keys.key_prefix

    def __repr__(self):
        return (f"Held(entry_id={self.entry_id!r}, stream={self.stream!r}, info={self.info!r}, "
                f"retry_count={self.retry_count}, token={self.token}, value={self.value!r}, "
                f"lock_key={self.lock_key!r})")

    def __reduce__(self):
        return (_rebuild_held, (self._keys, self.entry_id, self.stream, self._info, self.retry_count,
                                self.token))


def _rebuild_held(_HeldKeys keys, str entry_id, str stream, object info, int64_t retry_count, int64_t token):
    return _new_held(keys, entry_id, stream, info, retry_count, token)


cdef class HeldTable:
    """The streams one client holds: by entry id, and by stream name.

    ``consumer_id`` and ``lock_prefix`` are shared by every record the table
    creates (:meth:`take`). ``len()``, ``in`` and iteration are over entry
    ids, as for a dict; :meth:`values` is a snapshot of the records.
    """

    def __cinit__(self, str consumer_id, str lock_prefix):
        self._by_id = {}
        self._by_stream = {}
        self._keys = _HeldKeys(consumer_id, lock_prefix)

    def __len__(self):
        return len(self._by_id)

    def __contains__(self, entry_id):
        return entry_id in self._by_id

    def __iter__(self):
        return iter(self._by_id)

    def __bool__(self):
        return bool(self._by_id)

    cdef int _index(self, Held h) except -1:
        cdef object cur = self._by_stream.get(h.stream)
        if cur is None:
            self._by_stream[h.stream] = h
        elif type(cur) is list:
            (<list>cur).append(h)
        else:
            self._by_stream[h.stream] = [cur, h]
        return 0

    cdef int _unindex(self, Held h) except -1:
        cdef object cur = self._by_stream.get(h.stream)
        cdef list same
        if cur is h:
            del self._by_stream[h.stream]
        elif LBS_DEBUG and type(cur) is not list:
            _internal_error(f"held record {h.entry_id} missing from the index of {h.stream!r}")
        elif type(cur) is list:
            same = <list>cur
            for i in range(len(same)):
                if same[i] is h:
                    del same[i]
                    break
            else:
                if LBS_DEBUG:
                    _internal_error(f"held record {h.entry_id} missing from the index of {h.stream!r}")
            if len(same) == 1:
                self._by_stream[h.stream] = same[0]
            elif not same:
                del self._by_stream[h.stream]
        return 0

    cdef int _add(self, Held h) except -1:
        cdef object old = self._by_id.get(h.entry_id)
        if old is h:
            return 0
        if old is not None:
            self._unindex(<Held>old)
        self._by_id[h.entry_id] = h
        self._index(h)
        return 0

    def take(self, Entry entry not None, int64_t token, int64_t retry_count, double taken_at, bint queued=False):
        """Hold ``entry``: create its record, add it, and return it.

        ``entry`` is a well-formed :class:`Entry` (its id, stream and Info
        are the record's), ``token`` the lock's fencing token,
        ``retry_count`` the failed attempts so far and ``taken_at`` when it
        was taken (a monotonic time). ``queued``: it waits for the
        application and the read that delivered it put it in the
        consumer's queued set (the caller says).
        """
        cdef Held h
        if entry.error is not None or entry.stream is None:
            raise _data_error(f"entry {entry.id!r} cannot be held: {entry.error or 'it has no stream'}")
        h = _new_held(self._keys, entry.id, entry.stream, entry.info, retry_count, token, taken_at,
                      MARK_HELD if queued else MARK_RUNNING)
        if entry._other:
            h._entry = entry  # for Held.fields; an entry of lbs's fields only keeps nothing
        self._add(h)
        return h

    def add(self, Held h not None):
        """Add ``h``; it replaces a record of the same entry id."""
        self._add(h)

    def drop(self, Held h not None):
        """Forget ``h``; False if it was not (or no longer) in the table."""
        if self._by_id.get(h.entry_id) is not h:
            return False
        del self._by_id[h.entry_id]
        self._unindex(h)
        return True

    def get(self, str entry_id, default=None):
        """The record of ``entry_id``, or ``default``."""
        return self._by_id.get(entry_id, default)

    def find(self, str stream, str entry_id=None):
        """The record of ``stream`` (of ``entry_id`` if given, else the oldest held), or None."""
        cdef Held h
        cdef object cur
        if entry_id is not None:
            found = self._by_id.get(entry_id)
            if found is None:
                return None
            h = <Held>found
            return h if h.stream == stream else None
        cur = self._by_stream.get(stream)
        if type(cur) is list:
            return (<list>cur)[0]
        return cur

    def for_stream(self, str stream):
        """Every record of ``stream``, oldest first (a new list)."""
        cdef object cur = self._by_stream.get(stream)
        if cur is None:
            return []
        if type(cur) is list:
            return list(<list>cur)
        return [cur]

    def values(self):
        """The records, in the order they were added (a snapshot list)."""
        return list(self._by_id.values())

    def taken_before(self, double cutoff):
        """The records taken before ``cutoff`` (a monotonic time), oldest first.

        Insertion order is taking order, so the walk stops at the first
        record taken at or after ``cutoff``.
        """
        cdef list out = []
        cdef Held h
        for v in self._by_id.values():
            h = <Held>v
            if h.taken_at >= cutoff:
                break
            out.append(h)
        return out

    @staticmethod
    def pending_marks(list held not None):
        """The entry ids of ``held`` whose application took them since Redis last heard (:meth:`Held.start`);
        they count as sent from now on (:meth:`settle_marks` when Redis answered)."""
        cdef Held h
        cdef list out = []
        for v in held:
            h = <Held?>v
            if h.mark == MARK_WANTED or h.mark == MARK_SENT:
                h.mark = MARK_SENT
                out.append(h.entry_id)
        return out

    @staticmethod
    def settle_marks(list held not None):
        """Redis answered the call that carried ``held``'s pending marks: those records count as
        running from now on. (Unanswered, a mark stays pending: the next call carries it again.)"""
        cdef Held h
        for v in held:
            h = <Held?>v
            if h.mark == MARK_SENT:
                h.mark = MARK_RUNNING
