"""Where a GovernorWarning points: at the user's line, never at one of ftgov's own."""

from __future__ import annotations

import os
import sys
import warnings

from governor.client.connection import GovernorWarning

# Frames under this directory are ftgov's (the client, the adapters, the CLI), whichever module warns.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def warn(message: str) -> None:
    """Warn with a GovernorWarning attributed to the first frame outside the governor package.

    A location inside ftgov reads as an ftgov bug, and Python's default filter, which shows a warning once per
    location, would count every user's call as that one line of ours. Python 3.12's ``skip_file_prefixes`` does this;
    on 3.11 the stacklevel is counted here (1 is this function's own frame).
    """
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, GovernorWarning, stacklevel=level)
