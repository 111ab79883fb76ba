"""The Debian mirrors this machine's own apt configuration names.

The kit never writes a mirror's host name: the test hosts' and the images' root filesystems are
made by debootstrap from the mirror (and suites) this machine already uses, read here from
/etc/apt/sources.list and sources.list.d (one-line and deb822 formats).
"""

from __future__ import annotations

import re
from pathlib import Path


class NoMirror(RuntimeError):
    """No Debian mirror for the suite in this machine's apt sources; the message says what to add."""


def apt_mirrors() -> list[tuple[str, str]]:
    """(URI, suite) pairs from the machine's apt sources, in the order apt reads them."""
    found: list[tuple[str, str]] = []
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file() or not path.name.endswith((".list", ".sources")):
            continue
        text = path.read_text(errors="replace")
        for line in text.splitlines():  # one-line format
            m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m:
                found.append((m.group(1), m.group(2)))
        for stanza in re.split(r"\n\s*\n", text):  # deb822 format
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            if "deb" in fields.get("Types", "").split() and fields.get("Enabled", "yes") != "no":
                for uri in fields.get("URIs", "").split():
                    for suite in fields.get("Suites", "").split():
                        found.append((uri, suite))
    return found


def debian_mirror(suite: str = "bookworm") -> str:
    """The first mirror that carries `suite`."""
    for uri, found in apt_mirrors():
        if found == suite:
            return uri
    raise NoMirror(f"no {suite} mirror in this machine's apt sources: add one, then retry")
