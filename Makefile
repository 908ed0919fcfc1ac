# edgedistill: every stage is a make target; each writes runs/<recipe>/<stage>/manifest.json.
# Python alone decides whether a stage is up to date (the recipe settings it declares and its
# parent artifacts: common/stage.py). Make only orders the stages: every target runs its command,
# and a current stage says "up to date" and returns at once.

RECIPE   ?= recipes/sst2.yaml
NPROC    ?= 1
JOBS     ?= 2
CORES     = $(or $(shell $(PY) -c 'from edgedistill.common.machine import usable_cores; print(usable_cores())' 2>/dev/null),$(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN))
TEST_WORKERS ?= $(shell echo $$(( $(CORES) + 1 )))
# RUNS_DIR in the environment is EDGEDISTILL_RUNS_DIR's old name, which wins when both are set, as the stages read them;
# RUNS_DIR given on make's command line wins over both. A leading ~/ is the home folder, as the stages read it.
ifeq ($(origin RUNS_DIR),environment)
RUNS_DIR := $(or $(EDGEDISTILL_RUNS_DIR),$(RUNS_DIR))
endif
override RUNS_DIR := $(patsubst ~/%,$(HOME)/%,$(if $(filter undefined,$(origin RUNS_DIR)),$(or $(EDGEDISTILL_RUNS_DIR),runs),$(RUNS_DIR)))
PYTHON   ?= python3
VENV     := .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed
ED       := $(VENV)/bin/edgedistill
export EDGEDISTILL_RUNS_DIR := $(RUNS_DIR)

# Make ignores a variable it has no use for: `make all RECPIE=recipes/smoke.yaml` (or recipe=) would run the default
# recipe for an hour. One given on the command line that is near one of these in any case, but is none of them, stops
# make, naming the one meant; any other (EDGEDISTILL_DEVICE=cpu, OMP_NUM_THREADS=2, or PYTHONPATH, which extends a
# name by more than a typo would) passes on to the commands' environment. GIVEN takes the names whose origin is the
# command line: MAKEOVERRIDES escapes the spaces of a value (TEXT=a\ pair\ of), so its words are not definitions.
VARIABLES := RECIPE NPROC JOBS TEST_WORKERS RUNS_DIR PYTHON TORCH_INDEX ORT BUNDLE PORT TEXT PAIR CASCADE \
  SERVE_BENCH_ARGS PEERS_BENCH_ARGS SCALING_BENCH_ARGS PROFILE LOADTEST_ARGS IMAGE BASE_IMAGE REFRESH BAKE PIP_CERT CONFIRM
GIVEN := $(subst ',,$(filter-out $(VARIABLES),$(foreach name,$(.VARIABLES),$(if $(filter command line,$(origin $(name))),$(name)))))
MISSPELT := $(if $(GIVEN),$(shell $(PYTHON) -c 'import difflib, sys; known = sys.argv[1].split(); print("; ".join(f"{name}: did you mean {near[0]}?" for name in sys.argv[2].split() for near in [difflib.get_close_matches(name.upper(), known, 1, 0.75)] if near and not (name.upper().startswith(near[0]) and len(name) > len(near[0]) + 2)))' '$(VARIABLES)' '$(GIVEN)'))
$(if $(MISSPELT),$(error unknown variable $(MISSPELT) (every variable: docs/settings.md#make-variables)))

# torchrun gives each rank OMP_NUM_THREADS=1 where it is unset, which would leave all but NPROC cores idle on the CPU:
# each rank takes its share of the cores instead, at least one (CORES counts them as the stages do: within a cgroup's
# CPU quota, which nproc ignores; nproc before make setup); an OMP_NUM_THREADS or EDGEDISTILL_TORCH_THREADS given wins.
ifeq ($(NPROC),1)
LAUNCH := $(ED)
else
$(if $(shell echo '$(NPROC)' | grep -Ex '[1-9][0-9]*'),,$(error NPROC=$(NPROC): give the processes per stage under torchrun, a whole number from 1))
RANK_THREADS := $(shell n=$(CORES); echo $$(( n / $(NPROC) > 1 ? n / $(NPROC) : 1 )))
LAUNCH := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(RANK_THREADS)} $(VENV)/bin/torchrun --standalone --nproc_per_node=$(NPROC) \
  --no-python $(ED)
endif
# distill refuses a JOBS that is no whole number from 1; make stops at once, not after the stages it builds first.
$(if $(shell echo '$(JOBS)' | grep -Ex '[1-9][0-9]*'),,$(error JOBS=$(JOBS): give the students trained at once, a whole number from 1))
# Under torchrun the ranks train each student together, so distill refuses a JOBS above 1; given on the command line or
# in the environment, it stops make at once rather than after the teacher and the transfer set, which make builds first.
$(if $(and $(filter-out 1,$(NPROC)),$(filter command line environment%,$(origin JOBS)),$(filter-out 1,$(JOBS))),$(error JOBS=$(JOBS) with NPROC=$(NPROC): under torchrun the $(NPROC) processes train each student together, one student at a time; drop JOBS, or NPROC=1 for JOBS students at once))

# A measurement sets its servers' bundle, address, threads and workers by flags, so the benchmarks refuse those
# EDGEDISTILL_* variables exported (common/settings.py MEASURED_SETTINGS), from the environment or from make's command
# line, which make exports to the commands too: a goal that measures stops at once, not after the training make builds
# first. `make serve` reads them; the default goal, help, measures nothing. A Kubernetes service link on such a name
# (EDGEDISTILL_PORT=tcp://10.0.0.5:50051, for a Service `edgedistill`; common/settings.py service_link) is no setting
# anyone gave: it stops nothing, and make serve and make call take their default PORT beside it.
SERVICE_LINK_URL := tcp://% udp://% sctp://%
MEASURING := all serve-bench serve-accuracy serve-cascade loadtest soak peers-bench scaling-bench
MEASURED_EXPORTED := $(strip $(foreach name,BUNDLE HOST PORT THREADS WORKERS,$(if $(filter environment% command,$(origin EDGEDISTILL_$(name))),$(if $(filter $(SERVICE_LINK_URL),$(EDGEDISTILL_$(name))),,EDGEDISTILL_$(name)))))
$(if $(and $(MEASURED_EXPORTED),$(filter $(MEASURING),$(MAKECMDGOALS))),$(error $(MEASURED_EXPORTED) would do nothing: a measurement sets its servers' bundle, address, threads (the recipe's) and workers itself; leave them out of make $(filter $(MEASURING),$(MAKECMDGOALS)) (make serve reads them)))
# TLS likewise: a measurement calls its servers over plaintext loopback (an empty variable is unset)
MEASURED_TLS := $(strip $(foreach name,TLS_CERT TLS_KEY,$(if $(and $(filter environment% command,$(origin EDGEDISTILL_$(name))),$(EDGEDISTILL_$(name))),EDGEDISTILL_$(name))))
$(if $(and $(MEASURED_TLS),$(filter $(MEASURING),$(MAKECMDGOALS))),$(error $(MEASURED_TLS): a measurement calls its servers over plaintext loopback; leave them out of make $(filter $(MEASURING),$(MAKECMDGOALS)) (make serve reads them)))

.PHONY: all setup teacher pretrain transfer distill bundles bench triton-repo report proto serve call serve-bench serve-accuracy serve-cascade peers-setup peers-bench scaling-bench loadtest soak image base-image container-test wheel-test setup-system test gpu-check lint format clean help

help:  ## list the targets and the variables they take
	@awk -F ':.*## ' '/^[a-z-]+:.*## / { name[++n] = $$1; text[n] = $$2; if (length($$1) > width) width = length($$1) } \
	  END { for (i = 1; i <= n; i++) printf "%-" (width + 2) "s%s\n", name[i], text[i] }' $(MAKEFILE_LIST)
	@echo; echo "variables (make TARGET NAME=value), each in docs/settings.md#make-variables:"; echo "$(VARIABLES)" | fold -s -w 100 | sed 's/^/  /'
	@echo "PYTHON, TORCH_INDEX and ORT make .venv, once: given later with others, they stop make (rm -rf .venv, then make setup)"

all: bench  ## the whole pipeline on RECIPE (default recipes/sst2.yaml), then its headline figures
	$(ED) bench serving $(RECIPE) --bundle $(BUNDLE) $(SERVE_BENCH_ARGS)
	$(ED) bench accuracy $(RECIPE) --bundle $(BUNDLE)
	$(ED) bench cascade $(RECIPE) $(if $(CASCADE),--cascade $(CASCADE))
	$(ED) loadtest $(RECIPE) --profile smoke --bundle $(BUNDLE) $(LOADTEST_ARGS); \
	  status=$$?; [ $$status -le 1 ] || exit $$status; \
	  $(ED) report $(RECIPE) && \
	  $(ED) headline $(RECIPE) && exit $$status

# PyPI's torch wheel for Linux is the CUDA build (GBs of NVIDIA libraries): setup installs torch from
# PyTorch's CPU index first. TORCH_INDEX=https://download.pytorch.org/whl/cu130 takes a CUDA build;
# TORCH_INDEX= (empty) leaves torch to pip's configured indexes (docs/install.md). --index-url replaces pip's own
# index-url (a local mirror), so where torch cannot come from TORCH_INDEX (an offline machine) setup installs it again
# from pip's configured indexes; one retry, so that this comes at once instead of after pip's back-off of 7.5 s for
# each of torch's packages.
# Where .venv exists its stamp records the index its torch came from ([index], [] for pip's configured indexes; nothing
# in a stamp from before), and setup installs again from that one: after an edit of pyproject.toml a CUDA build stays.
VENV_TORCH_INDEX := $(if $(wildcard $(STAMP)),$(shell sed -n 's/^TORCH_INDEX=\(.*\)$$/[\1]/p' $(STAMP)))
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(if $(VENV_TORCH_INDEX),$(patsubst [%],%,$(VENV_TORCH_INDEX)),$(CPU_TORCH_INDEX))
TORCH       := $(shell sed -n 's/^ *"\(torch==[^"]*\)",*$$/\1/p' pyproject.toml)

# ONNX Runtime: ORT=cpu installs the cpu extra (onnxruntime), ORT=gpu the gpu extra (onnxruntime-gpu and TensorRT, whose
# wheel comes from NVIDIA's index: pyproject.toml). The two wheels own the same folder and break each other, so where
# the other one is installed (by hand) setup removes both before it installs its own whole. The stamp records ORT (cpu
# in a stamp from before, when setup installed the cpu extra alone), and setup installs that one again after an edit of
# pyproject.toml: onnxruntime never comes back over onnxruntime-gpu.
VENV_ORT := $(if $(wildcard $(STAMP)),$(or $(shell sed -n 's/^ORT=//p' $(STAMP)),cpu))
ORT      ?= $(or $(VENV_ORT),cpu)
$(if $(filter-out cpu gpu,$(ORT))$(filter-out 1,$(words $(ORT))),$(error ORT=$(ORT): ORT=cpu installs ONNX Runtime for the CPU, ORT=gpu for NVIDIA GPUs (with TensorRT)))
ORT_OTHER := $(if $(filter gpu,$(ORT)),onnxruntime,onnxruntime-gpu)
ORT_INDEX := $(if $(filter gpu,$(ORT)),--extra-index-url https://pypi.nvidia.com)

# .venv is made once: PYTHON (its interpreter), TORCH_INDEX (where its torch came from) and ORT (its ONNX Runtime), the
# last two recorded in the stamp, given on the command line once .venv exists, other than its own, would do nothing, so
# they stop make, naming the fix (rm -rf .venv, then make setup with them). Same interpreter: the same installation and
# version, however it is named; same index: with or without a trailing /. PYTHON also makes peers-setup's and
# wheel-test's environments, whatever .venv's.
INTERPRETER := import sys; print(sys.base_prefix, "%d.%d.%d" % sys.version_info[:3])
ifeq ($(origin PYTHON)$(filter peers-setup wheel-test,$(MAKECMDGOALS)),command line)
ifneq ($(wildcard $(PY)),)
VENV_INTERPRETER := $(shell $(PY) -c '$(INTERPRETER)')
ifneq ($(shell $(PYTHON) -c '$(INTERPRETER)' 2>/dev/null),$(VENV_INTERPRETER))
$(error PYTHON=$(PYTHON) would do nothing: $(VENV) exists, made with Python $(lastword $(VENV_INTERPRETER)) in $(firstword $(VENV_INTERPRETER)), and make setup makes it once; rm -rf $(VENV), then make setup PYTHON=$(PYTHON), or leave PYTHON out)
endif
endif
endif
ifeq ($(origin TORCH_INDEX),command line)
ifneq ($(VENV_TORCH_INDEX),)
ifneq ($(patsubst %/],%],$(VENV_TORCH_INDEX)),$(patsubst %/],%],[$(TORCH_INDEX)]))
$(error TORCH_INDEX=$(TORCH_INDEX) would do nothing: $(VENV)'s torch came from $(or $(patsubst [%],%,$(VENV_TORCH_INDEX)),pip's configured indexes), and make setup installs it once; rm -rf $(VENV), then make setup TORCH_INDEX=$(TORCH_INDEX)$(if $(filter gpu,$(VENV_ORT)), ORT=gpu (the ONNX Runtime it has)), or leave TORCH_INDEX out)
endif
endif
endif
$(if $(and $(filter command line,$(origin ORT)),$(VENV_ORT),$(filter-out $(VENV_ORT),$(ORT))),$(error ORT=$(ORT) would do nothing: $(VENV)'s ONNX Runtime is the $(VENV_ORT) extra's, and make setup installs it once; rm -rf $(VENV), then make setup ORT=$(ORT)$(if $(filter-out [$(CPU_TORCH_INDEX)],$(VENV_TORCH_INDEX)), TORCH_INDEX=$(patsubst [%],%,$(VENV_TORCH_INDEX)) (where its torch came from)), or leave ORT out))

setup: $(STAMP)  ## make .venv and install the project for development: `.[ORT,dev]` (ORT=cpu|gpu), torch from TORCH_INDEX (CPU)

$(STAMP): pyproject.toml
	$(PY) -m pip --version >/dev/null 2>&1 || { rm -rf $(VENV); $(PYTHON) -c 'import ensurepip' 2>/dev/null || { echo "setup: $(PYTHON) cannot make $(VENV) without python3-venv (Debian/Ubuntu: make setup-system installs it)" >&2; exit 1; }; $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(PY) -m pip install --quiet --retries 1 '$(TORCH)' --index-url $(TORCH_INDEX) || \
	  { echo "setup: no $(TORCH) from TORCH_INDEX=$(TORCH_INDEX); trying pip's configured indexes (TORCH_INDEX= goes there at once)" >&2; \
	  $(PY) -m pip install --quiet '$(TORCH)'; })
	if $(PY) -m pip show --quiet $(ORT_OTHER) >/dev/null 2>&1; then $(PY) -m pip uninstall --quiet --yes onnxruntime onnxruntime-gpu; fi
	$(PY) -m pip install --quiet -e '.[$(ORT),dev]' $(ORT_INDEX)
	printf 'TORCH_INDEX=%s\nORT=%s\n' '$(TORCH_INDEX)' '$(ORT)' > $@

pretrain: $(STAMP)  ## pretrain the teacher LM (recipes with a `pretrain` section)
	$(LAUNCH) pretrain $(RECIPE)

teacher: $(STAMP)  ## pretrain (if the recipe says so) and fine-tune the teacher
	$(LAUNCH) teacher $(RECIPE)

transfer: teacher  ## build the transfer set and label it with the teacher (through the bundle transfer.labeller names on the CPU, else in PyTorch)
	$(ED) labeller $(RECIPE)
	$(ED) transfer $(RECIPE)

# Under torchrun (NPROC above 1) the ranks train each student together: no JOBS (a JOBS above 1 given stops make, above).
distill: transfer  ## distil every student of the recipe and train their baselines, JOBS at a time; print the table
	$(LAUNCH) distill $(RECIPE) $(if $(filter 1,$(NPROC)),--jobs $(JOBS))

bundles: distill  ## build every bundle of the recipe (ONNX, fused, INT8), each gated on parity
	$(ED) bundles $(RECIPE)

bench: bundles  ## teacher PyTorch eager vs every bundle, batch x length, one run (recipe: bench.models)
	$(ED) bench models $(RECIPE)

# The recipe's name (its `name:`, else the file's) and export.deploy, read once when a target needs them; a recipe
# that does not load prints its error (one line), and then make stops where it needs the deployed bundle, and clean at
# once (the fallback, the file's name, is none for RECIPE= or a folder, and RUN would be every run). It reads the
# recipe as the targets' commands do, with EDGEDISTILL_RUNS_DIR set (make before 4.4 exports none to $(shell)), so
# a RUNS_DIR given in the environment is not read as that variable's old name. Given a word after the recipe, it
# also refuses a recipe without a section `edgedistill all` needs (`refuse_missing_sections`).
READ_RECIPE = EDGEDISTILL_RUNS_DIR='$(RUNS_DIR)' $(PY) -c "import sys; sys.excepthook = lambda kind, err, tb: sys.exit(f'{kind.__name__}: {err}'); from edgedistill.common.recipe import load_recipe; r = load_recipe(sys.argv[1]); sys.argv[2:] and __import__('edgedistill.cli').cli.refuse_missing_sections(sys.argv[1], []); print(r.name, r.export.deploy if r.export else '')" '$(RECIPE)'
RECIPE_INFO = $(eval RECIPE_INFO := $(shell $(READ_RECIPE)))$(RECIPE_INFO)
RUN = $(RUNS_DIR)/$(or $(word 1,$(RECIPE_INFO)),$(basename $(notdir $(RECIPE))))
DEPLOY = $(word 2,$(RECIPE_INFO))
# BUNDLE and PORT take the server's own EDGEDISTILL_BUNDLE and EDGEDISTILL_PORT where set (a goal that measures refuses
# those, above; a service link is none), so make serve and make call honour them rather than override them by flags.
# A bundle given either way is built already: make triton-repo then trains nothing and reads no recipe.
BUNDLE_GIVEN := $(or $(filter-out undefined,$(origin BUNDLE)),$(EDGEDISTILL_BUNDLE))
BUNDLE ?= $(or $(EDGEDISTILL_BUNDLE),$(RUN)/bundle-$(or $(DEPLOY),$(error no export.deploy from $(RECIPE) (an error above says why, else it has no export section): fix the recipe or pass BUNDLE=<bundle folder>)))
# A goal that builds the bundles trains first, and needs the recipe's transfer, distill and export sections: one it
# lacks (or a recipe that does not load) stops make at once, as it stops `edgedistill all`, not after the training,
# in the one read of the recipe. Before make setup nothing reads the recipe here, and the stages refuse it in turn.
BUILDING_BUNDLES := all bundles bench $(if $(BUNDLE_GIVEN),,triton-repo) serve-bench serve-accuracy serve-cascade peers-bench scaling-bench
ifneq ($(and $(filter $(BUILDING_BUNDLES),$(MAKECMDGOALS)),$(wildcard $(STAMP))),)
RECIPE_INFO := $(shell $(READ_RECIPE) all)
$(if $(RECIPE_INFO),,$(error make $(filter $(BUILDING_BUNDLES),$(MAKECMDGOALS)) cannot build $(RECIPE): the error above says why))
endif
# The repository goes beside the bundle (runs/<recipe>/triton for the recipe's own), found by the shell: a BUNDLE given
# quoted, with a space in it, is one word there, and several to make's word functions.
triton-repo: $(if $(BUNDLE_GIVEN),$(STAMP),bundles)  ## a Triton model repository for BUNDLE (default: the deployed bundle, built first) in triton/ beside it
	$(ED) triton-repo $(BUNDLE) "$$(dirname $(BUNDLE))/triton"

report: $(STAMP)  ## runs/<recipe>/report/index.html (and report.md): figures and tables from every finished stage
	$(ED) report $(RECIPE)

proto: $(STAMP)  ## regenerate serve/proto/*_pb2*.py from the .proto files
	$(ED) proto

PORT ?= $(or $(filter-out $(SERVICE_LINK_URL),$(EDGEDISTILL_PORT)),50051)
serve: $(STAMP)  ## serve BUNDLE (default: the recipe's deployed bundle) over gRPC on PORT
	$(ED) serve --bundle $(BUNDLE) --port $(PORT)

TEXT ?= a gripping , beautifully acted film
PAIR ?=
# The value of variable $(1) as written, single-quoted for the shell: in double quotes make would expand its $ and the
# shell its ", ` and $ (SST-2's own text quotes with `` and '').
QUOTED = '$(subst ','\'',$(value $(1)))'
call: $(STAMP)  ## classify TEXT (with its sentence B, PAIR, for a pair model) with the server on PORT
	$(ED) call --address localhost:$(PORT) $(if $(value PAIR),--pair=$(call QUOTED,PAIR)) -- $(call QUOTED,TEXT)

SERVE_BENCH_ARGS ?=
serve-bench: bundles  ## BUNDLE behind the server against the recipe's bench.serving targets: paced p99, capacity vs an echo server, batch-32 vs raw backend
	$(ED) bench serving $(RECIPE) --bundle $(BUNDLE) $(SERVE_BENCH_ARGS)

PEERS    := .venv-peers
# The peers' pins; MLServer 1.7.1 fails to start its inference workers with uvloop >= 0.22 (SeldonIO/MLServer#2286).
PEER_PINS := onnxruntime==1.31.1 tokenizers==0.23.3 PyYAML==6.0.3
# The peer and scaling benchmarks drive their servers with h2load, and the peers run from their own environments: a
# missing one stops make at once, not after the training it builds first (an interpreter given in PEERS_BENCH_ARGS,
# --kserve-python or --mlserver-python, is checked by the benchmark).
$(if $(and $(filter peers-bench scaling-bench,$(MAKECMDGOALS)),$(if $(shell command -v h2load),,missing)),$(error h2load not found, which make $(filter peers-bench scaling-bench,$(MAKECMDGOALS)) drives its servers with: install Debian's nghttp2-client (make setup-system)))
$(if $(and $(filter peers-bench,$(MAKECMDGOALS)),$(if $(findstring -python,$(PEERS_BENCH_ARGS)),,$(if $(wildcard $(PEERS)),,missing))),$(error no peer environments in $(PEERS)/: run make peers-setup first, or name their interpreters in PEERS_BENCH_ARGS (--kserve-python, --mlserver-python)))

peers-setup: setup-system $(STAMP)  ## the peers' own environments for peers-bench (.venv-peers/): KServe and MLServer, each with ONNX Runtime and this project
	$(PYTHON) -m venv $(PEERS)/kserve
	$(PEERS)/kserve/bin/pip install -q kserve==0.21.0 $(PEER_PINS)
	$(PEERS)/kserve/bin/pip install -q --no-deps -e .
	$(PYTHON) -m venv $(PEERS)/mlserver
	$(PEERS)/mlserver/bin/pip install -q mlserver==1.7.1 uvloop==0.21.0 $(PEER_PINS)
	$(PEERS)/mlserver/bin/pip install -q --no-deps -e .

peers-bench: bundles  ## BUNDLE behind the server, KServe's ModelServer, MLServer and an echo server, driven by h2load (needs peers-setup)
	$(ED) bench peers $(RECIPE) --bundle $(BUNDLE) $(PEERS_BENCH_ARGS)

scaling-bench: bundles  ## BUNDLE behind the server with 1, 2 and one worker per core, driven by h2load
	$(ED) bench scaling $(RECIPE) --bundle $(BUNDLE) $(SCALING_BENCH_ARGS)

serve-cascade: bundles  ## the recipe's cascade (CASCADE, default the deployed one, else the first) against its last member served alone
	$(ED) bench cascade $(RECIPE) $(if $(CASCADE),--cascade $(CASCADE))

serve-accuracy: bundles  ## the whole dev split through BUNDLE's server, both APIs, against the bundle's own predictions and dev accuracy
	$(ED) bench accuracy $(RECIPE) --bundle $(BUNDLE) --check

PROFILE       ?= smoke
LOADTEST_ARGS ?=
# make all runs the smoke load test: another PROFILE would do nothing there, and LOADTEST_ARGS for that profile would
# be refused only after the training; stop at once instead (make with no goal prints help, and runs nothing)
$(if $(and $(filter all,$(MAKECMDGOALS)),$(filter command line,$(origin PROFILE)),$(filter-out smoke,$(PROFILE))),$(error PROFILE=$(PROFILE): make all runs the smoke load test; make loadtest PROFILE=$(PROFILE) runs that one after it))
# likewise --echo, which would load the echo server in place of the deployed bundle, and make all pass without its test
$(if $(and $(filter all,$(MAKECMDGOALS)),$(filter --echo,$(LOADTEST_ARGS))),$(error LOADTEST_ARGS=$(LOADTEST_ARGS): --echo would load-test the echo server in place of the deployed bundle in make all; make loadtest LOADTEST_ARGS=--echo runs it after make all))
# --profile or --bundle in LOADTEST_ARGS would come after make's own, and the last one given wins: refuse it
LOADTEST_OWN = $(filter --profile --profile=% --bundle --bundle=%,$(LOADTEST_ARGS))
$(if $(and $(filter all loadtest soak,$(MAKECMDGOALS)),$(LOADTEST_OWN)),$(error LOADTEST_ARGS=$(LOADTEST_ARGS): $(LOADTEST_OWN) would replace make's own; give PROFILE=NAME (make loadtest) and BUNDLE=PATH instead))
loadtest: $(STAMP)  ## locust against BUNDLE, PROFILE=smoke|steady|step|spike|soak; runs/<recipe>/loadtest-PROFILE-<bundle id>; fails on a missed SLO
	$(ED) loadtest $(RECIPE) --profile $(PROFILE) --bundle $(BUNDLE) $(LOADTEST_ARGS)

soak: $(STAMP)  ## the long soak on BUNDLE (10 min at 200/s in the default recipe): errors and server memory growth
	$(if $(and $(filter command line,$(origin PROFILE)),$(filter-out soak,$(PROFILE))),$(error PROFILE=$(PROFILE): make soak runs the soak profile; make loadtest PROFILE=$(PROFILE) runs that one))
	$(MAKE) --no-print-directory loadtest PROFILE=soak

IMAGE      ?= edgedistill-serve
BASE_IMAGE ?= localhost/edgedistill-base:bookworm
# BAKE=1 bakes BUNDLE into the image, tagged <bundle folder>-<content version> (the version GetModelInfo reports,
# read once): a bundle built again with other weights gets a new tag, which a Deployment's image must name for the new
# model to roll out. Otherwise the bundle is mounted at /models/bundle at run time. Another value (BAKE=yes) would
# build the image without it.
$(if $(filter-out 0 1,$(BAKE)),$(error BAKE=$(BAKE): BAKE=1 bakes BUNDLE into the image, BAKE=0 or none mounts it at run time))
# The Dockerfile copies a baked bundle from the build context, this folder, which lets in runs/<recipe>/bundle-<id>/
# alone (.dockerignore): BAKED is BUNDLE there, however it is written (absolute, ./, a trailing /), and empty for a
# bundle elsewhere (RUNS_DIR outside this folder, or a link out of it), which make image refuses.
ifeq ($(BAKE),1)
IN_CONTEXT  = $(patsubst $(CURDIR)/%,%,$(realpath $(BUNDLE)))
BAKED       = $(if $(and $(filter runs/%,$(IN_CONTEXT)),$(filter 3,$(words $(subst /, ,$(IN_CONTEXT)))),$(filter bundle-%,$(notdir $(IN_CONTEXT)))),$(IN_CONTEXT))
BUNDLE_VERSION = $(eval BUNDLE_VERSION := $(shell $(PY) -c "import sys; sys.excepthook = lambda kind, err, tb: sys.exit(f'{kind.__name__}: {err}'); from edgedistill.common.cascade import served_version; print(served_version(sys.argv[1]))" '$(BUNDLE)'))$(BUNDLE_VERSION)
IMAGE_TAG   = $(IMAGE):$(notdir $(patsubst %/,%,$(BUNDLE)))-$(BUNDLE_VERSION)
IMAGE_ARGS  = --target baked --build-arg BUNDLE=$(BAKED)
else
IMAGE_TAG   = $(IMAGE):latest
IMAGE_ARGS  =
endif

base-image:  ## a local Debian bookworm base image for podman (debootstrap + podman import; skipped when present)
	deploy/base-image.sh $(BASE_IMAGE)

image: $(if $(filter 1,$(BAKE)),$(STAMP))  ## build the serving image (docker if an engine answers, else podman); BAKE=1 bakes BUNDLE in
	$(if $(filter 1,$(BAKE)),@test -f $(BUNDLE)/manifest.json || { echo "BAKE=1: $(BUNDLE) is not a finished bundle: build it (make bundles RECIPE=$(RECIPE)) or pass BUNDLE=<bundle folder>" >&2; exit 2; })
	$(if $(filter 1,$(BAKE)),$(if $(BAKED),,@echo "BAKE=1: $(BUNDLE) is outside the build context, which takes a bundle from runs/<recipe>/bundle-<id> in $(CURDIR) only: copy it there and pass that as BUNDLE, or mount it at run time (BAKE=0)" >&2; exit 2))
	$(if $(filter 1,$(BAKE)),$(if $(BUNDLE_VERSION),,@echo "BAKE=1: $(BUNDLE) does not load as a bundle (the line above says why), so there is no content version to tag its image with: build it again (make bundles RECIPE=$(RECIPE))" >&2; exit 2))
	@if refusal=$$(docker info 2>&1 >/dev/null); then \
	  set -x; docker build $(IMAGE_ARGS) $${PIP_CERT:+--secret id=pip-cert,src=$$PIP_CERT} -t $(IMAGE_TAG) .; \
	else \
	  if command -v docker >/dev/null; then \
	    echo "image: docker did not answer, so podman builds the image instead: $$(echo "$$refusal" | grep -m 1 .)" >&2; fi; \
	  deploy/base-image.sh $(BASE_IMAGE) && set -x && \
	  podman build --isolation chroot --format docker --build-arg BASE=$(BASE_IMAGE) $(IMAGE_ARGS) \
	    $${PIP_CERT:+--secret id=pip-cert,src=$$PIP_CERT} -t $(IMAGE_TAG) .; \
	fi

wheel-test: $(STAMP)  ## build the wheel, install it with the serve extra in a clean venv, serve BUNDLE from outside the checkout, call it once
	PY=$(PY) deploy/wheel-test.sh $(BUNDLE)

container-test: $(STAMP) base-image  ## build the image, serve BUNDLE from it with podman, call it from the host, stop it
	IMAGE=$(IMAGE):test BASE=$(BASE_IMAGE) deploy/container-test.sh $(BUNDLE)

# The commands the test suite runs besides Python (Chromium: the report's screenshot test; openssl:
# the TLS tests; h2load: the peer benchmark), and python3-venv, without which `make setup` cannot make
# .venv on Debian, nor peers-setup the peers' environments: test and peers-setup install them first.
setup-system:  ## install the system packages the tests need (chromium, openssl, nghttp2-client, python3-venv) when missing
	@missing=; \
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing="$$missing chromium"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v h2load >/dev/null || missing="$$missing nghttp2-client"; \
	$(PY) -m pip --version >/dev/null 2>&1 || $(PYTHON) -c 'import ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	[ -n "$$missing" ] || exit 0; \
	install="apt-get update && apt-get install -y --no-install-recommends$$missing"; \
	if ! command -v apt-get >/dev/null; then \
	  echo "the tests need$$missing; on Debian/Ubuntu, as root: sh -c '$$install'" >&2; exit 1; \
	elif [ "$$(id -u)" = 0 ]; then set -x; sh -c "$$install"; \
	elif command -v sudo >/dev/null; then set -x; sudo sh -c "$$install"; \
	else echo "the tests need$$missing; install them as root: sh -c '$$install'" >&2; exit 1; fi

# The tests run one torch thread each, so TEST_WORKERS pytest-xdist workers (one more than the cores: a worker waiting
# on a server or a process it started leaves its core to the others) share the cores, each given whole modules (so a
# module's fixtures are built once); those marked `serial` bound time or memory under load, and run alone afterwards.
# Both parts run, and either failing fails the target.
test: setup-system $(STAMP)  ## install what is missing (setup-system, setup), lint, then the test suite (unit and tiny end-to-end runs)
	$(MAKE) --no-print-directory lint
	@status=0; \
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m 'not serial' || status=$$?; \
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m serial || status=$$?; \
	exit $$status

# Everything that runs on a GPU, for a machine that has one: the GPU tests (training, labelling, checkpoints and DDP on
# CUDA; then ONNX Runtime's CUDA provider and TensorRT, which need the gpu extra and are skipped, saying so, without
# it), then RECIPE's training part (teacher, transfer set, students and baselines, JOBS at a time; the teacher and the
# students under torchrun with NPROC above 1, as `make teacher` and `make distill` run them) under the run name
# gpu-check, each stage a process timed from start to exit as docs/benchmarks.md times them; the walls go to
# $(RUNS_DIR)/gpu-check/timing.json, the figures to the stages' manifests beside it.
GPU_RUNTIME_TESTS := tests/export/test_tensorrt.py tests/common/test_runtime.py tests/serve/test_backend.py
gpu-check: $(STAMP)  ## on an NVIDIA GPU: the GPU tests, then RECIPE's training part there, each stage timed (runs/gpu-check/timing.json)
	@$(PY) -c 'import sys, torch; torch.cuda.is_available() or sys.exit(f"gpu-check needs an NVIDIA GPU and a CUDA build of torch, but PyTorch {torch.__version__} " + (f"(built with CUDA {torch.version.cuda}) sees no GPU" if torch.version.cuda else "is a CPU-only build: rm -rf $(VENV), then make setup TORCH_INDEX=https://download.pytorch.org/whl/cu130 ORT=gpu installs a CUDA one, and the ONNX Runtime and TensorRT for the GPU tests (docs/install.md)"))'
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n 4 -m gpu tests/distill/test_gpu.py tests/distill/test_device.py
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -rs -m gpu $(GPU_RUNTIME_TESTS)
	@set -e; mkdir -p "$(RUNS_DIR)/gpu-check"; walls=; total=0; \
	for stage in teacher transfer distill; do \
	  jobs=; $(if $(filter 1,$(NPROC)),[ $$stage = distill ] && jobs="--jobs $(JOBS)";) \
	  start=$$(date +%s%N); \
	  if [ $$stage = transfer ]; then $(ED) $$stage $(RECIPE) --name=gpu-check --runtime.device=cuda --force; \
	  else $(LAUNCH) $$stage $(RECIPE) --name=gpu-check --runtime.device=cuda --force $$jobs; fi; \
	  ms=$$(( ($$(date +%s%N) - start) / 1000000 )); total=$$((total + ms)); walls="$$walls\"$$stage\": $$ms, "; \
	done; \
	echo "{\"recipe\": \"$(RECIPE)\", \"nproc\": $(NPROC), \"wall_ms\": {$$walls\"training_part\": $$total}}" > "$(RUNS_DIR)/gpu-check/timing.json"; \
	cat "$(RUNS_DIR)/gpu-check/timing.json"

lint: $(STAMP)  ## ruff check and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)  ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:  ## remove the run folder of RECIPE (asks first; CONFIRM=1 to skip the question)
	$(if $(word 1,$(RECIPE_INFO)),,$(error RECIPE=$(RECIPE) does not load (the error above says why), so make clean has no run to remove: pass RECIPE=<recipe file> of the run, or remove its folder in $(RUNS_DIR) by hand))
	$(if $(strip $(RUNS_DIR)),,$(error RUNS_DIR is empty, so make clean would remove /$(word 1,$(RECIPE_INFO)): give the runs folder, or leave RUNS_DIR out for runs/))
	@if [ "$(CONFIRM)" != 1 ]; then \
	  printf 'remove %s? [y/N] ' "$(RUN)"; read answer || echo; \
	  [ "$$answer" = y ] || { echo "not removed (CONFIRM=1 removes it without asking)" >&2; exit 1; }; fi
	rm -rf -- "$(RUN)"
