"""ARCHITECTURE.md stays a true map: every path it names exists, and every top-level package of
the tree appears in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "ARCHITECTURE.md"
PATH = re.compile(r"`((?:reference_impl|harness|suites|fixtures|reports)/[\w./-]*)`")


def test_every_named_path_exists():
    named = sorted(set(PATH.findall(MAP.read_text())))
    assert len(named) >= 30, "the map names too few paths to be checked"
    missing = [p for p in named if not (ROOT / p).exists()]
    assert missing == []


def test_every_package_is_on_the_map():
    text = MAP.read_text()
    for package in ("reference_impl", "harness", "suites", "fixtures", "reports"):
        assert f"`{package}/`" in text, package


def test_named_symbols_exist():
    """The names the map tells a newcomer to look for are where it says."""
    assert "MIXERS" in (ROOT / "reference_impl" / "nemotron_h.py").read_text()
    assert "class NotImplementedByTarget" in (ROOT / "harness" / "targets" / "base.py").read_text()
    assert "def tiny_" in (ROOT / "reference_impl" / "presets.py").read_text()
