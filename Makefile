# kbcl — convenience front end over CMake. `make run` and `make test` work from a fresh clone:
# they install the Debian packages the build needs (scripts/install-deps.sh, idempotent),
# configure, build and then run the default job / every test.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
RUN_ARGS   ?= --bench ccl_allreduce --algorithm ring_allreduce_tcm --world-size 256 --n-elem 8 --device ref --verify-data

.PHONY: all deps build run test test-fast asan test-asan tsan test-tsan clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/kbcl run $(RUN_ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -L fast -j $(JOBS)

$(ASAN_BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKBCL_SANITIZE=ON $(CMAKE_ARGS)

asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)

test-asan: asan
	cd $(ASAN_BUILD) && ctest --output-on-failure -L fast -j $(JOBS)

# ThreadSanitizer: the threaded tests only (ctest label `threads`: kb_par, kb_psim; TSan counts every
# fiber as a thread, so the many-fiber tests of kb_sim stay out)
$(TSAN_BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKBCL_TSAN=ON -DKBCL_MPI=OFF $(CMAKE_ARGS)

tsan: deps $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target test_par test_psim test_fork

test-tsan: tsan
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -L threads -j $(JOBS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
