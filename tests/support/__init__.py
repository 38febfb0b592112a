"""What tests, benchmarks, the demo and scripts share to run ftgovd outside systemd; never shipped in the package.

- daemon: the one launcher (start ftgovd on a fake tree, wait for READY=1 through its sd_notify messages) and a raw
  JSON-RPC client;
- notify: the receiving end of sd_notify;
- fswatch: inotify on a devfreq node (which files were written, and how often);
- faults: the random-point SIGKILL trial (tests/daemon/test_faults.py and benchmarks/stress.py);
- fakenvml/: a pynvml stand-in, importable as ``pynvml`` with FAKENVML_DIR first on sys.path.

Import it as ``tests.support`` with the repository root on sys.path (tests/conftest.py, and each script, put it there).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKENVML_DIR = Path(__file__).resolve().parent / "fakenvml"
# A file that reads as an integer but refuses every write, root's included: a sysctl of mode 0444 (sysctl enforces its
# mode even for root, who ignores the mode of an ordinary file, so chmod would prove nothing). One whose value holds
# still: /proc/sys/fs/file-nr, used before, counts the system's open files, so a limit read from it moved between a
# pin's snapshot and its restore's on a busy machine, and the restore, finding "changed" limits, wrote and failed.
READ_ONLY_INT_FILE = Path("/proc/sys/kernel/ngroups_max")

# An AGX Orin /etc/nvpmodel.conf cut to two modes, in the layout ftgov doctor parses (unverified on a board).
NVPMODEL_CONF = """\
< PARAM TYPE=CLOCK NAME=GPU >
MAX_FREQ /sys/devices/platform/gpu.0/devfreq_dev/max_freq
< POWER_MODEL ID=0 NAME=MAXN >
GPU MIN_FREQ 0
GPU MAX_FREQ -1
< POWER_MODEL ID=2 NAME=MODE_30W >
GPU MIN_FREQ 0
GPU MAX_FREQ 612000000
< PM_CONFIG DEFAULT=2 >
"""
