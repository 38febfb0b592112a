# ftgov: install and uninstall. (Targets demo, test and bench are added by the lead.)
#
#   sudo make install                    # venv in /opt/ftgov, units in /etc/systemd/system, config in /etc/ftgov
#   sudo make install WHEELHOUSE=DIR     # offline: the package and its dependencies from a directory of wheels
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

VENV = $(DESTDIR)$(PREFIX)
CONFIG = $(DESTDIR)$(SYSCONFDIR)/ftgov/ftgov.yaml
COMMANDS = ftgov ftgovd
UNITS = ftgovd.service ftgovd.socket
PKG_SPEC = $(if $(EXTRAS),[$(EXTRAS)])
ifeq ($(WHEELHOUSE),)
PIP_SOURCE = '.$(PKG_SPEC)'
else
PIP_SOURCE = --no-index --find-links '$(WHEELHOUSE)' 'ftgov$(PKG_SPEC)'
endif
# Post-install steps that touch the running system, skipped for staged installs and where systemd is not PID 1.
LIVE_SYSTEMD = $(and $(if $(DESTDIR),,yes),$(wildcard /run/systemd/system))

.PHONY: install uninstall install-venv install-units install-config

install: install-venv install-units install-config
	@echo "installed. First install: usermod -aG ftgov USER; systemctl enable --now ftgovd.socket." \
	  "Upgrade: systemctl restart ftgovd"

# Over an existing install the venv is updated in place rather than recreated, so a running ftgovd never finds its
# files gone; ftgov itself is reinstalled even at the same version number. Restart the service to run the new code.
install-venv:
	$(PYTHON) -m venv '$(VENV)'
	'$(VENV)/bin/pip' install --quiet --disable-pip-version-check $(PIP_SOURCE)
	'$(VENV)/bin/pip' install --quiet --disable-pip-version-check --force-reinstall --no-deps $(PIP_SOURCE)
# A venv's scripts carry its absolute path; a staged venv must carry the final one.
ifneq ($(DESTDIR),)
	grep -rlIF '$(VENV)' '$(VENV)/bin' '$(VENV)/pyvenv.cfg' | xargs -r sed -i 's|$(VENV)|$(PREFIX)|g'
endif
	install -D -m 0644 model/mlg-tree.json '$(VENV)/share/ftgov/mlg-tree.json'
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

# Leaves the ftgov group (files may still carry its gid) and an edited config in place. Deletes PREFIX only when it is
# a venv (has pyvenv.cfg), whatever PREFIX says.
uninstall:
ifneq ($(LIVE_SYSTEMD),)
	-systemctl disable --now ftgovd.socket ftgovd.service
endif
	for u in $(UNITS); do rm -f '$(DESTDIR)$(UNITDIR)/'$$u; done
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
