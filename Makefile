# Set-up is two commands on a fresh machine: `make demo` and `make test`.
# ORT selects the ONNX Runtime package: gpu (onnxruntime-gpu, default), cpu (onnxruntime),
# or none (keep whichever onnxruntime the environment already has). Both packages provide the
# module `onnxruntime`, so each has a venv of its own: .venv for gpu, .venv-cpu, .venv-none.
PYTHON ?= python3
ORT ?= gpu
VENV := $(if $(filter gpu,$(ORT)),.venv,.venv-$(ORT))
PY := $(VENV)/bin/python
EXTRAS := $(if $(filter none,$(ORT)),test,$(ORT),test)
STAMP := $(VENV)/.installed-$(ORT)

.PHONY: install demo test test-all fuzz bench gpu-bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-*
	touch $@

demo: install
	$(PY) -m models out/demo
	$(VENV)/bin/amp-rewrite convert out/demo/transformer.onnx -o out/demo/transformer.mixed.onnx \
		--report out/demo/transformer.report.json
	$(VENV)/bin/amp-rewrite convert out/demo/seed_cnn.onnx -o out/demo/seed_cnn.mixed.onnx
	$(VENV)/bin/amp-rewrite check out/demo/transformer.onnx out/demo/transformer.mixed.onnx --random 2 \
		--junit out/demo/transformer.check.xml
	$(VENV)/bin/amp-rewrite bench out/demo/seed_cnn.onnx out/demo/seed_cnn.mixed.onnx --runs 20 --report out/demo/seed_cnn.bench.json
	$(VENV)/bin/amp-rewrite train out/demo/mlp.onnx --data out/demo/digits_train.npz --eval out/demo/digits_test.npz \
		--loss cross-entropy --output log_probs --labels labels --epochs 5 --lr 1e-3 --precision float16 \
		-o out/demo/mlp.trained.onnx --mixed-output out/demo/mlp.trained.mixed.onnx --report out/demo/mlp.train.json

test: install
	$(PY) -m pytest -q -n 2 --dist loadgroup

# The suite with each ONNX Runtime package at its newest (CI runs this): each in its own venv.
test-all:
	$(MAKE) test ORT=gpu
	$(MAKE) test ORT=cpu

# The fuzz tests of `make test` with many more examples from a random seed: random graphs
# (tests/test_fuzz.py; hypothesis prints a failing example's model as ONNX text) and mutated model
# files (tests/test_fuzz_models.py; its seed is printed, a failing model kept).
FUZZ_EXAMPLES ?= 2000
fuzz: install
	AMP_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) AMP_FUZZ_MODEL_EXAMPLES=$(FUZZ_EXAMPLES) AMP_FUZZ_RANDOM=1 \
		$(PY) -m pytest -q -s tests/test_fuzz.py tests/test_fuzz_models.py

# ruff over the code, then mypy over amp_rewrite with pyproject's [tool.mypy] (its strictness is set there).
lint: install
	$(PY) -m ruff check amp_rewrite models tests benchmarks
	$(PY) -m mypy

# The peers' modules are compiled to bytecode when pip installs them; an editable install's
# are not, and where PYTHONDONTWRITEBYTECODE is set every conversion compiled amp_rewrite
# from source (0.25-0.3 s a process): compiled here, as pip does.
bench: install
	$(PY) -m pip install -q -e ".[$(EXTRAS),bench]"
	$(PY) -m compileall -q amp_rewrite
	$(PY) benchmarks/run.py
	$(PY) benchmarks/floor.py
	$(PY) benchmarks/validate_bench.py
	$(PY) benchmarks/grad_bench.py
	$(PY) benchmarks/train_bench.py

clean:
	rm -rf .venv .venv-cpu .venv-none out benchmarks/work

# Issue 10's GPU figures (needs onnxruntime-gpu and a GPU; `--quick --provider CPUExecutionProvider` tries it on a CPU).
gpu-bench: install
	$(PY) benchmarks/gpu_bench.py
