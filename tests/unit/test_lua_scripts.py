"""Lua scripts: file names carry the key count their headers document."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lbs import _scripts

SCRIPTS = Path(_scripts.__file__).parent / "scripts"


@pytest.mark.parametrize("name", _scripts.SCRIPT_NAMES)
def test_header_matches_the_file_name(name: str) -> None:
    text = (SCRIPTS / f"{name}.lua").read_text()
    header = text.split("]]", 1)[0]
    assert header.startswith("--[["), "each script opens with a header comment"
    assert "Output" in header and "ARGV[1]" in header
    count = name.rsplit("-", 1)[1]
    keys = re.findall(r"KEYS\[(\d+)(?:\.\.[^\]]*)?\]", header)
    if count == "n":
        assert re.search(r"KEYS\[\d+\.\.", header), "a variable key count is documented as a range"
    else:
        assert max(map(int, keys)) == int(count)


def test_every_script_file_is_registered() -> None:
    assert sorted(p.stem for p in SCRIPTS.glob("*.lua")) == sorted(_scripts.SCRIPT_NAMES)
