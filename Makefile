# The two commands a newcomer needs:
#   make demo   - the main job on real input: local control plane, operator, a run, its rollback
#                 (make demo KEEP=1 leaves it all running to try it yourself)
#   make test   - builds what is missing, starts the local control plane, runs every test, stops it
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: install build test unit demo up down crds

install:
	$(PIP) install -q -e '.[test]'

build: install
	reversi-devcluster build --all

test: build
	$(PYTHON) -m pytest -q

unit: install
	$(PYTHON) -m pytest -q tests/unit

demo: install
	reversi-devcluster build
	$(PYTHON) demo/run_demo.py $(if $(KEEP),--keep,)

up: install
	reversi-devcluster up

down:
	reversi-devcluster down

crds: install
	reversi-crdgen   # crds/ and the chart's templates/crds/
