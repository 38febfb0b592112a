"""Text from the daemon made safe for a terminal: every character a terminal could act on is shown as an escape.

Job names come from clients. The daemon refuses control and format characters in new names, but a name already in
a state file, or a daemon of another version, may still carry ESC sequences (a new window title, a cleared screen, a
forged status line), a CR, a NUL or U+202E (which reverses what follows it). Whatever prints daemon text on an
operator's terminal or into a metrics file passes it through ``printable``.
"""

from __future__ import annotations

import unicodedata

_UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def printable(text: str) -> str:
    """text with each control, format, surrogate, private-use, unassigned or line-separator character written as
    \\xNN, \\uNNNN or \\UNNNNNNNN (and backslashes doubled, so an escape cannot be forged)."""
    if text.isascii() and text.isprintable() and "\\" not in text:
        return text
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in _UNPRINTABLE_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)
