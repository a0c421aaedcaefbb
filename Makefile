# zeroshard quickstart targets. `make demo` and `make test` work on a fresh
# Debian machine as root: they install what is missing, configure, build and run.
# docs/testing.md describes the test, fuzz and sanitizer targets.

BUILD_DIR ?= build
ASAN_BUILD_DIR ?= build-asan
TSAN_BUILD_DIR ?= build-tsan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEMO_ARGS ?=
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?= -1
FUZZ_TIMEOUT ?= 10
FUZZ_RSS_MB ?= 2048
# `make perf`: extra arguments of perf/run_perf.sh (--no-mpi, --price X, --out DIR).
PERF_ARGS ?=

# fortunes: the GPT example's default text corpus (/usr/share/games/fortunes,
# examples/gpt/text_data.h); data files only, about 2.7 MB.
APT_PACKAGES := build-essential cmake pkg-config libabsl-dev nlohmann-json3-dev \
	libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin libopenblas-dev \
	fortunes liburing-dev ccache
# clang with its libFuzzer and sanitizer runtimes, and llvm-symbolizer for
# readable reports: the fuzz smoke run in `make test` and the sanitizer builds.
CLANG_APT_PACKAGES := clang libclang-rt-dev llvm
# Headless Chromium renders the perf report's charts to PNG (perf/report/screenshot.sh).
PERF_APT_PACKAGES := chromium

FUZZ_TARGETS := hf_config_fuzzer spec_json_fuzzer estimate_args_fuzzer safetensors_header_fuzzer \
                latest_fuzzer rank_header_fuzzer \
                manifest_fuzzer
# The thread-heavy tests that run under ThreadSanitizer: every in-process
# multi-rank test (local communicator, engine, trainer, planner vs ledger,
# checkpoints: the background writer thread, the CPU streams) and
# the ledger's concurrent-update test, the swap files' I/O threads. MPI tests stay out
# (separate processes).
TSAN_TESTS := comm_local_test device_test engine_test engine_stage3_test engine_tied_frozen_test engine_memory_test \
	mlp_trainer_test mlp_data_loader_test engine_step_times_test plan_vs_ledger_test checkpoint_test \
	checkpoint_directory_test checkpoint_recovery_test \
	device_ops_test engine_opaque_device_test swap_files_test engine_offload_test \
	comm_collective_batch_test grad_reducer_test param_gatherer_test grad_norm_test checkpoint_writer_test \
	quantized_reduce_scatter_test engine_zeropp_test engine_frozen_replica_test gpt_grid_trainer_test

# Sanitizer builds: clang, optimised with line info, CPU only.
CLANG_CMAKE_FLAGS := -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo -DZS_CUDA=OFF
# MAKELEVEL/MAKEFLAGS unset: the build's own make need not print every directory.
CMAKE_BUILD := env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS cmake --build

empty :=
space := $(empty) $(empty)
TSAN_TEST_REGEX := ^($(subst $(space),|,$(strip $(TSAN_TESTS))))$$

.PHONY: all deps deps-clang configure build demo test fuzz-build fuzz test-asan test-tsan \
	sanitize bench perf deps-perf clean format

all: build

# $(call apt_install,PACKAGES): installs the missing ones (needs root; a no-op
# when all are there).
define apt_install
@missing=""; for p in $(1); do \
  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
done; \
if [ -n "$$missing" ]; then \
  echo "zeroshard: installing$$missing"; \
  if [ "$$(id -u)" != "0" ]; then echo "zeroshard: missing packages:$$missing; run as root or install them" >&2; exit 1; fi; \
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
fi
endef

deps:
	$(call apt_install,$(APT_PACKAGES))

deps-clang: deps
	$(call apt_install,$(CLANG_APT_PACKAGES))

deps-perf: deps
	$(call apt_install,$(PERF_APT_PACKAGES))

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

# One clang build directory with ASan+UBSan serves both the fuzz targets and
# the sanitized test suite, so the libraries they share compile once. The
# benchmarks are left out there: their smoke tests run in `make test`, and
# compiling them again under ASan cost CI minutes it does not have.
$(ASAN_BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD_DIR) $(CLANG_CMAKE_FLAGS) -DZS_SANITIZE=address -DZS_FUZZ=ON \
	  -DZS_BUILD_PERF=OFF

$(TSAN_BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(TSAN_BUILD_DIR) $(CLANG_CMAKE_FLAGS) -DZS_SANITIZE=thread -DZS_MPI=OFF

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	$(CMAKE_BUILD) $(BUILD_DIR) -j $(JOBS)

demo: build
	$(BUILD_DIR)/examples/mlp/mlp_demo $(DEMO_ARGS)

# The whole suite (gcc, CUDA compiled when nvcc is there), then a few seconds
# of every fuzz target (clang, ASan+UBSan; ctest label `fuzz`).
test: build fuzz-build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --output-junit ctest-test.xml
	cd $(ASAN_BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -L fuzz --output-junit ctest-fuzz.xml

# Only the fuzz targets and the libraries they link.
fuzz-build: deps-clang $(ASAN_BUILD_DIR)/CMakeCache.txt
	$(CMAKE_BUILD) $(ASAN_BUILD_DIR) -j $(JOBS) --target zs_fuzz_targets

# Each target for FUZZ_SECONDS (0: no limit) or FUZZ_RUNS executions (-1: no
# limit), whichever ends first; stops at the first crash, hang, out-of-memory
# or sanitizer report and prints its reproducer.
fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	  FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_TIMEOUT=$(FUZZ_TIMEOUT) \
	    FUZZ_RSS_MB=$(FUZZ_RSS_MB) tests/fuzz/run_fuzzer.sh \
	    $(ASAN_BUILD_DIR)/tests/fuzz/$$t $(ASAN_BUILD_DIR)/fuzz/$$t || exit $$?; \
	done

# The whole suite under ASan+UBSan (MPI included); the fuzz smoke runs in `make test`.
test-asan: deps-clang $(ASAN_BUILD_DIR)/CMakeCache.txt
	$(CMAKE_BUILD) $(ASAN_BUILD_DIR) -j $(JOBS)
	cd $(ASAN_BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE fuzz --output-junit ctest-asan.xml

# TSAN_TESTS under ThreadSanitizer.
test-tsan: deps-clang $(TSAN_BUILD_DIR)/CMakeCache.txt
	@# Re-configure first: make reads the target list before a stale build
	@# tree regenerates, and would not know a test added since.
	cmake -S . -B $(TSAN_BUILD_DIR) >/dev/null
	$(CMAKE_BUILD) $(TSAN_BUILD_DIR) -j $(JOBS) --target $(TSAN_TESTS)
	cd $(TSAN_BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -R '$(TSAN_TEST_REGEX)' \
	  --output-junit ctest-tsan.xml

sanitize: test-asan test-tsan

bench: build
	$(BUILD_DIR)/perf/kernels/adam_bench

# Every layer with the full settings (docs/perf.md): kernels, collectives per
# backend, the engine step for stages 0-3 on 1, 2, 4 ranks; JSON, report.md,
# report.html, SVG charts and their PNGs under $(BUILD_DIR)/perf/. About 5-10
# minutes on two cores. Not part of `make test`, which runs a smoke version
# (ctest perf_pipeline_smoke).
perf: deps-perf configure
	$(CMAKE_BUILD) $(BUILD_DIR) -j $(JOBS) --target adam_bench collective_bench step_bench offload_bench zeroshard_cli \
		zeroshard_calibrate mlp_demo
	perf/run_perf.sh --build-dir $(BUILD_DIR) $(PERF_ARGS)

format:
	find engine kernels tools examples tests perf -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) $(ASAN_BUILD_DIR) $(TSAN_BUILD_DIR)
