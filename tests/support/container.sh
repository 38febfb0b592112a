# The container machinery shared by the suites that boot a Debian container (bookworm; the Slurm suite's, trixie or
# Ubuntu's noble or jammy too) with systemd-nspawn (tests/systemd/run.sh, tests/slurm/run.sh): host packages
# installed for the run and purged at its end, one run at a time, the checkout copied as git sees it, dependency wheels
# and the root file system cached, a per-run cgroup, boot, nsenter, and a teardown that leaves the host as found. Sourced, not run. The suite sets, before
# sourcing:
#   REPO, CACHE (may be empty), SUITE, HOST_PYTHON, HOST_PACKAGES, ROOTFS_PACKAGES, BOOT_TIMEOUT_S, LOG_TAG, MACHINE,
#   and optionally TMPFS_SIZE (default 3g), NSPAWN_EXTRA (an array of more systemd-nspawn options) and TARGET_PYTHON
#   (the container's Python as X.Y, where it is not HOST_PYTHON's version: build_wheels says what changes),
#   MMDEBSTRAP_MIRRORS (mmdebstrap's MIRROR arguments, sources.list lines; default: Debian's mirror for SUITE) and
#   MMDEBSTRAP_OPTS (more mmdebstrap options); it may define customize_rootfs, run on the extracted root file system
#   ($ROOTFS) before the container boots, and prepare_mmdebstrap, run before a root file system is built (only then:
#   a cached one needs nothing), which may add to MMDEBSTRAP_OPTS.
# and calls `trap teardown EXIT` first thing in its main.
# shellcheck shell=bash

RUN_LOCK=/run/lock/ftgov-ci.lock
NSPAWN_EXTRA=(${NSPAWN_EXTRA[@]+"${NSPAWN_EXTRA[@]}"})  # more systemd-nspawn options (the Slurm suite: a network namespace of its own)
MMDEBSTRAP_MIRRORS=(${MMDEBSTRAP_MIRRORS[@]+"${MMDEBSTRAP_MIRRORS[@]}"})  # (the Slurm suite's Ubuntu releases)
MMDEBSTRAP_OPTS=(${MMDEBSTRAP_OPTS[@]+"${MMDEBSTRAP_OPTS[@]}"})

log() { printf '[%s %(%T)T] %s\n' "$LOG_TAG" -1 "$*" >&2; }
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
    fi
    # setuptools>=77 is the project's build requirement (pyproject.toml); ensurepip's is older, and so is one a cached
    # venv (FTGOV_CI_CACHE) got under an older requirement: pip asks the index only when the installed one falls short.
    # wheel: systemd-python builds with it.
    "$venv/bin/pip" install -q "setuptools>=77" wheel
    local key
    if [[ -n ${TARGET_PYTHON:-} ]]; then
        key=$( { cat "$src/pyproject.toml"; echo "target Python $TARGET_PYTHON"; uname -m; } | sha_of)
    else
        key=$( { cat "$src/pyproject.toml"; "$HOST_PYTHON" --version; uname -m; } | sha_of)
    fi
    local deps=$CACHE/wheels-$key
    if [[ ! -d $deps ]]; then
        log "building dependency wheels into $deps"
        rm -rf "$deps.tmp"
        if [[ -n ${TARGET_PYTHON:-} ]]; then
            download_target_wheels "$src" "$deps.tmp"
        else
            # nvml: check_nvml_dropin installs with BACKEND=nvml, which adds nvidia-ml-py.
            "$venv/bin/pip" wheel -q --no-build-isolation -w "$deps.tmp" "$src[systemd,nvml]"
        fi
        rm -f "$deps.tmp"/ftgov-*.whl
        mv "$deps.tmp" "$deps"
    fi
    mkdir -p "$out"
    cp "$deps"/* "$out/"  # download_target_wheels: a source too
    "$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$out" "$src"
}

# Wheels built with the host's Python are its own version's (cp311 on bookworm): pydantic-core's and pyyaml's do not
# install in another Python. For a container whose Python is TARGET_PYTHON, the dependencies' binary wheels for that
# version come from the package index instead. systemd-python has none: its source goes in, with setuptools and wheel
# to build it from, and the container (gcc, python3-dev, libsystemd-dev, pkg-config in its root file system) builds
# it during `make install`. pip reads the source's metadata here, with the host's libsystemd-dev (HOST_PACKAGES).
download_target_wheels() {
    local src=$1 out=$2
    local venv=$CACHE/build-venv own abi=cp${TARGET_PYTHON/./}
    own=$(mktemp -d)
    "$venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$own" "$src"
    "$venv/bin/pip" download -q -d "$out" --only-binary=:all: --python-version "$TARGET_PYTHON" --implementation cp \
        --abi "$abi" --platform "manylinux2014_$(uname -m)" "$(echo "$own"/ftgov-*.whl)[nvml]" setuptools wheel
    rm -rf "$own"
    local systemd_req
    systemd_req=$("$HOST_PYTHON" -c 'import sys, tomllib
print(*tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["systemd"])' "$src/pyproject.toml")
    "$venv/bin/pip" download -q -d "$out" --no-deps --no-binary=:all: "$systemd_req"
}

# A cached root file system, keyed on what goes into it. mmdebstrap writes the tarball itself (as root it keeps owners,
# modes and device nodes); the tarball is renamed into place only once complete, so an interrupted run leaves no bad cache.
ensure_rootfs_tarball() {
    local key
    key=$(printf '%s\n' "$SUITE" "${ROOTFS_PACKAGES[@]}" "$(uname -m)" ${MMDEBSTRAP_MIRRORS[@]+"${MMDEBSTRAP_MIRRORS[@]}"} \
        | sha_of)
    ROOTFS_TAR=$CACHE/rootfs-$SUITE-$key.tar.zst
    [[ -f $ROOTFS_TAR ]] && return
    log "building the $SUITE root file system (cold cache: half a minute; the Slurm suite's, a minute or two)"
    if declare -F prepare_mmdebstrap >/dev/null; then prepare_mmdebstrap; fi
    local pkgs
    pkgs=$(IFS=,; echo "${ROOTFS_PACKAGES[*]}")
    mmdebstrap --quiet --variant=apt --include="$pkgs" ${MMDEBSTRAP_OPTS[@]+"${MMDEBSTRAP_OPTS[@]}"} \
        "$SUITE" "$ROOTFS_TAR.tmp.tar.zst" ${MMDEBSTRAP_MIRRORS[@]+"${MMDEBSTRAP_MIRRORS[@]}"}
    mv "$ROOTFS_TAR.tmp.tar.zst" "$ROOTFS_TAR"
}

# nspawn leaves payload/supervisor cgroups behind; a per-run cgroup in both hierarchies of this hybrid layout keeps them
# contained and lets teardown remove them. Only one container at a time: the machine name below is fixed.
CGROUP_NAME=$MACHINE-$$
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
    # A killed nspawn leaves the container's own init (and so everything in it) running: end it, which ends its PID
    # namespace, before the cgroups are removed.
    if [[ -n $LEADER ]] && kill -0 "$LEADER" 2>/dev/null; then
        kill -KILL "$LEADER"
        timeout 10 tail --pid="$LEADER" -f /dev/null || log "warning: the container's init $LEADER did not end"
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
    systemd-nspawn -q -D "$rootfs" --register=no --keep-unit --machine="$MACHINE" --console=read-only --boot \
        "${NSPAWN_EXTRA[@]}" \
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


# The run's tmpfs with the root file system (from the cached tarball) in it; with_source=1 adds the checkout as git sees
# it and its wheels (/src, /wheelhouse). Sets WORK, CACHE (when empty) and ROOTFS.
prepare_container() {
    local with_source=$1
    WORK=$(mktemp -d "/var/tmp/$MACHINE.XXXXXX")
    # The container lives in memory (about 400 MB): writing and deleting its 250 MB root file system on a busy disk
    # took half a minute each way on our machines, in RAM it takes two seconds.
    mount -t tmpfs -o "size=${TMPFS_SIZE:-3g},mode=0755" "$MACHINE" "$WORK"
    WORK_MOUNTED=1
    CACHE=${CACHE:-$WORK/cache}
    mkdir -p "$CACHE"
    ensure_rootfs_tarball
    ROOTFS=$WORK/rootfs
    mkdir "$ROOTFS"
    tar --zstd -C "$ROOTFS" -xpf "$ROOTFS_TAR"
    if declare -F customize_rootfs >/dev/null; then customize_rootfs; fi
    log "root file system extracted"
    ((with_source)) || return 0
    copy_source "$WORK/src"
    build_wheels "$WORK/src" "$ROOTFS/wheelhouse"
    cp -a "$WORK/src" "$ROOTFS/src"
    log "wheels built"
}

# A suite's opening: teardown on exit, the run lock (under it, a run's purge at its end cannot pull packages from under
# another run), the host packages, the container prepared (with the checkout unless SMOKE=1), its cgroups, its boot.
start_container() {
    trap teardown EXIT
    log "start"
    take_run_lock
    ensure_host_packages
    prepare_container $((SMOKE == 0))
    enter_run_cgroup
    boot_container "$ROOTFS"
}

# Run the suite's checks in the booted container (a clean environment, bounded), after which teardown prints no console.
run_checks() {
    local timeout_s=$1
    shift
    CHECKS_STARTED=1
    timeout --foreground "$timeout_s" nsenter -t "$LEADER" -a env -i \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
}
