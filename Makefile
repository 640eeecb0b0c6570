# The front door. Every target installs missing Debian packages and configures CMake first.
#   make run     the main job with defaults: a federated simulation on Fashion-MNIST
#                (100 clients, 10 per round, Dirichlet(0.5), FedAvg, MLP 784-100-10, 200 rounds)
#   make tour    the tour of the examples
#   make test    build everything and run the tests
#   make bench   run the benchmark suites (and the CAF anchor side by side when installed)
#   make tsan    build and run the actor runtime's and the pipeline runtime's tests under ThreadSanitizer
#   make asan    build and run the unit tests under AddressSanitizer + UBSan
#   make fuzz    build the libFuzzer targets with clang (the frame decoder, load_npz, the PSI decoder, the
#                HTTP router, the cluster status report, the DCAP quote parser, the norm proofs' decoder, the
#                enclave's decoders) and run each (FUZZ_SECONDS apiece, 60)
#   make package build everything and make the Debian packages libtroupe-dev and troupe in
#                $(BUILD)/ (CPack; install them with apt install ./build/*.deb)
#   make install cmake --install into PREFIX (default /usr/local)

BUILD      ?= build
TSAN_BUILD ?= build-tsan
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS       ?= $(shell nproc)
GENERATOR  := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")
CMAKE_ARGS ?=
PREFIX     ?= /usr/local

.PHONY: all deps deps-bench configure build run tour test bench tsan asan fuzz package install clean

all: build

deps:
	@cmake/install-deps.sh

deps-bench:
	@cmake/install-deps.sh --bench

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/bin/troupe fedsim

tour: build
	@examples/tour.sh $(BUILD)/bin

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

package: build
	cmake --build $(BUILD) --target package

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

bench: deps-bench configure
	cmake --build $(BUILD) -j $(JOBS)
	@if [ -x $(BUILD)/bin/caf_bench ]; then tests/bench/compare.sh --build $(BUILD); \
	else $(BUILD)/bin/troupe bench actors; fi

$(TSAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(TSAN_BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DTROUPE_SANITIZE=thread -DTROUPE_WITH_CUDA=OFF -DTROUPE_BUILD_BENCH=OFF \
	  -DTROUPE_BUILD_EXAMPLES=OFF $(CMAKE_ARGS)

tsan: deps $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target actors_test pipeline_test kernels_test
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" TROUPE_STRESS_SCALE=small \
	  $(TSAN_BUILD)/bin/actors_test
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  $(TSAN_BUILD)/bin/pipeline_test --gtest_filter='Runtime*:*RuntimeSchedules*:GptPipeline*:*GptSchedules*:Checkpoint*:*ResumedTraining*:MeasuredTimeline*'
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  $(TSAN_BUILD)/bin/kernels_test --gtest_filter='JobPool.*:OptimizerStorage.ResultsAreIdenticalForAnyThreadCount'

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DTROUPE_SANITIZE=address,undefined -DTROUPE_WITH_CUDA=OFF -DTROUPE_BUILD_BENCH=OFF \
	  -DTROUPE_BUILD_EXAMPLES=OFF $(CMAKE_ARGS)

asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target actors_test core_test pipeline_test kernels_test federated_test
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  TROUPE_STRESS_SCALE=small $(ASAN_BUILD)/bin/actors_test
	ASAN_OPTIONS=detect_leaks=1 $(ASAN_BUILD)/bin/core_test
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(ASAN_BUILD)/bin/pipeline_test
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(ASAN_BUILD)/bin/kernels_test
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(ASAN_BUILD)/bin/federated_test

$(FUZZ_BUILD)/CMakeCache.txt:
	cmake -S . -B $(FUZZ_BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++ -DTROUPE_FUZZ=ON -DTROUPE_WITH_CUDA=OFF -DTROUPE_BUILD_TESTS=OFF \
	  -DTROUPE_BUILD_BENCH=OFF -DTROUPE_BUILD_EXAMPLES=OFF $(CMAKE_ARGS)

# Seeds are valid frames written by frame_fuzz_seeds; what the fuzzer finds accumulates in
# $(FUZZ_BUILD)/corpus, crashes land in $(FUZZ_BUILD)/crashes.
# npz_fuzz's seeds are valid .npz archives and .npy arrays written by npz_fuzz_seeds; its corpus
# is $(FUZZ_BUILD)/npz-corpus, its crashes land in $(FUZZ_BUILD)/crashes/npz-*.
fuzz: deps $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target frame_fuzz frame_fuzz_seeds
	rm -rf $(FUZZ_BUILD)/seeds && mkdir -p $(FUZZ_BUILD)/seeds $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/crashes
	$(FUZZ_BUILD)/bin/frame_fuzz_seeds $(FUZZ_BUILD)/seeds
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 TROUPE_LOG_LEVEL=off \
	  $(FUZZ_BUILD)/bin/frame_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -rss_limit_mb=2048 \
	  -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/ \
	  $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/seeds
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target npz_fuzz npz_fuzz_seeds
	rm -rf $(FUZZ_BUILD)/npz-seeds && mkdir -p $(FUZZ_BUILD)/npz-seeds $(FUZZ_BUILD)/npz-corpus
	$(FUZZ_BUILD)/bin/npz_fuzz_seeds $(FUZZ_BUILD)/npz-seeds
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(FUZZ_BUILD)/bin/npz_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -rss_limit_mb=2048 \
	  -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/npz- \
	  $(FUZZ_BUILD)/npz-corpus $(FUZZ_BUILD)/npz-seeds
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target psi_fuzz psi_fuzz_seeds
	rm -rf $(FUZZ_BUILD)/psi-seeds && mkdir -p $(FUZZ_BUILD)/psi-seeds $(FUZZ_BUILD)/psi-corpus
	$(FUZZ_BUILD)/bin/psi_fuzz_seeds $(FUZZ_BUILD)/psi-seeds
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(FUZZ_BUILD)/bin/psi_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=2049 -rss_limit_mb=2048 \
	  -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/psi- \
	  $(FUZZ_BUILD)/psi-corpus $(FUZZ_BUILD)/psi-seeds
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target http_fuzz
	rm -rf $(FUZZ_BUILD)/http-seeds && mkdir -p $(FUZZ_BUILD)/http-seeds $(FUZZ_BUILD)/http-corpus
	printf 'GET\n/api/state?a=1&b=%%20\nBearer fuzz-token-0123456789\n\n' >$(FUZZ_BUILD)/http-seeds/bearer
	printf 'POST\n/login\n\na=1; troupe_session=abc\ntoken=fuzz-token-0123456789' >$(FUZZ_BUILD)/http-seeds/login
	printf 'GET\n/%%zz\nBasic x\n\n' >$(FUZZ_BUILD)/http-seeds/bad-escape
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(FUZZ_BUILD)/bin/http_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -rss_limit_mb=2048 \
	  -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/http- \
	  $(FUZZ_BUILD)/http-corpus $(FUZZ_BUILD)/http-seeds
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target status_fuzz
	mkdir -p $(FUZZ_BUILD)/status-corpus
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(FUZZ_BUILD)/bin/status_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -rss_limit_mb=2048 \
	  -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/status- \
	  $(FUZZ_BUILD)/status-corpus
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target dcap_fuzz dcap_fuzz_seeds
	rm -rf $(FUZZ_BUILD)/dcap-seeds && mkdir -p $(FUZZ_BUILD)/dcap-seeds $(FUZZ_BUILD)/dcap-corpus
	$(FUZZ_BUILD)/bin/dcap_fuzz_seeds $(FUZZ_BUILD)/dcap-seeds
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(FUZZ_BUILD)/bin/dcap_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -rss_limit_mb=2048 \
	  -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/dcap- \
	  $(FUZZ_BUILD)/dcap-corpus $(FUZZ_BUILD)/dcap-seeds
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target zk_fuzz zk_fuzz_seeds
	rm -rf $(FUZZ_BUILD)/zk-seeds && mkdir -p $(FUZZ_BUILD)/zk-seeds $(FUZZ_BUILD)/zk-corpus
	$(FUZZ_BUILD)/bin/zk_fuzz_seeds $(FUZZ_BUILD)/zk-seeds
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(FUZZ_BUILD)/bin/zk_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4097 -rss_limit_mb=2048 \
	  -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/zk- \
	  $(FUZZ_BUILD)/zk-corpus $(FUZZ_BUILD)/zk-seeds
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target tee_fuzz tee_fuzz_seeds
	rm -rf $(FUZZ_BUILD)/tee-seeds && mkdir -p $(FUZZ_BUILD)/tee-seeds $(FUZZ_BUILD)/tee-corpus
	$(FUZZ_BUILD)/bin/tee_fuzz_seeds $(FUZZ_BUILD)/tee-seeds
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(FUZZ_BUILD)/bin/tee_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -rss_limit_mb=2048 \
	  -timeout=10 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/tee- \
	  $(FUZZ_BUILD)/tee-corpus $(FUZZ_BUILD)/tee-seeds

clean:
	rm -rf $(BUILD) $(TSAN_BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
