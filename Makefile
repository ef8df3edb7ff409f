# EDL front door. `make` builds build/edl (Release); `make test` installs deps when missing, builds
# and runs every GoogleTest suite through ctest, then the sanitizer stages (below); `make demo` runs
# the one-machine elastic demo; `make gpu-check` packs build/gpu-check.tar.gz, the one-call proof of
# the GPU path (scripts/build_gpu_check.sh, scripts/gpu_check.sh); `make install PREFIX=/opt/edl`
# installs bin/edl, its libraries, the runtime's headers and CMake package (find_package(edl));
# `make package` writes the Debian package.
# Knobs: BUILD_DIR=build, BUILD_TYPE=Release, JOBS=$(nproc), CTEST_JOBS=4*JOBS,
#        EDL_USE_CUDA=AUTO|ON|OFF, SANITIZE=address,undefined|thread (for BUILD_DIR itself),
#        SANITIZERS=0 (skip the stages). `make format-check` checks the sources against
#        .clang-format and the 100-column limit (`make test` does too, in ScriptsLintTest);
#        scripts/check_format.sh --fix reformats.
#
# Sanitizer stages of `make test`, each a clang tree of its own with EDL_USE_CUDA=OFF (the sanitizers
# check host code; CUDA kernels are out of their reach):
#   build-asan  ASan+UBSan (+ libFuzzer harnesses): every suite but ASAN_EXCLUDE, and the replay of
#               every fuzz seed corpus (tests/fuzz/corpus); bench/fuzz.sh fuzzes with this tree.
#   build-tsan  ThreadSanitizer: the suites that run threads in the test process (TSAN_TESTS).
# Each build directory keeps its configure.log; nothing is written outside build*/. After each ctest
# stage, tests/ctest_report.sh prints how many cases ran, passed, failed and were skipped, and each
# skipped case's reason.
BUILD_DIR  ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
# ctest runs this many cases at once; the cores they ask for (tests/CMakeLists.txt, CORES) never
# exceed the machine's, so the rest are cases that mostly wait (servers, sockets, timeouts).
CTEST_JOBS ?= $(shell echo $$(( 4 * $(JOBS) )))
EDL_USE_CUDA ?= AUTO
SANITIZE   ?=
CTEST_ARGS ?=
SANITIZERS ?= 1
PREFIX     ?= /usr/local
ASAN_DIR   ?= build-asan
TSAN_DIR   ?= build-tsan
ASAN_TARGETS ?=
# Left out under ASan: the end-to-end runs that train ResNets in several processes at once (the
# PyTorch one trains in Python); they exercise no edl code the other suites leave uncovered, and
# under ASan they outlast their deadlines. install_test checks packaging (paths, RUNPATH, the CMake
# package), which sanitizers add nothing to, and its example would need the sanitizer runtime.
# slurm_test checks scripts/slurm/edl.sbatch under a real Slurm, which sanitizers cannot see into;
# the edl server and clients the script starts run the code the control-plane suites check under
# ASan already. The same holds for the launcher binary's shell-script suites (ASAN_EXCLUDE_SUITES:
# scripts/*.sh and their shellcheck; the binary's other suites stay). The PyTorch in-place suites
# need the edl Python module, which the sanitizer trees do not build (a sanitized libedl cannot be
# loaded into an unsanitized python3): there they could only skip. The README's quick start
# (docs_test's QuickStartTest) trains 4 ResNets in as many processes, as the demo does; the docs'
# link check stays.
ASAN_EXCLUDE ?= ^(demo_test|elastic_training_test|distill_test|pytorch_restart_test|pytorch_inplace_test|pytorch_inplace_job_test|install_test|cluster_tutorial_test|slurm_test)\.
ASAN_EXCLUDE_SUITES ?= ^(launcher_test\.Scripts(Lint)?Test|docs_test\.QuickStartTest)\.
# Both select test binaries: every case of binary B is a ctest entry "B.Suite.Case".
# Threads inside the test process: Asio channels, the async checkpoint writer, RocksDB store
# concurrency, Gloo rings of thread-ranks, the elastic trainer's watcher, the batch prefetch thread.
TSAN_TESTS ?= ^(net_test|async_checkpointer_test|checkpoint_store_test|gloo_communicator_test|elastic_trainer_test|resnet50_data_test|resnet50_image_folder_test|teacher_service_test)\.
# The TSan tree builds only those binaries (and `edl`, which every test depends on).
TSAN_TARGETS := $(subst |, ,$(patsubst ^(%)\.,%,$(TSAN_TESTS)))

ASAN_SANITIZERS := address,undefined
# The ASan tree does not build the binaries it does not run (EDL_SKIP_TESTS).
ASAN_SKIP := $(subst |,;,$(patsubst ^(%)\.,%,$(ASAN_EXCLUDE)))
# Expanded when a tree is configured, after `deps` installed ccache (scripts/install_deps.sh).
# CCACHE_BASEDIR: paths under this checkout are hashed relative to it, so a clone elsewhere hits;
# CCACHE_NOHASHDIR: nor does the working directory count where -g is on (the sanitizer trees'
# -g1), as ccache's default hash_dir would have it. What else a clone elsewhere would miss on,
# the tests' paths of the tree, sits in one small generated file (tests/CMakeLists.txt,
# edl_test_path).
CCACHE = $(if $(shell command -v ccache 2>/dev/null),-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1
SAN_CMAKE = -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DEDL_USE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" $(CCACHE)
# Reports name the source line; leaks of the test processes are findings too.
# allocator_may_return_null (ASan and TSan): new(std::nothrow) returns null as the language says (the checkpoint
# store relies on it for damaged sizes) instead of ASan aborting the process.
export ASAN_OPTIONS  ?= detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS  ?= halt_on_error=1:allocator_may_return_null=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp

# $(call cmake_tree,DIR,ARGS): configure DIR; the log stays inside DIR, its summary is printed.
define cmake_tree
	@mkdir -p $(1)
	@cmake -S . -B $(1) $(2) > $(1)/configure.log 2>&1 || { cat $(1)/configure.log; exit 1; }
	@grep -E '^-- (EDL|  )' $(1)/configure.log || true
endef
# $(call timed,LABEL,COMMAND): runs COMMAND and prints how long it took, keeping its exit status.
define timed
	@start=$$(date +%s); $(2); rc=$$?; \
	  echo "== make test: $(1): $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc
endef
# $(call ctest_stage,LABEL,DIR,ARGS[,JOBS]): ctest in DIR (JOBS cases at once, default CTEST_JOBS),
# timed; then every skipped case with its reason and the count of cases run
# (tests/ctest_report.sh), whatever the outcome.
define ctest_stage
	@start=$$(date +%s); (cd $(2) && ctest --output-on-failure -j $(or $(4),$(CTEST_JOBS)) \
	  --resource-spec-file ctest_resources.json $(3) $(CTEST_ARGS)); rc=$$?; \
	  bash tests/ctest_report.sh $(2); \
	  echo "== make test: $(1): $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc
endef

.PHONY: all deps configure build install package test test-unit asan test-asan test-tsan demo bench clean gpu-check format-check

all: build

deps:
	@bash scripts/install_deps.sh

configure:
	$(call cmake_tree,$(BUILD_DIR),-DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DEDL_USE_CUDA=$(EDL_USE_CUDA) -DEDL_SANITIZE=$(SANITIZE) $(CCACHE))

build: deps configure
	$(call timed,build ($(BUILD_DIR)),cmake --build $(BUILD_DIR) -j $(JOBS))

# bin/ and lib/ under PREFIX; the tree can be moved afterwards (bin/edl finds lib/ relative to itself).
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# $(BUILD_DIR)/packages/edl_<version>_<arch>.deb (plus edl-cuda_... in a CUDA build); install it
# with `apt install ./edl_...deb`, which pulls in the Debian libraries it needs.
package: build
	cd $(BUILD_DIR) && cpack -G DEB -B packages

format-check: deps
	@bash scripts/check_format.sh

test-unit: build
	$(call ctest_stage,ctest ($(BUILD_DIR)),$(BUILD_DIR),)

test: test-unit
ifneq ($(SANITIZERS),0)
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory test-tsan
endif

# ASAN_TARGETS: build only these (bench/fuzz.sh builds just the harnesses); empty builds all.
asan: deps
	$(call cmake_tree,$(ASAN_DIR),$(SAN_CMAKE) -DEDL_SANITIZE=$(ASAN_SANITIZERS) -DEDL_FUZZ=ON "-DEDL_SKIP_TESTS=$(ASAN_SKIP)")
	$(call timed,build ($(ASAN_DIR)),cmake --build $(ASAN_DIR) -j $(JOBS) $(if $(ASAN_TARGETS),--target $(ASAN_TARGETS)))

test-asan: asan
	$(call ctest_stage,ctest ASan+UBSan and fuzz corpus replay ($(ASAN_DIR)),$(ASAN_DIR),-E '$(ASAN_EXCLUDE)|$(ASAN_EXCLUDE_SUITES)|_NOT_BUILT$$')

# TSan: JOBS cases at once, not CTEST_JOBS: its cases are in-process rings of thread-ranks that
# keep the cores busy (~10x slower under TSan), and the stage takes ~25 s at JOBS.
test-tsan: deps
	$(call cmake_tree,$(TSAN_DIR),$(SAN_CMAKE) -DEDL_SANITIZE=thread)
	$(call timed,build ($(TSAN_DIR)),cmake --build $(TSAN_DIR) -j $(JOBS) --target $(TSAN_TARGETS))
	$(call ctest_stage,ctest TSan ($(TSAN_DIR)),$(TSAN_DIR),-R '$(TSAN_TESTS)',$(JOBS))

demo: build
	@bash scripts/demo.sh

# build/gpu-check.tar.gz: on a GPU host `tar xzf gpu-check.tar.gz && gpu-check/gpu_check.sh OUT_DIR`.
gpu-check: deps
	@BUILD_DIR=$(BUILD_DIR) JOBS=$(JOBS) bash scripts/build_gpu_check.sh

bench: build
	@for b in bench/*.sh; do echo "== $$b"; bash $$b; done

clean:
	@rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) $(BUILD_DIR).configure.log
