"""Reading ftgov's YAML config files (ftgovd's, the Slurm prolog's) where PyYAML alone would lose input silently.

- A key given twice in one mapping is an error naming it and both lines: PyYAML keeps the last one, and the first,
  with every key under it when it is a section (``limits:`` twice), is dropped without a word. Merge keys (``<<``)
  still let a mapping's own keys override what it merges.
- The file is read as bytes, which PyYAML decodes (UTF-8, or UTF-16 with a byte-order mark): a file that is not text
  is a YAMLError like any other, not a UnicodeDecodeError that escapes as a traceback (and, in the Slurm prolog, as a
  non-zero exit that drains the node).
- At most MAX_BYTES are read: the shipped config is 4 KB, and PyYAML's pure-Python parser takes seconds for each
  10 MB, during which a reloading daemon answers nobody and misses its watchdog.
"""

from __future__ import annotations

import os
from collections.abc import Hashable

import yaml

MAX_BYTES = 1 << 20


class TooLarge(ValueError):
    """The file is over MAX_BYTES."""


def read(path: str | os.PathLike) -> bytes:
    """The file's bytes; OSError as open and read raise it (FileNotFoundError, IsADirectoryError, PermissionError);
    TooLarge over MAX_BYTES."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise TooLarge(f"it is larger than {MAX_BYTES // 1024} KiB: not a config file")
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, Hashable):
                    continue  # SafeLoader refuses it ("found unhashable key")
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}: given on line {seen[key].line + 1}, and again",
                        key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def safe_load(data: bytes | str):
    """yaml.safe_load, but a key given twice in one mapping is a yaml.YAMLError naming it."""
    return yaml.load(data, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
