"""The ftgovd command and ``python -m governor.daemon``: the daemon's entry, run before any of its imports.

asyncio imports ssl where it can (asyncio.base_events), and that is 4 MB of the daemon's 40 MB resident set. ftgovd
speaks only over a Unix socket and never uses TLS, so the import is refused here, before asyncio loads; asyncio runs
without it (only its TLS support is unavailable). A library that did need ssl in the daemon would fail to import,
loudly, at start (tests/daemon/test_entry.py).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    if "ssl" not in sys.modules:  # already loaded (an embedding process): nothing to save
        sys.modules["ssl"] = None  # type: ignore[assignment]  # None: `import ssl` raises ImportError
    try:
        from governor.daemon.main import main as run_daemon

        return run_daemon(argv)
    except KeyboardInterrupt:
        # Before the loop takes SIGINT over (imports, the store, the GPUs' probe): a Ctrl-C there was a traceback. A
        # baseline it saved is in the state file, for the next start or `ftgov restore`.
        print("ftgovd: interrupted while starting", file=sys.stderr)
        return 130
