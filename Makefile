# pstrain: `make` builds into build/ (binaries in build/bin/), `make test` runs the whole
# suite, `make demo` runs the main job. test, demo and install install missing Debian packages first.
# The CUDA backend is compiled whenever the CUDA toolkit is found (PSTRAIN_CUDA=AUTO); pass
# CMAKE_FLAGS=-DPSTRAIN_CUDA=OFF for a CPU-only build. `make test-gpu` is for GPU machines.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build install test test-tsan test-nocuda test-gpu demo demo-ctr bench fuzz docs clean

all: build

deps:
	@scripts/deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# trainer, pserver and pslaunch into $(DESTDIR)$(PREFIX)/bin, and their man pages (made from
# --help by help2man) into $(DESTDIR)$(PREFIX)/share/man/man1 (scripts/install.sh). Fails
# with one line, without sudo, when PREFIX is not writable: PREFIX=$HOME/.local, or as root.
PREFIX ?= /usr/local
install: deps
	$(MAKE) build
	scripts/install.sh "$(DESTDIR)$(PREFIX)" $(BUILD)

test: deps
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900
	$(MAKE) test-tsan

# The device-runtime tests again under ThreadSanitizer, in a build of their own. They
# exercise the CPU backend, so this build skips the (slow to compile) CUDA backend.
test-tsan: deps
	cmake -S . -B $(BUILD)-tsan -DCMAKE_BUILD_TYPE=Debug -DPSTRAIN_TSAN=ON -DPSTRAIN_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD)-tsan -j $(JOBS) --target tsan_tests
	cd $(BUILD)-tsan && ctest --output-on-failure -L tsan --timeout 900

# The whole suite in a CPU-only build (-DPSTRAIN_CUDA=OFF), as on a machine without the
# CUDA toolkit.
test-nocuda: deps
	cmake -S . -B $(BUILD)-nocuda -DCMAKE_BUILD_TYPE=Release -DPSTRAIN_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD)-nocuda -j $(JOBS)
	cd $(BUILD)-nocuda && ctest --output-on-failure -j $(JOBS) --timeout 900

# For machines WITH a GPU: a build that requires CUDA (configure fails without the toolkit
# and NCCL), then the CUDA-vs-CPU op parity test and the collectives (NCCL on the GPUs).
# Fails at the end when no GPU was used (the tests themselves skip with "skipped: no GPU").
test-gpu: deps
	cmake -S . -B $(BUILD)-gpu -DCMAKE_BUILD_TYPE=Release -DPSTRAIN_CUDA=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD)-gpu -j $(JOBS) --target test_ops test_seq_ops test_collectives test_cuda_nogpu
	cd $(BUILD)-gpu && ctest --output-on-failure --timeout 900 -R '^(test_ops|test_seq_ops|test_collectives|test_cuda_nogpu)$$'
	@cd $(BUILD)-gpu && ./tests/test_ops --filter 'ops_backends/*' 2>&1 | grep 'parity runs on' \
	  || { echo "test-gpu: no GPU was used (CUDA parity skipped); run it on a machine with a GPU" >&2; exit 1; }

demo: deps
	@# the build's progress goes to stderr: stdout carries only trainer 0's summary line
	@$(MAKE) --no-print-directory build >&2
	@scripts/demo.sh $(BUILD)

# The click model alone on a planted-truth file that ctr-synth writes once into
# $(BUILD)/data/ (scripts/demo_ctr.sh; about 300,000 rows): stdout carries only its summary.
demo-ctr: deps
	@$(MAKE) --no-print-directory build >&2
	@scripts/demo_ctr.sh $(BUILD)

bench: deps
	@scripts/deps.sh python3-torch iperf3 libblis4-pthread uthash-dev libgenht1-dev
	$(MAKE) build
	bench/run.sh $(BUILD)

# libFuzzer (clang) on the decoders of untrusted input (fuzz/): each target for FUZZ_SECONDS
# on a copy of its corpus in $(BUILD)-fuzz/fuzz-work/ (crashes listed at the end; exit 1
# when any). FUZZ_TARGETS picks some (e.g. "wire_push config"). make test replays the
# committed corpus in the normal build (ctest -L fuzz-replay), without fuzzing.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: deps
	@scripts/deps.sh clang libclang-rt-14-dev
	cmake -S . -B $(BUILD)-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPSTRAIN_FUZZ=ON -DPSTRAIN_WERROR=OFF -DPSTRAIN_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzz_targets
	scripts/fuzz.sh $(BUILD)-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# docs/configuration.md from the option table in common/config.c (the suite's docs_check
# fails when they disagree).
docs: build
	$(BUILD)/bin/trainer --config-reference > docs/configuration.md

clean:
	rm -rf $(BUILD) $(BUILD)-tsan $(BUILD)-nocuda $(BUILD)-gpu $(BUILD)-fuzz
