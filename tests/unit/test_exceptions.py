from __future__ import annotations

import inspect

import lbs
import lbs.exceptions


def test_every_exception_descends_from_lbs_error_and_is_exported() -> None:
    classes = [
        c
        for _, c in inspect.getmembers(lbs.exceptions, inspect.isclass)
        if issubclass(c, BaseException)
    ]
    assert classes
    for cls in classes:
        assert issubclass(cls, lbs.LbsError), cls
        assert cls.__name__ in lbs.exceptions.__all__
        assert getattr(lbs, cls.__name__) is cls
        assert cls.__doc__ and cls.__doc__.strip(), f"{cls.__name__} has no docstring"


def test_misuse_errors_are_also_builtin_kinds() -> None:
    assert issubclass(lbs.ConfigurationError, ValueError)
    assert issubclass(lbs.InvalidInputError, ValueError)
    assert issubclass(lbs.DataError, TypeError)


def test_batch_error_says_which_entries_were_written() -> None:
    import pickle

    from redis.exceptions import ResponseError

    cause = ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    err = lbs.BatchError("add_streams", cause, ["1-0", None, "1-1", None], [3])
    assert isinstance(err, lbs.RedisOperationError) and isinstance(err, lbs.LbsError)
    assert (err.operation, err.cause, err.entry_ids, err.unknown) == (
        "add_streams",
        cause,
        ["1-0", None, "1-1", None],
        [3],
    )
    assert str(err) == (
        "add_streams failed: 2 of 4 registered, 1 unknown: ResponseError: WRONGTYPE Operation "
        "against a key holding the wrong kind of value"
    )
    assert str(lbs.BatchError("add_streams", cause, [None])).startswith(
        "add_streams failed: 0 of 1 registered: "
    )
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), str(copy), copy.entry_ids, copy.unknown) == (
        lbs.BatchError,
        str(err),
        err.entry_ids,
        [3],
    )
    assert "BatchError" in lbs.__all__ and "BatchError" in (lbs.exceptions.__doc__ or "")
