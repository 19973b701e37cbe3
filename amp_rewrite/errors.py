"""Errors that reach the user as one line, and the text of untrusted strings made safe to print."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable


class UserError(Exception):
    """A mistake in the user's input or options: reported as one line, exit code 2."""


class RangeCheckFailed(UserError):
    """The range check could not measure the model on the data it was asked to use: ``reason``,
    and ``source``, the data as the range check names them (None where they were never made, and
    the reason says why). A caller that tries other data (the training step, on generated sets)
    catches this type and names the data as it knows them (``on``)."""

    def __init__(self, reason: str, source: str | None) -> None:
        self.reason, self.source = reason, source
        super().__init__(f"range check: {self.on(source)}")

    def __reduce__(self):
        return type(self), (self.reason, self.source)

    def on(self, data: str | None) -> str:
        """Why, with the data named ``data``."""
        return self.reason if self.source is None else f"onnxruntime could not run the model on {data} ({self.reason})"


_LINE_BREAKING = frozenset({"Cc", "Zl", "Zp"})
_ESCAPED = frozenset(map(chr, [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C,
                                0xFFFE, 0xFFFF]))
"""Bidirectional controls, and the two noncharacters that XML 1.0 forbids."""


def printable(text: str) -> str:
    """``text`` with every character that could break its line or drive a terminal written as an
    escape (newlines, carriage returns, ANSI escape sequences, Unicode line separators, and the
    bidirectional controls that reorder what a reader sees): names and strings from model and data
    files are the sender's choice, and printed as they are they could forge lines of a log, an error
    that spans several, or a terminal's title. What is left is also valid in XML 1.0 (JUnit files).
    Printable text, non-ASCII letters included, is kept."""
    if text.isprintable():  # the common case: nothing to escape (isprintable is false for every escaped class)
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _LINE_BREAKING or c in _ESCAPED else c
                   for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable_lines(lines: Iterable[str]) -> str:
    """The lines of a text for the terminal, each ``printable``: a name inside one cannot start another."""
    return "\n".join(map(printable, lines))
