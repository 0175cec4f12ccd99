# dynamig — `make demo` and `make test` are all a fresh clone needs (Go and gcc).
SHELL := /usr/bin/env bash
GO ?= go
# go-nvml is cgo; its header marks calls deprecated that we do not use.
export CGO_ENABLED := 1
export CGO_CFLAGS := -Wno-deprecated-declarations

BIN := bin

# The Kubernetes matrix (k8s/versions.txt, the one place that lists the minors). K8S picks the
# minor to build and test: `make build K8S=1.36`; the default is the newest supported. The base
# minor builds with go.mod, every other with its k8s/<minor>/go.mod (`go -modfile`), passed to
# every go command, and the tests' own, through GOFLAGS.
k8s_column = $(shell awk '!/^\#/ && NF && $$3 ~ /$(2)/ {print $$$(1)}' k8s/versions.txt)
K8S_SUPPORTED := $(call k8s_column,1,supported)
K8S_PREVIEW := $(call k8s_column,1,preview)
K8S_BASE := $(firstword $(K8S_SUPPORTED))
K8S_NEWEST := $(lastword $(K8S_SUPPORTED))
K8S ?= $(K8S_NEWEST)
ifeq ($(filter $(K8S),$(K8S_SUPPORTED) $(K8S_PREVIEW)),)
$(error K8S=$(K8S) is not in k8s/versions.txt: supported $(K8S_SUPPORTED), preview $(K8S_PREVIEW))
endif
K8S_RELEASE := $(shell awk '$$1 == "$(K8S)" {print $$2}' k8s/versions.txt)
MODFILE := $(abspath $(if $(filter $(K8S),$(K8S_BASE)),go.mod,k8s/$(K8S)/go.mod))
export GOFLAGS := $(strip $(filter-out -modfile=%,$(GOFLAGS)) -modfile=$(MODFILE))
# A minor whose module file needs a newer Go than this one builds with that release, which the
# go command fetches from the module proxy (1.38 needs Go 1.27).
K8S_GO := $(shell awk '/^go /{print $$2}' $(MODFILE))
ifneq ($(shell printf '%s\n' $(K8S_GO) $$($(GO) env GOVERSION | sed 's/^go//') | sort -V | tail -1),$(shell $(GO) env GOVERSION | sed 's/^go//'))
export GOTOOLCHAIN := go$(K8S_GO)
endif
# Flags of every go test here: test binaries without DWARF (-w), which nothing reads (stack
# traces use the symbol table), link in about 60 % of the CPU time: a 160 MB sandbox suite in 15
# s instead of 23-31 s, and make test links over a hundred test binaries. Without go test's own
# vet (-vet=off): lint's go vet ./... runs every analyzer on every package of the newest minor,
# and go test's would vet each package's whole dependency graph again for its facts, per minor
# and per build mode (race): +23 % CPU on a cold test build of ./deviceplugin/... ./webhook/...
# (574 CPU-seconds instead of 465). The few per-minor files (build tags) are compiled by their
# minor's suite.
TESTFLAGS := -ldflags=-w -vet=off
# The go command, the compiler and the tests collect garbage at 4x the live heap instead of 2x
# (GOGC=400), within GOMEMLIMIT: a cold test build of RACE_PKGS took 6.4 % less CPU (703
# CPU-seconds instead of 751), at 1.3 GB peak for one process.
export GOGC ?= 400
export GOMEMLIMIT ?= 4GiB
# How many inputs each fuzz target tries in `make test`: a smoke run of every decoder's
# fuzz target, about 1 CPU-minute of make test's at 30000x (6.6 measured at 200000x);
# `make fuzz FUZZSCALE=50` fuzzes longer.
# An execution count, not a duration: a duration-based -fuzztime can fail a clean run with
# "context deadline exceeded" at its end (go.dev/issue/75804, fixed in Go 1.27).
FUZZTIME ?= 30000x
# Packages with concurrency run under the race detector: every package with goroutines but
# the suites that run whole sandbox clusters (test/...), whose race build of the API server
# and run under it do not fit make test's time (docs/reliability.md).
RACE_PKGS := ./nvml/... ./plugins/... ./deviceplugin/... ./webhook/... ./signing/... ./metricsserver/... ./cmd/dynamig-device-plugin/... ./cmd/dynamig-webhook/...
# package:FuzzTarget[:count] entries, one decoder of external input each; count, when given,
# replaces FUZZTIME for a slow target (a count of FUZZTIME's scale: `make fuzz` multiplies).
FUZZ_TARGETS := \
	./api:FuzzDecodeInventory \
	./api:FuzzDecodeMigReservations \
	./api:FuzzDecodeHAMiCoreDevices \
	./api:FuzzParseSignature \
	./config:FuzzParseDeviceConfig \
	./config:FuzzParseNodeConfig \
	./config:FuzzDecodeDynamicMIGArgs:6000x \
	./config:FuzzDynamicMIGArgsOf \
	./deviceplugin/podresources:FuzzOwner \
	./deviceplugin/runtimecdi:FuzzJudge \
	./test/sandbox/sandboxconfig:FuzzParseConfig:15000x \
	./plugins/dynamicmig/request:FuzzParsePod \
	./deviceplugin/checkpoint:FuzzDecode \
	./nvml/sim:FuzzParseGPUList \
	./nvml/sim:FuzzRestore:6000x \
	./webhook/mutation:FuzzDecide

.PHONY: all build kubelet test test-minors test-previews minors-run test-minor test-kubelet test-preview modfiles print-k8s unit race fuzz soak lint demo clean manifests images bench-allocator bench-packing bench-throughput bench-throughput-quick bench-throughput-extender bench-throughput-sampled bench-throughput-floor bench-throughput-rounds bench-throughput-batching-off bench-burst kubectl

all: build

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
# Stamped into every binary's --version (package version).
LDFLAGS := -X github.com/dynamig/dynamig/version.version=$(VERSION) -X github.com/dynamig/dynamig/version.commit=$(COMMIT)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# Everything: lint, which compiles every package of the newest minor, then two lanes at once
# sharing the build cache: the newest minor's unit, race and fuzz, then the preview minors'
# tests (test-previews), and the suite of every other supported minor (test-minors, its lines
# marked [other minors]). On 2 cores the sandbox suites mostly wait on timers and the other
# lane's compiles fill the CPU; the previews close the newest lane, which ends first without
# them (docs/architecture.md, "The Kubernetes matrix"); each lane's result and time is printed
# last.
# make test compiles without inlining (-gcflags=all=-l, through GOFLAGS, so that lint, the
# kubelets, the race and fuzz builds and the binaries tests build share one build cache): a
# cold build of k8s.io/kubernetes/pkg/scheduler took 490 CPU-seconds instead of 576 (-15 %),
# and make test compiles about 100 of its 120 cold CPU-minutes. Nothing here measures speed.
test: GOFLAGS += -gcflags=all=-l
test: lint
	@set -o pipefail; start=$$(date +%s); \
	( $(MAKE) --no-print-directory test-minors 2>&1 | sed -u 's/^/[other minors] /' ) & minors=$$!; \
	if $(MAKE) --no-print-directory unit race fuzz test-previews; then newest=ok; else newest=FAILED; fi; \
	newest="$$newest in $$(( $$(date +%s) - start )) s"; \
	if wait $$minors; then others=ok; else others=FAILED; fi; \
	others="$$others in $$(( $$(date +%s) - start )) s"; \
	echo "make test: Kubernetes $(K8S) (unit, race, fuzz) and the previews $(K8S_PREVIEW): $$newest; other minors: $$others"; \
	[[ $$newest == ok* && $$others == ok* ]]

# The real kubelet of the minor (its module file's tool k8s.io/kubernetes/cmd/kubelet), which
# the test nodes run (test/kubeletnode); tests find it through DYNAMIG_KUBELET. The version
# stamp is test/kubeletnode's (ldFlags).
KUBELET := $(BIN)/kubelet-$(K8S)
export DYNAMIG_KUBELET := $(abspath $(KUBELET))
kubelet: $(KUBELET)
$(KUBELET): $(MODFILE) $(MODFILE:.mod=.sum)
	$(GO) build -ldflags "-w -X k8s.io/component-base/version.gitVersion=$(K8S_RELEASE) -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(K8S)))" -o $@ k8s.io/kubernetes/cmd/kubelet

# Every package but RACE_PKGS, which race runs: each package's tests run once.
unit: $(KUBELET)
	$(GO) test $(TESTFLAGS) -count=1 -timeout 30m $$($(GO) list ./... | grep -vxF -f <($(GO) list $(RACE_PKGS)))

race: $(KUBELET)
	$(GO) test $(TESTFLAGS) -count=1 -race $(RACE_PKGS)

# Each other supported minor of the matrix on its own module file and kubelet (test-minor),
# or each preview minor (test-preview); then a line per minor with its result.
test-minors:
	@$(MAKE) --no-print-directory minors-run TARGET=test-minor MINORS="$(filter-out $(K8S),$(K8S_SUPPORTED))"
test-previews:
	@$(MAKE) --no-print-directory minors-run TARGET=test-preview MINORS="$(K8S_PREVIEW)"
minors-run:
	@results=; failed=; \
	for m in $(MINORS); do \
		start=$$(date +%s); \
		if $(MAKE) --no-print-directory K8S=$$m $(TARGET); then r=ok; else r=FAILED; failed=1; fi; \
		results="$$results  Kubernetes $$m ($(TARGET)): $$r in $$(( $$(date +%s) - start )) s\n"; \
	done; \
	printf "Kubernetes minors besides $(K8S) ($(TARGET)):\n$$results"; [ -z "$$failed" ]

# One minor's suite: the DynamicMIG plugin's framework-level tests, the scheduler app's, the
# integration suite (a DRA node beside a dynamig node included) and the end-to-end subset (the
# seed example through the webhook, a kubelet and a device-plugin restart with pods running,
# preemption) on its real kube-apiserver, dynamig-scheduler and kubelet, every component built
# on this minor but kubectl dynamig, a client shipped once, built on the newest minor; then the
# device plugin as shipped (built on the newest minor) on this minor's real kubelet
# (test-kubelet).
MINOR_PKGS := ./plugins/dynamicmig/... ./cmd/dynamig-scheduler/... ./test/integration/...
MINOR_E2E := ^(TestSeedExample|TestNodeRestarts|TestPreemption)$$/^(install.yaml|device_plugin|kubelet)$$
test-minor: $(KUBELET)
	$(GO) test $(TESTFLAGS) -count=1 -timeout 30m $(MINOR_PKGS)
	$(MAKE) --no-print-directory K8S=$(K8S_NEWEST) $(BIN)/kubectl-dynamig
	DYNAMIG_KUBECTL_DYNAMIG=$(abspath $(BIN)/kubectl-dynamig) $(GO) test $(TESTFLAGS) -count=1 -timeout 30m -run '$(MINOR_E2E)' ./test/e2e/
	$(MAKE) --no-print-directory K8S=$(K8S_NEWEST) DYNAMIG_KUBELET=$(abspath $(KUBELET)) test-kubelet

# kubectl dynamig alone (make build builds it with the rest).
.PHONY: $(BIN)/kubectl-dynamig
$(BIN)/kubectl-dynamig:
	$(GO) build -ldflags "$(LDFLAGS)" -o $@ ./cmd/kubectl-dynamig

# The device plugin on the kubelet DYNAMIG_KUBELET names (test/kubeletnode).
test-kubelet:
	$(GO) test $(TESTFLAGS) -count=1 -timeout 30m ./test/kubeletnode/...

# A preview (pre-release) minor: the plugin's framework-level tests.
test-preview:
	$(GO) test $(TESTFLAGS) -count=1 -timeout 30m ./plugins/dynamicmig/...

# Each fuzz target for a bounded count; `make fuzz FUZZSCALE=50` runs each 50 times longer.
FUZZSCALE ?= 1
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		IFS=: read -r pkg fn count <<< "$$t"; count=$${count:-$(FUZZTIME)}; \
		count=$$(( $${count%x} * $(FUZZSCALE) ))x; \
		echo "fuzz $$fn ($$pkg), $$count executions"; \
		$(GO) test $(TESTFLAGS) -run='^$$' -fuzz="^$$fn$$" -fuzztime=$$count $$pkg; \
	done

# go vet's analyzers on this module's packages (hack/vet: the dependencies' facts are not
# computed, 260 of 390 CPU-seconds of vetting the newest minor's graph).
NO_KUBERNETES_PKGS := ./api/... ./config/... ./nvml/... ./signing/... ./metricsserver/... ./manifests/... ./version/... ./inspect/... ./plugins/dynamicmig/placement/... ./plugins/dynamicmig/quota/... ./plugins/dynamicmig/request/... ./webhook/... ./cmd/dynamig-webhook/... ./images/...
# It first says how much disk the build cache, the module cache and temporary files have
# (make test's first step): a cold make test writes about 16 GB (build cache 12, modules 3,
# the go command's temporary copies of what it compiles up to 4).
lint:
	@for d in "$$($(GO) env GOCACHE)" "$$($(GO) env GOMODCACHE)" "$${TMPDIR:-/tmp}"; do \
		p=$$d; while [ ! -e "$$p" ]; do p=$$(dirname "$$p"); done; \
		echo "disk: $$(df -h --output=avail "$$p" | tail -1 | tr -d ' ') free for $$d"; done
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) build -o $(BIN)/vet ./hack/vet
	$(GO) vet -vettool=$(abspath $(BIN)/vet) ./...
	@# api, config, nvml, the allocator and the webhook must not link k8s.io/kubernetes
	@# (docs/architecture.md): one go list of them all, with their tests' dependencies.
	@out=$$($(GO) list -test -f '{{.ImportPath}}{{range .Deps}} {{.}}{{end}}' $(NO_KUBERNETES_PKGS) | awk '/ k8s.io\/kubernetes\// {print $$1}'); \
	if [ -n "$$out" ]; then echo "links k8s.io/kubernetes:"; echo "$$out"; exit 1; fi

# The randomized soak at length: pods of mixed profiles, pools and layouts created and
# deleted across 10 simulated nodes for 20 minutes while faults fire at random (fixed
# seed), the invariants checked throughout; its figures go to docs/reliability-soak.txt.
# `make test` runs a 75-second one (test/faults TestSoak).
SOAK_DURATION ?= 20m
SOAK_SEED ?= 1
soak: $(KUBELET)
	$(GO) test $(TESTFLAGS) -count=1 -timeout 90m -run '^TestSoak$$' ./test/faults -args -soak.duration=$(SOAK_DURATION) -soak.seed=$(SOAK_SEED) -soak.plugin-stops -soak.report=$(abspath docs/reliability-soak.txt)

# The in-process sandbox (etcd, kube-apiserver, dynamig-scheduler, simulated GPU nodes with
# the real device plugin): apply examples/, wait until both pods run with realised MIG
# reservations, print them and the A100's occupancy, stop. Needs only Go and gcc.
demo: $(KUBELET)
	$(GO) build -o $(BIN)/dynamig-sandbox ./cmd/dynamig-sandbox
	$(BIN)/dynamig-sandbox demo --examples examples --install manifests/install.yaml

# The three images (images/*/Dockerfile) with docker, podman or buildah; says so where none is.
images:
	VERSION=$(VERSION) COMMIT=$(COMMIT) hack/images.sh

# k8s/<minor>/go.mod and go.sum of every minor of k8s/versions.txt but the base, from go.mod.
modfiles:
	GOFLAGS= $(GO) run ./hack/modfiles

# manifests/install.yaml and manifests/scheduler-config.yaml, rendered from the Helm chart
# manifests/charts/dynamig (a test fails when they drift from it).
manifests:
	$(GO) run ./hack/render-manifests

# kubectl from the pinned Kubernetes modules (cmd/kubectl), to drive the sandbox by hand.
kubectl:
	$(GO) build -o $(BIN)/ ./cmd/kubectl

# Allocator benchmarks, written to docs/benchmarks/allocator.md with the command and machine.
bench-allocator:
	hack/bench-allocator.sh

# Placement-quality benchmark (inflation fill, queueing replay with its relocation variant,
# static fill vs optimal, drop-on-arrival replay), written to docs/benchmarks/packing.md and
# packing.svg; about 16 minutes on 2 cores.
bench-packing:
	$(GO) run ./test/bench/packing/cmd -out docs/benchmarks

# Benchmarks that time the control plane run it with the Go runtime's defaults, as its
# components run in a cluster, not with make test's collector settings (GOGC, GOMEMLIMIT
# above): with them a throughput run held about twice the memory (peak RSS of a 100-node
# scenario 1450–2115 MiB, against 701–840 MiB with the defaults). A report's command names
# the runtime variables it ran with (test/bench/machine).
TIMED := env -u GOGC -u GOMEMLIMIT

# Scheduling throughput of the real dynamig-scheduler against the in-process API server
# (default plugins vs DynamicMIG, GPU and CPU pods) at 100, 500 and 1000 nodes with 5000
# pods, three rounds at QPS 5000, written to docs/benchmarks/throughput.md: about 40 minutes
# on 2 cores.
bench-throughput:
	$(TIMED) $(GO) run ./test/bench/throughput/cmd -out docs/benchmarks

# The same allocator behind a kube-scheduler HTTP extender (HAMi's architecture) against
# the in-process plugin, 1000 nodes, QPS 5000, written to docs/benchmarks/extender/.
bench-throughput-extender:
	$(TIMED) $(GO) run ./test/bench/throughput/cmd -out docs/benchmarks/extender -nodes 1000 -qps 5000/5000 -scenarios a,e,b -cpuprofile ''

# (a), (g) and (b) with kube-scheduler examining 100 nodes per pod (percentageOfNodesToScore
# 10), 500 and 1000 nodes, QPS 5000, written to docs/benchmarks/sampled/ (~5 minutes).
bench-throughput-sampled:
	$(TIMED) $(GO) run ./test/bench/throughput/cmd -out docs/benchmarks/sampled -nodes 500,1000 -qps 5000/5000 -scenarios a,g,b -cpuprofile '' -percentage-of-nodes-to-score 10

# The floor: (a) and (b) beside (h) and (i), no scheduler (the harness binds CPU and GPU pods,
# deciding nothing), 100 and 500 nodes, QPS 5000, 7 rounds, with each pod's CPU cost,
# written to docs/benchmarks/floor/ (~17 minutes).
bench-throughput-floor:
	$(TIMED) $(GO) run ./test/bench/throughput/cmd -out docs/benchmarks/floor -nodes 100,500 -qps 5000/5000 -rounds 7 -scenarios a,h,i,b -cpuprofile '' -mixed ''

# (a) and (b) alone, 100 and 500 nodes, QPS 5000, 11 rounds, written to docs/benchmarks/rounds/:
# the ratio where it is near 1.0, with its noise (~16 minutes).
bench-throughput-rounds:
	$(TIMED) $(GO) run ./test/bench/throughput/cmd -out docs/benchmarks/rounds -nodes 100,500 -qps 5000/5000 -rounds 11 -scenarios a,b -cpuprofile '' -mixed ''

# (a) and (b) beside (j), (b) with kube-scheduler's batching off, 100 and 500 nodes, QPS 5000,
# 5 rounds, written to docs/benchmarks/batching-off/ (~11 minutes).
bench-throughput-batching-off:
	$(TIMED) $(GO) run ./test/bench/throughput/cmd -out docs/benchmarks/batching-off -nodes 100,500 -qps 5000/5000 -rounds 5 -scenarios a,b,j -cpuprofile '' -mixed ''

# A burst of 56 one-slice pods at one node of 8 A100-40GB on the whole sandbox, NVML taking
# 1.5 s per GPU-instance create, three runs, written to docs/benchmarks/burst.md (~3 minutes).
bench-burst: $(KUBELET)
	$(TIMED) $(GO) run ./test/bench/burst/cmd -out docs/benchmarks

# The same at 100 nodes and 1000 pods (about 3 minutes), written to /tmp/dynamig-throughput.
bench-throughput-quick:
	$(TIMED) $(GO) run ./test/bench/throughput/cmd -out /tmp/dynamig-throughput -nodes 100 -pods 1000

clean:
	rm -rf $(BIN)

print-k8s:
	@echo "K8S=$(K8S) release=$(K8S_RELEASE) GOFLAGS=$(GOFLAGS) GOTOOLCHAIN=$(GOTOOLCHAIN) kubelet=$(DYNAMIG_KUBELET)"
