# The two commands a new user needs (README): `make demo` and `make test`.
# Both create .venv at the repository root and install the pinned requirements into it, once:
# the install is redone only when a requirements file changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
REQUIREMENTS := requirements/dev.txt requirements/cpu.txt requirements/base.txt requirements/launch.txt
INSTALLED := $(VENV)/.installed
# SageMaker SDK v2 beside v3: `launch submit` must send the same request through both
SDK2 := .venv-sdk2
SDK2_INSTALLED := $(SDK2)/.installed

.PHONY: demo test bench venv container-base clean

demo: $(INSTALLED)
	$(BIN)/python -m launch.demo

test: $(INSTALLED) $(SDK2_INSTALLED)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(INSTALLED)
	$(BIN)/python -m bench.pipe_reader $(BENCH_ARGS)
	$(BIN)/python -m bench.input_pipeline $(BENCH_ARGS)
	$(BIN)/python -m bench.photo_pipeline $(BENCH_ARGS)

venv: $(INSTALLED)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): $(REQUIREMENTS) pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements/dev.txt
	# this project itself, editable: `python -m launch ...` then works from any folder
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

# the local Debian base image the container tests build on (podman, debootstrap; run as root)
container-base:
	.ci/container-base

$(SDK2_INSTALLED): requirements/sdk2.txt requirements/launch.txt pyproject.toml Makefile
	$(PYTHON) -m venv $(SDK2)
	$(SDK2)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/sdk2.txt
	$(SDK2)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

clean:
	rm -rf $(VENV) $(SDK2) .pytest_cache
