# pstrain: `make` builds into build/ (binaries in build/bin/), `make test` runs the whole
# suite, `make demo` runs the main job. test and demo install missing Debian packages first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test test-tsan demo bench clean

all: build

deps:
	@scripts/deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: deps
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900
	$(MAKE) test-tsan

# The device-runtime tests again under ThreadSanitizer, in a build of their own.
test-tsan: deps
	cmake -S . -B $(BUILD)-tsan -DCMAKE_BUILD_TYPE=Debug -DPSTRAIN_TSAN=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD)-tsan -j $(JOBS) --target tsan_tests
	cd $(BUILD)-tsan && ctest --output-on-failure -L tsan --timeout 900

demo: deps
	$(MAKE) build
	scripts/demo.sh $(BUILD)

bench: deps
	@scripts/deps.sh python3-torch iperf3
	$(MAKE) build
	bench/run.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD)-tsan
