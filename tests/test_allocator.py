"""mtt keeps freed memory for reuse (glibc's allocator), unless the user tuned the allocator."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import untuned_allocator_environment

# a 64 MB tensor filled and freed: is its memory still the process's afterwards?
KEPT_AFTER_FREE = """
import torch
from mtt.allocator import keep_freed_memory

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

print(keep_freed_memory())
before = resident()
tensor = torch.ones(16 * 2**20)
del tensor
print((resident() - before) / 2**20)
"""


def _run(extra_env: dict[str, str]) -> tuple[bool, float]:
    result = subprocess.run(
        [sys.executable, "-c", KEPT_AFTER_FREE],
        env={**untuned_allocator_environment(), **extra_env},
        capture_output=True,
        text=True,
        check=True,
    )
    applied, kept = result.stdout.split()
    return applied == "True", float(kept)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator settings are Linux-only")
def test_freed_memory_is_kept_for_the_next_step():
    applied, kept = _run({})
    assert applied
    assert kept > 60  # MB: the freed tensor's pages stay mapped for the next allocation


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator settings are Linux-only")
def test_the_users_allocator_settings_win():
    applied, kept = _run({"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert not applied
    assert kept < 10  # MB: glibc's default, a large block goes back to the system when freed
