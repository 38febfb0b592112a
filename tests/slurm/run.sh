#!/usr/bin/env bash
# End-to-end tests of `ftgov slurm prolog|epilog` under a real Slurm: boots a Debian bookworm container (the machinery
# of tests/support/container.sh, shared with tests/systemd/run.sh) with Debian's munge, slurmctld, slurmd, slurmdbd and
# MariaDB (for sacct), installs ftgov with `make install BACKEND=nvml`, gives ftgovd two fake NVML GPUs
# (tests/support/fakenvml) that slurmd offers as GRES gpu:2, and runs checks.py there. checks.py starts a second
# slurmd in namespaces of its own, a second node for a heterogeneous job's second component.
#
# Usage: tests/slurm/run.sh [--smoke]      (as root; --smoke stops after booting the container)
# Environment: FTGOV_CI_CACHE and FTGOV_CI_KEEP as for tests/systemd/run.sh (the root file system tarball is cached
# under its own key: its package list differs).
#
# The host is left as found, as the systemd suite leaves it: purged host packages, no tmpfs, no cgroups, no lock file.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${FTGOV_CI_CACHE:-}
SMOKE=0
[[ ${1:-} == --smoke ]] && SMOKE=1

HOST_PYTHON=/usr/bin/python3
SUITE=bookworm
HOST_PACKAGES=(systemd-container mmdebstrap libsystemd-dev pkg-config gcc python3-dev python3-venv zstd)
# Debian's Slurm 22.05 and what it needs: munge for authentication, slurmdbd on MariaDB so that sacct has the jobs.
# iproute2: the container's network namespace gets one more address (checks.py says why).
ROOTFS_PACKAGES=(systemd systemd-sysv dbus python3 python3-venv make procps iproute2
                 munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
BOOT_TIMEOUT_S=90
CHECKS_TIMEOUT_S=300
LOG_TAG=slurm-ci
MACHINE=ftgov-slurm-ci
TMPFS_SIZE=4g
# Slurm's daemons and MariaDB listen on TCP ports: in a network namespace of the container's own (loopback only), they
# cannot meet the host's services or another run's.
NSPAWN_EXTRA=(--private-network)

# shellcheck source=tests/support/container.sh
source "$REPO/tests/support/container.sh"

main() {
    start_container
    ((SMOKE == 1)) && return 0

    log "make install BACKEND=nvml in the container"
    in_ct make -C /src install WHEELHOUSE=/wheelhouse BACKEND=nvml >/dev/null
    log "running checks"
    run_checks "$CHECKS_TIMEOUT_S" python3 /src/tests/slurm/checks.py
    log "checks done; shutting the container down"
}

main "$@"
