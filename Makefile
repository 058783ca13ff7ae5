# kvindex: every target works on a fresh clone; tools it needs are installed by it.
GO          ?= go
GOBIN       := $(shell $(GO) env GOPATH)/bin
STATICCHECK := $(GOBIN)/staticcheck
STATICCHECK_VERSION := v0.8.2
# The gRPC code generators, pinned: protoc-gen-go is google.golang.org/protobuf's (the
# version go.mod requires), protoc-gen-go-grpc grpc-go's. protoc is Debian's.
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
# nats-server, for the tests of fabric, server and the CLI (internal/natstest runs it as a
# child process; TestMakefilePinsVersion checks this equals natstest.Version).
NATS_SERVER_VERSION := v2.15.2
NATS_SERVER := $(GOBIN)/nats-server
PROTOC_GEN_GO      := $(GOBIN)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(GOBIN)/protoc-gen-go-grpc
PROTO       := api/kvindexv1/kvindex.proto
SHARED      ?= ../shared
# FUZZTIME, when set (30s, 100000x), is every fuzz target's budget; unset, each target
# runs a fixed number of executions (about 5 s each on a 2-core machine). Counts, not
# durations: Go 1.26's fuzz coordinator can fail a target with a spurious "context
# deadline exceeded" when a duration budget expires mid-execution (golang/go#75804,
# fixed in Go 1.27), and a count has no deadline to race.
FUZZTIME    ?=
fuzzbudget   = $(if $(FUZZTIME),$(FUZZTIME),$(1))

.PHONY: index plain-pkgs plain-index checks tools race-deps race-pkgs race-invariants plain test-phases build386-all cross-all fuzz-long docs docs-check shared-note soak test test-long unit race lint fmt fmt-check vet staticcheck build386 conformance fuzz stress bench bench-peers demo tidy-check publisher-deps loadtest loadgen proto proto-deps proto-check

## test: everything CI runs: lint, every package's tests once (the concurrent ones under
## the race detector, the index's with its invariants checked too, the sequential ones
## without it), conformance replays, every fuzz target's seed corpus, the docs check.
## The tools are installed first, one at a time (apt-get holds a lock; `make tools` says
## what each is for); then the phases run TEST_JOBS at a time (default 4), in an order
## that lets no two go commands compile the same packages at once (they do not share
## work in flight): race-deps and checks (lint without staticcheck) first; race-pkgs and
## index (race-invariants, then plain-index) after race-deps (both reuse what it built for
## the detector); plain-pkgs, staticcheck, docs-check and conformance after checks
## (whose go vet has compiled every package without the detector). Each phase runs
## through scripts/phase.sh: a line when it starts, a line a minute while it runs, its
## whole output when it ends, then its result and wall time.
## Every go test has an explicit -timeout (TEST_TIMEOUT per package binary: a guard
## against a hang, about 5x the slowest package's wall time at load 4 on 2 cores).
## Four at a time: phases wait on one another, and on a 2-core machine
## shared with a busy neighbour the scheduler shares the cores by runnable thread, so a
## fourth phase in the slots the dependencies leave open shortens make test (cold,
## beside two busy loops: 603-631 s with three, see README for four); its memory stays
## under 1.5 GB because the race phases' largest binaries take turns (HEAVY_LOCK).
TEST_JOBS ?= 4
TEST_TIMEOUT ?= 15m
## TEST_GOFLAGS: make test builds without debug information (DWARF). Nothing in a test
## run reads it: panics and race reports are symbolised from the binary's own tables
## (file and line, as before). Linking a test binary costs about a quarter less CPU
## (server's: 2.2-2.7 s -> 1.6-1.9 s), compiling about 7% less.
## -vet=off: go test's own vet pass is off in make test, where the checks phase's go vet
## runs every analyzer on every package and its tests (and with -tags invariants on
## internal/invariants, the one package with tagged files). go test's pass ran a subset of the same analyzers again per build (race,
## invariants, plain), each over the dependencies too for their facts: 75 s of CPU on a
## cold cache.
TEST_GOFLAGS ?= -ldflags=-w -gcflags=all=-dwarf=false -vet=off
test: export GOFLAGS += $(TEST_GOFLAGS)
## TEST_GORACE: a race-detector binary sleeps a second at exit by default, so that other
## threads can finish a report (atexit_sleep_ms); a test binary's goroutines have ended
## by then (goleak checks it in every TestMain), and make test starts about 25 of them.
TEST_GORACE ?= atexit_sleep_ms=0
test: export GORACE = $(TEST_GORACE)
test: export DOCS_PARSE = 0
GOTEST = $(GO) test -timeout $(TEST_TIMEOUT)
TEST_PHASES := race-deps checks race-pkgs index plain-pkgs staticcheck docs-check conformance
test: shared-note tools
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) test-phases

test-phases: $(addprefix phase-,$(TEST_PHASES))
phase-race-pkgs phase-index: phase-race-deps
phase-plain-pkgs phase-staticcheck phase-conformance phase-docs-check: phase-checks

## race-deps: the race detector's build of what the two race phases share (the standard
## library and the test libraries the index's tests import), once, before either starts.
## Two go commands do not share work in flight: without it both compiled the standard
## library for the detector side by side, and race-invariants took 308 s of CPU on a cold
## cache instead of 114 s. make test runs it as a phase before both (each phase's own
## race-deps then finds it built).
RACE_DEPS = $$($(GO) list -deps -test -tags invariants $(INDEX_PKGS) | grep -v -e '^github.com/kvindex/' -e ' ' -e '\.test$$')
race-deps:
	$(GO) build -race $(RACE_DEPS)

phase-%:
	@bash scripts/phase.sh $* $(MAKE) --no-print-directory $*

## tools: what make test installs, each once, each saying so when it does:
##   staticcheck (Go module, into GOPATH/bin): the lint phase;
##   protoc (Debian's protobuf-compiler) and protoc-gen-go / protoc-gen-go-grpc (Go
##     modules, into GOPATH/bin): proto-check regenerates the gRPC code and compares;
##   python3-zmq and python3-msgpack (Debian's): the ZeroMQ interop tests' publisher;
##   nats-server (Go module, into GOPATH/bin): the NATS server the tests of fabric,
##     server and the CLI start (internal/natstest; without it they install it into the
##     user's cache folder on first use).
## The tokenizer and chat-template oracle tests install their pinned npm packages
## themselves, into a cache folder outside the tree.
tools: publisher-deps proto-deps $(STATICCHECK) $(NATS_SERVER)

## docs: regenerate the figure blocks of README.md and docs/*.md (each block's marker
## names the command that prints it; internal/docsgen).
DOCS ?= README.md sim/README.md $(wildcard docs/*.md)
docs:
	$(GO) run ./internal/docsgen -write $(DOCS)

## docs-check: the figure blocks equal what their commands print now (timings and memory,
## marked volatile, up to their digits), every text block names its command, and every
## documented kvindex command line parses (TestDocCommandsParse; make test's plain-pkgs phase
## runs it with the CLI's other tests, so its docs-check phase sets DOCS_PARSE=0). About
## 40 s.
DOCS_PARSE ?= 1
docs-check:
	$(GO) run ./internal/docsgen $(DOCS)
	$(if $(filter 1,$(DOCS_PARSE)),$(GOTEST) -count=1 -run '^TestDocCommandsParse' ./cmd/kvindex/)

## shared-note: one line saying which tests skip when $(SHARED) (traces, conformance logs,
## EVENTS.md; not shipped to users) is absent.
shared-note:
	@if [ ! -d $(SHARED) ]; then echo "NOTE: $(SHARED) not found: the tests that read its trace, conformance logs and EVENTS.md skip, and make conformance replays only testdata/ (go test -v ./... | grep SKIP lists them)"; fi

## publisher-deps: python3-zmq/python3-msgpack for the ZeroMQ interop tests (no-op when present).
publisher-deps:
	@bash testdata/publisher/install.sh || echo "WARN: python3-zmq/msgpack unavailable: interop tests will SKIP"

## unit: the unit tests without the race detector (quick local loop).
unit: publisher-deps
	$(GOTEST) -short ./...

## race and plain: make test runs each package's tests once, in the build that can find
## something in them. race-pkgs: the packages whose code starts goroutines or shares
## memory between them (RACE_PKGS; TestRacePackages in internal/docsgen checks the list
## against the code), under the race detector, at the sizes package internal/testsize
## gives it. race-invariants: the index's packages
## (engine, shard, the table toolkit) under the detector with their invariants checked
## after every change (-tags invariants, package internal/invariants; -short, and the
## histories sized by testsize.Sized, as the checks recount after each event), the
## owners' race sweep among them (engine's TestOwnersRace: non-owners racing on each
## owner's state are reported, in child runs of the same binary). plain: every other
## package, sequential code that the detector slows 5-10x and finds nothing in (the CLI,
## the simulator, the tokenizer and chat templates with their npm references, the
## decoders, the replays), without the detector and -short (the trace-sized replays and
## oracle corpora shortened; the conformance phase replays the trace log, make test-long
## runs them whole), plus the index's differentials (-short sizes), its zero-allocation
## tests (which skip where the detector or the invariant checks allocate) and the
## sequential end-to-end checks of the concurrent packages. race-pkgs builds its test
## binaries with one go test -c and runs them in two lanes (scripts/gotest-lanes.sh):
## its large ones (RACE_HEAVY) one at a time, the small ones one at a time beside them.
RACE_PKGS := ./bench ./bench/fleet ./bench/loadgen ./engine/internal/worker ./fabric ./internal/fakevllm ./internal/natstest \
	./internal/freeport ./internal/kube ./internal/parallel ./internal/warnlimit ./ringbuf ./route ./server \
	./server/internal/guard ./subscriber ./subscriber/pubtest
# RACE_HEAVY and INDEX_HEAVY: the race phases' largest test binaries (peak RSS with their
# children, under the detector with make test's flags: engine 362 MiB, server 243 MiB,
# subscriber 176 MiB; `go test -race [-tags invariants] -c -o /tmp/m/ ./PKG`, then in
# PKG's folder `scripts/peakrss.sh /tmp/m/PKG.test -test.short`),
# run in their own lane (scripts/gotest-lanes.sh) holding HEAVY_LOCK, so that one runs
# at a time across both phases whatever the build cache (make test's 1.5 GB leaves room
# for one beside the other phases' compiles and links); the others run one at a time
# beside them.
RACE_HEAVY := ./server ./subscriber
INDEX_HEAVY := ./engine ./internal/table
HEAVY_LOCK ?= $(or $(TMPDIR),/tmp)/kvindex-heavy-tests.$(shell id -u).lock
export HEAVY_LOCK
INDEX_PKGS := ./engine/... ./shard/... ./internal/table/... ./internal/invariants/
# PLAIN_PKGS: every package that is neither in RACE_PKGS nor an index package.
PLAIN_PKGS = $$($(GO) list ./... | grep -v -x $(foreach p,$(RACE_PKGS),-e 'github.com/kvindex/kvindex/$(patsubst ./%,%,$(p))') \
	-e '.*/engine' -e '.*/shard' -e '.*/internal/table' -e '.*/internal/invariants')
race: race-pkgs race-invariants plain

race-pkgs: publisher-deps race-deps
	GO=$(GO) HEAVY="$(RACE_HEAVY)" bash scripts/gotest-lanes.sh "-race" "-test.timeout=$(TEST_TIMEOUT)" $(RACE_PKGS)

race-invariants: race-deps
	GO=$(GO) HEAVY="$(INDEX_HEAVY)" bash scripts/gotest-lanes.sh "-race -tags invariants" "-test.short -test.timeout=$(TEST_TIMEOUT)" \
		$$($(GO) list -tags invariants $(INDEX_PKGS))

## make test runs plain in two phases: plain-index (the index's differentials and
## zero-allocation tests in one lane of scripts/gotest-lanes.sh, serve's and the
## subscriber's memory tests one after the other in the other) in the index phase,
## after race-invariants, by when checks' go vet has compiled most of what it needs;
## plain-pkgs (every other package) after checks. Run as one phase after
## checks, plain was make test's longest path, and its last minute ran on one or two
## threads.
index:
	@$(MAKE) --no-print-directory race-invariants
	@$(MAKE) --no-print-directory plain-index
plain: plain-pkgs plain-index
plain-pkgs: publisher-deps
	$(GOTEST) -short -count=1 $(PLAIN_PKGS)
PLAIN_INDEX_RUN := ^(TestPartitionBalance|TestDifferential.*|Test.*Allocs.*|TestIndexAgainstMap|TestStressLocked)$$
plain-index: publisher-deps
	GO=$(GO) HEAVY="./engine ./shard" HEAVY_LOCK= bash scripts/gotest-lanes.sh "" "-test.short -test.timeout=$(TEST_TIMEOUT)" \
		'./engine:$(PLAIN_INDEX_RUN)' './shard:$(PLAIN_INDEX_RUN)' \
		'./subscriber:^TestFloodRSSBounded$$' './server:^(TestMemoryBudget|TestTextRouting.*)$$'

## test-long: every test at its full size under the race detector (KVINDEX_TEST_LONG=1:
## the histories, logs and sweeps make test shortens; see internal/testsize), and every
## package vetted on 386 (build386-all) and on Windows and macOS (cross-all), every
## conformance pairing, and every fuzz target (fuzz-long). CI may skip it.
test-long: publisher-deps build386-all cross-all
	KVINDEX_TEST_LONG=1 $(GO) test -race -count=1 -timeout 60m ./...
	$(MAKE) conformance CONFORMANCE_MATRIX=full
	$(MAKE) fuzz-long

## lint: gofmt, go vet, staticcheck, go mod tidy and the generated gRPC code; make test
## runs it as two phases, checks (all but staticcheck) and staticcheck.
lint: checks staticcheck
checks: fmt-check vet tidy-check proto-check

## proto-deps: protoc (Debian's protobuf-compiler, when missing) and the pinned Go plugins.
proto-deps: $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	@bash api/kvindexv1/install-protoc.sh

$(NATS_SERVER):
	GOFLAGS=-mod=mod $(GO) install github.com/nats-io/nats-server/v2@$(NATS_SERVER_VERSION)

$(PROTOC_GEN_GO):
	GOFLAGS=-mod=mod $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(PROTOC_GEN_GO_GRPC):
	GOFLAGS=-mod=mod $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# protogen DIR: generates $(PROTO)'s Go code under DIR (a module-root-like tree).
protogen = PATH="$(GOBIN):$$PATH" protoc --go_out=$(1) --go_opt=module=github.com/kvindex/kvindex \
	--go-grpc_out=$(1) --go-grpc_opt=module=github.com/kvindex/kvindex $(PROTO)

## proto: regenerate the gRPC code from api/kvindexv1/kvindex.proto.
proto: proto-deps
	$(call protogen,.)

## proto-check: the committed generated code is what kvindex.proto generates (the
## "protoc vX" header line aside, which names the local protoc). Skipped, visibly,
## where protoc cannot be installed.
proto-check: proto-deps
	@if ! command -v protoc >/dev/null 2>&1; then echo "SKIP proto-check: protoc not installed"; exit 0; fi; \
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(call protogen,$$tmp) && \
	for f in kvindex.pb.go kvindex_grpc.pb.go; do \
		grep -v '^//.*protoc[[:space:]][[:space:]]*v[0-9]' api/kvindexv1/$$f >$$tmp/committed; \
		grep -v '^//.*protoc[[:space:]][[:space:]]*v[0-9]' $$tmp/api/kvindexv1/$$f >$$tmp/generated; \
		if ! cmp -s $$tmp/committed $$tmp/generated; then \
			echo "api/kvindexv1/$$f is stale: run make proto"; exit 1; fi; \
	done

fmt:
	gofmt -w $$(git ls-files '*.go')

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt-ed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags invariants ./internal/invariants/

$(STATICCHECK):
	GOFLAGS=-mod=mod $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

staticcheck: $(STATICCHECK)
	$(STATICCHECK) ./...

tidy-check:
	@$(GO) mod tidy -diff || { echo "go mod tidy would change go.mod/go.sum (run go mod tidy)"; exit 1; }

## build386: catches 64-bit assumptions in sizes and constants (an int constant past 2^31,
## a size assertion written for 8-byte words) in the packages whose arithmetic an embedder
## relies on (the index, the ring buffers, hashing, the event decoder, the tokenizer and
## chat templates, routing, op logs), compiled for 386 as an embedder's build would,
## without their tests. make test-long vets every package with its tests on 386
## (build386-all), which includes it; make test runs neither: the 386 build compiles the
## standard library a third time (37-44 s of CPU on a cold cache, 4% of make test).
BUILD386 := ./engine/... ./shard/... ./internal/table/... ./ringbuf ./hash ./kvevents ./tokenize \
	./chattemplate ./route ./internal/oplog ./internal/cbor ./internal/namespace ./vllmhash
build386:
	GOARCH=386 $(GO) build $(BUILD386)

build386-all:
	GOARCH=386 $(GO) vet ./...

## cross-all: every package, tests included, vetted for Windows and macOS: the library and
## the kvindex binary build there (what needs Linux or Unix, as epoll, io_uring, thread
## renicing and SIGSTOP, sits in files with build tags and a fallback).
cross-all:
	GOOS=windows $(GO) vet ./...
	GOOS=darwin $(GO) vet ./...

## conformance: replays every golden op log through the kvindex CLI (scripts/conformance.sh,
## a log per CPU at a time): on the engine at shards 1, 2, 3, 4 and 8, on the locked
## baseline, and on the locked baseline with SPEC's prefix chain (--spec-chain), at jumps
## 1, 4 and 64: two of those pairings in make test (CONFORMANCE_MATRIX=short: eight
## shards at jump 1, the locked index with the spec chain at jump 4; internal/replay's
## TestConformance, in the plain-pkgs phase, replays every log in process at shards 1 and 4
## and every jump), all 21 in make test-long. The
## repository's own logs (testdata/demo.jsonl, testdata/tiers.jsonl) always, the shared
## ones (hybrid/ included) where present (skipped, with a notice, where they are absent).
CONFORMANCE_MATRIX ?= short
conformance:
	@logs="testdata/demo.jsonl testdata/tiers.jsonl"; \
	if ls $(SHARED)/conformance/*.jsonl >/dev/null 2>&1; then logs="$$logs $$(ls $(SHARED)/conformance/*.jsonl $(SHARED)/conformance/hybrid/*.jsonl 2>/dev/null)"; \
	else echo "SKIP shared conformance logs: $(SHARED)/conformance not found"; fi; \
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(GO) build -o $$tmp/kvindex ./cmd/kvindex && \
	MATRIX=$(CONFORMANCE_MATRIX) bash scripts/conformance.sh $$tmp/kvindex $$logs

## fuzz: a short run of the fuzz targets fed by the network (see FUZZTIME above): the
## engines' event batches (kvevents), what a ZeroMQ peer sends (subscriber), a chat body
## as serve reads it (chattemplate), a Kubernetes watch stream (internal/kube). fuzz-long
## (make test-long) runs every target. make test runs neither: each target's build is
## instrumented, its own compile of the standard library and its package's dependencies
## (105 s of CPU for kvevents' alone on a cold cache), while every target's seed corpus
## (its testdata/fuzz findings included) runs in make test as a test.
fuzz:
	$(GOTEST) -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(call fuzzbudget,50000x) ./kvevents/
	$(GOTEST) -run '^$$' -fuzz '^FuzzGuard$$' -fuzztime $(call fuzzbudget,50000x) ./subscriber/
	$(GOTEST) -run '^$$' -fuzz '^FuzzFromRequest$$' -fuzztime $(call fuzzbudget,10000x) ./chattemplate/
	$(GOTEST) -run '^$$' -fuzz '^FuzzWatchStream$$' -fuzztime $(call fuzzbudget,20000x) ./internal/kube/

fuzz-long: fuzz
	$(GOTEST) -run '^$$' -fuzz '^FuzzApplyBatch$$' -fuzztime $(call fuzzbudget,20000x) ./subscriber/
	$(GOTEST) -run '^$$' -fuzz '^FuzzBlocks$$' -fuzztime $(call fuzzbudget,30000x) ./hash/
	$(GOTEST) -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(call fuzzbudget,60000x) ./internal/oplog/
	$(GOTEST) -run '^$$' -fuzz '^FuzzEngine$$' -fuzztime $(call fuzzbudget,12000x) ./engine/
	$(GOTEST) -run '^$$' -fuzz '^FuzzRestore$$' -fuzztime $(call fuzzbudget,25000x) ./engine/
	$(GOTEST) -run '^$$' -fuzz '^FuzzEncode$$' -fuzztime $(call fuzzbudget,10000x) ./tokenize/
	$(GOTEST) -run '^$$' -fuzz '^FuzzTemplate$$' -fuzztime $(call fuzzbudget,10000x) ./chattemplate/
	$(GOTEST) -run '^$$' -fuzz '^FuzzDecodeJSON$$' -fuzztime $(call fuzzbudget,10000x) ./chattemplate/
	$(GOTEST) -run '^$$' -fuzz '^FuzzDecodeMatch$$' -fuzztime $(call fuzzbudget,25000x) ./server/
	$(GOTEST) -run '^$$' -fuzz '^FuzzDecodeRouted$$' -fuzztime $(call fuzzbudget,25000x) ./server/
	$(GOTEST) -run '^$$' -fuzz '^FuzzGRPCMatch$$' -fuzztime $(call fuzzbudget,20000x) ./server/
	$(GOTEST) -run '^$$' -fuzz '^FuzzMooncake$$' -fuzztime $(call fuzzbudget,15000x) ./server/
	$(GOTEST) -run '^$$' -fuzz '^FuzzDigestInfo$$' -fuzztime $(call fuzzbudget,10000x) ./server/
	$(GOTEST) -run '^$$' -fuzz '^FuzzDecodeMessage$$' -fuzztime $(call fuzzbudget,20000x) ./fabric/
	$(GOTEST) -run '^$$' -fuzz '^FuzzLoadDelta$$' -fuzztime $(call fuzzbudget,20000x) ./fabric/

## soak: bounded soaks (SOAK each, default 3m): publisher churn, restarts, gaps, hostile
## peers and queries through real libzmq (subscriber); serve's API under every
## client-facing attack at once while events and checked queries go on (server).
## Resources stay flat, answers equal the model. Not part of make test.
SOAK ?= 3m
soak: publisher-deps
	KVINDEX_SOAK=$(SOAK) KVINDEX_REQUIRE_PUBLISHER=1 $(GO) test -count=1 -run '^TestSoak$$' -timeout 30m -v ./subscriber/
	KVINDEX_SOAK=$(SOAK) $(GO) test -count=1 -run '^TestServeSoak$$' -timeout 30m -v ./server/

## stress: the long concurrency stress (many producers and readers, all shard counts).
stress:
	KVINDEX_STRESS=long $(GO) test -race -count=1 -run 'Stress' -timeout 30m ./engine/

## bench: microbenchmarks (each with its baseline in the same run), then the harness on the
## trace-driven workload (conversation trace, 16 workers x 16,384 blocks of 64 tokens): the
## engine at shards 1, 2, 4 against the locked index and the radix tree, as markdown
## tables in bench/out/ (BENCHMARKS.md quotes them).
bench:
	mkdir -p bench/out
	$(GO) test -run '^$$' -bench . -benchmem ./hash/ ./shard/ ./ringbuf/ ./engine/ | tee bench/out/micro.txt
	@if [ -f $(SHARED)/traces/conversation_trace.jsonl ]; then \
		$(GO) run ./cmd/kvindex gen-ops --trace $(SHARED)/traces/conversation_trace.jsonl --workers 16 \
			--capacity 16384 --block-size 64 --requests 3000 --expect-every 50 --out bench/out/trace16.jsonl && \
		$(GO) run ./cmd/kvindex bench --ops bench/out/trace16.jsonl --shards 1,2,4 --markdown | tee bench/out/trace16.md; \
	else echo "SKIP trace harness: $(SHARED)/traces/conversation_trace.jsonl not found"; fi
	@if [ -f $(SHARED)/conformance/trace_conversation.jsonl ]; then \
		$(GO) run ./cmd/kvindex bench --ops $(SHARED)/conformance/trace_conversation.jsonl --shards 1,2,4,8 --markdown | tee bench/out/conformance-trace.md; fi

## bench-peers: SMG's ChainIndex and PositionalIndexer, as Rust replay drivers of ours built
## from SMG_SRC=DIR (never vendored; bench/peers/README.md says what DIR holds and how to
## export it), beside the engine at shards 1, 2, 4 and the locked index: one table per op
## log (PEER_LOGS; default the conformance trace log and the 16-worker trace log of
## `make bench`), PEER_ROUNDS alternating rounds, in bench/out/peers.md. Needs cargo and
## Debian's librust-*-dev crates; neither `make test` nor CI builds it.
PEERS_BUILD ?= bench/peers/build
PEER_ROUNDS ?= 3
PEER_LOGS   ?=
bench-peers:
	@if [ -z "$(SMG_SRC)" ]; then echo "usage: make bench-peers SMG_SRC=DIR (see bench/peers/README.md)"; exit 2; fi
	bash bench/peers/build.sh "$(SMG_SRC)" "$(PEERS_BUILD)"
	mkdir -p bench/out
	$(GO) build -o $(PEERS_BUILD)/kvindex ./cmd/kvindex
	@logs="$(PEER_LOGS)"; \
	if [ -z "$$logs" ]; then \
		if [ -f $(SHARED)/conformance/trace_conversation.jsonl ]; then logs="$(SHARED)/conformance/trace_conversation.jsonl"; fi; \
		if [ -f $(SHARED)/traces/conversation_trace.jsonl ]; then \
			$(PEERS_BUILD)/kvindex gen-ops --trace $(SHARED)/traces/conversation_trace.jsonl --workers 16 \
				--capacity 16384 --block-size 64 --requests 3000 --expect-every 50 --out bench/out/trace16.jsonl && \
			logs="$$logs bench/out/trace16.jsonl"; fi; \
	fi; \
	if [ -z "$$logs" ]; then echo "bench-peers: no op log (set PEER_LOGS, or put ../shared beside the repo)"; exit 2; fi; \
	: > bench/out/peers.md; \
	for f in $$logs; do \
		$(PEERS_BUILD)/kvindex bench --ops $$f --peers $(PEERS_BUILD)/bin --impls engine,locked,locked-spec --shards 1,2,4 \
			--rounds $(PEER_ROUNDS) --markdown >> bench/out/peers.md || exit 1; \
	done; cat bench/out/peers.md

## loadtest: the fleet load test (kvindex loadtest): LOADTEST_ENGINES simulated engines
## publishing into one serve at each of LOADTEST_RATES batches/s, nothing lost
## (BENCHMARKS.md, "Fleet load test"; about a minute at the defaults).
LOADTEST_ENGINES ?= 64
LOADTEST_RATES   ?= 1000,2000,4000,8000
LOADTEST_FLAGS   ?=
loadtest:
	$(GO) build -o bench/out/kvindex ./cmd/kvindex
	bench/out/kvindex loadtest --engines $(LOADTEST_ENGINES) --rates $(LOADTEST_RATES) $(LOADTEST_FLAGS)

## loadgen: the query load test over loopback with the Python publisher; rewrites
## bench/loadgen/RESULTS.md (about 1 min).
loadgen: publisher-deps
	$(GO) run ./bench/loadgen --out bench/loadgen/RESULTS.md

## demo: try serve locally: simulated vLLM engines publishing into a serve on
## 127.0.0.1:8080 (DEMO_FLAGS, e.g. --listen 127.0.0.1:9000), and three curl lines to
## ask it (docs/engines.md). The simulator is `go run ./cmd/kvindex sim`.
DEMO_FLAGS ?=
demo:
	$(GO) run ./cmd/kvindex demo $(DEMO_FLAGS)
