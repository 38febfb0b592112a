"""governor.daemon.entry: the real ftgovd process runs without the ssl module, which asyncio would load (4 MB)."""

from __future__ import annotations

import subprocess
import sys


def test_the_running_daemon_has_no_ssl_loaded_and_serves(start_daemon):
    d = start_daemon()
    assert d.client().call("ping") == {}
    with open(f"/proc/{d.proc.pid}/maps") as f:
        mapped = f.read()
    assert "_ssl" not in mapped and "libssl" not in mapped, "asyncio loaded ssl in ftgovd"


def test_ssl_is_refused_only_in_the_daemon_entry():
    probe = ("import sys\nfrom governor.daemon import entry, main\nmain.main = lambda argv: "
             "print(sys.modules['ssl'] is None and 'asyncio' in sys.modules) or 0\nsys.exit(entry.main([]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out  # asyncio came first here: ssl was loaded
    fresh = ("import sys\nsys.argv = ['ftgovd', '--help']\nfrom governor.daemon import entry\n"
             "try:\n    entry.main(['--help'])\nexcept SystemExit:\n    pass\nimport asyncio\n"
             "print(sys.modules.get('ssl', 'absent'))")
    out = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "None", out


def test_a_ctrl_c_while_ftgovd_starts_is_one_line_not_a_traceback():
    """Before the loop takes SIGINT over (the imports, the store, the GPUs' probe: about half a second), a Ctrl-C was
    Python's KeyboardInterrupt traceback."""
    probe = ("import sys\nfrom governor.daemon import entry, main\n"
             "def interrupted(argv):\n    raise KeyboardInterrupt\n"
             "main.main = interrupted\nsys.exit(entry.main([]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr) == (130, "ftgovd: interrupted while starting\n"), out
