# Commands encoded into one buffer: one write per batch, and no per-command
# Python objects.
#
# CommandBatch holds the commands of one write and, when asked (expect), the
# shape of each reply, so the reader (reader.pyx, driven by
# lbs/_redis/wire.py) builds stream entries straight from the reply's bytes.
# Replies come back one per command, server errors as values, so each
# command of a batch gets its own.
#
# The consumer's scripts over many locks are one EVALSHA each with a lock key
# per entry: done-n.lua through evalsha_locks (from entry ids), extend-n.lua
# through HeldTable.encode_extend (held.pyx, from the held records).
# evalsha_over_locks writes what they share, the command up to its last
# key, each lock key "<prefix><entry id>" straight into the buffer.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_CheckExact


cdef class CommandBatch:
    """Commands encoded into one RESP buffer.

    ``len(batch)`` is the number of commands (so of replies to read);
    :meth:`getvalue` the bytes to write.
    """

    def __cinit__(self, Py_ssize_t initial=4096):
        self._buf = WriteBuffer(initial)
        self._count = 0
        self._shapes = None

    def __len__(self):
        return self._count

    def getvalue(self):
        """The encoded commands, as one bytes object."""
        return self._buf.to_bytes()

    def clear(self):
        """Forget every command (the buffer's memory is kept for reuse)."""
        self._buf.clear()
        self._count = 0
        self._shapes = None

    def expect(self, int shape):
        """Say where the reply of the last command added holds stream entries
        (a :class:`Shape` value), so the reader builds Entry objects."""
        if self._count == 0:
            raise _data_error("expect() needs a command before it")
        if shape < SHAPE_ANY or shape > SHAPE_MESSAGES:
            raise _data_error(f"unknown reply shape {shape}")
        if self._shapes is None:
            self._shapes = [SHAPE_ANY] * self._count
        while len(self._shapes) < self._count:
            self._shapes.append(SHAPE_ANY)
        self._shapes[self._count - 1] = shape

    @property
    def expects_entries(self):
        """True when :meth:`expect` marked any reply of this batch."""
        return self._shapes is not None

    def reply_shape(self, Py_ssize_t index):
        """The shape expected of reply ``index`` (``Shape.ANY`` unless :meth:`expect` said otherwise)."""
        if self._shapes is None or index >= len(self._shapes) or index < 0:
            return SHAPE_ANY
        return self._shapes[index]

    def command(self, *args):
        """Append one command, encoded as redis-py would send it."""
        pack_into(self._buf, args)
        self._count += 1

    cdef inline WriteBuffer buffer(self):
        return self._buf

    cdef inline void command_written(self) noexcept:
        self._count += 1

    def evalsha_locks(self, sha, tuple head_keys, bytes lock_prefix not None, list entry_ids not None,
                      tuple head_args, list values=None, bint append_ids=True, list tail=None,
                      list names=None, bytes name_prefix not None=b"", bint lock_keys=True):
        """Append ``EVALSHA sha numkeys KEYS... ARGV...`` for a batch of locks.

        KEYS are ``head_keys`` then, with ``lock_keys``, ``lock_prefix + id`` per entry id; ARGV
        are ``head_args``, then ``values`` (one per entry, when given), then
        the entry ids themselves when ``append_ids``, then ``names`` (one per
        entry, when given) each written as ``name_prefix + name`` ("" for an
        empty name), then ``tail`` (any length, when given).
        """
        cdef Py_ssize_t n = len(entry_ids)
        cdef Py_ssize_t nvalues = 0
        cdef Py_ssize_t ntail = 0 if tail is None else len(tail)
        cdef Py_ssize_t nnames = 0
        cdef Py_ssize_t begin = self._buf.length()
        cdef const char *namep
        cdef Py_ssize_t namen
        if values is not None:
            nvalues = len(values)
            if nvalues != n:
                raise _data_error(f"{nvalues} lock values for {n} entry ids")
        if names is not None:
            nnames = len(names)
            if nnames != n:
                raise _data_error(f"{nnames} names for {n} entry ids")
        evalsha_over_locks(self._buf, sha, head_keys, lock_prefix, entry_ids, 0, n if lock_keys else 0,
                           len(head_args) + nvalues + (n if append_ids else 0) + nnames + ntail)
        for a in head_args:
            pack_arg(self._buf, a)
        if values is not None:
            for v in values:
                pack_arg(self._buf, v)
        if append_ids:
            for entry_id in entry_ids:
                pack_arg(self._buf, entry_id)
        if names is not None:
            for name in names:
                if not PyUnicode_CheckExact(name):
                    raise _data_error(f"a name must be str, got {type(name).__name__}")
                namep = PyUnicode_AsUTF8AndSize(name, &namen)
                if namen == 0:
                    self._buf.write_bulk(b"", 0)
                else:
                    self._buf.write_bulk2(PyBytes_AS_STRING(name_prefix), PyBytes_GET_SIZE(name_prefix),
                                          namep, namen)
        if tail is not None:
            for a in tail:
                pack_arg(self._buf, a)
        if LBS_DEBUG:
            _check_command(self._buf, begin)
        self._count += 1


cdef int evalsha_over_locks(WriteBuffer buf, object sha, tuple head_keys, bytes prefix, list locks,
                            Py_ssize_t start, Py_ssize_t stop, Py_ssize_t nargs) except -1:
    # "EVALSHA sha numkeys KEYS..." of a script over locks[start:stop], up to
    # its last key: the array header (counting the ``nargs`` ARGV the caller
    # writes next), head_keys, then one lock key "<prefix><entry id>" per
    # lock. A lock is an entry id (str or bytes), or with ``prefix`` None a
    # Held record, under its own client's prefix.
    cdef Py_ssize_t i, n
    cdef const char *idp
    cdef Py_ssize_t idn
    cdef bytes part
    cdef object lock
    cdef Held h
    n = stop - start
    buf.write_len_header(c'*', 3 + len(head_keys) + n + nargs)
    buf.write_bulk(b"EVALSHA", 7)
    pack_arg(buf, sha)
    buf.write_int(len(head_keys) + n)
    for k in head_keys:
        pack_arg(buf, k)
    for i in range(start, stop):
        lock = locks[i]
        if prefix is None:
            h = <Held?>lock
            part = h.lock_key_prefix()
            idp = PyUnicode_AsUTF8AndSize(h.entry_id, &idn)
        else:
            part = prefix
            if PyUnicode_CheckExact(lock):
                idp = PyUnicode_AsUTF8AndSize(lock, &idn)
            elif isinstance(lock, bytes):
                idp = PyBytes_AS_STRING(lock)
                idn = PyBytes_GET_SIZE(lock)
            else:
                raise _data_error(f"an entry id must be str or bytes, got {type(lock).__name__}")
        buf.write_bulk2(PyBytes_AS_STRING(part), PyBytes_GET_SIZE(part), idp, idn)
    return 0


cdef int _check_command(WriteBuffer buf, Py_ssize_t start) except -1:
    # Debug builds: the command just written from ``start`` reads back as one
    # whole RESP array of bulk strings, nothing more and nothing less.
    cdef RespReader r = RespReader()
    cdef bytes written = buf.since(start)
    r.feed(written)
    command = r.gets()
    if type(command) is not list or r.unread() or not all(type(a) is bytes for a in command):
        _internal_error(f"encoded a malformed command ({len(written)} bytes)")
    return 0
