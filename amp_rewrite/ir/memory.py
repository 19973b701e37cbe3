"""The process's memory: what it hands back to the system between steps."""

from __future__ import annotations

import ctypes
import os


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Freed memory otherwise stays resident for the process's next allocations:
    a process that now only waits would hold it for nothing."""
    libc = ctypes.CDLL(None) if os.name == "posix" else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
