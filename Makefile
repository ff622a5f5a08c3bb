# veritap — the two commands are `make demo` and `make test`; everything else
# here is what they need. Both create .venv and install into it when missing.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.veritap-installed
# CPU torch: this machine's pip finds the wheel through its configured
# find-links; elsewhere it comes from PyTorch's CPU index (TORCH_INDEX).
TORCH := torch==2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Debian packages the tests use: tshark (capture benchmark), prometheus
# (metrics scrape test), libsystemd-dev + pkg-config (systemd-python),
# ethtool and iproute2 (mirror-port simulation), systemd (systemd-analyze and
# systemd-sysusers for the unit and playbook checks), nginx and its JavaScript
# module (the seed gateway, appliance/gateway/).
APT_PACKAGES := systemd tshark prometheus libsystemd-dev pkg-config ethtool iproute2 tcpdump \
	nginx libnginx-mod-http-js
PROTO_SRC := $(wildcard protos/veritap/v1/*.proto)
PROTOC := $(PY) -m grpc_tools.protoc -I protos \
	--plugin=protoc-gen-mypy=$(VENV)/bin/protoc-gen-mypy \
	--plugin=protoc-gen-mypy_grpc=$(VENV)/bin/protoc-gen-mypy_grpc \
	--python_out=OUT --grpc_python_out=OUT --mypy_out=OUT --mypy_grpc_out=OUT

.PHONY: help install system-deps test lint typecheck proto proto-check config-schema \
	config-schema-check pytest demo bench lock wheelhouse clean

help:
	@echo "make demo   run the whole pair live on loopback and catch a dishonest prover"
	@echo "make test   lint, type-check, check generated code, run the tests"
	@echo "make proto  regenerate protos/veritap/v1/*_pb2*.py{,i}"
	@echo "make config-schema  regenerate appliance/config/*.schema.json"
	@echo "make bench  run the benchmarks under bench/"
	@echo "make lock   pin each role's dependencies with hashes in requirements/*.txt"
	@echo "make wheelhouse ROLE=collector|verifier  every file a role's host installs, for air-gapped sites"

install: $(STAMP)

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null; \
	  else echo "missing Debian packages (install them as root):$$missing"; fi; \
	fi

$(STAMP): pyproject.toml | system-deps
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)" || $(PIP) install -q --extra-index-url $(TORCH_INDEX) "$(TORCH)"
	$(PIP) install -q -e ".[cpu,dev,systemd]"
	# PyPI's CUDA builds of these fail to import beside CPU torch and break transformers.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

proto: $(STAMP)
	$(subst OUT,protos,$(PROTOC)) $(PROTO_SRC)

# Regenerate into a scratch folder and fail when anything differs.
proto-check: $(STAMP)
	tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(subst OUT,$$tmp,$(PROTOC)) $(PROTO_SRC); \
	diff -r -x __init__.py -x __pycache__ -x '*.proto' protos/veritap/v1 $$tmp/veritap/v1 \
	  || { echo "generated code is stale: run 'make proto' and commit"; exit 1; }

# The daemons' config files as JSON Schema, for editors: `DAEMON check-config --schema`.
CONFIG_SCHEMA_DAEMONS := collector verifierd

config-schema: $(STAMP)
	for d in $(CONFIG_SCHEMA_DAEMONS); do \
	  $(VENV)/bin/$$d check-config --schema > appliance/config/$$d.schema.json; done

config-schema-check: $(STAMP)
	tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	for d in $(CONFIG_SCHEMA_DAEMONS); do \
	  $(VENV)/bin/$$d check-config --schema > $$tmp/$$d.schema.json; \
	  diff appliance/config/$$d.schema.json $$tmp/$$d.schema.json \
	    || { echo "$$d.schema.json is stale: run 'make config-schema' and commit"; exit 1; }; \
	done

pytest: $(STAMP)
	$(PY) -m pytest -q

test: lint typecheck proto-check config-schema-check pytest

demo: $(STAMP)
	$(PY) -m verifierd.demo

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b; done

# Each role's dependencies (pyproject.toml's extras), pinned with hashes for every platform
# and Python >= 3.11: the playbook installs them with --require-hashes. uv runs from a
# throwaway venv, not from .venv.
LOCK_VENV ?= /tmp/veritap-lock-venv
UV_COMPILE = $(LOCK_VENV)/bin/uv pip compile pyproject.toml --universal --python-version 3.11 \
	--generate-hashes --custom-compile-command "make lock" -q
lock:
	test -x $(LOCK_VENV)/bin/uv || { python3 -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install -q uv; }
	$(UV_COMPILE) --extra collector --extra systemd -o requirements/collector.txt
	$(UV_COMPILE) --extra verifier --extra gpu --extra systemd -o requirements/verifier.txt

# An air-gapped site's packages for ROLE: the veritap wheel and every file its lock pins
# (systemd-python as its sdist, built on the host: the common role installs its compiler
# and headers, and setuptools to build it with), downloaded on a machine with the hosts'
# Python and architecture. The playbook installs from it with veritap_wheelhouse.
ROLE ?= collector
WHEELHOUSE ?= wheelhouse/$(ROLE)
wheelhouse:
	test -f requirements/$(ROLE).txt || { echo "ROLE: collector or verifier"; exit 1; }
	tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; python3 -m venv $$tmp/venv; \
	$$tmp/venv/bin/pip download -q --require-hashes -r requirements/$(ROLE).txt -d $(WHEELHOUSE); \
	$$tmp/venv/bin/pip download -q setuptools wheel -d $(WHEELHOUSE); \
	$$tmp/venv/bin/pip wheel -q --no-deps -w $(WHEELHOUSE) .

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
