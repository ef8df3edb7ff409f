# EDL front door. `make` builds build/edl (Release); `make test` installs deps when missing, builds
# and runs every GoogleTest suite through ctest; `make demo` runs the one-machine elastic demo.
# Knobs: BUILD_DIR=build, BUILD_TYPE=Release, JOBS=$(nproc), EDL_USE_CUDA=AUTO|ON|OFF, SANITIZE=address|thread
BUILD_DIR  ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
EDL_USE_CUDA ?= AUTO
SANITIZE   ?=
CTEST_ARGS ?=

.PHONY: all deps configure build test demo bench clean

all: build

deps:
	@bash scripts/install_deps.sh

configure:
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DEDL_USE_CUDA=$(EDL_USE_CUDA) \
	  -DEDL_SANITIZE=$(SANITIZE) > $(BUILD_DIR).configure.log 2>&1 || { cat $(BUILD_DIR).configure.log; exit 1; }
	@grep -E '^-- (EDL|  )' $(BUILD_DIR).configure.log || true

build: deps configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

demo: build
	@bash scripts/demo.sh

bench: build
	@for b in bench/*.sh; do echo "== $$b"; bash $$b; done

clean:
	@rm -rf $(BUILD_DIR) $(BUILD_DIR).configure.log
