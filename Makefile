# The two commands a new user needs (README): `make demo` and `make test`.
# Both create .venv at the repository root and install the pinned requirements into it, once:
# the install is redone only when a requirements file changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
REQUIREMENTS := requirements/dev.txt requirements/cpu.txt requirements/base.txt requirements/launch.txt requirements/duplicates.txt \
	requirements/hub.txt
PROJECTS := train/pipemode/pyproject.toml train/pyproject.toml launch/pyproject.toml
EDITABLE := -e train/pipemode -e train -e launch
# the reader's optional compiled part: the editable install builds it in place (setup.py)
COMPILED := train/pipemode/setup.py train/pipemode/pipemode/_framing.c
INSTALLED := $(VENV)/.installed
# The installer of every virtualenv: uv's `pip install`, the same pinned packages as pip's (their
# `pip freeze` compared equal), in 62 s for all four where pip took 196 s from empty caches on 2
# cores (without --compile-bytecode: one download and cache for the TensorFlow all but .venv-mxnet
# install). Their bytecode is compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is
# set (these machines set it), nothing writes it later, and every process that imports TensorFlow
# would compile its 1,847 files again (a CI run went twice as slow so). uv itself comes from PyPI
# into .venv, by the pip that `venv` gives it.
UV := $(BIN)/uv
# SageMaker SDK v2 beside v3: `keras-pipe submit` must send the same request through both
SDK2 := .venv-sdk2
SDK2_INSTALLED := $(SDK2)/.installed
# What a script-mode job has in AWS's TF images (TensorFlow, the sagemaker-training toolkit) and
# nothing of this project: the tests install the reader's wheel into it, as a user would
TOOLKIT := .venv-toolkit
TOOLKIT_INSTALLED := $(TOOLKIT)/.installed
# What the reader's install snippet (train/pipemode/README.md) needs, as wheels, for the test that
# runs it as a new user does, in a virtualenv of its own with the index off (tests/docs): pipemode's
# dependencies at the pinned versions and the setuptools that builds it. Downloaded here, as the
# virtualenvs' packages are; the tests never reach the internet.
# MXNet's own Gluon, beside the numpy it needs: the reference the ResNet-18/34 weight conversion is
# checked against (requirements/mxnet-reference.txt)
MXNET := .venv-mxnet
MXNET_INSTALLED := $(MXNET)/.installed
WHEELHOUSE := .wheelhouse
WHEELHOUSE_DOWNLOADED := $(WHEELHOUSE)/.downloaded

.PHONY: demo test test-setup test-quick fuzz lint bench bench-aws venv container-base clean

demo: $(INSTALLED)
	$(BIN)/python -m keras_pipe_launch.demo

# The tests run in TEST_WORKERS processes (pytest-xdist; tests/scheduling.py says how they share the
# work): 3 on CI's two cores, where much of a test's time is waiting on a writer, a server, a
# container or a subprocess's start, which a third worker fills (measured: docs/speed.md, Figures
# behind the code's choices: The suite's workers). TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= 3

# what `make test` installs beside .venv, each part independent of the others and of .venv's packages
TEST_SETUP_BESIDE := $(SDK2_INSTALLED) $(TOOLKIT_INSTALLED) $(MXNET_INSTALLED) $(WHEELHOUSE_DOWNLOADED)
TEST_SETUP := $(INSTALLED) $(TEST_SETUP_BESIDE)

test: $(TEST_SETUP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# What `make test` installs before it runs, side by side (.ci/run does this first): .venv, the
# longest install, at full priority, and the others beside it at a lower one (nice), filling the
# cores while .venv's single pip process leaves one idle. Side by side at one priority, .venv
# waited on the others and ended last, a minute and a half after them, half the cores idle.
test-setup: | $(UV)
	nice -n 10 $(MAKE) -j3 --output-sync=target $(TEST_SETUP_BESIDE) & beside=$$!; \
	$(MAKE) $(INSTALLED); venv=$$?; wait $$beside && exit $$venv

# the quick tier, while working (about 3 minutes on 2 cores): every test but those that train a model,
# start a job, a server or a container, or run a benchmark (marked `slow` or `container`: a test that
# took more than a few seconds is marked slow); one folder alone: `make test-quick PYTEST_ARGS=tests/reader`
test-quick: $(INSTALLED) $(SDK2_INSTALLED) $(TOOLKIT_INSTALLED) $(MXNET_INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not slow and not container" $(PYTEST_ARGS)

# the property tests at length (20,000 examples per property instead of 250; about 40 minutes on 2 busy
# cores, a property up to 3 minutes: hence a test limit of an hour, not pyproject.toml's 300 s):
# the TFRecord, RecordIO and TextLine decoders, the Ground Truth manifest lines (tests/hypothesis_profiles.py)
PROPERTIES := tests/reader/test_tfrecord_properties.py tests/reader/test_recordio_properties.py \
  tests/reader/test_textline_properties.py tests/job/sources/test_manifest_properties.py
fuzz: $(INSTALLED)
	HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest --timeout=3600 $(PROPERTIES) $(PYTEST_ARGS)

lint: $(INSTALLED)
	$(BIN)/ruff check .

bench: $(INSTALLED)
	$(BIN)/python -m bench.pipe_reader $(BENCH_ARGS)
	$(BIN)/python -m bench.input_pipeline $(BENCH_ARGS)
	$(BIN)/python -m bench.photo_pipeline $(BENCH_ARGS)
	$(BIN)/python -m bench.prepare_at_scale $(BENCH_ARGS)
	$(BIN)/python -m bench.resync $(BENCH_ARGS)
	$(BIN)/python -m bench.serve $(BENCH_ARGS)
	$(BIN)/python -m bench.sources $(BENCH_ARGS)
	$(BIN)/python -m bench.cpu_kernels $(BENCH_ARGS)
	$(BIN)/python -m bench.onnx_runtime $(BENCH_ARGS)

# pipemode against AWS's PipeModeDataset (needs `bash bench/aws/setup.sh` once: docs/speed.md)
bench-aws: $(INSTALLED)
	$(BIN)/python -m bench.vs_aws $(BENCH_ARGS)

venv: $(INSTALLED)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(UV): | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==0.13.9

$(INSTALLED): $(REQUIREMENTS) $(PROJECTS) $(COMPILED) Makefile | $(UV)
	$(UV) pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements/dev.txt
	# the project's three distributions, editable (their dependencies are pinned above): the
	# reader (pipemode), the job (keras_pipe_train), the launcher (keras_pipe_launch, `keras-pipe`);
	# and keras-hub, whose declared dependencies would replace tensorflow-cpu (requirements/hub.txt)
	$(UV) pip install --quiet --compile-bytecode --python $(BIN)/python --no-deps -r requirements/hub.txt $(EDITABLE)
	touch $@

# the local Debian base image the container tests build on (podman, debootstrap; run as root)
container-base:
	.ci/container-base

$(SDK2_INSTALLED): requirements/sdk2.txt requirements/launch.txt $(PROJECTS) $(COMPILED) Makefile | $(UV)
	$(PYTHON) -m venv $(SDK2)
	$(UV) pip install --quiet --compile-bytecode --python $(SDK2)/bin/python -r requirements/sdk2.txt
	$(UV) pip install --quiet --compile-bytecode --python $(SDK2)/bin/python --no-deps $(EDITABLE)
	touch $@

$(WHEELHOUSE_DOWNLOADED): $(REQUIREMENTS) train/pipemode/pyproject.toml Makefile | $(BIN)/python
	rm -rf $(WHEELHOUSE)
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --dest $(WHEELHOUSE) ./train/pipemode \
	  $$(grep -h -E '^(numpy|google-crc32c|setuptools)==' requirements/base.txt requirements/dev.txt)
	touch $@

$(TOOLKIT_INSTALLED): requirements/toolkit.txt Makefile | $(UV)
	$(PYTHON) -m venv $(TOOLKIT)
	$(UV) pip install --quiet --compile-bytecode --python $(TOOLKIT)/bin/python -r requirements/toolkit.txt
	touch $@

$(MXNET_INSTALLED): requirements/mxnet-reference.txt Makefile | $(UV)
	$(PYTHON) -m venv $(MXNET)
	$(UV) pip install --quiet --compile-bytecode --python $(MXNET)/bin/python -r requirements/mxnet-reference.txt
	touch $@

clean:
	rm -rf $(VENV) $(SDK2) $(TOOLKIT) $(MXNET) $(WHEELHOUSE) .pytest_cache train/*.egg-info train/pipemode/*.egg-info launch/*.egg-info \
	  train/pipemode/build train/pipemode/pipemode/_framing.*.so
