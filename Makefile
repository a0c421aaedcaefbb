# zeroshard quickstart targets. `make demo` and `make test` work on a fresh
# Debian machine as root: they install what is missing, configure, build and run.

BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEMO_ARGS ?=

APT_PACKAGES := build-essential cmake pkg-config libabsl-dev nlohmann-json3-dev \
	libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin libopenblas-dev

.PHONY: all deps configure build demo test bench clean format

all: build

# Installs the Debian packages that are missing (needs root; a no-op when all are there).
deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "zeroshard: installing$$missing"; \
	  if [ "$$(id -u)" != "0" ]; then echo "zeroshard: missing packages:$$missing; run as root or install them" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: deps $(BUILD_DIR)/CMakeCache.txt

# MAKELEVEL/MAKEFLAGS unset: the build's own make need not print every directory.
build: configure
	env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	$(BUILD_DIR)/examples/mlp/mlp_demo $(DEMO_ARGS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

bench: build
	$(BUILD_DIR)/perf/kernels/adam_bench

format:
	find engine kernels tools examples tests perf -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
