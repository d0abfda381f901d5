# nodevol: `make demo` runs the demo node agent, `make test` runs every test.
# Both install what they need on a fresh Debian machine (system packages when
# run as root, pinned Go tools into ./bin). `make fuzz` fuzzes each target for
# FUZZTIME (default 1m).

GO              ?= go
BIN             := $(CURDIR)/bin
CSI_SANITY_VER  := v5.6.0
STATICCHECK_VER := v0.8.2
GOTESTFLAGS     ?= -race -count=1 -timeout 30m
export PATH     := $(BIN):$(PATH)
export CSI_SANITY := $(BIN)/csi-sanity

.PHONY: kubelet-fork kubelet-fork-src lint-fork test-fork all build test unit fuzz bench bench-compare bench-objects bench-fleet bench-scale demo nodeagent-static lint deps tools clean testenv-bins integration test-kubelet conformance-bins storage-suites-bins conformance-e2e-node conformance-ginkgo conformance-kubelet conformance-agnhost lint-conformance test-conformance test-node-conformance test-storage-suites

all: build

build:
	$(GO) build ./...

# System packages the real-mount tests and the loop driver use, and the
# real node's (package internal/realnode: containerd, runc, the CNI plugins,
# a static busybox for the images, nsenter and ip for a node's network
# namespace). Only root can install them; as non-root the root tests skip
# and say so.
deps:
	@if [ "$$(id -u)" = 0 ]; then \
		missing=""; \
		for c in mkfs.ext4:e2fsprogs resize2fs:e2fsprogs mkfs.xfs:xfsprogs xfs_growfs:xfsprogs losetup:util-linux mount:mount blkid:util-linux \
			nsenter:util-linux ip:iproute2 /usr/bin/containerd:containerd /usr/sbin/runc:runc \
			/usr/lib/cni/loopback:containernetworking-plugins /usr/lib/cni/bridge:containernetworking-plugins curl:curl iptables:iptables; do \
			command -v $${c%%:*} >/dev/null 2>&1 || missing="$$missing $${c##*:}"; \
		done; \
		busybox --list 2>/dev/null | grep -qx sh && ! ldd /bin/busybox >/dev/null 2>&1 || missing="$$missing busybox-static"; \
		if [ -n "$$missing" ]; then \
			echo "installing:$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
		fi; \
		modprobe loop 2>/dev/null || true; \
	else \
		echo "not root: skipping system packages (tests that need root will skip)"; \
	fi

tools: $(BIN)/csi-sanity

# staticcheck 2026.2.2 (v0.8.2), a release that supports Go 1.26.
$(BIN)/staticcheck:
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VER)

$(BIN)/csi-sanity:
	GOBIN=$(BIN) $(GO) install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_SANITY_VER)

test: deps tools testenv-bins lint lint-fork test-conformance
	$(GO) test $(GOTESTFLAGS) ./...
	cd bench/kubelet && $(GO) vet .
	cd bench/kubelet && $(GO) test $(GOTESTFLAGS) .
	$(MAKE) test-fork

# The hand-over of a node between the kubelet and nodevol, both ways, on
# real mounts with the loop driver (bench/kubelet, its own module: the
# kubelet's volume manager v1.37.2 in the test, nodevol as the example
# node agent built from this module, or linked in for the pods with every
# kind of volume). Root only; the tests skip otherwise.
# About 15 s once built; the first build of the test binary takes minutes.
test-kubelet: deps
	cd bench/kubelet && $(GO) vet .
	cd bench/kubelet && $(GO) test $(GOTESTFLAGS) .

# Fast tests only: no root, no real mounts.
unit:
	$(GO) test -short -count=1 ./...

# Native Go fuzzing of everything that parses outside input, one target
# after another for FUZZTIME each (go test fuzzes one package at a time).
# New crashers land in the package's testdata/fuzz/{target}/; plain go test
# (make test, make unit) runs them with the seeds.
FUZZTIME ?= 1m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzValidateName$$' -fuzztime $(FUZZTIME) ./internal/fsutil
	$(GO) test -run '^$$' -fuzz '^FuzzReadJSON$$' -fuzztime $(FUZZTIME) ./internal/fsutil
	$(GO) test -run '^$$' -fuzz '^FuzzLoadVolumeData$$' -fuzztime $(FUZZTIME) ./internal/ondisk
	$(GO) test -run '^$$' -fuzz '^FuzzSaveVolumeData$$' -fuzztime $(FUZZTIME) ./internal/ondisk
	$(GO) test -run '^$$' -fuzz '^FuzzReadRecord$$' -fuzztime $(FUZZTIME) ./internal/ondisk
	$(GO) test -run '^$$' -fuzz '^FuzzPaths$$' -fuzztime $(FUZZTIME) ./internal/ondisk
	$(GO) test -run '^$$' -fuzz '^FuzzValidatePlugin$$' -fuzztime $(FUZZTIME) ./registration
	$(GO) test -run '^$$' -fuzz '^FuzzHighestSupportedVersion$$' -fuzztime $(FUZZTIME) ./registration
	$(GO) test -run '^$$' -fuzz '^FuzzRegister$$' -fuzztime $(FUZZTIME) ./pluginmanager
	$(GO) test -run '^$$' -fuzz '^FuzzResolvePod$$' -fuzztime $(FUZZTIME) ./volumemanager

# Every benchmark but bench-scale's: the workloads W1-W5 and the
# driver-only floor (volumemanager), the loop driver, registration, the CSI
# test kit.
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -timeout 60m $$($(GO) list ./... | grep -v '/bench/scale$$')

# nodevol and the kubelet's volume manager (bench/kubelet, its own module
# requiring k8s.io/kubernetes) on the same workloads, one table with ratios:
# each figure's range over RUNS runs per side. Takes about 11 minutes a run
# (W6, real pods, about 3); PODS, W6_PODS, IDLE_VOLUMES and RUNS shrink it.
# When strace is in PATH (SYSCALLS=false skips it), W1, W6 and the
# driver-only floor also get their file-system system calls per pod, mount
# and unmount, harness included, counted once after the timed runs under
# strace between SYSCALL_PODS pods (default 100,300; a few minutes), and
# under the table each side's own (less the test's removal of what the run
# left and the floor's driver share). Those rows alone, no timed run and no
# quiet machine needed:
#   go run ./bench/compare -only-syscalls
PODS         ?= 10,100,1000,5000,10000
IDLE_VOLUMES ?= 10000
W6_PODS      ?= 100,1000,5000
RUNS         ?= 3
SYSCALL_PODS ?= 100,300
bench-compare:
	$(GO) run ./bench/compare -pods $(PODS) -w6-pods $(W6_PODS) -idle-volumes $(IDLE_VOLUMES) -runs $(RUNS) \
		-syscall-pods $(SYSCALL_PODS) $(if $(SYSCALLS),-syscalls=$(SYSCALLS))

# configMap, secret and projected volumes (issue 26): the stock kubelet
# v1.37.2 (on a fake container runtime) and the example node agent, each a
# process with the node's own certificate against testenv's kube-apiserver,
# on the same PODS pods (default 50): requests per pod at start and per hour
# at rest (the API server's audit log), configMap update to file, RSS per
# pod. Root only. IDLE is the window at rest (default 10m); the whole takes
# about 2*(IDLE+3m), plus a cold build of the kubelet (minutes, kept in
# $$XDG_CACHE_HOME/nodevol-kubelet) the first time. Not part of make test.
OBJECTS_PODS := $(if $(filter command line environment,$(origin PODS)),$(PODS),50)
IDLE         ?= 10m
bench-objects: deps testenv-bins
	cd bench/kubelet && $(GO) test -run '^$$' -v -bench '^BenchmarkPodObjects$$' -benchtime 1x -timeout 90m . \
		-args -objects.pods $(OBJECTS_PODS) -objects.idle $(IDLE)

# A cluster of nodes simulated, as kubemark's hollow nodes (issue 41;
# bench/kubelet's BenchmarkFleet): FLEET_NODES kubelet processes (a
# comma-separated list, one shape each; default 5) of the stock kubelet
# v1.37.2 and, in the next run, of the fork (make kubelet-fork), each its
# own node on the fake container runtime with FLEET_PODS pods (default 30)
# holding every kind of volume it runs there, against one testenv
# kube-apiserver with an audit log: per node the API requests at boot, at
# start, at rest (FLEET_IDLE, default 2m) and under churn, the watches it
# holds, the kubelets' and the API server's CPU and RSS, pod created to
# Running and deleted to gone. FLEET_NODES=1 FLEET_PODS=100,500 is the fork
# as a whole process against the kubelet. RUNS runs a side, the sides
# alternated; each run of a side of a shape is a go test process of its
# own, under flock FLEET_LOCK when set (a lock shared with other heavy
# work: one run a hold). Each run is saved in FLEET_DIR and the summary of
# every run saved there is written to FLEET_DIR/summary.md (remove
# FLEET_DIR to start afresh). FLEET_PROFILE (a duration, default 0: none)
# saves a CPU profile that long of each kubelet from the delete phase's
# start in FLEET_DIR (its /debug/pprof/profile; the kubelets then allow
# anonymous requests). FLEET_CLAIMS=1 (default false) gives each pod a CSI
# claim too: each node runs the loop driver and its registrar as
# processes (a loop device per mounted claim: FLEET_NODES*FLEET_PODS at
# once), each claim a PV of its node's driver created Bound, no attach;
# the summary then has the claim requests (pvc, pv, va, csidriver) in rows
# of their own. FLEET_RUNTIME (default fake) is the nodes'
# container runtime: fake, or containerd for real containers
# (internal/realnode: containerd and runc started per run in its scratch
# directory, a busybox image built here, nothing pulled; one node only,
# FLEET_NODES=1), which adds the runtime's CPU (containerd, its shims and
# their runc) and memory beside the kubelet's. Root only; not yet timed
# (an estimate: 2*RUNS*(FLEET_IDLE+3m) a shape at 5 nodes). Not part of
# make test.
comma       := ,
FLEET_NODES ?= 5
FLEET_PODS  ?= 30
FLEET_IDLE  ?= 2m
FLEET_DIR   ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nodevol-fleet
FLEET_LOCK  ?=
FLEET_PROFILE ?= 0
FLEET_CLAIMS ?= false
FLEET_RUNTIME ?= fake
bench-fleet: deps testenv-bins kubelet-fork
	cd bench/kubelet && for n in $(subst $(comma), ,$(FLEET_NODES)); do for p in $(subst $(comma), ,$(FLEET_PODS)); do \
		for r in $$(seq 0 $$(($(RUNS)-1))); do \
			if [ $$((r % 2)) = 0 ]; then sides="kubelet fork"; else sides="fork kubelet"; fi; \
			for side in $$sides; do \
				$(if $(FLEET_LOCK),flock $(FLEET_LOCK)) $(GO) test -run '^$$' -v -bench '^BenchmarkFleet$$' -benchtime 1x -timeout 120m . \
					-args -fleet.nodes $$n -fleet.pods $$p -fleet.runs $(RUNS) -fleet.run $$r -fleet.side $$side -fleet.idle $(FLEET_IDLE) \
					-fleet.fork $(CURDIR)/bin/kubelet -fleet.dir $(FLEET_DIR) -fleet.out $(FLEET_DIR)/summary.md \
					-fleet.profile $(FLEET_PROFILE) -fleet.claims=$(FLEET_CLAIMS) -fleet.runtime $(FLEET_RUNTIME) || exit 1; \
			done; \
		done; \
	done; done

# The example node agent (its default mode) with its node's certificate
# against testenv's kube-apiserver, with OTHERS other PersistentVolumes and
# bound claims in the cluster (a comma-separated list, one run each;
# default 0,1000): its heap and VmRSS at rest and its API requests
# (bench/scale). Root only. Each run takes about SCALE_SAMPLES*3 minutes,
# plus the creates (100,000 pairs: minutes). Not part of make test.
OTHERS        ?= 0,1000
SCALE_SAMPLES ?= 3
bench-scale: deps testenv-bins
	nice -n 10 $(GO) test -run '^$$' -v -bench '^BenchmarkClusterSize$$' -benchtime 1x -timeout 180m ./bench/scale \
		-args -scale.others $(OTHERS) -scale.samples $(SCALE_SAMPLES)

# The node agent as one static binary, for deploy/Containerfile (FROM scratch).
# grpcnotrace leaves out gRPC's golang.org/x/net/trace, whose html/template
# (reflect's method lookups by name) makes the linker keep every exported
# method of every type: 28 to 17 MB of text, and the pages the agent
# touches with them (docs/perf/2026-11-30-agent-memory.md).
NODEAGENT_TAGS ?= grpcnotrace
nodeagent-static:
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(NODEAGENT_TAGS)' -ldflags='-s -w' -o deploy/nodeagent ./examples/nodeagent

demo: deps build
	$(GO) run ./examples/nodeagent/demo

# The test environment's binaries (package testenv): kube-apiserver and etcd,
# built by testenv/build (its own module, requiring k8s.io/kubernetes) into a
# cache directory keyed by the Kubernetes version, only when missing. A cold
# build takes minutes; once cached, the target does nothing.
TESTENV_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" && $$2 ~ /^v/ { print $$2 }' testenv/build/go.mod)
TESTENV_CACHE   ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nodevol-testenv/$(TESTENV_VERSION)
TESTENV_VERSION_PARTS := $(subst ., ,$(patsubst v%,%,$(TESTENV_VERSION)))
# kube-apiserver reports the version it is given at link time (/version, its
# log); unset, it says v0.0.0-master.
TESTENV_VERSION_PKG := k8s.io/component-base/version
TESTENV_LDFLAGS := -s -w -X $(TESTENV_VERSION_PKG).gitVersion=$(TESTENV_VERSION) \
	-X $(TESTENV_VERSION_PKG).gitMajor=$(word 1,$(TESTENV_VERSION_PARTS)) \
	-X $(TESTENV_VERSION_PKG).gitMinor=$(word 2,$(TESTENV_VERSION_PARTS)) \
	-X $(TESTENV_VERSION_PKG).gitTreeState=clean
export NODEVOL_TESTENV_DIR := $(TESTENV_CACHE)

testenv-bins: $(TESTENV_CACHE)/kube-apiserver $(TESTENV_CACHE)/etcd

$(TESTENV_CACHE)/kube-apiserver:
	@mkdir -p $(@D)
	cd testenv/build && $(GO) build -trimpath -ldflags='$(TESTENV_LDFLAGS)' -o $@.tmp k8s.io/kubernetes/cmd/kube-apiserver
	mv $@.tmp $@

$(TESTENV_CACHE)/etcd:
	@mkdir -p $(@D)
	cd testenv/build && $(GO) build -trimpath -ldflags='$(TESTENV_LDFLAGS)' -o $@.tmp go.etcd.io/etcd/server/v3
	mv $@.tmp $@

# What a run of Kubernetes' node conformance suite needs, built by
# conformance/ (its own module, requiring k8s.io/kubernetes) into a cache
# directory keyed by the Kubernetes version, each only when missing:
# e2e_node.test (the suite, go test -c: -vet=off, else the build vets its
# ~2,700 dependencies), the ginkgo CLI at the version k8s.io/kubernetes
# requires (it runs the suite in parallel), the stock kubelet (with cgo, as
# upstream builds it; the suite runs the binary named kubelet in its own
# directory) and agnhost (static, for the agnhost image, reporting the
# version in its VERSION file). Measured cold, each with an empty build
# cache (modules already downloaded), beside other builds on 2 cores (load
# 4 to 11): e2e_node.test 8.8 minutes wall clock, 12.1 CPU-minutes, 191 MB
# (3.2 GB peak memory); kubelet 10.9 min, 8.2 CPU-min, 92 MB; agnhost 9.2
# min, 5.5 CPU-min, 64 MB; ginkgo 52 s, 41 CPU-s, 18 MB. Once cached, the
# target does nothing. Not part of make test.
CONF_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" && $$2 ~ /^v/ { print $$2 }' conformance/go.mod)
CONF_CACHE   ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nodevol-conformance/$(CONF_VERSION)
CONF_VERSION_PARTS := $(subst ., ,$(patsubst v%,%,$(CONF_VERSION)))
# The suite (its in-process API server) and the kubelet report the version
# they are given at link time, as upstream's builds do.
CONF_LDFLAGS := -s -w -X $(TESTENV_VERSION_PKG).gitVersion=$(CONF_VERSION) \
	-X $(TESTENV_VERSION_PKG).gitMajor=$(word 1,$(CONF_VERSION_PARTS)) \
	-X $(TESTENV_VERSION_PKG).gitMinor=$(word 2,$(CONF_VERSION_PARTS)) \
	-X $(TESTENV_VERSION_PKG).gitTreeState=clean
CONF_AGNHOST := k8s.io/kubernetes/test/images/agnhost
# The suites' busybox image holds busybox built with its default
# configuration, as upstream's does: Debian's busybox-static leaves out
# applets the specs run (nmeter, in every Containers Lifecycle spec; pgrep,
# flock, nohup, ...). The source is Debian's copy of busybox's release,
# checked against its digest; building it takes about 1 min on 2 cores.
CONF_BUSYBOX_SRC    := http://deb.debian.org/debian/pool/main/b/busybox/busybox_1.35.0.orig.tar.bz2
CONF_BUSYBOX_SHA256 := faeeb244c35a348a334f4a59e44626ee870fb07b6884d68c10ae8bc19f83a694

conformance-bins: $(CONF_CACHE)/e2e_node.test $(CONF_CACHE)/ginkgo $(CONF_CACHE)/kubelet $(CONF_CACHE)/agnhost $(CONF_CACHE)/busybox $(CONF_CACHE)/nginx $(CONF_CACHE)/image-files/.done $(CONF_CACHE)/sample-device-plugin
conformance-e2e-node: $(CONF_CACHE)/e2e_node.test
conformance-ginkgo: $(CONF_CACHE)/ginkgo
conformance-kubelet: $(CONF_CACHE)/kubelet
conformance-agnhost: $(CONF_CACHE)/agnhost

$(CONF_CACHE)/e2e_node.test:
	@mkdir -p $(@D)
	cd conformance && $(GO) test -c -vet=off -trimpath -ldflags='$(CONF_LDFLAGS)' -o $@.tmp k8s.io/kubernetes/test/e2e_node
	mv $@.tmp $@

$(CONF_CACHE)/ginkgo:
	@mkdir -p $(@D)
	cd conformance && $(GO) build -trimpath -o $@.tmp github.com/onsi/ginkgo/v2/ginkgo
	mv $@.tmp $@

$(CONF_CACHE)/kubelet:
	@mkdir -p $(@D)
	cd conformance && $(GO) build -trimpath -ldflags='$(CONF_LDFLAGS)' -o $@.tmp k8s.io/kubernetes/cmd/kubelet
	mv $@.tmp $@

$(CONF_CACHE)/agnhost:
	@mkdir -p $(@D)
	cd conformance && v=$$(cat "$$($(GO) list -f '{{.Dir}}' $(CONF_AGNHOST))/VERSION") && test -n "$$v" && \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w -X main.Version=$$v" -o $@.tmp $(CONF_AGNHOST)
	mv $@.tmp $@

# What a run of Kubernetes' cluster storage suites needs beside
# conformance-bins, built the same way from the conformance module into
# the same cache: e2e.test (test/e2e: the [sig-storage] testsuites; go
# test -c, -vet=off), kube-controller-manager and kube-scheduler (the
# one-node cluster's control plane beside testenv's API server) and
# kubectl (the suites write and read volumes through it). Not part of make
# test; build times in docs/STORAGE-SUITES.md.
storage-suites-bins: conformance-bins $(CONF_CACHE)/e2e.test $(CONF_CACHE)/kube-controller-manager $(CONF_CACHE)/kube-scheduler $(CONF_CACHE)/kubectl \
	$(foreach s,$(CSI_SIDECARS),$(CONF_CACHE)/csi/$(word 3,$(subst :, ,$(s)))) $(CONF_CACHE)/csi/hostpathplugin $(CONF_CACHE)/csi/crd/.done

# The kubernetes-csi sidecars the suites' CSI drivers deploy (the versions
# test/e2e/testing-manifests/storage-csi names in v1.37.2), each built from
# its module as the module proxy serves it, in a copy of its directory with
# its own go.mod (their replace directives rule out go install), static:
# module@version:package:binary. A replace that points into the
# repository itself (external-snapshotter's ./client, a module of its own
# not in the sidecar's zip) takes that module at the sidecar's version
# from the proxy. node-driver-registrar and livenessprobe,
# which no module proxy serves, are played by testenv/cmd/csi-standins
# (the runner builds it), csi-driver-host-path's hostpathplugin by
# conformance/cmd/hostpathplugin.
CSI_SIDECARS := \
	github.com/kubernetes-csi/external-provisioner/v6@v6.3.0:./cmd/csi-provisioner:csi-provisioner \
	github.com/kubernetes-csi/external-attacher/v4@v4.12.0:./cmd/csi-attacher:csi-attacher \
	github.com/kubernetes-csi/external-resizer/v2@v2.2.0:./cmd/csi-resizer:csi-resizer \
	github.com/kubernetes-csi/external-snapshotter/v8@v8.6.0:./cmd/csi-snapshotter:csi-snapshotter
define CSI_SIDECAR_RULE
$(CONF_CACHE)/csi/$(word 3,$(subst :, ,$(1))):
	@mkdir -p $$(@D)
	rm -rf $$@.src
	d=$$$$($(GO) mod download -json $(word 1,$(subst :, ,$(1))) | sed -n 's/^\t"Dir": "\(.*\)",$$$$/\1/p') && test -n "$$$$d" && \
		cp -r "$$$$d" $$@.src && chmod -R u+w $$@.src
	cd $$@.src && for m in $$$$(sed -n 's|^replace \([^ ]*\) => \./.*|\1|p' go.mod); do \
		$(GO) mod edit -replace=$$$$m=$$$$m@$(lastword $(subst @, ,$(word 1,$(subst :, ,$(1))))) || exit 1; done
	cd $$@.src && CGO_ENABLED=0 GOFLAGS=-mod=mod $(GO) build -trimpath -ldflags='-s -w' -o $$@.tmp $(word 2,$(subst :, ,$(1)))
	mv $$@.tmp $$@ && rm -rf $$@.src
endef
$(foreach s,$(CSI_SIDECARS),$(eval $(call CSI_SIDECAR_RULE,$(s))))

# The volume snapshot CRDs (cluster/addons/volumesnapshots/crd, as
# local-up-cluster installs them): csi-snapshotter watches them.
$(CONF_CACHE)/csi/crd/.done:
	@mkdir -p $(@D)
	cd conformance && cp "$$($(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes)"/cluster/addons/volumesnapshots/crd/*.yaml $(@D)/
	touch $@

# The hostpathplugin image's program: Kubernetes' own mock CSI driver (and
# the CSI mock specs' proxy), conformance/cmd/hostpathplugin, static.
$(CONF_CACHE)/csi/hostpathplugin: $(wildcard conformance/cmd/hostpathplugin/*.go)
	@mkdir -p $(@D)
	cd conformance && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $@.tmp ./cmd/hostpathplugin
	mv $@.tmp $@

$(CONF_CACHE)/e2e.test:
	@mkdir -p $(@D)
	cd conformance && $(GO) test -c -vet=off -trimpath -ldflags='$(CONF_LDFLAGS)' -o $@.tmp k8s.io/kubernetes/test/e2e
	mv $@.tmp $@

$(CONF_CACHE)/kube-controller-manager $(CONF_CACHE)/kube-scheduler $(CONF_CACHE)/kubectl:
	@mkdir -p $(@D)
	cd conformance && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='$(CONF_LDFLAGS)' -o $@.tmp k8s.io/kubernetes/cmd/$(@F)
	mv $@.tmp $@

# Kubernetes' node conformance suite (e2e_node.test v1.37.2) judging the
# stock kubelet v1.37.2 and the fork, one after the other, on the same real
# node (testenv/cmd/node-conformance: containerd and runc in a network
# namespace of its own, images built here, the kubelet's root
# /var/lib/kubelet, which it refuses to take while in use); then the two
# runs compared spec for spec into docs/conformance/node-$(NODE_SUITE).md
# (conformance-report, which fails when a spec passes on stock and not on
# the fork). NODE_SUITE names the specs: storage (default: every
# [sig-storage] spec and the volume specs of [sig-node]), conformance
# (upstream's node conformance job: every [NodeConformance] spec but the
# slow and serial ones; NODE_PROCS=8 as upstream runs it), conformance-slow
# (the slow and serial rest), disruptive (the kubelet restarted with pods
# running: serial) or eviction (local storage eviction: serial);
# NODE_PROCS the parallel ginkgo processes. Root only. Not part of make
# test; times in docs/NODE-CONFORMANCE.md.
# NODE_SHARD=K/N runs part K of N of the suite (split by the specs' place
# in its source, every spec in one part) into $(NODE_OUT)/part-K-of-N, and
# the table covers every part run so far: a suite longer than a sitting
# runs in parts.
NODE_SUITE ?= storage
NODE_PROCS ?= 4
NODE_OUT   ?= $(CURDIR)/_output/node-conformance/$(NODE_SUITE)
# NODE_RERUN=1 runs again, on each side, only the specs that failed in its
# runs so far (into $(NODE_OUT)/rerun), and the table takes the rerun's
# result for them: after a fix to the node (an image), or for a flake.
NODE_SHARD ?=
NODE_RERUN ?=
# NODE_RUNS(side): a side's reports of the whole suite or its parts.
NODE_RUNS   = $$(ls -d $(NODE_OUT)/$(1).json $(NODE_OUT)/part-*/$(1).json 2>/dev/null | paste -sd, -)
NODE_RUN    = $(BIN)/node-conformance -suite $(NODE_SUITE) -procs $(NODE_PROCS) -bin-dir $(CONF_CACHE) -name $(1) \
	$(if $(NODE_RERUN),-rerun-failed $(call NODE_RUNS,$(1)) -out $(NODE_OUT)/rerun, \
	$(if $(NODE_SHARD),-shard $(NODE_SHARD) -out $(NODE_OUT)/part-$(subst /,-of-,$(NODE_SHARD)),-out $(NODE_OUT)))
# NODE_JSON(side): its runs' reports, and the rerun's last.
NODE_JSON   = $(call NODE_RUNS,$(1))$$(test -e $(NODE_OUT)/rerun/$(1).json && echo ,$(NODE_OUT)/rerun/$(1).json)
test-node-conformance: deps conformance-bins kubelet-fork
	$(GO) build -o $(BIN)/node-conformance ./testenv/cmd/node-conformance
	$(call NODE_RUN,stock) -kubelet $(CONF_CACHE)/kubelet
	$(call NODE_RUN,fork) -kubelet $(BIN)/kubelet
	cd conformance && $(GO) run ./cmd/conformance-report -stock $(call NODE_JSON,stock) -fork $(call NODE_JSON,fork) \
		-reasons e2e_node.reasons -markdown ../docs/conformance/node-$(NODE_SUITE).md -summary $(NODE_OUT)/summary.json

# Kubernetes' cluster storage suites (e2e.test v1.37.2, its [sig-storage]
# testsuites) judging the stock kubelet v1.37.2 and the fork, one after the
# other, each the node of a one-node cluster made on this machine
# (testenv/cmd/storage-suites: testenv's API server, the controller
# manager and scheduler, containerd and runc, in network, mount and PID
# namespaces of its own); then the two runs compared spec for spec into
# docs/conformance/storage-$(STORAGE_SET).md (conformance-report, which
# fails when a spec passes on stock and not on the fork). STORAGE_SET
# names the specs: default (the in-tree drivers that apply to one node, as
# upstream's presubmit storage jobs run them), csi-mock (the CSI mock
# specs: the kubelet's calls to a CSI driver, against Kubernetes' own mock
# driver and the real kubernetes-csi sidecars), csi-hostpath (the
# testsuites against csi-driver-host-path deployed as pods with its
# sidecars), csi-hostpath-slow (its slow and serial specs) or all (the
# in-tree drivers with the slow and serial specs); STORAGE_PROCS the
# parallel ginkgo processes. HOSTPATHPLUGIN names csi-driver-host-path's
# hostpathplugin v1.17.1, which the csi-hostpath sets need: no module
# proxy serves its source, and the project builds none of its code
# (docs/STORAGE-SUITES.md). Root only.
# Not part of make test; times in docs/STORAGE-SUITES.md.
STORAGE_SET   ?= default
STORAGE_PROCS ?= 4
STORAGE_OUT   ?= $(CURDIR)/_output/storage-suites/$(STORAGE_SET)
HOSTPATHPLUGIN ?=
STORAGE_RUN    = $(BIN)/storage-suites -set $(STORAGE_SET) -procs $(STORAGE_PROCS) -bin-dir $(CONF_CACHE) -testenv-dir $(TESTENV_CACHE) -out $(STORAGE_OUT) -name $(1) $(if $(HOSTPATHPLUGIN),-hostpathplugin $(HOSTPATHPLUGIN))
test-storage-suites: deps storage-suites-bins testenv-bins kubelet-fork
	$(GO) build -o $(BIN)/storage-suites ./testenv/cmd/storage-suites
	$(call STORAGE_RUN,stock) -kubelet $(CONF_CACHE)/kubelet
	$(call STORAGE_RUN,fork) -kubelet $(BIN)/kubelet
	cd conformance && $(GO) run ./cmd/conformance-report -stock $(STORAGE_OUT)/stock.json -fork $(STORAGE_OUT)/fork.json \
		-reasons e2e.reasons -markdown ../docs/conformance/storage-$(STORAGE_SET).md -summary $(STORAGE_OUT)/summary.json

# What the suite's other images hold beside a binary, from their source
# (test/images): the porter's certificate and key in agnhost, kitten's and
# nautilus's pictures and data, and nonewprivs' nnp (static).
CONF_IMAGES := k8s.io/kubernetes/test/images
$(CONF_CACHE)/busybox:
	@mkdir -p $(@D)
	rm -rf $@.src && mkdir $@.src
	curl -sSfL -o $@.src/src.tar.bz2 $(CONF_BUSYBOX_SRC)
	echo "$(CONF_BUSYBOX_SHA256)  $@.src/src.tar.bz2" | sha256sum -c --quiet
	tar -xjf $@.src/src.tar.bz2 -C $@.src --strip-components=1
	$(MAKE) -C $@.src -s defconfig >$@.src/build.log
	sed -i 's/^# CONFIG_STATIC is not set$$/CONFIG_STATIC=y/' $@.src/.config && grep -qx CONFIG_STATIC=y $@.src/.config
	$(MAKE) -C $@.src -s -j$$(nproc) busybox >$@.src/build.log 2>&1 || { tail -50 $@.src/build.log; exit 1; }
	mv $@.src/busybox $@ && rm -rf $@.src

# The nginx image's nginx: Debian's, from its package, not installed (no
# service started); its libraries are this machine's.
$(CONF_CACHE)/nginx:
	@mkdir -p $(@D)
	rm -rf $@.deb && mkdir $@.deb
	cd $@.deb && apt-get download -qq nginx
	dpkg -x $@.deb/nginx_*.deb $@.deb/x
	mv $@.deb/x/usr/sbin/nginx $@ && rm -rf $@.deb

# The device plugin specs' sample plugin (static; about 30 s warm).
$(CONF_CACHE)/sample-device-plugin:
	@mkdir -p $(@D)
	cd conformance && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $@.tmp $(CONF_IMAGES)/sample-device-plugin
	mv $@.tmp $@

$(CONF_CACHE)/image-files/.done:
	@mkdir -p $(@D)/kitten $(@D)/nautilus
	cd conformance && d=$$($(GO) list -f '{{.Dir}}' $(CONF_AGNHOST)/porter) && cp "$$d/localhost.crt" "$$d/localhost.key" $(@D)/
	cd conformance && d=$$($(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images && \
		cp "$$d/kitten/html/kitten.jpg" "$$d/kitten/html/data.json" $(@D)/kitten/ && \
		cp "$$d/nautilus/html/nautilus.jpg" "$$d/nautilus/html/data.json" $(@D)/nautilus/
	cd conformance && CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(@D)/nnp $(CONF_IMAGES)/nonewprivs
	touch $@

# go mod tidy, go vet and staticcheck over the conformance module (make
# lint's gofmt covers its files already), and its tests: the report tool's
# and the check that the module keeps what e2e_node.test needs. Neither
# builds the binaries above; make test runs both.
lint-conformance: $(BIN)/staticcheck
	cd conformance && $(GO) mod tidy -diff
	cd conformance && $(GO) vet ./...
	cd conformance && $(BIN)/staticcheck ./...

test-conformance: lint-conformance
	cd conformance && $(GO) test -count=1 ./...

# The integration tests against a real kube-apiserver and etcd (make test runs
# them too, with everything else).
integration: deps tools testenv-bins
	$(GO) test $(GOTESTFLAGS) ./testenv/
	$(GO) test $(GOTESTFLAGS) -run '^TestIntegration' ./volumemanager/ ./examples/nodeagent/...

# gofmt, go mod tidy, go vet and staticcheck over the module; part of make
# test (about 10 s warm, 30-40 s with staticcheck's cache empty, on 2 cores).
lint: $(BIN)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(BIN)/staticcheck ./...

clean:
	rm -rf $(BIN)

# The kubelet fork (kubeletfork/, its own module): the kubelet v1.37.2's
# source from the module proxy, with kubeletfork/patches applied, in
# kubeletfork/_kubernetes (not in git; remade when a patch changes), and
# the kubelet binary built from it with nodevol as its volume manager.
FORK_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" && $$2 ~ /^v/ { print $$2 }' kubeletfork/go.mod)
FORK_SRC     := kubeletfork/_kubernetes
FORK_PATCHES := $(sort $(wildcard kubeletfork/patches/*.patch))
FORK_VERSION_PARTS := $(subst ., ,$(patsubst v%,%,$(FORK_VERSION)))
FORK_LDFLAGS := -s -w -X $(TESTENV_VERSION_PKG).gitVersion=$(FORK_VERSION)-nodevol \
	-X $(TESTENV_VERSION_PKG).gitMajor=$(word 1,$(FORK_VERSION_PARTS)) \
	-X $(TESTENV_VERSION_PKG).gitMinor=$(word 2,$(FORK_VERSION_PARTS)) \
	-X $(TESTENV_VERSION_PKG).gitTreeState=clean

kubelet-fork-src: $(FORK_SRC)/.patched

$(FORK_SRC)/.patched: $(FORK_PATCHES) kubeletfork/go.mod
	rm -rf $(FORK_SRC) $(FORK_SRC).tmp
	dir=$$(cd / && GOFLAGS=-mod=mod $(GO) mod download -json k8s.io/kubernetes@$(FORK_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
		test -n "$$dir" && cp -R "$$dir" $(FORK_SRC).tmp
	chmod -R u+w $(FORK_SRC).tmp
	for p in $(FORK_PATCHES); do patch -d $(FORK_SRC).tmp -p1 --forward --no-backup-if-mismatch < $$p || exit 1; done
	touch $(FORK_SRC).tmp/.patched
	mv $(FORK_SRC).tmp $(FORK_SRC)

kubelet-fork: $(BIN)/kubelet

# go mod tidy, go vet and staticcheck over the fork's module (make lint's
# gofmt covers its files already).
lint-fork: kubelet-fork-src $(BIN)/staticcheck
	cd kubeletfork && $(GO) mod tidy -diff
	cd kubeletfork && $(GO) vet ./...
	cd kubeletfork && $(BIN)/staticcheck ./...

# The fork links nodevol (kubeletfork/go.mod replaces it with this tree):
# a change to the library rebuilds it too.
$(BIN)/kubelet: kubelet-fork-src $(shell git ls-files go.mod go.sum '*.go' ':!:*_test.go' ':!:bench/*' ':!:conformance/*' ':!:examples/*' ':!:testenv/*') kubeletfork/go.mod kubeletfork/go.sum
	cd kubeletfork && $(GO) build -trimpath -ldflags='$(FORK_LDFLAGS)' -o $(BIN)/kubelet ./cmd/kubelet

# The kubelet fork's tests: the adapter's unit tests, and two end-to-end
# tests (root only; they skip otherwise and under -short): the fork built
# from this tree as a node's kubelet against testenv's kube-apiserver, with
# the node's own certificate, the loop driver and the registrar
# registering through its plugins_registry. On the fake container runtime,
# pods with a CSI claim, an inline CSI volume, configMap, secret, emptyDir
# and kube-api-access volumes run, are deleted, and survive a restart of
# the fork with their mounts (about 25 s warm). On real containers
# (containerd and runc, internal/realnode), containers read every kind of
# volume and a subPath of each, write, see a configMap update and their
# token rotated, run on through a SIGKILL of the fork, and leave nothing
# (about 10 minutes, most of it waiting for the token's rotation at 80% of
# the 10 minutes the API server allows at least).
test-fork: deps testenv-bins kubelet-fork
	cd kubeletfork && $(GO) vet ./...
	cd kubeletfork && $(GO) test $(GOTESTFLAGS) ./...
