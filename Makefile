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
	# [tensorboard] brings tensorboard: its events are read back by the tests; [video] the
	# mp4 encoder of the flythrough (imageio-ffmpeg, which [sfm] brings too).
	$(BIN)/pip install --quiet -e ".[dev,cuda,viewer,sfm,tensorboard,video]"
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

# PlayCanvas's splat-transform 3.7.0 (Node 20) for the splat-file interoperability tests
# (tests/test_splat_transform.py), into a cache folder outside the work tree (~215 MB, once).
# Node and npm come from Debian where they are missing (as root). A failed install does not
# stop make: those tests then fail (under CI=true) saying what is missing.
SPLAT_TRANSFORM_DIR ?= $(HOME)/.cache/tilesplat/splat-transform-3.7.0
SPLAT_TRANSFORM := $(SPLAT_TRANSFORM_DIR)/node_modules/.bin/splat-transform
$(SPLAT_TRANSFORM):
	@if ! command -v npm >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "installing Debian's nodejs and npm for the splat-transform tests"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
		else echo "the splat-transform tests need Node 20 and npm: sudo apt-get install -y nodejs npm"; fi; \
	fi
	@if command -v npm >/dev/null 2>&1; then \
		echo "installing @playcanvas/splat-transform@3.7.0 into $(SPLAT_TRANSFORM_DIR)"; \
		timeout 600 npm install --prefix "$(SPLAT_TRANSFORM_DIR)" --no-audit --no-fund \
			--loglevel=error @playcanvas/splat-transform@3.7.0 \
			|| echo "npm could not install splat-transform: its tests will fail"; \
	fi

test: $(STAMP) $(CHROMIUM) $(SPLAT_TRANSFORM)
	$(BIN)/ruff check .
	# worksteal: a worker that runs out takes tests queued on the other (the simulated and
	# training tests take 30-150 s each; a plain split can leave one worker alone at the end);
	# the 30 slowest tests are listed, for the next trim of CI's time
	TILESPLAT_SPLAT_TRANSFORM_DIR="$(SPLAT_TRANSFORM_DIR)" $(BIN)/python -m pytest -n 2 \
		--dist worksteal --durations=30 -q

train: $(STAMP)
	$(BIN)/tilesplat train

render: $(STAMP)
	$(BIN)/tilesplat render-garden --out renders/garden

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) renders
