#!/usr/bin/env bash
# End-to-end tests of ftgovd under a real systemd: boots a Debian bookworm container with systemd-nspawn (systemd is PID 1
# inside, which it is not on our CI machines), installs ftgov in it with `make install`, and runs checks.py there.
# Recipe and pitfalls: docs/install.md (the systemd suite) and the comments below.
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
RUN_LOCK=/run/lock/ftgov-ci.lock
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

installed_packages() { dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" {print $2}' | sort; }

# Packages built from systemd's source must be the installed systemd's version: the newest would upgrade the host's
# systemd and its libraries along with them, which a purge does not undo.
host_install_args() {
    local p version
    version=$(dpkg-query -W -f='${Version}' libsystemd0 2>/dev/null || true)
    for p in "$@"; do
        case $p in
            systemd-container | libsystemd-dev) [[ -n $version ]] && p="$p=$version" ;;
        esac
        printf '%s\n' "$p"
    done
}

# What this run installs on the host, dependencies included; teardown purges exactly these. The .deb files go to a
# directory of the run's own, not to apt's cache.
INSTALLED_BY_RUN=()
APT_ARCHIVES=
ensure_host_packages() {
    local missing=() args=() p before upgrades
    for p in "${HOST_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return
    mapfile -t args < <(host_install_args "${missing[@]}")
    APT_ARCHIVES=$(mktemp -d /var/tmp/ftgov-apt.XXXXXX)
    mkdir "$APT_ARCHIVES/partial"
    local apt=(apt-get -o "Dir::Cache::Archives=$APT_ARCHIVES" -o APT::Sandbox::User=root)
    apt-get update -qq
    # An installed package that would change version is refused: the host is to be left as found.
    upgrades=$("${apt[@]}" -s install --no-install-recommends "${args[@]}" | awk '/^Inst [^ ]+ \[/ {print $2}')
    [[ -z $upgrades ]] || die "installing ${args[*]} would change installed packages (${upgrades//$'\n'/ }):" \
        "install ${missing[*]} by hand, or upgrade first"
    log "installing host packages: ${args[*]} (purged again at the end of the run)"
    before=$(installed_packages)
    # Recorded even when the install fails half-way: whatever it did install is purged.
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends "${args[@]}" >/dev/null || {
        mapfile -t INSTALLED_BY_RUN < <(comm -13 <(echo "$before") <(installed_packages))
        die "apt-get install ${missing[*]} failed"
    }
    mapfile -t INSTALLED_BY_RUN < <(comm -13 <(echo "$before") <(installed_packages))
}

purge_host_packages() {
    [[ -n $APT_ARCHIVES ]] && rm -rf "$APT_ARCHIVES"
    ((${#INSTALLED_BY_RUN[@]} == 0)) && return 0
    log "purging the host packages this run installed: ${INSTALLED_BY_RUN[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${INSTALLED_BY_RUN[@]}" >/dev/null \
        || log "warning: could not purge ${INSTALLED_BY_RUN[*]}"
}

# One container at a time (fixed machine name, one per-run cgroup pair): a second run waits for the first. The last
# run out removes the lock file; a waiter that then gets the lock on the removed file takes the lock again on a new one.
take_run_lock() {
    while :; do
        exec 9>>"$RUN_LOCK"
        flock -w 900 9 || die "another run holds $RUN_LOCK"
        [[ /proc/self/fd/9 -ef $RUN_LOCK ]] && return
        exec 9>&-
    done
}

release_run_lock() {
    { true >&9; } 2>/dev/null || return 0  # never taken
    rm -f "$RUN_LOCK"
    exec 9>&-
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
    purge_host_packages
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
    release_run_lock
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
    # Under the lock: a run's purge at its end must not pull packages from under another run.
    take_run_lock
    ensure_host_packages
    WORK=$(mktemp -d /var/tmp/ftgov-systemd.XXXXXX)
    # The container lives in memory (about 400 MB): writing and deleting its 250 MB root file system on a busy disk
    # took half a minute each way on our machines, in RAM it takes two seconds.
    mount -t tmpfs -o size=3g,mode=0755 ftgov-ci "$WORK"
    WORK_MOUNTED=1
    CACHE=${CACHE:-$WORK/cache}
    mkdir -p "$CACHE"
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
