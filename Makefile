# The two commands a newcomer needs:
#   make demo   - the main job on real input: local control plane, operator, a run, its rollback
#                 (make demo KEEP=1 leaves it all running to try it yourself)
#   make test   - builds what is missing, starts the local control planes, runs the unit and integration tests, stops them
#   make e2e    - the e2e tier: the real node, chart releases and upgrades, chaos, failover, live Prometheus
#   make lint   - ruff, mypy and lint-imports with the rule set in pyproject.toml, and flake8's function length limit
#                 in .flake8 (seconds; .ci/run runs it before make test)
#   make demo-mcp - an MCP agent recorded by reversi-gateway, halted, and rolled back through MCP
#   make demo-kube - an SRE agent's plain kubectl writes recorded at admission and rolled back, on the real node
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# make test runs the suite on this many pytest-xdist workers, each with a local control plane of its
# own (tests/conftest.py); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2

.PHONY: node-deps install build lint test e2e test-long fuzz chaos unit demo demo-mcp demo-kube up down crds bench-record bench-record-load bench-sdk bench-kube bench-kube-admission bench-gateway bench-rollback bench-journal bench-failover chaos-failover

install:
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q -e ./devcluster  # after reversi: an older reversi owned the reversi-devcluster command

build: install
	reversi-devcluster build --all
	reversi-devcluster images

# Debian packages the real node needs (root): installed only when missing. The list is in
# devcluster/reversi_devcluster/nodedeps.py, which the demos use too (run as a script: no install needed)
node-deps:
	$(PYTHON) devcluster/reversi_devcluster/nodedeps.py

# ruff over the code, tests, benchmarks and demo; mypy over operator/reversi and devcluster/reversi_devcluster; lint-imports:
# the package's layers, no import cycle, a pure engine (rules: pyproject.toml); flake8 over operator/ with one check,
# flake8-functions' CFQ001: no function longer than 80 lines (.flake8)
lint: install
	$(PYTHON) -m ruff check operator devcluster tests benchmarks demo
	$(PYTHON) -m mypy
	$(PYTHON) -c "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())" --no-cache
	$(PYTHON) -m flake8 operator

# the README's test command: unit tests and the integration tests on the local control plane with
# the node agent; make e2e: the real node, every chart release and upgrade, chaos, failover and live
# Prometheus (the tier is E2E_MODULES in tests/conftest.py; docs/development.md#tests)
test: build
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not e2e" --durations=15

e2e: build
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m e2e

# the long variants: runs of 5,000 steps, a rollback of 2,000 (recording is sequential per run: many minutes), and
# 25 races of an agent recording while a rollback takes the lock (make test makes 3 of each)
test-long: build
	REVERSI_LONG_RUN_STEPS=5000 REVERSI_BIG_RUN_STEPS=2000 REVERSI_BOUNDARY_ATTEMPTS=25 $(PYTHON) -m pytest -q \
	  tests/integration/test_journal.py tests/integration/test_crash_and_scale.py \
	  tests/integration/test_cancel_delete_and_guards_misuse.py::test_the_run_boundary_holds_against_an_agent_recording_as_fast_as_it_can \
	  tests/integration/test_recording_policies.py::test_a_call_racing_the_lock_is_refused_or_rolled_back_never_silent

# malformed objects of every kind against the webhooks: 2,000 of them (make test sends 240)
fuzz: build
	REVERSI_FUZZ_EXAMPLES=2000 $(PYTHON) -m pytest -q -s tests/integration/test_fuzz.py

# chaos: 100 rollbacks while the operator is SIGKILLed, kube-apiserver and etcd restarted, the node agent
# lost and every watch cut; then 12 on the real node while containerd or the kubelet is SIGKILLed or the
# compensator evicted (skipped where the machine runs no real node); invariants checked against the
# downstream (make e2e runs 8 and 1). Replay a run with REVERSI_CHAOS_SEED=<the seed it printed>.
chaos: build
	REVERSI_CHAOS_ROLLBACKS=100 $(PYTHON) -m pytest -q -s tests/integration/test_chaos.py
	REVERSI_NODE_CHAOS_ROLLBACKS=12 $(PYTHON) -m pytest -q -s tests/e2e/test_real_node.py -k own_faults

# recording cost at step 100 and step 5,000 of one run (the journal's O(1) claim)
bench-record: build
	$(PYTHON) benchmarks/record_bench.py --steps 5000

# recording under load: what each layer of a recorded call costs (floor), 1, 4, 16 and 32 agents next to the same
# API server's plain writes, and an agent's calls while the operator or one admission replica is SIGKILLed
# (docs/operations.md#admission-where-each-rule-is-enforced); --only crowd and --only rolling when named
bench-record-load: build
	$(PYTHON) benchmarks/record_load_bench.py

# the operator's cost next to the bare work: P1-P6 with their targets (ONLY=P1,P4 for a subset)
bench-rollback: build
	$(PYTHON) benchmarks/rollback_bench.py $(if $(ONLY),--only $(ONLY),)

# 20 failovers of the operator's Lease holder (SIGKILL, SIGTERM, SIGSTOP past the lease then SIGCONT) at random
# moments during rollbacks: no compensation made twice, no write by a stopped replica (make e2e makes 2)
chaos-failover: build
	REVERSI_FAILOVER_CHAOS=20 $(PYTHON) -m pytest -q -s tests/integration/test_failover_chaos.py

# failover of the reconciling operator: two operator processes, a 20-step parallelism-2 rollback, the active one
# SIGKILLed and then SIGTERMed mid-way; seconds to the standby's next Job and each refund made once, for the Lease
# (targets 15 s and 3 s) and for kopf peering as main runs it (the baseline); ROUNDS=2 for more rounds
bench-failover: build
	$(PYTHON) benchmarks/failover_bench.py --rounds $(or $(ROUNDS),1)

# the journal's ceiling: etcd bytes per recorded call, the operator's RSS and first dry run with 0, 10,000 and
# 50,000 Runs, retention deleting 10,000 expired Runs of 20 steps while agents record, and the archive with
# PostgreSQL stopped 60 s mid-way (ONLY=bytes,startup for a subset; RUNS=0,2000 for other sizes)
bench-journal: build
	$(PYTHON) benchmarks/journal_bench.py $(if $(ONLY),--only $(ONLY),) $(if $(RUNS),--runs $(RUNS),)

unit: install
	$(PYTHON) -m pytest -q tests/unit

# the demos build what is missing themselves (the control plane; on a real node its parts and images, after
# installing the node's Debian packages where they are missing), with a progress line per stage
demo: install
	$(PYTHON) demo/run_demo.py $(if $(KEEP),--keep,)

demo-mcp: install
	$(PYTHON) demo/mcp_demo.py

# an SRE agent's plain kubectl writes recorded at admission (Run spec.record), a person's edit since, and the
# rollback checked against the cluster, on the real node (docs/concepts.md#recording-with-no-agent-code)
demo-kube: install
	$(PYTHON) demo/kube_demo.py

bench-sdk: build
	$(PYTHON) benchmarks/sdk_overhead_bench.py

# an agent's write to a ConfigMap recorded by rec.kube against the same write unrecorded: median over 200 each
bench-kube: build
	$(PYTHON) benchmarks/kube_record_bench.py

# an agent's own write (kubectl, and the Python client) recorded at admission by a Run's spec.record against the
# same write unrecorded, median over 200 each, and the recorded steps counted (docs/concepts.md#recording-with-no-agent-code)
bench-kube-admission: build
	$(PYTHON) benchmarks/kube_admission_bench.py

bench-gateway: install
	reversi-devcluster build
	$(PYTHON) benchmarks/gateway_bench.py

up: install
	reversi-devcluster up

down:
	reversi-devcluster down

crds: install
	reversi-crdgen   # crds/, the chart's templates/crds/ and the field references in docs/reference/
