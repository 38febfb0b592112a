#!/usr/bin/env bash
# End-to-end tests of ftgovd under a real systemd: boots a Debian bookworm container with systemd-nspawn (systemd is PID 1
# inside, which it is not on our CI machines), installs ftgov in it with `make install`, and runs checks.py there.
# Recipe and pitfalls: docs/install.md (the systemd suite) and the comments below.
#
# Usage: tests/systemd/run.sh [--smoke]      (as root; --smoke stops after booting and running `systemctl --version`)
# Environment: FTGOV_CI_CACHE (default /var/cache/ftgov-ci) holds the root file system tarball and the dependency wheels,
# outside the checkout so that later runs skip mmdebstrap (about 25 s) and the PyPI downloads.
# FTGOV_CI_KEEP=1 keeps the container's directory after the run for inspection.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${FTGOV_CI_CACHE:-/var/cache/ftgov-ci}
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

log() { printf '[systemd-ci %(%T)T] %s\n' -1 "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

[[ $(id -u) == 0 ]] || die "must run as root (systemd-nspawn, cgroups)"

ensure_host_packages() {
    local missing=() p
    for p in "${HOST_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return
    log "installing host packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The checkout as git sees it (tracked plus untracked, not ignored), so uncommitted work is tested and build/ or .venv/
# never leak in. Building from this copy also keeps setuptools' build/ and *.egg-info out of the checkout.
copy_source() {
    local dest=$1
    mkdir -p "$dest"
    git -C "$REPO" ls-files -z --cached --others --exclude-standard \
        | (cd "$REPO" && xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) \
        | tar -C "$REPO" --null -T - -cf - | tar -C "$dest" -xf -
}

sha_of() { sha256sum | cut -c1-16; }

# Dependency wheels (pydantic, pyyaml, systemd-python, nvidia-ml-py) are cached under a key made of the project metadata and
# the interpreter; the project's own wheel is rebuilt every run because it is the thing under test.
build_wheels() {
    local src=$1 out=$2
    local venv=$CACHE/build-venv
    if [[ ! -x $venv/bin/pip ]]; then
        log "creating the wheel-building venv with $HOST_PYTHON"
        rm -rf "$venv"
        "$HOST_PYTHON" -m venv "$venv"
        # setuptools>=68 is the project's build requirement; ensurepip's is older. wheel: systemd-python builds with it.
        "$venv/bin/pip" install -q "setuptools>=68" wheel
    fi
    local key
    key=$( { cat "$src/pyproject.toml"; "$HOST_PYTHON" --version; uname -m; } | sha_of)
    local deps=$CACHE/wheels-$key
    if [[ ! -d $deps ]]; then
        log "building dependency wheels into $deps"
        rm -rf "$deps.tmp"
        # nvml: check_nvml_dropin installs with BACKEND=nvml, which adds nvidia-ml-py.
        "$venv/bin/pip" wheel -q --no-build-isolation -w "$deps.tmp" "$src[systemd,nvml]"
        rm -f "$deps.tmp"/ftgov-*.whl
        mv "$deps.tmp" "$deps"
    fi
    mkdir -p "$out"
    cp "$deps"/*.whl "$out/"
    "$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$out" "$src"
}

# A cached root file system, keyed on what goes into it. mmdebstrap writes the tarball itself (as root it keeps owners,
# modes and device nodes); the tarball is renamed into place only once complete, so an interrupted run leaves no bad cache.
ensure_rootfs_tarball() {
    local key
    key=$(printf '%s\n' "$SUITE" "${ROOTFS_PACKAGES[@]}" "$(uname -m)" | sha_of)
    ROOTFS_TAR=$CACHE/rootfs-$SUITE-$key.tar.zst
    [[ -f $ROOTFS_TAR ]] && return
    log "building the $SUITE root file system (cold cache, about half a minute)"
    local pkgs
    pkgs=$(IFS=,; echo "${ROOTFS_PACKAGES[*]}")
    mmdebstrap --quiet --variant=apt --include="$pkgs" "$SUITE" "$ROOTFS_TAR.tmp.tar.zst"
    mv "$ROOTFS_TAR.tmp.tar.zst" "$ROOTFS_TAR"
}

# nspawn leaves payload/supervisor cgroups behind; a per-run cgroup in both hierarchies of this hybrid layout keeps them
# contained and lets teardown remove them. Only one container at a time: the machine name below is fixed.
CGROUP_NAME=ftgov-ci-$$
CGROUP_DIRS=()
enter_run_cgroup() {
    local h
    for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
        [[ -f $h/cgroup.procs ]] || continue
        mkdir -p "$h/$CGROUP_NAME"
        echo $$ >"$h/$CGROUP_NAME/cgroup.procs"
        CGROUP_DIRS+=("$h/$CGROUP_NAME")
    done
}

leave_run_cgroup() {
    local d
    for d in "${CGROUP_DIRS[@]}"; do
        echo $$ >"$(dirname "$d")/cgroup.procs" 2>/dev/null || true
        # Children first: rmdir only works on empty leaves.
        find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
        [[ -d $d ]] && log "warning: could not remove cgroup $d"
    done
    return 0
}

NSPAWN_PID=
LEADER=
WORK=
WORK_MOUNTED=0
CHECKS_STARTED=0
teardown() {
    local rc=$?
    set +e
    if [[ -n $NSPAWN_PID ]] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
        # SIGTERM makes nspawn ask the container's systemd for an orderly shutdown.
        kill -TERM "$NSPAWN_PID"
        timeout 30 tail --pid="$NSPAWN_PID" -f /dev/null || { log "container did not stop; killing it"; kill -KILL "$NSPAWN_PID"; }
        wait "$NSPAWN_PID" 2>/dev/null
    fi
    leave_run_cgroup
    # Once the checks run they print the daemon's journal themselves; the console only helps before that.
    if ((rc != 0 && !CHECKS_STARTED)) && [[ -n $WORK && -f $WORK/console.log ]]; then
        log "container console (last 40 lines):"
        tail -n 40 "$WORK/console.log" >&2
    fi
    if [[ -n $WORK ]]; then
        if [[ ${FTGOV_CI_KEEP:-0} == 1 ]]; then
            log "kept $WORK (a tmpfs: umount $WORK && rmdir $WORK when done)"
        else
            ((WORK_MOUNTED)) && umount "$WORK"
            rm -rf "$WORK"
        fi
    fi
    ((rc == 0)) && log "PASS" || log "FAIL (exit $rc)"
    exit $rc
}

# Run a command in the booted container: all of its namespaces, a clean environment.
in_ct() {
    nsenter -t "$LEADER" -a env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
}

# The container's PID 1 is nspawn's first child. It exists within milliseconds and listens on its bus socket within a
# fraction of a second; there is no event to wait on from outside the container, hence the bounded retry.
find_leader() {
    local deadline=$((SECONDS + 10)) children
    while ((SECONDS < deadline)); do
        kill -0 "$NSPAWN_PID" 2>/dev/null || die "systemd-nspawn exited early"
        children=$(cat "/proc/$NSPAWN_PID/task/$NSPAWN_PID/children" 2>/dev/null || true)
        if [[ -n $children ]]; then
            LEADER=${children%% *}
            # nspawn's child execs systemd once the namespaces are set up; nsenter before that would join half-made ones.
            # systemctl needs the manager's private socket, which systemd binds a moment after it starts.
            [[ $(readlink "/proc/$LEADER/exe" 2>/dev/null) == */systemd && -S /proc/$LEADER/root/run/systemd/private ]] \
                && return
        fi
        sleep 0.05
    done
    die "no container manager after 10 s"
}

boot_container() {
    local rootfs=$1
    log "booting the container"
    systemd-nspawn -q -D "$rootfs" --register=no --keep-unit --machine=ftgov-ci --console=read-only --boot \
        >"$WORK/console.log" 2>&1 &
    NSPAWN_PID=$!
    find_leader
    local state
    state=$(timeout --foreground "$BOOT_TIMEOUT_S" nsenter -t "$LEADER" -a env -i PATH=/usr/bin:/bin \
        systemctl is-system-running --wait 2>&1) || true
    case $state in
        running) ;;
        degraded) log "container is degraded:"; in_ct systemctl --failed --no-pager >&2 ;;
        *) die "container did not finish booting within ${BOOT_TIMEOUT_S}s (state: ${state:-none})" ;;
    esac
    log "container up (leader pid $LEADER, state $state)"
}

main() {
    trap teardown EXIT
    log "start"
    ensure_host_packages
    mkdir -p "$CACHE"
    # One container at a time (fixed machine name, one per-run cgroup pair): a second run waits for the first.
    exec 9>"$CACHE/run.lock"
    flock -w 900 9 || die "another run holds $CACHE/run.lock"
    WORK=$(mktemp -d /var/tmp/ftgov-systemd.XXXXXX)
    # The container lives in memory (about 400 MB): writing and deleting its 250 MB root file system on a busy disk
    # took half a minute each way on our machines, in RAM it takes two seconds.
    mount -t tmpfs -o size=2g,mode=0755 ftgov-ci "$WORK"
    WORK_MOUNTED=1
    ensure_rootfs_tarball
    local rootfs=$WORK/rootfs
    mkdir "$rootfs"
    tar --zstd -C "$rootfs" -xpf "$ROOTFS_TAR"
    log "root file system extracted"

    if ((SMOKE == 0)); then
        copy_source "$WORK/src"
        build_wheels "$WORK/src" "$rootfs/wheelhouse"
        cp -a "$WORK/src" "$rootfs/src"
        log "wheels built"
    fi

    enter_run_cgroup
    boot_container "$rootfs"
    in_ct systemctl --version | head -n 1
    ((SMOKE == 1)) && return 0

    log "make install in the container"
    in_ct make -C /src install WHEELHOUSE=/wheelhouse
    log "running checks"
    CHECKS_STARTED=1
    timeout --foreground "$CHECKS_TIMEOUT_S" nsenter -t "$LEADER" -a env -i \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        python3 /src/tests/systemd/checks.py
    log "checks done; shutting the container down"
}

main "$@"
