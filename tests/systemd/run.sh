#!/usr/bin/env bash
# End-to-end tests of ftgovd under a real systemd: boots a Debian bookworm container with systemd-nspawn (systemd is PID 1
# inside, which it is not on our CI machines), installs ftgov in it with `make install`, and runs checks.py there.
# Recipe and pitfalls: docs/install.md (the systemd suite), the comments below and the shared machinery in
# tests/support/container.sh.
#
# Usage: tests/systemd/run.sh [--smoke]      (as root; --smoke stops after booting and running `systemctl --version`)
# Environment: FTGOV_CI_CACHE names a directory that keeps the root file system tarball and the dependency wheels across
# runs (later runs skip mmdebstrap, about 25 s, and the PyPI downloads); by default they live in the run's own tmpfs and
# go with it. FTGOV_CI_KEEP=1 keeps the container's directory after the run for inspection.
#
# The host is left as found: host packages the run had to install (HOST_PACKAGES and what they pulled in) are purged
# at its end, the run's tmpfs and cgroups are removed, and its lock file goes with the last run.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${FTGOV_CI_CACHE:-}  # empty: $WORK/cache, gone with the run
SMOKE=0
[[ ${1:-} == --smoke ]] && SMOKE=1

# The Debian interpreter, not whatever `python3` is first on PATH: the wheels must match the container's Python 3.11.
HOST_PYTHON=/usr/bin/python3
SUITE=bookworm
HOST_PACKAGES=(systemd-container mmdebstrap libsystemd-dev pkg-config gcc python3-dev python3-venv zstd)
# procps: the unit's ExecReload= runs /bin/kill, which every Ubuntu/L4T image has and a minimal Debian lacks.
ROOTFS_PACKAGES=(systemd systemd-sysv dbus python3 python3-venv make procps)
BOOT_TIMEOUT_S=60
CHECKS_TIMEOUT_S=240
LOG_TAG=systemd-ci
MACHINE=ftgov-ci

# shellcheck source=tests/support/container.sh
source "$REPO/tests/support/container.sh"

main() {
    start_container
    in_ct systemctl --version | head -n 1
    ((SMOKE == 1)) && return 0

    log "make install in the container"
    in_ct make -C /src install WHEELHOUSE=/wheelhouse
    log "running checks"
    run_checks "$CHECKS_TIMEOUT_S" python3 /src/tests/systemd/checks.py
    log "checks done; shutting the container down"
}

main "$@"
