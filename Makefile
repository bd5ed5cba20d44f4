# appease: `make run` and `make test` are all a user needs on a fresh Debian machine.
SHELL := /bin/bash
CARGO ?= cargo
# Debian packages the build and the tests need (clang compiles the BPF program,
# libelf/zlib/pkg-config build the bundled libbpf).
APT_PACKAGES := clang libelf-dev zlib1g-dev pkg-config make
# What the tests and the bench run: PostgreSQL (db scenario), gcc (the compile batch
# load), nginx and wget (web scenario), ab (apache2-utils) and sysbench (the closed-loop
# client sweeps); all tested end to end. QEMU, debootstrap and
# e2fsprogs boot the Debian VM in which the cgroup v2 layouts are tested (scripts/vm);
# docker.io runs real containers (the docker batch load and its end-to-end tests).
# prometheus brings promtool, which checks the metrics endpoint's output. systemd, dbus and
# procps: a real systemd boots as PID 1 of a container over this machine's own root
# (scripts/systemd-container.sh, the system-container test).
TEST_PACKAGES := postgresql gcc nginx wget apache2-utils sysbench qemu-system-x86 debootstrap e2fsprogs docker.io prometheus tmux perl systemd dbus procps
# The peer daemons' modes (ananicy, system76-scheduler) also need schedtool and dbus;
# the peers themselves are built from their own sources (`make peers`); the nested
# scenario measures redis-server with redis-benchmark.
BENCH_PACKAGES := $(TEST_PACKAGES) schedtool redis-server redis-tools curl
# Building the peers: Ananicy is Python; system76-scheduler's crates generate bindings with
# libclang and link PipeWire.
PEER_PACKAGES := schedtool dbus git python3 libclang-dev libpipewire-0.3-dev
# Counts the simulator's instructions per event (a figure the host's noise cannot move).
PROFILE_PACKAGES := valgrind
CONFIG ?=

.PHONY: all deps test-deps bench-deps profile-deps peer-deps peers build image run test chaos bench sim-instructions fmt clippy clean install uninstall

all: build

# Installs only what is missing; apt-get update only when something is.
deps: PACKAGES = $(APT_PACKAGES)
test-deps: PACKAGES = $(APT_PACKAGES) $(TEST_PACKAGES)
bench-deps: PACKAGES = $(APT_PACKAGES) $(BENCH_PACKAGES)
profile-deps: PACKAGES = $(APT_PACKAGES) $(PROFILE_PACKAGES)
peer-deps: PACKAGES = $(APT_PACKAGES) $(PEER_PACKAGES)
deps test-deps bench-deps profile-deps peer-deps:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" -ne 0 ]; then echo "error: installing$$missing needs root (run as root or: sudo apt-get install$$missing)"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "error: cargo not found: install Rust (rustup, stable) first"; exit 1; }

build: deps
	$(CARGO) build --release --locked -p appease

# The DaemonSet's image without a registry (docs/FLEET.md): imported into the local Docker
# engine as appease:latest and saved to appease.tar for a node's containerd.
image: build
	scripts/image.sh appease:latest appease.tar

# Installs the binary, a config, the systemd unit, the man page and shell completions
# (root; after `make build`).
# PREFIX, SYSCONFDIR, UNITDIR and DESTDIR (a staging root) are honoured. An existing
# config is kept: it is the operator's.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR ?= $(SYSCONFDIR)/systemd/system
MANDIR ?= $(PREFIX)/share/man
DATADIR ?= $(PREFIX)/share
install:
	@test -x target/release/appease || { echo "error: no target/release/appease: run make build first"; exit 1; }
	install -D -m 0755 target/release/appease $(DESTDIR)$(BINDIR)/appease
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/appease/appease.toml ]; then \
	  echo "keeping $(DESTDIR)$(SYSCONFDIR)/appease/appease.toml"; \
	else \
	  install -D -m 0644 config/default.toml $(DESTDIR)$(SYSCONFDIR)/appease/appease.toml; \
	fi
	install -d $(DESTDIR)$(UNITDIR)
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' deploy/appease.service \
	  > $(DESTDIR)$(UNITDIR)/appease.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/appease.service
	install -d $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(DATADIR)/bash-completion/completions \
	  $(DESTDIR)$(DATADIR)/zsh/vendor-completions $(DESTDIR)$(DATADIR)/fish/vendor_completions.d
	target/release/appease manpage > $(DESTDIR)$(MANDIR)/man8/appease.8
	target/release/appease completions bash > $(DESTDIR)$(DATADIR)/bash-completion/completions/appease
	target/release/appease completions zsh > $(DESTDIR)$(DATADIR)/zsh/vendor-completions/_appease
	target/release/appease completions fish > $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/appease.fish
	@echo "installed; start it with: systemctl daemon-reload && systemctl enable --now appease"

# Removes what `make install` put in place but the config (the operator's).
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/appease $(DESTDIR)$(UNITDIR)/appease.service \
	  $(DESTDIR)$(MANDIR)/man8/appease.8 $(DESTDIR)$(DATADIR)/bash-completion/completions/appease \
	  $(DESTDIR)$(DATADIR)/zsh/vendor-completions/_appease \
	  $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/appease.fish
	@echo "kept $(DESTDIR)$(SYSCONFDIR)/appease/appease.toml (remove it by hand if unwanted)"

# Runs the daemon in the foreground with the embedded default config (root needed).
run: build
	./target/release/appease daemon $(if $(CONFIG),--config $(CONFIG),)

test: test-deps
	$(CARGO) fmt --all -- --check
	# No separate `cargo build`: the tests build the binary they run themselves, with the
	# chaos harness's crash points, and a build without them would compile the daemon twice.
	# Root-only tests are #[ignore]d with their reason, so a plain `cargo test` lists
	# them as ignored; here (root) they run.
	# The VM tests' base image (debootstrap: mostly downloads and unpacking, once per
	# machine) is built beside the compile; the VM test waits for it (image.sh's lock).
	# Its own process group, ended with the tests if they are interrupted.
	mkdir -p target; setsid scripts/vm/image.sh > target/vm-image.log 2>&1 & image=$$!; \
	trap 'kill -- -$$image 2>/dev/null' INT TERM; \
	$(CARGO) test --workspace --locked --release -- --include-ignored; rc=$$?; \
	wait $$image || echo "the VM's image was not built beside the compile: target/vm-image.log"; \
	exit $$rc

# The chaos harness at length (root; about an hour): the daemon killed 1,000 times at
# random moments and at its crash points, each time restored and checked, then 100 times
# while it sets systemd units, in the VM (about 35 minutes on its emulated CPUs). `make
# test` runs 7 (each kind of kill, each way of putting back, an administrator's changes)
# and 1 (inside a restore, an administrator's change). CHAOS_ROUNDS, CHAOS_UNIT_ROUNDS and
# CHAOS_SEED override.
CHAOS_ROUNDS ?= 1000
CHAOS_UNIT_ROUNDS ?= 100
chaos: test-deps
	CHAOS_ROUNDS=$(CHAOS_ROUNDS) CHAOS_UNIT_ROUNDS=$(CHAOS_UNIT_ROUNDS) $(CARGO) test --locked --release -p appease --test e2e -- \
		--include-ignored --nocapture chaos::

# The figures in docs/RESULTS.md (root; hours): the overhead benches, every row of its summary
# table by the command the row gives (scripts/results.sh; ROWS="db frames" for some, PEER_BIN=…
# adds the peer daemons), the simulator's speed. Output and each row's time land in bench-out/.
ROWS ?=
bench: bench-deps build
	$(CARGO) bench --locked -p appease-probe --bench read_cost
	$(CARGO) bench --locked -p appease --bench daemon
	$(CARGO) bench --locked -p appease --bench memory
	OUT=bench-out ./scripts/results.sh $(ROWS)
	$(CARGO) bench --locked -p appease-sim --bench speed

# The peer daemons the bench compares, built from their sources into /opt/appease-peers
# (a few minutes); prints the PEER_BIN to give scripts/results.sh. `scripts/peers.sh remove` undoes it.
peers: peer-deps
	./scripts/peers.sh

# Instructions per simulated event, every policy, both speed workloads (about a minute).
sim-instructions: profile-deps build
	./scripts/sim-instructions.sh

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

clean:
	$(CARGO) clean
