# Batches of commands encoded into one buffer: one write per batch, and no
# per-command Python objects. The client's hot paths (take, heartbeat, done)
# are one EVALSHA each over a variable number of lock keys; evalsha_locks
# writes those lock keys as <prefix><entry id> straight into the buffer.
#
# Replies are read back through the core's RespReader (reader.pyx, used by
# lbs/_wire.py), which returns server errors as values, so each command of a
# batch gets its own.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
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
        self._buf._length = 0
        self._count = 0
        self._shapes = None

    def expect(self, int shape):
        """Say where the reply of the last command added holds stream entries
        (a :class:`Shape` value), so the reader builds Entry objects."""
        if self._count == 0:
            raise _data_error("expect() needs a command before it")
        if shape < SHAPE_ANY or shape > SHAPE_XREAD:
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

    cdef int _lock_key(self, bytes prefix, object entry_id) except -1:
        cdef const char *data
        cdef Py_ssize_t n
        if PyUnicode_CheckExact(entry_id):
            data = PyUnicode_AsUTF8AndSize(entry_id, &n)
        elif isinstance(entry_id, bytes):
            data = PyBytes_AS_STRING(entry_id)
            n = PyBytes_GET_SIZE(entry_id)
        else:
            raise _data_error(f"an entry id must be str or bytes, got {type(entry_id).__name__}")
        self._buf.write_len_header(c'$', PyBytes_GET_SIZE(prefix) + n)
        self._buf.write(PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix))
        self._buf.write(data, n)
        self._buf.write(b"\r\n", 2)
        return 0

    def evalsha_locks(self, sha, tuple head_keys, bytes lock_prefix, list entry_ids,
                      tuple head_args, list values=None, bint append_ids=True):
        """Append ``EVALSHA sha numkeys KEYS... ARGV...`` for a batch of locks.

        KEYS are ``head_keys`` then ``lock_prefix + id`` per entry id; ARGV
        are ``head_args``, then ``values`` (one per entry, when given), then
        the entry ids themselves when ``append_ids``.
        """
        cdef Py_ssize_t n = len(entry_ids)
        cdef Py_ssize_t nvalues = 0
        if values is not None:
            nvalues = len(values)
            if nvalues != n:
                raise _data_error(f"{nvalues} lock values for {n} entry ids")
        cdef Py_ssize_t nkeys = len(head_keys) + n
        cdef Py_ssize_t nargs = len(head_args) + nvalues + (n if append_ids else 0)
        self._buf.write_len_header(c'*', 3 + nkeys + nargs)
        pack_arg(self._buf, b"EVALSHA")
        pack_arg(self._buf, sha)
        pack_arg(self._buf, nkeys)
        for k in head_keys:
            pack_arg(self._buf, k)
        for entry_id in entry_ids:
            self._lock_key(lock_prefix, entry_id)
        for a in head_args:
            pack_arg(self._buf, a)
        if values is not None:
            for v in values:
                pack_arg(self._buf, v)
        if append_ids:
            for entry_id in entry_ids:
                pack_arg(self._buf, entry_id)
        self._count += 1
