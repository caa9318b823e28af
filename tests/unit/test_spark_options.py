"""The lbs data source's options: one list (``lbs.spark._optionlist``), checked against the code that
reads them and against docs/spark.md's table; misspelt and misplaced options are errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the lbs-streams[spark] extra")

from lbs import LbsError
from lbs.spark import _optionlist
from lbs.spark._options import _SSL_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
SPARK = ROOT / "src" / "lbs" / "spark"
#: How the parsers read an option: opts.get("x"), opts["x"], number(opts, "x"), flag(opts, "x").
READS = re.compile(r'(?:opts\.get\(|opts\[|(?:number|flag)\((?:self\.)?opts, )"([A-Za-z_]+)"')


def _read_by_code() -> set[str]:
    names = set()
    for path in SPARK.glob("*.py"):
        if path.name != "_optionlist.py":
            names.update(m.lower() for m in READS.findall(path.read_text()))
    return names | set(_SSL_OPTIONS)


def test_the_list_is_what_the_code_reads() -> None:
    listed = {o.name.lower() for o in _optionlist.OPTIONS}
    hooks = {"_failafterrows", "_pauseat"}  # test hooks, not documented
    assert _read_by_code() - hooks == listed


def test_docs_spark_md_has_the_table_of_the_list() -> None:
    assert _optionlist.table() in (ROOT / "docs" / "spark.md").read_text()


def test_a_misspelt_option_is_an_error_naming_the_close_ones() -> None:
    with pytest.raises(
        LbsError, match=r"unknown option 'maxEntriesPerTriger'.*'maxEntriesPerTrigger'"
    ):
        _optionlist.check({"url": "redis://x", "maxEntriesPerTriger": "5"}, "readStream")


def test_an_option_of_another_mode_is_an_error() -> None:
    with pytest.raises(LbsError, match="option 'group' applies to readStream, not to write"):
        _optionlist.check({"url": "redis://x", "group": "g"}, "write")


def test_sparks_own_options_pass_and_a_path_is_refused() -> None:
    _optionlist.check({"url": "u", "checkpointLocation": "/c", "queryName": "q"}, "writeStream")
    with pytest.raises(LbsError, match="takes no path"):
        _optionlist.check({"url": "u", "path": "p"}, "read")
