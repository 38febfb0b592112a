#!/usr/bin/env bash
# End-to-end tests of `ftgov slurm prolog|epilog` under a real Slurm: boots a Debian bookworm container (the machinery
# of tests/support/container.sh, shared with tests/systemd/run.sh) with Debian's munge, slurmctld, slurmd, slurmdbd and
# MariaDB (for sacct), installs ftgov with `make install BACKEND=nvml`, gives ftgovd two fake NVML GPUs
# (tests/support/fakenvml) that slurmd offers as GRES gpu:2, and runs checks.py there. checks.py starts a second
# slurmd in namespaces of its own, a second node for a heterogeneous job's second component.
#
# Usage: tests/slurm/run.sh [--smoke]      (as root; --smoke stops after booting the container)
# Environment: FTGOV_CI_CACHE and FTGOV_CI_KEEP as for tests/systemd/run.sh (the root file system tarball is cached
# under its own key: its package list differs). FTGOV_SLURM_SUITE: the container's release, Debian's bookworm (the
# default, what CI runs: Slurm 22.05, Python 3.11) or trixie (Slurm 24.11, Python 3.13), or Ubuntu's noble (Slurm
# 23.11, Python 3.12) or jammy (Slurm 21.08, Python 3.10).
#
# The host is left as found, as the systemd suite leaves it: purged host packages, no tmpfs, no cgroups, no lock file.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${FTGOV_CI_CACHE:-}
SMOKE=0
[[ ${1:-} == --smoke ]] && SMOKE=1

HOST_PYTHON=/usr/bin/python3
SUITE=${FTGOV_SLURM_SUITE:-bookworm}
HOST_PACKAGES=(systemd-container mmdebstrap libsystemd-dev pkg-config gcc python3-dev python3-venv zstd)
# Debian's Slurm and what it needs: munge for authentication, slurmdbd on MariaDB so that sacct has the jobs.
# iproute2: the container's network namespace gets one more address (checks.py says why).
ROOTFS_PACKAGES=(systemd systemd-sysv dbus python3 python3-venv make procps iproute2
                 munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
SLURMDBD_LIB=/opt/ftgov-ci/slurmdbd-lib  # (trixie) the library slurmdbd runs with, in the container
UBUNTU_MIRROR=http://archive.ubuntu.com/ubuntu

# Ubuntu's archive key, for mmdebstrap: bookworm has no ubuntu-keyring, trixie has (signed by trixie's key, which the
# host's debian-archive-keyring has). apt-get downloads it from trixie with a source list, lists and a cache of its own
# in the run's directory, leaving the host's apt as found.
ubuntu_keyring() {
    local dir=$WORK/apt-trixie keyring=$WORK/ubuntu-archive-keyring.gpg
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        >"$dir/sources.list"
    local apt=(apt-get -q -o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
               -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o APT::Sandbox::User=root)
    { "${apt[@]}" update && (cd "$dir" && "${apt[@]}" download ubuntu-keyring); } >/dev/null \
        || die "apt-get download ubuntu-keyring (trixie's, for Ubuntu's archive key) failed"
    dpkg-deb --fsys-tarfile "$dir"/ubuntu-keyring_*.deb \
        | tar -x -O ./usr/share/keyrings/ubuntu-archive-keyring.gpg >"$keyring"
    rm -rf "$dir"
    MMDEBSTRAP_OPTS+=(--keyring="$keyring")
}
case $SUITE in
    bookworm) ;;
    # Its Python is not the host's: the dependencies' wheels come from the package index for 3.13, and the container
    # builds systemd-python, which has no wheels (tests/support/container.sh, download_target_wheels).
    trixie)
        TARGET_PYTHON=3.13
        ROOTFS_PACKAGES+=(gcc python3-dev libsystemd-dev pkg-config)
        # trixie's slurmd.service has no ConditionPathExists=/etc/slurm/slurm.conf (bookworm's has): enabled, with no
        # slurm.conf yet, slurmd looks for a configless slurmctld in DNS until its start times out, 90 s of the boot,
        # and the unit fails. checks.py starts it once slurm.conf is written.
        # trixie's slurmdbd 24.11.5-4+deb13u1 with its libmariadb3 1:11.8.9+ds-0+deb13u1 stops at its first query
        # ("mysql_query failed: 5027 Number of columns in result (=1) set execeeds maxmimum allowed number of columns
        # (=0)", the mariadb client's same query answers); with bookworm's libmariadb3 (the host's apt, the same
        # soname) it runs. checks.py gives slurmdbd that library where SLURMDBD_LIB is.
        customize_rootfs() {
            rm -f "$ROOTFS/etc/systemd/system/multi-user.target.wants/slurmd.service"
            local deb
            deb=$(mktemp -d)
            (cd "$deb" && apt-get -q -o APT::Sandbox::User=root download libmariadb3 >/dev/null) \
                || die "apt-get download libmariadb3 (the host's, for slurmdbd) failed"
            mkdir -p "$ROOTFS$SLURMDBD_LIB"
            dpkg-deb --fsys-tarfile "$deb"/libmariadb3_*.deb | tar -x -C "$ROOTFS$SLURMDBD_LIB" \
                --strip-components=4 "./usr/lib/$(uname -m)-linux-gnu/libmariadb.so.3"
            rm -rf "$deb"
        }
        ;;
    # Ubuntu's Slurm, from Ubuntu's archive (main and universe, with the -updates and -security pockets a cluster
    # has), signed by a key that ubuntu_keyring fetches. Python as for trixie: not the host's.
    noble | jammy)
        case $SUITE in noble) TARGET_PYTHON=3.12 ;; jammy) TARGET_PYTHON=3.10 ;; esac
        ROOTFS_PACKAGES+=(gcc python3-dev libsystemd-dev pkg-config)
        MMDEBSTRAP_MIRRORS=("deb $UBUNTU_MIRROR $SUITE main universe"
                            "deb $UBUNTU_MIRROR $SUITE-updates main universe"
                            "deb $UBUNTU_MIRROR $SUITE-security main universe")
        prepare_mmdebstrap() { ubuntu_keyring; }
        # noble's slurmd.service has its ConditionPathExists=/etc/slurm/slurm.conf commented out (jammy's has it, as
        # bookworm's): enabled, with no slurm.conf yet, slurmd fails during the boot and the container comes up
        # degraded. As on trixie, checks.py starts it once slurm.conf is written.
        if [[ $SUITE == noble ]]; then
            customize_rootfs() { rm -f "$ROOTFS/etc/systemd/system/multi-user.target.wants/slurmd.service"; }
        fi
        ;;
    *) echo "FTGOV_SLURM_SUITE=$SUITE: use bookworm, trixie, noble or jammy" >&2; exit 2 ;;
esac
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
