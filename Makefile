# glmdeploy: pinned, verified ChatGLM3-6B-32k nodes. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON    ?= python3
VENVS     := .venv
TOOLS     := $(VENVS)/tools
REFENV    := $(VENVS)/tokenizer-ref
ARTIFACTS := artifacts
# The Python minor version `make wheelhouse` fetches for (a node's own version decides at deploy).
NODE_PY   ?= 3.11
# The control node's Python (checked below), which the tool and reference environments use.
CONTROL_PY := 3.11
# The profile registry (constraints/profiles.toml), read through its one loader: profile names,
# models, file names and the GPU rule come from there, never from this file. One call per make
# gives every value as REG_* variables (`python -m glmdeploy_control.registry make-vars`).
comma := ,
REGISTRY  = PYTHONPATH=$(CURDIR)/service $(PYTHON) -m glmdeploy_control.registry
$(foreach word,$(shell $(REGISTRY) make-vars --python $(NODE_PY) --control-python $(CONTROL_PY) \
  $(if $(filter undefined,$(origin PROFILE)),--detect)),$(eval $(word)))
REG_PROFILE_LIST := $(subst $(comma), ,$(REG_PROFILES))
# Each node's profile is its own (inventory `glmdeploy_profile`, else the node's hardware by the
# registry's GPU rule: playbooks/tasks/profile.yml). PROFILE=... on the command line forces one
# for every node of the run; the targets that work on the control node alone (wheelhouse,
# model, tokenizer-lock) default to what the same rule gives for this machine.
ifeq ($(origin PROFILE),undefined)
PROFILE   := $(REG_DETECTED)
endif
FORCE_PROFILE := $(if $(filter command line environment,$(origin PROFILE)),-e glmdeploy_profile=$(PROFILE))
# Wheels kept on this machine across checkouts and CI runs (checked by hash on every use).
WHEEL_CACHE ?= /var/cache/glmdeploy/wheels
export GLMDEPLOY_WHEEL_CACHE := $(WHEEL_CACHE)
# Environment packs (a lock's installed environment, zstd) kept the same way: a new checkout's first
# deploy unpacks the pack an earlier deploy of the same lock built instead of running pip.
PACK_CACHE ?= /var/cache/glmdeploy/packs
export GLMDEPLOY_PACK_CACHE := $(PACK_CACHE)
# The locks of the control node's tool and reference environments.
TOOLS_LOCK := constraints/$(REG_TOOLS_LOCK)
REFENV_LOCK := constraints/$(REG_REFENV_LOCK)
# Where deploy, verify, smoke and releases write the control node's reports (smoke/, releases/,
# verify.*): one directory per run that goes on at the same time from this checkout (make test
# runs this machine's deploys and the test hosts' side by side, each with its own).
REPORTS   ?= reports
export GLMDEPLOY_REPORTS := $(abspath $(REPORTS))
INVENTORY ?= playbooks/localhost.ini
# How long `make soak` loads each node (90s, 3m, 72h).
DURATION  ?= 3m
ANSIBLE_ARGS ?=
WHEELHOUSE = $(ARTIFACTS)/wheelhouse/$(REG_WHEELHOUSE.$(PROFILE))
N         ?= 3
# make hosts: how many of the N (the last) run Debian 13, whose releases run the kit's image.
DEBIAN13  ?= 0
HOSTCTL   := $(TOOLS)/bin/python tests/hosts/hostctl.py
# The kit's generated model (`make fixture`) and the model PROFILE serves, as the registry names them.
FIXTURE   := $(ARTIFACTS)/models/$(REG_FIXTURE_MODEL)
MODEL_DIR ?= $(ARTIFACTS)/models/$(REG_MODEL.$(PROFILE))
# make verify: the model directories the nodes were deployed from (each node's manifest is held to
# MODELS/<model name>/SHA256SUMS); set it when a deploy used model_source_dir elsewhere.
MODELS    ?= $(ARTIFACTS)/models
PYTEST_ARGS ?=
# make bench: the endpoint (default: this machine's deployed node), what to run (sweep, or
# matrix: the concurrency levels) and extra bench arguments.
NODE_CONFIG ?= /etc/glmdeploy/node.json
BENCH     ?= sweep
URL       ?=
MODEL     ?= $(REG_SERVED_MODEL)
# make rollout: nodes per batch, and the share of a batch that may fail before it stops (percent).
ROLLOUT_SERIAL   ?= 1
ROLLOUT_MAX_FAIL ?= 0
# A duration (e.g. 10m): each batch's first upgraded node must pass a soak of it before the
# rollout goes on; empty: no soak.
ROLLOUT_SOAK     ?=
BENCH_ARGS ?=
# make deploy / rollout serve artifacts/ (wheelhouse, environment packs) to the inventory's other
# machines for the length of the run, on the address each node is routed to (0: a free port).
ARTIFACT_PORT ?= 0
# One deploy, rollout, rollback, undeploy, driver or balancer change per inventory at a time on this control node (LOCK_WAIT: seconds a
# second run waits for the first before it stops, naming it).
LOCK_WAIT ?= 0
# ... and the same wait for each node's own lock (the playbooks read it: glmdeploy_node_lock_wait).
export GLMDEPLOY_LOCK_WAIT := $(LOCK_WAIT)
RUN_LOCKED = $(TOOLS)/bin/python -m glmdeploy_control.runlock --inventory $(INVENTORY) --wait $(LOCK_WAIT) --
APT_CACHE ?= /var/cache/glmdeploy/apt
export GLMDEPLOY_APT_CACHE := $(APT_CACHE)
APTLOCK = $(TOOLS)/bin/python -m glmdeploy_control.aptlock
SERVE_ARTIFACTS = $(RUN_LOCKED) $(TOOLS)/bin/python -m glmdeploy_control.artifact_server \
  --root $(ARTIFACTS) --inventory $(INVENTORY) --port $(ARTIFACT_PORT) --

export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PYTHONDONTWRITEBYTECODE := 1
export PATH := $(CURDIR)/$(TOOLS)/bin:$(PATH)

.PHONY: sbom audit audit-refresh update backup restore apt-repo control-packages sizes stage fixture-full firewall keys soak output-lock image image-smoke e2e-image test-inputs test-packages hosts-prefetch wheels-prefetch rehearsal-model rehearsal-source rollout rollback releases releases-table drills lb drain undrain weights driver driver-upgrade bench baseline verify tokenizer-lock hosts hosts-down hosts-status help tools lock lock-check wheelhouse fixture model deploy undeploy smoke lint unit e2e e2e-node e2e-hosts test clean

help: ## List the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_-]+:.*## /{printf "  make %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  variables: INVENTORY=$(INVENTORY)  ANSIBLE_ARGS=...  PROFILE=$(subst $(comma),|,$(REG_PROFILES)) (forces one profile on every node;"
	@echo "             unset, each node's inventory setting or hardware decides)  WHEEL_CACHE=$(WHEEL_CACHE)"
	@echo "             PACK_CACHE=$(PACK_CACHE) (environment packs kept across checkouts; empty: off)"
	@echo "             LOCK_WAIT=$(LOCK_WAIT) (seconds a deploy, rollout, rollback or undeploy waits for another run on the same inventory)"
	@echo "             ARTIFACT_PORT=$(ARTIFACT_PORT) (the port make deploy/rollout serve artifacts/ on to other machines; 0: a free one)"

$(TOOLS)/.stamp: $(TOOLS_LOCK)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || \
	  { echo "ERROR: the control node needs Python 3.11 as $(PYTHON) (found $$($(PYTHON) -V 2>&1)); fix: make PYTHON=/path/to/python3.11 ..."; exit 2; }
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || \
	  { echo "ERROR: $(PYTHON) cannot create virtual environments; fix: apt install python3-venv"; exit 2; }
	@echo "==> bootstrapping the tool environment in $(TOOLS) (ansible, linters, test tools)"
	@rm -rf $(TOOLS) && $(PYTHON) -m venv $(TOOLS)
	@awk '/^uv==/{p=1; print; next} p && /^[^ #]/{exit} p' $(TOOLS_LOCK) > $(TOOLS)/uv.txt
	@$(TOOLS)/bin/pip install -q --no-deps --require-hashes --only-binary=:all: -r $(TOOLS)/uv.txt
	@$(call UV_INSTALL,$(TOOLS),$(TOOLS_LOCK))
	@touch $@

# The lock's uv (pip installs it, hash-checked) installs the tool and reference environments:
# the same hash-checked wheels as pip, from the same sources (the machine's pip configuration,
# read by glmdeploy_control.lock), in a third of pip's time (its cache outlives the checkout).
UV_INSTALL = $(TOOLS)/bin/uv pip install -q --python $(1)/bin/python --no-deps --require-hashes \
  --only-binary :all: --compile-bytecode $$(PYTHONPATH=$(CURDIR)/service:$(CURDIR)/module_utils $(PYTHON) -m glmdeploy_control.lock uv-args) -r $(2)

# The tool venvs use this checkout's own packages (service/glmdeploy, service/glmdeploy_control,
# and module_utils' stdlib-only helpers they share with the Ansible modules) through a .pth file,
# the file an editable install writes for this layout: `python -m
# glmdeploy.<module>` works with nothing set in the environment. Nodes get the wheel instead
# (roles/python_env, tasks/kit.yml).
# Named for what it holds: a checkout whose venvs have the earlier file (service/ only) gets this
# one made by the next make, with nothing to clean by hand.
CHECKOUT_PTH := lib/python3.11/site-packages/glmdeploy-checkout-service-module_utils.pth
$(TOOLS)/$(CHECKOUT_PTH): $(TOOLS)/.stamp
	@printf '%s\n' "$(CURDIR)/service" "$(CURDIR)/module_utils" > $@
$(REFENV)/$(CHECKOUT_PTH): $(REFENV)/.stamp
	@printf '%s\n' "$(CURDIR)/service" "$(CURDIR)/module_utils" > $@
REFENV_READY := $(REFENV)/$(CHECKOUT_PTH)

tools: $(TOOLS)/.stamp $(TOOLS)/$(CHECKOUT_PTH) ## Bootstrap the tool venv (ansible, ansible-lint, yamllint, ruff, pytest, playwright)

$(REFENV)/.stamp: $(REFENV_LOCK) $(TOOLS)/.stamp
	@echo "==> building the reference tokenizer environment in $(REFENV) (transformers 4.40.2, tokenizers 0.19.1)"
	@rm -rf $(REFENV) && $(PYTHON) -m venv $(REFENV)
	@$(call UV_INSTALL,$(REFENV),$(REFENV_LOCK))
	@touch $@

lock: tools ## Re-resolve every constraints/*.in into hash-locked files (dated, reproducible), and each node OS release's apt lock (constraints/apt/; APT_MIRROR=<uri> for a release this machine's apt sources lack)
	$(TOOLS)/bin/python -m glmdeploy_control.lock lock
	$(APTLOCK) lock $(if $(APT_MIRROR),--mirror $(APT_MIRROR))

lock-check: tools ## Fail if a committed lock differs from a fresh resolve (apt locks: from the registry; versions the mirror moved past are named)
	$(TOOLS)/bin/python -m glmdeploy_control.lock check
	$(APTLOCK) check $(if $(APT_MIRROR),--mirror $(APT_MIRROR))

sbom: tools ## CycloneDX inventory of every lock nodes install from, in artifacts/sbom/ (NODES=<reports>/smoke: also each node as make verify saw it; each image make image-smoke ran); same lock, same bytes
	$(TOOLS)/bin/python -m glmdeploy_control.sbom --out $(ARTIFACTS)/sbom --images $(REPORTS) $(if $(NODES),--nodes $(NODES))

audit: tools ## Every locked Python package against published advisories, joined with constraints/advisories/triage.toml; fails on one nobody triaged (offline: the committed snapshot on loopback; OSV_URL=<an OSV /v1/query> asks that service)
	$(TOOLS)/bin/python -m glmdeploy_control.audit check $(if $(OSV_URL),--osv-url $(OSV_URL))

audit-refresh: tools ## Record a new advisory snapshot (constraints/advisories/osv-snapshot.json) from OSV_URL=<an OSV /v1/query> (needs it reachable); then make audit and triage what is new
	@test -n "$(OSV_URL)" || { echo "ERROR: name the service: make audit-refresh OSV_URL=https://<OSV's API host>/v1/query"; exit 2; }
	$(TOOLS)/bin/python -m glmdeploy_control.audit refresh --osv-url $(OSV_URL)

# The kit's apt repository of a release's lock (artifacts/apt/), signed by the kit's key; a deploy
# builds the one each node needs by itself (roles/glmdeploy, tasks_from apt): this builds it ahead.
apt-repo: tools control-packages ## Build the kit's offline apt repository of RELEASE's lock (default: every release) from APT_CACHE
	$(APTLOCK) repo $(if $(RELEASE),--release $(RELEASE)) --artifacts $(ARTIFACTS) --cache $(APT_CACHE) $(if $(APT_MIRROR),--mirror $(APT_MIRROR))

# What the control node needs from its distribution to build the kit's apt repository (and to
# serve stores): apt-ftparchive (apt-utils), gpg, rsync. Installed when run as root; else named.
CONTROL_PACKAGES := apt-utils gnupg rsync
control-packages: ## Install what the control node needs to build the kit's apt repository (root; nothing happens when all are there)
	@if dpkg -s $(CONTROL_PACKAGES) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" != 0 ]; then echo "ERROR: the control node needs these packages: $(CONTROL_PACKAGES); fix: sudo apt install $(CONTROL_PACKAGES)"; exit 2; \
	else echo "==> installing what the control node needs: $(CONTROL_PACKAGES)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(CONTROL_PACKAGES) >/dev/null; fi

wheelhouse: tools ## Download the wheels of PROFILE's lock once, on the control node, and verify them
	$(TOOLS)/bin/python -m glmdeploy_control.lock wheelhouse --profile $(PROFILE) --python $(NODE_PY) --dest $(WHEELHOUSE) --cache "$(WHEEL_CACHE)"

# The generated models' files all carry one fixed time (deterministic trees), so make cannot judge
# them by their times: a stamp beside each says when it was made, and a missing model is made
# again whatever its stamp says. (Without the stamps every make that needed the fixture made it
# again, swapping the directory under a server that was loading it.)
FIXTURE_SOURCES := $(REFENV_READY) $(filter-out %/full_size.py,$(wildcard tests/support/fixture_model/*.py)) service/glmdeploy/model/chatglm3.py $(wildcard tests/support/fixture_model/fixture_files/*.py)
FIXTURE_MADE    := $(ARTIFACTS)/models/.$(REG_FIXTURE_MODEL).made
$(FIXTURE_MADE): $(FIXTURE_SOURCES) $(if $(wildcard $(FIXTURE)/SHA256SUMS),,FORCE)
	@PYTHONPATH=tests/support $(REFENV)/bin/python -m fixture_model $(FIXTURE)
	@touch $@

fixture: $(FIXTURE_MADE) ## Generate the tiny ChatGLM3-architecture fixture model (deterministic)

.PHONY: FORCE
FORCE:

# ChatGLM3-6B-32k's real size (random fp16 in the published revision's seven .bin shards, 12.5 GB):
# written once into a cache outside the checkout, checked by its manifest, staged as hard links.
# For transfer and check costs only (bench/sizes/): no server loads it.
FULL_SIZE_MODEL := $(ARTIFACTS)/models/chatglm3-6b-32k-full-size
fixture-full: $(REFENV_READY) ## The model at its real size (12.5 GB, random fp16; cached in /var/cache/glmdeploy/fixtures), staged in artifacts/models/
	@PYTHONPATH=tests/support $(REFENV)/bin/python -m fixture_model.full_size --stage $(FULL_SIZE_MODEL)

# The gpu-cu121 rehearsal's model goes the way a real revision goes: a plain copy of a repo in the
# published revision's shape (.bin shards, the 2023 tokenizer file, the chat template), with
# ChatGLM3-6B-32k's KV-cache geometry, staged by `make weights` (checked, converted to safetensors).
REHEARSAL_SOURCE   := $(ARTIFACTS)/published/chatglm3-rehearsal
REHEARSAL_MODEL    := $(ARTIFACTS)/models/chatglm3-rehearsal
REHEARSAL_REVISION := c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00
REHEARSAL_MADE     := $(ARTIFACTS)/published/.chatglm3-rehearsal.made
$(REHEARSAL_MADE): $(FIXTURE_SOURCES) $(if $(wildcard $(REHEARSAL_SOURCE)/pytorch_model.bin.index.json),,FORCE)
	@PYTHONPATH=tests/support $(REFENV)/bin/python -m fixture_model --shape published --kv-geometry $(REHEARSAL_SOURCE)
	@touch $@

rehearsal-source: $(REHEARSAL_MADE) ## The rehearsal model as a plain repo copy in the published revision's shape (make weights stages it)

$(REHEARSAL_MODEL)/SHA256SUMS: $(REHEARSAL_MADE) service/glmdeploy_control/weights.py service/glmdeploy_control/checkpoint.py
	@$(MAKE) --no-print-directory weights FROM=$(REHEARSAL_SOURCE) REVISION=$(REHEARSAL_REVISION) MODEL_DIR=$(REHEARSAL_MODEL)

rehearsal-model: $(REHEARSAL_MODEL)/SHA256SUMS ## The gpu-cu121 rehearsal's model, staged by make weights from rehearsal-source (docs/rehearsal.md)

# The same pinned stack as a container image (images/README.md): podman, offline, reproducible
# (the same inputs give the same image ID), kept by its inputs' digest in /var/cache/glmdeploy/images.
# The image runs its base's Python (the registry's [kit.image]), whatever NODE_PY is.
image: tools ## Build PROFILE's container image offline and reproducibly (podman; no weights inside)
	@$(MAKE) --no-print-directory wheelhouse NODE_PY=$(REG_IMAGE_PY)
	$(TOOLS)/bin/python -m glmdeploy_control.image build --profile $(PROFILE) \
	  --wheelhouse $(ARTIFACTS)/wheelhouse/$(REG_IMAGE_WHEELHOUSE.$(PROFILE)) --json $(REPORTS)/image-$(PROFILE).json

# The image run as a node runs it (playbooks/image_smoke.yml renders the container runtime's
# launcher and bin/run with the roles), PROFILE's model mounted read-only, the smoke suite inside.
# IMAGE_SMOKE_THROUGHPUT=0 leaves the throughput check out (make test: the deploys share the CPUs).
IMAGE_SMOKE_PORT ?= 18000
IMAGE_SMOKE_THROUGHPUT ?= 1
image-smoke: image model ## Start PROFILE's image as a node would (model mounted read-only) and pass the smoke suite in it
	$(TOOLS)/bin/python -m glmdeploy_control.image smoke --profile $(PROFILE) --image $(REPORTS)/image-$(PROFILE).json \
	  --model $(MODEL_DIR) --port $(IMAGE_SMOKE_PORT) --reports $(REPORTS) --json $(REPORTS)/image-smoke-$(PROFILE).json \
	  $(if $(filter 0,$(IMAGE_SMOKE_THROUGHPUT)),--no-throughput)

e2e-image: ## make test's image check: make image, then make image-smoke without the throughput check (it runs beside the deploys)
	@$(MAKE) --no-print-directory image-smoke IMAGE_SMOKE_THROUGHPUT=0

# The cpu profile serves the fixture; gpu-cu121 serves pre-staged real weights (see README).
model: $(if $(filter fixture,$(REG_MODEL_SOURCE.$(PROFILE))),fixture) ## The model PROFILE serves on the control node (cpu: the fixture; gpu-cu121: make weights)

weights: PROFILE = $(REG_GPU_PROFILE)
weights: $(REFENV_READY) ## Stage a model revision once: REVISION=<40-hex commit>; from the hub (HF_ENDPOINT=<a hub mirror>), MIRROR=url or FROM=dir
	@test -n "$(REVISION)" || { echo "error: REVISION=<commit> is required (the model repo's 40-hex commit; a branch name moves)"; exit 2; }
	$(REFENV)/bin/python -m glmdeploy_control.weights --revision "$(REVISION)" --dest $(MODEL_DIR) --work $(ARTIFACTS)/staging \
	  $(if $(MIRROR),--mirror $(MIRROR)) $(if $(FROM),--from $(FROM)) $(foreach g,$(INCLUDE),--include '$(g)')

# The playbook prepares the wheelhouse of every profile and Python the nodes need; the fixture
# is always made (seconds; cpu nodes serve it), real weights are staged by `make weights`.
deploy: tools $(REFENV_READY) fixture control-packages ## Deploy to INVENTORY (default: this machine) and run the smoke tests; each node's profile is its own
	$(SERVE_ARTIFACTS) ansible-playbook -i $(INVENTORY) playbooks/site.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)

stage: tools fixture control-packages ## Place the model on INVENTORY's nodes that lack it, from the nodes that hold it (fan-out); starts and switches nothing
	$(SERVE_ARTIFACTS) ansible-playbook -i $(INVENTORY) playbooks/stage.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)

undeploy: tools ## Stop the services and remove the deployment (keeps artifacts/)
	$(RUN_LOCKED) ansible-playbook -i $(INVENTORY) playbooks/undeploy.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)

lb: tools control-packages ## Configure the load balancer (INVENTORY's glmdeploy_lb group) in front of the nodes
	$(SERVE_ARTIFACTS) ansible-playbook -i $(INVENTORY) playbooks/lb.yml $(ANSIBLE_ARGS)

firewall: tools control-packages ## Keep each node's vLLM, UI and exporter ports to the balancer and the monitoring host (nftables; part of make deploy)
	$(SERVE_ARTIFACTS) ansible-playbook -i $(INVENTORY) playbooks/firewall.yml $(ANSIBLE_ARGS)

# The control node's store of user keys (digests); roles/load_balancer's load_balancer_keys_store.
KEYS_STORE := $(ARTIFACTS)/secrets/api-keys.json
keys: tools ## API keys at the balancer: ADD=<name> creates one (shown once), REVOKE=<name> removes one; neither: list with last use
	@$(TOOLS)/bin/python -m glmdeploy_control.keys --store $(KEYS_STORE) --inventory $(INVENTORY) \
	  $(if $(ADD),--add "$(ADD)") $(if $(REVOKE),--revoke "$(REVOKE)") \
	  $(if $(ADD)$(REVOKE),-- $(RUN_LOCKED) ansible-playbook -i $(INVENTORY) playbooks/keys.yml $(ANSIBLE_ARGS))

backup: tools ## What this control node must not lose (secrets, locks, recordings; INVENTORY when not this machine's) in one archive: OUT=<file> (default backup-<date>.tar.gz), mode 0600
	@$(TOOLS)/bin/python -m glmdeploy_control.backup write --out "$(or $(OUT),backup-$(shell date -u +%Y%m%dT%H%M%SZ).tar.gz)" \
	  $(if $(filter-out playbooks/localhost.ini,$(INVENTORY)),--inventory "$(INVENTORY)")

restore: tools ## Take up a backup in this checkout: ARCHIVE=<file>; files that differ are refused unless FORCE=1
	@test -n "$(ARCHIVE)" || { echo "error: ARCHIVE=<the file make backup wrote> is required"; exit 2; }
	@$(TOOLS)/bin/python -m glmdeploy_control.backup restore "$(ARCHIVE)" $(if $(FORCE),--force)

drain: tools ## Take HOST out of the load balancer (in-flight requests finish; it stays drained until undrain)
	@test -n "$(HOST)" || { echo "error: HOST=<inventory name of a node> is required"; exit 2; }
	$(RUN_LOCKED) ansible-playbook -i $(INVENTORY) playbooks/lb.yml -e '{"load_balancer_drain": ["$(HOST)"]}' $(ANSIBLE_ARGS)

undrain: tools ## Put HOST back behind the load balancer
	@test -n "$(HOST)" || { echo "error: HOST=<inventory name of a node> is required"; exit 2; }
	$(RUN_LOCKED) ansible-playbook -i $(INVENTORY) playbooks/lb.yml -e '{"load_balancer_undrain": ["$(HOST)"]}' $(ANSIBLE_ARGS)

rollout: tools $(REFENV_READY) fixture control-packages ## Upgrade the fleet one node at a time out of the balancer (ROLLOUT_SERIAL=1, ROLLOUT_MAX_FAIL=0, ROLLOUT_SOAK=10m: soak each batch's first node); a failing node returns to its previous release
	@rc=0; $(SERVE_ARTIFACTS) ansible-playbook -i $(INVENTORY) playbooks/rollout.yml $(FORCE_PROFILE) \
	  -e rollout_serial=$(ROLLOUT_SERIAL) -e rollout_max_fail_percentage=$(ROLLOUT_MAX_FAIL) -e rollout_soak=$(ROLLOUT_SOAK) \
	  $(ANSIBLE_ARGS) || rc=$$?; \
	  $(MAKE) --no-print-directory releases; exit $$rc

update: tools $(REFENV_READY) fixture control-packages ## Bring the kit's distribution packages to each node's apt lock (after make lock takes the release's updates), one node at a time out of the balancer; a node failing its gate returns to its previous versions and the run stops
	$(SERVE_ARTIFACTS) ansible-playbook -i $(INVENTORY) playbooks/update.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)

rollback: tools ## Return every node (or HOST=node) to its previous release, one at a time out of the balancer
	@rc=0; $(RUN_LOCKED) ansible-playbook -i $(INVENTORY) playbooks/rollback.yml $(FORCE_PROFILE) $(if $(HOST),--limit $(HOST)) $(ANSIBLE_ARGS) || rc=$$?; \
	  $(MAKE) --no-print-directory releases; exit $$rc

releases: tools ## Which release each node of INVENTORY runs, and which it would roll back to
	rm -rf $(REPORTS)/releases
	ansible-playbook -i $(INVENTORY) playbooks/releases.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)
	@$(MAKE) --no-print-directory releases-table

releases-table: ## Print the table of releases per node from reports/releases/ (after make releases)
	@echo "==> releases per node ($(REPORTS)/releases/)"
	@$(TOOLS)/bin/python -m glmdeploy_control.releases $(REPORTS)/releases/*.json

driver: tools control-packages ## Install the pinned NVIDIA driver on INVENTORY's nodes (held; reboots a node only when the driver changed)
	$(SERVE_ARTIFACTS) ansible-playbook -i $(INVENTORY) playbooks/driver.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)

driver-upgrade: tools control-packages ## The driver's upgrade path: install the driver the apt lock carries over another one, hold it, reboot
	$(SERVE_ARTIFACTS) ansible-playbook -i $(INVENTORY) playbooks/driver.yml $(FORCE_PROFILE) -e nvidia_driver_upgrade=true $(ANSIBLE_ARGS)

monitor: tools control-packages ## Apply just the monitoring: the nodes' exporters, the balancer's nginx exporter, Prometheus and Alertmanager on the monitoring host
	$(SERVE_ARTIFACTS) ansible-playbook -i $(INVENTORY) playbooks/monitor.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)

smoke: tools ## Run the smoke suite on every node of INVENTORY; reports land in reports/smoke/
	ansible-playbook -i $(INVENTORY) playbooks/smoke.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)

bench: tools ## Benchmark this node's server (or URL=... MODEL=...): a request-rate sweep with goodput (BENCH=matrix: concurrency levels); JSON + PNG in reports/bench/ (BENCH_ARGS=...)
	$(TOOLS)/bin/python -m glmdeploy.tools.bench $(if $(filter matrix,$(BENCH)),run,sweep) \
	  $(if $(URL),--url $(URL) --model $(MODEL),--node-config $(NODE_CONFIG)) \
	  --json reports/bench/$(if $(filter matrix,$(BENCH)),bench,sweep).json --plots reports/bench $(BENCH_ARGS)

baseline: tools ## Record the throughput baseline of INVENTORY's first node (smoke_tests/baselines/<profile>-<class>.json)
	ansible-playbook -i $(INVENTORY) playbooks/baseline.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)

soak: tools ## A bounded mixed load on every node of INVENTORY for DURATION (default 3m; 72h for GPU nodes), judged against its gates; reports and plots in reports/soak/
	rm -rf $(REPORTS)/soak
	@rc=0; ansible-playbook -i $(INVENTORY) playbooks/soak.yml -e smoke_soak_duration=$(DURATION) \
	  $(FORCE_PROFILE) $(ANSIBLE_ARGS) || rc=$$?; \
	  for report in $(REPORTS)/soak/*/soak.json; do test -f $$report || continue; \
	    $(TOOLS)/bin/python -m glmdeploy.tools.soak plot --json $$report --out $$(dirname $$report); done; exit $$rc

output-lock: tools ## Record the greedy outputs of INVENTORY's first node to the fixed prompt set (smoke_tests/outputs/<model>/<profile>-<class>.json)
	ansible-playbook -i $(INVENTORY) playbooks/output_lock.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS)

verify: tools ## Smoke suite + fingerprint on every node of INVENTORY, then one fleet table; non-zero on any drift
	rm -rf $(REPORTS)/smoke
	@# The fleet table is printed even when a node's smoke suite failed: it names what drifted.
	@rc=0; ansible-playbook -i $(INVENTORY) playbooks/smoke.yml $(FORCE_PROFILE) $(ANSIBLE_ARGS) || rc=$$?; \
	  $(TOOLS)/bin/python -m glmdeploy_control.fleet --reports $(REPORTS)/smoke --root . \
	  --models $(MODELS) --out $(REPORTS) || rc=$$?; exit $$rc

# promtool, from the distribution's Prometheus package (the one the monitoring host installs),
# unpacked beside the tools, not installed: installing the package would start a Prometheus here.
PROMTOOL := $(TOOLS)/prometheus/usr/bin/promtool
$(PROMTOOL): $(TOOLS)/.stamp
	@echo "==> unpacking promtool from the distribution's prometheus package"
	@rm -rf $(TOOLS)/prometheus && mkdir -p $(TOOLS)/prometheus/deb
	@cd $(TOOLS)/prometheus/deb && apt-get download -q prometheus 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
	@dpkg -x $(TOOLS)/prometheus/deb/prometheus_*.deb $(TOOLS)/prometheus && rm -rf $(TOOLS)/prometheus/deb
	@test -x $@ || { echo "ERROR: promtool not found in the prometheus package; fix: check this machine's apt sources (apt-get download prometheus)"; exit 2; }

lint: tools $(PROMTOOL) ## ansible-lint (production profile), yamllint, ruff, mypy --strict on service/, playbook syntax check (every playbook in playbooks/), role README and GPU class tables up to date, the registry's facts written once, the lints' own tests, the alerts' promtool tests
	$(PROMTOOL) check rules roles/monitoring/files/rules/*.yml
	$(PROMTOOL) test rules tests/monitoring/rules.test.yml
	yamllint -s .
	ansible-lint --profile production --strict playbooks roles tests/scenarios
	ansible-playbook -i playbooks/localhost.ini --syntax-check $(shell grep -l '^- ' playbooks/*.yml)
	ruff check service smoke_tests tests constraints roles plugins library module_utils
	$(TOOLS)/bin/mypy --config-file service/pyproject.toml service/glmdeploy service/glmdeploy_control module_utils tests/support/fixture_model
	$(TOOLS)/bin/python tests/lint/role_docs.py --check
	$(TOOLS)/bin/python tests/lint/facts.py
	$(TOOLS)/bin/python tests/lint/single_source.py
	$(TOOLS)/bin/python -m glmdeploy_control.gpu_docs --check
	$(TOOLS)/bin/python -m glmdeploy_control.audit table --check
	$(TOOLS)/bin/python -m pytest -q -p no:cacheprovider tests/lint/test_lints.py
	ruff format --check service smoke_tests tests constraints roles plugins library module_utils

unit: tools $(REFENV_READY) fixture ## Unit tests of service/ and the lock tooling
	$(REFENV)/bin/python -m pytest -q -rs -p no:cacheprovider tests/unit $(PYTEST_ARGS)

# The end-to-end tests come in two parts that share nothing but the control node's caches: this
# machine's node (deployed here under supervisord) and the test hosts (systemd, own network
# namespaces), each with its own REPORTS. make e2e and make test run them side by side.
E2E_PYTEST = $(TOOLS)/bin/python -m pytest -q -rs -p no:cacheprovider --durations=15
E2E_NODE_TESTS  := tests/e2e/test_deploy.py tests/e2e/test_node_lock.py
E2E_HOSTS_TESTS := tests/e2e/test_roles.py tests/e2e/test_fleet.py

e2e: tools ## End-to-end, both parts side by side (e2e-node, e2e-hosts; the hosts' output is printed when both end)
	@mkdir -p reports; rc=0; $(MAKE) --no-print-directory e2e-hosts > reports/e2e-hosts.log 2>&1 & hosts=$$!; \
	  $(MAKE) --no-print-directory e2e-node || rc=$$?; wait $$hosts || rc=1; \
	  echo "==> make e2e-hosts (ran beside e2e-node; reports/e2e-hosts.log)"; cat reports/e2e-hosts.log; exit $$rc

e2e-node: tools ## End-to-end on this machine: real make deploy, API + headless-browser chat, upgrades, broken setups, undeploy
	rm -rf reports/e2e-logs/node
	GLMDEPLOY_E2E_PART=node $(E2E_PYTEST) -m "not drill" $(E2E_NODE_TESTS) $(PYTEST_ARGS)

e2e-hosts: tools ## End-to-end on fresh test hosts: each role alone, then a 2-host mixed fleet with the gpu-cu121 rehearsal
	rm -rf reports/e2e-logs/hosts
	GLMDEPLOY_E2E_PART=hosts REPORTS=reports/hosts $(E2E_PYTEST) -m "not drill" $(E2E_HOSTS_TESTS) $(PYTEST_ARGS)

sizes: tools ## Real sizes (a drill, about 20 min): the model at 12.5 GB on a test host, a store fanned out to 8 hosts on capped links, a cut transfer resumed; figures in bench/sizes/
	rm -rf reports/e2e-logs/sizes
	GLMDEPLOY_E2E_PART=sizes REPORTS=reports/hosts $(E2E_PYTEST) -s tests/e2e/test_sizes.py $(PYTEST_ARGS)

drills: tools ## Fault drills: the fleet tests and drills on 3 test hosts, this machine's drills, then make sizes (~80 min on 2 cores); output in bench/drills/last-run.txt
	rm -rf reports/e2e-logs/drills
	@mkdir -p bench/drills
	set -o pipefail; export GLMDEPLOY_E2E_PART=drills; \
	  { GLMDEPLOY_FLEET_HOSTS=3 REPORTS=reports/hosts $(E2E_PYTEST) tests/e2e/test_fleet.py $(PYTEST_ARGS) && \
	  { $(E2E_PYTEST) -m drill $(E2E_NODE_TESTS) tests/e2e/test_roles.py tests/e2e/test_image.py tests/e2e/test_container_host.py $(PYTEST_ARGS) || [ $$? = 5 ]; } && \
	  { GLMDEPLOY_E2E_PART=sizes REPORTS=reports/hosts $(E2E_PYTEST) tests/e2e/test_sizes.py $(PYTEST_ARGS) || [ $$? = 5 ]; }; } \
	  2>&1 | tee bench/drills/last-run.txt

# What the tests need from the distribution: a headless browser (UI test), libnuma (CPU vLLM),
# zstd (release packs), rsync (model stores: the artifact server and the unit tests), apt-utils and gnupg (the kit's apt repository), debootstrap + systemd-nspawn + iproute2 + ssh (test hosts).
TEST_PACKAGES := chromium fonts-wqy-microhei libnuma1 python3-venv zstd rsync apt-utils gnupg debootstrap systemd-container iproute2 openssh-client podman runc

test-packages: ## Install the distribution packages the tests need (root; nothing happens when all are there)
	@if dpkg -s $(TEST_PACKAGES) >/dev/null 2>&1; then echo "==> test packages present"; \
	elif [ "$$(id -u)" != 0 ]; then echo "ERROR: the tests need these packages: $(TEST_PACKAGES); fix: run make test as root, or apt install them"; exit 2; \
	else echo "==> installing the packages the tests need (about a minute): $(TEST_PACKAGES)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(TEST_PACKAGES) >/dev/null; fi

# The test hosts' golden rootfs is mostly download and unpack: built in the background while
# lint, lock check and unit tests run (the first test host waits on its lock if not done by then).
hosts-prefetch: tools test-packages ## Build the test hosts' Debian rootfs in the background (make test starts it)
	@if [ "$$(id -u)" = 0 ]; then echo "==> building the test-host golden rootfs in the background (reports/golden.log)"; \
	  mkdir -p reports; nohup $(HOSTCTL) golden > reports/golden.log 2>&1 & fi

# The wheelhouses the end-to-end tests deploy (cpu here and on the test hosts, gpu-cu121 on the
# rehearsal host, 3.3 GB) download in the background while lint, lock check and unit tests run;
# a deploy that needs one meanwhile waits for its download (glmdeploy_control.lock holds a lock).
wheels-prefetch: tools ## Download every profile's wheelhouse for NODE_PY in the background (make test starts it)
	@echo "==> downloading the wheelhouses of $(REG_PROFILE_LIST) in the background (reports/wheels-prefetch.log)"
	@mkdir -p reports; nohup sh -c '$(foreach p,$(REG_PROFILE_LIST),$(TOOLS)/bin/python -m glmdeploy_control.lock wheelhouse \
	  --profile $(p) --python $(NODE_PY) --dest $(ARTIFACTS)/wheelhouse/$(REG_WHEELHOUSE.$(p)) --cache "$(WHEEL_CACHE)";)' \
	  > reports/wheels-prefetch.log 2>&1 &

# make test runs its phases, each timed (tests/ci/phases.py): the table at the end says where the
# time went; reports/ci-phases.{txt,json} and a line in bench/ci/runs.jsonl keep it. The first
# phases run one after another (the rootfs and the wheels download in the background meanwhile);
# then three chains side by side: this machine's end-to-end tests; the test hosts' end-to-end
# tests; lint, the lock check and the unit tests. The last two chains' output is kept in
# reports/checks/ and printed once all have ended.
TEST_FIRST  := tools test-packages hosts-prefetch wheels-prefetch test-inputs
TEST_BESIDE := lint lock-check sbom audit unit e2e-image
TEST_HOSTS  := e2e-hosts
TEST_MAIN   := e2e-node
PHASES := $(PYTHON) tests/ci/phases.py
test: ## Everything CI runs: system packages, lint, lock re-resolve check, unit tests, end-to-end deploy (incl. the gpu-cu121 rehearsal), then a table of time per phase
	@$(PHASES) begin
	@rc=0; for phase in $(TEST_FIRST); do \
	  $(PHASES) run $$phase -- $(MAKE) --no-print-directory $$phase || { rc=$$?; echo "==> make test: $$phase failed"; break; }; \
	done; \
	if [ $$rc = 0 ]; then \
	  rm -rf reports/checks && mkdir -p reports/checks; \
	  echo "==> $(TEST_HOSTS) and $(TEST_BESIDE) run beside $(TEST_MAIN) (reports/checks/, printed at the end)"; \
	  for chain in "$(TEST_HOSTS)" "$(TEST_BESIDE)"; do \
	    ( crc=0; for phase in $$chain; do $(PHASES) run --beside $(TEST_MAIN) $$phase -- $(MAKE) --no-print-directory $$phase \
	        > reports/checks/$$phase.log 2>&1 || { crc=1; echo "==> make test: $$phase failed (reports/checks/$$phase.log)"; }; \
	      done; exit $$crc ) & pids="$$pids $$!"; \
	  done; \
	  $(PHASES) run $(TEST_MAIN) -- $(MAKE) --no-print-directory $(TEST_MAIN) || { rc=$$?; echo "==> make test: $(TEST_MAIN) failed"; }; \
	  for pid in $$pids; do wait $$pid || rc=1; done; \
	  for phase in $(TEST_HOSTS) $(TEST_BESIDE); do test -f reports/checks/$$phase.log || continue; \
	    echo "==> make $$phase (ran beside $(TEST_MAIN))"; cat reports/checks/$$phase.log; done; \
	fi; $(PHASES) report; exit $$rc

# The reference stack's wheels (other real versions of packages the cpu lock pins, tokenizers
# 0.19.1 among them): the end-to-end deploy test installs one into a deployed environment, as an
# admin's `pip install` would, and the next deploy must name and repair it.
REFENV_WHEELHOUSE_MADE := $(ARTIFACTS)/wheelhouse/.$(REG_REFENV_WHEELHOUSE).made
$(REFENV_WHEELHOUSE_MADE): $(REFENV_LOCK) $(TOOLS)/.stamp
	$(TOOLS)/bin/python -m glmdeploy_control.lock wheelhouse --profile tokenizer-ref --python $(CONTROL_PY) \
	  --dest $(ARTIFACTS)/wheelhouse/$(REG_REFENV_WHEELHOUSE) --cache "$(WHEEL_CACHE)"
	@touch $@

# What the end-to-end tests and the unit tests both read, made once before they run side by side.
test-inputs: tools $(REFENV_READY) fixture $(REFENV_WHEELHOUSE_MADE)

hosts: tools ## Create N (default 3) fresh systemd test hosts in network namespaces (DEBIAN13=K: the last K run Debian 13); writes their inventory
	$(HOSTCTL) up $(N) --debian13 $(DEBIAN13)

hosts-down: tools ## Destroy every test host
	$(HOSTCTL) down

hosts-status: tools ## List the test hosts
	$(HOSTCTL) status

tokenizer-lock: $(REFENV_READY) model ## Record the tokenizer golden file of PROFILE's model with the pinned reference stack
	$(REFENV)/bin/python -m glmdeploy.model.golden record $(MODEL_DIR) \
	  $(if $(shell grep -qs "\"auto_map\"" $(MODEL_DIR)/config.json && echo yes),--trust-remote-code) --output smoke_tests/golden/$(notdir $(MODEL_DIR)).json

clean: ## Remove tool venvs and reports (keeps downloaded artifacts/)
	rm -rf $(VENVS) reports
