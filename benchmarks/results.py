"""benchmarks/RESULTS.md is shared by the benchmark scripts: each owns its "## " sections."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
TITLE = "# Benchmark results"


def machine() -> str:
    """Where and when: for the line under each section's title."""
    uname = platform.uname()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), uname.processor) if Path("/proc/cpuinfo").exists() else ""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"Measured {datetime.date.today().isoformat()} on {uname.node}: {cpu}, {os.cpu_count()} cores, "
            f"{memory:.0f} GiB RAM, {uname.system} {uname.release}, Python {platform.python_version()}")


def _split(text: str) -> tuple[str, dict[str, str]]:
    head, *parts = text.split("\n## ")
    return head, {part.split("\n", 1)[0]: "## " + part.rstrip() for part in parts}


def write(head: list[str] | None = None, sections: dict[str, list[str]] | None = None) -> None:
    """Replace the text above the first section (``head``) and the named sections, keeping the others."""
    current_head, current = _split(RESULTS.read_text() if RESULTS.exists() else TITLE + "\n")
    for title, lines in (sections or {}).items():
        current[title] = "\n".join([f"## {title}", "", *lines]).rstrip()
    text = ("\n".join(head) if head is not None else current_head).rstrip()
    RESULTS.write_text(text + "\n\n" + "\n\n".join(current.values()) + "\n")


def child(command: list[str], timeout: float | None = None) -> dict:
    """Run one measurement in its own process: the JSON object its last output line holds, or
    ``{"error": its last line of errors}`` (also when it runs past ``timeout`` seconds)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    output = done.stdout.strip().splitlines()
    if done.returncode == 0 and output:
        return json.loads(output[-1])
    return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
