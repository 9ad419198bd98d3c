"""trainer.allocator: glibc keeps large buffers in its heaps instead of mapping each one afresh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.allocator import _glibc

ROOT = Path(__file__).resolve().parents[1]

# In a fresh process: tune (or not), allocate 8 MB, and report how much glibc mmap-ed for it (mallinfo2).
PROBE = """
import ctypes, json, sys
from trainer.allocator import keep_large_buffers
tuned = keep_large_buffers() if sys.argv[1] == "1" else False
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                     "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.mallinfo2.restype = Info
before = libc.mallinfo2().hblkhd
block = libc.malloc(8 << 20)
print(json.dumps({"tuned": tuned, "mapped": libc.mallinfo2().hblkhd - before >= 8 << 20}))
"""

pytestmark = pytest.mark.skipif(_glibc() is None, reason="glibc only")


def _probe(tune: bool, **environment: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    env.update(environment)
    command = [sys.executable, "-c", PROBE, str(int(tune))]
    output = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(output)


def test_large_buffers_come_from_the_heap_once_tuned():
    assert _probe(tune=False) == {"tuned": False, "mapped": True}, "glibc's default: a mapping of its own"
    assert _probe(tune=True) == {"tuned": True, "mapped": False}


def test_thresholds_set_in_the_environment_win():
    assert _probe(tune=True, MALLOC_TRIM_THRESHOLD_="1048576") == {"tuned": False, "mapped": True}


def test_run_tunes_malloc_unless_told_not_to(monkeypatch):
    from conftest import compose
    from trainer.config import to_settings
    from trainer.tasks import common

    calls = []
    monkeypatch.setattr(common.allocator, "keep_large_buffers", lambda: calls.append(True) or True)
    for value, expected in (("true", [True]), ("false", [])):
        calls.clear()
        common.setup_strategy(to_settings(compose(["debug=smoke", f"trainer.tune_malloc={value}"], Path("/tmp"))))
        assert calls == expected
