# ftgov. The two commands of the README:
#   make demo      set up a virtual environment and run the demo on a simulated Jetson AGX Orin
#   make test      set up, then run every test (pytest, then the systemd and Slurm suites in booted containers when root)
# Also: make lint (ruff and mypy; make test runs it first), make bench (daemon, client and tuner figures), make model (retrain
# the MLG tree: the pipeline's stages, each file from the files it is computed from), make evaluate (policies on the
# held-out workloads, with plots), make stress (fault-injection and load figures), make learn (the measurement store
# teaching the tree on a simulated board). bench, evaluate, stress and learn each write their sections of
# docs/benchmarks.md.
#
# Install on a Jetson:
#
#   sudo make install                    # venv in /opt/ftgov, units in /etc/systemd/system, config in /etc/ftgov
#   sudo make install WHEELHOUSE=DIR     # offline: the package and its dependencies from a directory of wheels
#   sudo make install BACKEND=nvml       # an NVIDIA datacenter/desktop GPU: nvidia-ml-py, and the unit drop-in that
#                                        # lets the sandboxed daemon reach /dev/nvidia* (systemd/ftgovd.service.d/nvml.conf)
#   make install DESTDIR=/tmp/stage      # staged install for packaging (no sysusers, no daemon-reload)
#   sudo make uninstall
#
# The package lives in its own virtual environment so that the daemon's dependencies never meet the system's Python
# packages. The [systemd] extra (systemd-python, for structured journald logging) builds from source: it needs
# libsystemd-dev, pkg-config, gcc and python3-dev, or set EXTRAS= to log plain text to the journal instead.

DESTDIR ?=
PREFIX ?= /opt/ftgov
SYSCONFDIR ?= /etc
UNITDIR ?= /etc/systemd/system
SYSUSERSDIR ?= /usr/lib/sysusers.d
# Where the commands are linked, so that `ftgov` is on PATH.
BINDIR ?= /usr/local/bin
PYTHON ?= /usr/bin/python3
EXTRAS ?= systemd
WHEELHOUSE ?=
# devfreq (a Jetson; the default) or nvml.
BACKEND ?= devfreq
ifeq ($(filter $(BACKEND),devfreq nvml),)
$(error BACKEND=$(BACKEND): use devfreq (a Jetson) or nvml (an NVIDIA datacenter or desktop GPU))
endif

VENV = $(DESTDIR)$(PREFIX)
CONFIG = $(DESTDIR)$(SYSCONFDIR)/ftgov/ftgov.yaml
COMMANDS = ftgov ftgovd
UNITS = ftgovd.service ftgovd.socket
DROPIN_DIR = $(DESTDIR)$(UNITDIR)/ftgovd.service.d
comma := ,
space := $(subst ,, )
PKG_EXTRAS = $(strip $(EXTRAS) $(if $(filter nvml,$(BACKEND)),nvml))
PKG_SPEC = $(if $(PKG_EXTRAS),[$(subst $(space),$(comma),$(PKG_EXTRAS))])
# What building the package reads (pyproject.toml's readme, license-files and packages).
PACKAGE_SOURCE = pyproject.toml README.md LICENSE MANIFEST.in governor
ifeq ($(WHEELHOUSE),)
PIP_SOURCE = "$$src"'$(PKG_SPEC)'
else
PIP_SOURCE = --no-index --find-links '$(WHEELHOUSE)' 'ftgov$(PKG_SPEC)'
endif
# Post-install steps that touch the running system, skipped for staged installs and where systemd is not PID 1.
LIVE_SYSTEMD = $(and $(if $(DESTDIR),,yes),$(wildcard /run/systemd/system))

.PHONY: install uninstall install-venv install-units install-config demo test test-unit test-systemd test-slurm lint bench model \
	evaluate stress learn

# --- development: a virtual environment in .venv, made by the first target that needs it ---------------------------
DEV_PYTHON ?= python3
DEV_VENV = .venv
VPY = $(DEV_VENV)/bin/python
PIP_QUIET = --quiet --disable-pip-version-check

$(DEV_VENV)/.base: pyproject.toml
	$(DEV_PYTHON) -m venv $(DEV_VENV)
	$(VPY) -m pip install $(PIP_QUIET) --upgrade pip
	$(VPY) -m pip install $(PIP_QUIET) -e '.[model]'
	touch $@

# torch first and pinned: the CPU build of 2.13.0 comes from this machine's disk; asked for later by another
# package, pip would fetch a multi-GB CUDA build instead.
$(DEV_VENV)/.test: $(DEV_VENV)/.base
	$(VPY) -m pip install $(PIP_QUIET) torch==2.13.0
	$(VPY) -m pip install $(PIP_QUIET) -e '.[test]'
	touch $@

demo: $(DEV_VENV)/.base
	$(VPY) -m governor.sim.demo

# Lint first: a finding fails the run before the slow suites start.
test: lint test-unit test-systemd test-slurm

# ruff and mypy come with the [test] extra; their settings are pyproject.toml's [tool.ruff] and [tool.mypy] (which
# packages mypy checks: its `files`).
lint: $(DEV_VENV)/.test
	$(VPY) -m ruff check .
	$(VPY) -m mypy

test-unit: $(DEV_VENV)/.test
	$(VPY) -m pytest

# A real systemd in a container (tests/systemd/run.sh); it needs root, as CI has.
test-systemd:
	@if [ "$$(id -u)" = 0 ]; then bash tests/systemd/run.sh; \
	else echo "test-systemd: SKIPPED: needs root to boot a systemd container (CI runs it as root)"; fi

# A real Slurm (munge, slurmctld, slurmd, slurmdbd; a second slurmd for a heterogeneous job) in a container, with
# ftgovd on two fake NVML GPUs as GRES (tests/slurm/run.sh); root, as for test-systemd.
test-slurm:
	@if [ "$$(id -u)" = 0 ]; then bash tests/slurm/run.sh; \
	else echo "test-slurm: SKIPPED: needs root to boot a container (CI runs it as root)"; fi

bench: $(DEV_VENV)/.test
	$(VPY) -m benchmarks.bench_daemon
	$(VPY) -m benchmarks.bench_client
	$(VPY) -m benchmarks.bench_tuner --max-slowdown 0.1
	$(VPY) -m benchmarks.bench_tuner --sets real simulated --meter gauss nvml ina3221 --window-rule time --seeds 2 --tuners new follow --lengths 300 2000 20000
	$(VPY) -m benchmarks.bench_tuner --sets real --meter nvml ina3221 --window-rule time --seeds 2 --tuners follow --max-slowdown 0.1
	$(VPY) -m benchmarks.tuner_bound
	$(VPY) -m benchmarks.bench_tuner --sets real simulated --meter nvml-replay --window-rule time --seeds 2 --tuners new follow --lengths 300 2000 20000
	$(VPY) -m benchmarks.tuner_bound --sets real --groups 2 --meter nvml-replay --window-rule time
	$(VPY) -m benchmarks.tuner_tradeoffs
	$(VPY) -m benchmarks.bench_saving
	$(VPY) -m benchmarks.meter_windows
	$(VPY) -m benchmarks.baseline_drift
	$(VPY) -m benchmarks.warmup_gate
	$(VPY) -m benchmarks.sampler_cost
	$(VPY) -m benchmarks.phase_cost
	$(VPY) -m benchmarks.nvml_call_cost
	$(VPY) -m benchmarks.trace_register
	$(VPY) -m benchmarks.meter_saving
	$(VPY) -m benchmarks.meter_saving --job-steps 20000 --meter nvml ina3221 nvml-edges nvml-replay --window-rule time --seeds 1 --every 2
	$(VPY) -m benchmarks.meter_saving --meter nvml-edges --window-rule time --baseline-max-share 0.05 0.1 0.2
	$(VPY) -m benchmarks.meter_saving --meter nvml-edges nvml-replay --window-rule time --baseline-parts 1 5 10
	$(VPY) -m benchmarks.meter_saving --job-steps 20000 --meter nvml-replay --window-rule time --seeds 1 --every 2 --baseline-parts 1 2 5
	$(VPY) -m benchmarks.meter_saving --meter nvml ina3221 nvml-edges nvml-replay --window-rule time --top-step-s 0.04
	$(VPY) -m benchmarks.meter_saving --job-steps 20000 --meter ina3221 nvml-replay --window-rule time --seeds 1 --every 2 --top-step-s 0.04
	$(VPY) -m benchmarks.bench_groups
	$(VPY) -m benchmarks.group_tuner

# --- the model pipeline (governor/pipeline): each file is made from the files it is computed from, so `make model`
# redoes only the stages whose inputs changed (cookiecutter-data-science style; `make -B model` redoes them all).
# The sweeps, the trained tree and FFG's frequency live in governor/data/, package data (model/ links them).
PIPELINE = $(VPY) -m governor.pipeline
CHARACTERIZATION = governor/data/characterization.csv
HELD_OUT = governor/data/held-out.csv
ARTIFACTS = model/artifacts
SHIPPED = governor/data
MODEL_SEED ?= 0
MODEL_JOBS ?= 2

model: $(SHIPPED)/mlg-tree.json $(SHIPPED)/ffg.json

# The measurements are committed; these recreate a deleted one (characterize appends to an existing file).
$(CHARACTERIZATION): | $(DEV_VENV)/.base
	$(PIPELINE) characterize --simulate --suite characterization --seed 0 --quiet --out $@
$(HELD_OUT): | $(DEV_VENV)/.base
	$(PIPELINE) characterize --simulate --suite held-out --seed 1 --quiet --out $@

$(ARTIFACTS)/dataset.csv: $(CHARACTERIZATION) | $(DEV_VENV)/.base
	$(PIPELINE) dataset --data $< --out $@

# fit scores each fold on the whole energy curve, so it reads the characterization beside the labels.
$(ARTIFACTS)/mlg.joblib: $(ARTIFACTS)/dataset.csv $(CHARACTERIZATION) | $(DEV_VENV)/.base
	$(PIPELINE) fit --data $(CHARACTERIZATION) --dataset $< --estimator $@ --report $(ARTIFACTS)/cv-report.json \
	  --seed $(MODEL_SEED) --jobs $(MODEL_JOBS)

$(SHIPPED)/mlg-tree.json: $(ARTIFACTS)/mlg.joblib | $(DEV_VENV)/.base
	$(PIPELINE) export --data $(CHARACTERIZATION) --estimator $< --report $(ARTIFACTS)/cv-report.json --tree $@ \
	  --rules model/mlg-rules.txt

$(SHIPPED)/ffg.json: $(CHARACTERIZATION) | $(DEV_VENV)/.base
	$(PIPELINE) ffg --data $< --out $@

stress: $(DEV_VENV)/.test
	$(VPY) -m benchmarks.stress

evaluate: $(SHIPPED)/mlg-tree.json $(SHIPPED)/ffg.json $(HELD_OUT) | $(DEV_VENV)/.base
	$(PIPELINE) evaluate --data $(HELD_OUT) --mlg-tree $(SHIPPED)/mlg-tree.json --ffg $(SHIPPED)/ffg.json \
	  --paper-tree $(SHIPPED)/paper-tree.json --out out/evaluate
	$(VPY) -m benchmarks.model_evaluation

# The measurement store teaching the tree on a simulated board (benchmarks/learn.py): table and figure in out/learn.
learn: $(DEV_VENV)/.base
	$(VPY) -m benchmarks.learn --out out/learn


install: install-venv install-units install-config
	@echo "installed. First install: usermod -aG ftgov USER; systemctl enable --now ftgovd.socket." \
	  "Upgrade: systemctl restart ftgovd"

# Over an existing install the venv is updated in place rather than recreated, so a running ftgovd never finds its
# files gone; ftgov itself is reinstalled even at the same version number. Restart the service to run the new code.
# umask 022: what ftgovd runs as root must be no one else's to write, whatever umask root's shell had (002, 000).
# pip builds a source directory in place (build/, ftgov.egg-info): the package is built from a copy ($$src), so that
# root leaves nothing in the checkout that its owner's next `make demo` or `make test` could not overwrite.
install-venv:
	umask 022 && $(PYTHON) -m venv '$(VENV)'
	umask 022 && src=$$(mktemp -d) && trap 'rm -rf "$$src"' EXIT && cp -R $(PACKAGE_SOURCE) "$$src" && \
	  '$(VENV)/bin/pip' install --quiet --disable-pip-version-check $(PIP_SOURCE) && \
	  '$(VENV)/bin/pip' install --quiet --disable-pip-version-check --force-reinstall --no-deps $(PIP_SOURCE)
# A venv's scripts carry its absolute path; a staged venv must carry the final one.
ifneq ($(DESTDIR),)
	grep -rlIF '$(VENV)' '$(VENV)/bin' '$(VENV)/pyvenv.cfg' | xargs -r sed -i 's|$(VENV)|$(PREFIX)|g'
endif
	install -D -m 0644 docs/install.md '$(VENV)/share/doc/ftgov/install.md'
	install -d '$(DESTDIR)$(BINDIR)'
	for c in $(COMMANDS); do ln -sfn '$(PREFIX)/bin/'$$c '$(DESTDIR)$(BINDIR)/'$$c; done

# The units name /opt/ftgov and /etc/ftgov; other prefixes are written into the installed copies.
install-units:
	install -d '$(DESTDIR)$(UNITDIR)' '$(DESTDIR)$(SYSUSERSDIR)'
	for u in $(UNITS); do \
	  sed -e 's|/opt/ftgov/|$(PREFIX)/|g' -e 's|/etc/ftgov/|$(SYSCONFDIR)/ftgov/|g' systemd/$$u > '$(DESTDIR)$(UNITDIR)/'$$u; \
	  chmod 0644 '$(DESTDIR)$(UNITDIR)/'$$u; \
	done
	install -m 0644 systemd/sysusers.d/ftgov.conf '$(DESTDIR)$(SYSUSERSDIR)/ftgov.conf'
# The NVML drop-in is added by BACKEND=nvml and kept by a later plain `make install` (an upgrade must not take the
# GPU away from a running setup); uninstall removes it.
ifeq ($(BACKEND),nvml)
	install -d '$(DROPIN_DIR)'
	install -m 0644 systemd/ftgovd.service.d/nvml.conf '$(DROPIN_DIR)/nvml.conf'
endif
ifneq ($(LIVE_SYSTEMD),)
	systemd-sysusers '$(SYSUSERSDIR)/ftgov.conf'
	systemctl daemon-reload
endif

# Never overwrite an edited config: the new default goes next to it as ftgov.yaml.new.
install-config:
	install -d -m 0755 '$(DESTDIR)$(SYSCONFDIR)/ftgov'
	@if [ ! -e '$(CONFIG)' ]; then \
	  install -m 0644 etc/ftgov.yaml '$(CONFIG)' && echo "installed the default $(SYSCONFDIR)/ftgov/ftgov.yaml"; \
	elif ! cmp -s etc/ftgov.yaml '$(CONFIG)'; then \
	  install -m 0644 etc/ftgov.yaml '$(CONFIG).new'; \
	  echo "kept your $(SYSCONFDIR)/ftgov/ftgov.yaml; the new default is ftgov.yaml.new"; \
	fi

# Leaves the ftgov group (files may still carry its gid), an edited config and the measurement store in place. Deletes
# PREFIX only when it is a venv (has pyvenv.cfg), whatever PREFIX says.
# After the stop, `ftgov restore` (not --on-stop: whatever restore_on_stop says) puts back a pin the stop left, with the
# config the unit names: once the venv is gone, nothing could. If it fails, the uninstall stops before removing anything.
UNINSTALL_RESTORE = config=$$(systemctl show -p Environment --value ftgovd.service | tr ' ' '\n' \
	  | sed -n 's/^FTGOV_CONFIG=//p' | tail -n 1); \
	'$(VENV)/bin/ftgov' restore --state-dir /run/ftgov $${config:+--config "$$config"} \
	  || { echo "make uninstall: the GPU may still be pinned (see above); no file removed: fix that, run it again"; \
	    exit 1; }
uninstall:
ifneq ($(LIVE_SYSTEMD),)
	-systemctl disable --now ftgovd.socket ftgovd.service
	if [ -x '$(VENV)/bin/ftgov' ]; then $(UNINSTALL_RESTORE); fi
endif
	for u in $(UNITS); do rm -f '$(DESTDIR)$(UNITDIR)/'$$u; done
	rm -f '$(DROPIN_DIR)/nvml.conf'
	rmdir '$(DROPIN_DIR)' 2>/dev/null || true  # kept when it holds the operator's own drop-ins
	rm -f '$(DESTDIR)$(SYSUSERSDIR)/ftgov.conf'
ifneq ($(LIVE_SYSTEMD),)
	systemctl daemon-reload
endif
	for c in $(COMMANDS); do \
	  if [ "$$(readlink '$(DESTDIR)$(BINDIR)/'$$c)" = '$(PREFIX)/bin/'$$c ]; then rm -f '$(DESTDIR)$(BINDIR)/'$$c; fi; \
	done
	if [ -f '$(VENV)/pyvenv.cfg' ]; then rm -rf '$(VENV)'; fi
	rm -f '$(CONFIG).new'
	@if cmp -s etc/ftgov.yaml '$(CONFIG)'; then rm -f '$(CONFIG)'; rmdir '$(DESTDIR)$(SYSCONFDIR)/ftgov' 2>/dev/null || true; \
	else [ ! -e '$(CONFIG)' ] || echo "kept your edited $(SYSCONFDIR)/ftgov/ftgov.yaml"; fi
	@[ ! -d '$(DESTDIR)/var/lib/ftgov' ] || echo "kept the measurement store /var/lib/ftgov (ftgov history's jobs)"
