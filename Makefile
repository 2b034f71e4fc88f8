# The two commands of the README. Each sets itself up from scratch on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test train render lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: this machine's CPU build; a bare "torch" would pull a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	# [cuda] brings numba-cuda and its NVVM: CI compiles every GPU kernel to PTX and runs
	# them in the simulator (no GPU needed). [viewer] brings viser for the browser tests.
	# [sfm] brings pycolmap: the structure-from-motion tests run in CI, none is skipped.
	$(BIN)/pip install --quiet -e ".[dev,cuda,viewer,sfm]"
	touch $(STAMP)

setup: $(STAMP)

# Debian's Chromium for the viewer's browser tests: installed as root; without root, one line
# says what to install (the browser tests then fail with the same advice).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian's chromium for the browser tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "the browser tests need Debian's chromium: sudo apt-get install -y chromium"; fi

test: $(STAMP) $(CHROMIUM)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 -q

train: $(STAMP)
	$(BIN)/tilesplat train

render: $(STAMP)
	$(BIN)/tilesplat render-garden --out renders/garden

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) renders
