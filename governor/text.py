"""Client text on operators' screens: one rule for what the protocol refuses in a name and what every display escapes.

Job names come from clients and end up in `ftgov status`, `history`, `report`, metric labels and the journal. What
a terminal or a bidi-aware viewer could act on is refused in new names (`unprintable_at`, called by the protocol) and
escaped wherever daemon text is shown (`printable`), so that a name from an older state file or daemon is harmless
too:

- control, format, surrogate, private-use and unassigned characters, and line/paragraph separators (ESC sequences, a
  CR that rewrites a line, U+202E that reverses what follows, zero-width joiners);
- Hangul fillers (U+115F, U+1160, U+3164, U+FFA0): letters by category that draw nothing, so a name of them is blank;
- a combining mark at the start of a name (it would sit on the cell before it), and more than `MAX_MARKS` in a row
  (stacked marks that paint over the lines above and below).

Right-to-left scripts are names like any other (Hebrew, Arabic). In a table, though, a right-to-left name reorders
the cells around it, so human outputs wrap such names in FIRST STRONG ISOLATE ... POP DIRECTIONAL ISOLATE
(`isolated`), which confines the reordering to the name (Unicode Bidirectional Algorithm, UAX #9, isolates).
JSON output carries names as they are, with non-ASCII escaped.
"""

from __future__ import annotations

import unicodedata

_UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")
MAX_NAME_CHARS = 256  # the longest job name the protocol takes (and the state file keeps)


def shortened_name(name: str | None) -> str | None:
    """A name made up for a job (a model's local path) cut to MAX_NAME_CHARS, its end kept: the part of a path that
    tells runs apart. A name the user gave is sent as given, and a long one is refused, naming the field."""
    if name is None or len(name) <= MAX_NAME_CHARS:
        return name
    return "\u2026" + name[-(MAX_NAME_CHARS - 1):]


MAX_MARKS = 4  # combining marks in a row: Vietnamese and Indic text need two or three
_FSI, _PDI = "\u2068", "\u2069"


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _flags(text: str) -> list[bool]:
    """For each character, whether a screen could act on it (the module's rules)."""
    flags, marks = [], 0
    for i, ch in enumerate(text):
        cat = unicodedata.category(ch)
        marks = marks + 1 if cat.startswith("M") else 0
        leading_mark = marks > 0 and i + 1 == marks  # a run of marks that opens the text
        flags.append(cat in _UNPRINTABLE_CATEGORIES or ch in _BLANK_LETTERS or leading_mark or marks > MAX_MARKS)
    return flags


def unprintable_at(text: str) -> int | None:
    """The index of the first character a screen could act on, or None when there is none."""
    if text.isascii() and text.isprintable():  # the usual name: one C-speed check
        return None
    return next((i for i, bad in enumerate(_flags(text)) if bad), None)


def name_problem(name: str) -> str | None:
    """Why a job's name is refused (the daemon's protocol checks with this, and the clients before they send it), or
    None."""
    if len(name) > MAX_NAME_CHARS:
        return f"must have at most {MAX_NAME_CHARS} characters, not {len(name)}"
    bad = unprintable_at(name)
    if bad is not None:
        return (f"must not contain control or format characters, blank fillers or stray combining marks "
                f"(U+{ord(name[bad]):04X} at index {bad}): a name is shown on operators' terminals (governor/text.py)")
    return None


def made_up_name(name: str | None) -> str | None:
    """A name made up for a job (a command's, a model's path) that the daemon takes: what a screen could act on
    escaped (printable), and cut to MAX_NAME_CHARS (shortened_name)."""
    return None if name is None else shortened_name(printable(name))


def printable(text: str) -> str:
    """text with each character `unprintable_at` would flag written as \\xNN, \\uNNNN or \\UNNNNNNNN, and
    backslashes doubled, so that an escape cannot be forged."""
    if text.isascii() and text.isprintable() and "\\" not in text:
        return text
    return "".join("\\\\" if ch == "\\" else _escape(ch) if bad else ch
                   for ch, bad in zip(text, _flags(text), strict=True))


def cells(text: str) -> int:
    """The terminal cells text takes: two for a wide or fullwidth character (CJK, most emoji), none for a combining
    mark, one for the rest (what wcwidth says of the characters `printable` leaves)."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.category(ch) in ("Mn", "Me") else 2 if unicodedata.east_asian_width(ch) in "WF"
               else 1 for ch in text)


def padded(text: str, width: int) -> str:
    """text and spaces up to ``width`` cells (str.ljust counts characters: a wide name pushed the columns after it)."""
    return text + " " * (width - cells(text))


def cut(text: str, width: int, mark: str = "~") -> str:
    """text in at most ``width`` cells, its end replaced by ``mark`` where it was longer."""
    if cells(text) <= width:
        return text
    out, used = "", cells(mark)
    for ch in text:
        if used + cells(ch) > width:
            break
        out, used = out + ch, used + cells(ch)
    return out + mark


def isolated(text: str) -> str:
    """text between FSI and PDI when it holds a right-to-left letter, so that it cannot reorder its neighbours."""
    if text.isascii() or not any(unicodedata.bidirectional(ch) in ("R", "AL") for ch in text):
        return text
    return _FSI + text + _PDI
