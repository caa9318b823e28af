from __future__ import annotations

import inspect

import lbs
import lbs.exceptions


def test_every_exception_descends_from_lbs_error_and_is_exported() -> None:
    classes = [c for _, c in inspect.getmembers(lbs.exceptions, inspect.isclass) if issubclass(c, BaseException)]
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
