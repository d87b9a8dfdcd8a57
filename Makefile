# kiln - build, test, run, bench.
#   make                  build build/kiln (and build/libkiln_cuda.so when nvcc exists; CUDA=0 skips)
#   make run              serve model_repository/ on :8000
#   make test             unit tests, conformance, end-to-end tests
#   make SANITIZE=address,undefined test   (or SANITIZE=thread)
#   make conformance | isa | layers | bench | fuzz | gpu-check | clean   (isa: unit + conformance under ONEDNN_MAX_CPU_ISA=AVX2, SSE41)
# Variables: WARN, OPT, DEBUG, SANITIZE, CUDA, BUILD.

BUILD ?= build
CC ?= cc
CXX ?= g++
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA ?= $(if $(NVCC),1,0)
CUDA_HOME ?= /usr/local/cuda

WARN ?= -Wall -Wextra -Werror -Wno-unused-parameter -Wno-format-truncation
OPT ?= -O2 -march=x86-64-v2 -mtune=native
DEBUG ?= -g
SANITIZE ?=
ifneq ($(SANITIZE),)
SANFLAGS = -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
ifneq ($(findstring thread,$(SANITIZE)),)
OPT = -O1
endif
endif

CPPFLAGS += -I. -I$(BUILD)/gen -D_GNU_SOURCE -MMD -MP
CFLAGS += -std=c11 $(WARN) $(OPT) $(DEBUG) $(SANFLAGS) -fopenmp -pthread
LDFLAGS += $(SANFLAGS) -fopenmp -pthread -rdynamic
LDLIBS += -levent -levent_pthreads -lcjson -lhiredis -ldnnl -lprotobuf-c -lnghttp2 -lsodium -lcrypto -lpcre2-8 -lutf8proc -ljpeg -lpng -lwebp -lz -ldl -lm

# Every .c under these folders is part of libkiln, except commands/main.c.
SRC_DIRS = common config graph models kernels kernels/cpu kernels/text cache server commands
SRCS = $(filter-out commands/main.c,$(foreach d,$(SRC_DIRS),$(wildcard $(d)/*.c)))
GEN_SRCS = $(BUILD)/gen/onnx/onnx.pb-c.c $(TRITON_GEN:%=$(BUILD)/gen/triton/%.pb-c.c)
OBJS = $(SRCS:%.c=$(BUILD)/obj/%.o) $(GEN_SRCS:$(BUILD)/gen/%.c=$(BUILD)/obj/gen/%.o)
LIB = $(BUILD)/libkiln.a
BIN = $(BUILD)/kiln

TEST_SRCS = $(wildcard tests/*/test_*.c)
TEST_BINS = $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
FUZZ_SRCS = $(wildcard tests/fuzz/fuzz_*.c)

ONNX_PROTO ?= /usr/include/onnx/onnx.proto
# The gRPC service's schema: the descriptors inside the pinned tritonclient
# wheel (requirements-dev.txt), which bootstrap installs into .venv.
TRITON_GEN = grpc_service model_config
TRITONCLIENT ?= .venv

.PHONY: all bootstrap run test unit isa conformance e2e bench fuzz gpu-check clean cuda deploy-check layers sanitize \
	fleet-test image-check
all: bootstrap $(BIN) cuda

bootstrap:
	@tools/bootstrap.sh

# protobuf-c code is generated from the schema Debian's libonnx-dev ships.
$(BUILD)/gen/onnx/onnx.pb-c.c $(BUILD)/gen/onnx/onnx.pb-c.h: $(ONNX_PROTO)
	@mkdir -p $(BUILD)/gen
	protoc-c --proto_path=$(patsubst %/onnx/,%,$(dir $(ONNX_PROTO))) --c_out=$(BUILD)/gen $(ONNX_PROTO)

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -w -c $< -o $@

# gRPC: no copy of Triton's .proto files here. tools/grpc_descriptors.py
# reads the FileDescriptorProtos the tritonclient package carries and
# protoc-c generates C from them.
$(BUILD)/gen/triton/descriptors.pb: tools/grpc_descriptors.py requirements-dev.txt | bootstrap
	@mkdir -p $(dir $@)
	python3 tools/grpc_descriptors.py $(TRITONCLIENT) $@

$(TRITON_GEN:%=$(BUILD)/gen/triton/%.pb-c.c) $(TRITON_GEN:%=$(BUILD)/gen/triton/%.pb-c.h) &: $(BUILD)/gen/triton/descriptors.pb
	protoc-c --descriptor_set_in=$< --c_out=$(BUILD)/gen/triton $(TRITON_GEN:%=%.proto)

# Everything that includes generated headers waits for them.
$(OBJS) $(BUILD)/obj/commands/main.o: | $(BUILD)/gen/onnx/onnx.pb-c.h $(BUILD)/gen/triton/grpc_service.pb-c.h

# The schema comes from a package that bootstrap installs: under make -j the
# generator must wait for it.
$(ONNX_PROTO): | bootstrap
	@test -f $@ || { echo "$@ is missing: install libonnx-dev (tools/bootstrap.sh)" >&2; exit 1; }

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(LIB): $(OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(BUILD)/obj/commands/main.o $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(LIB) $(LDFLAGS) $(LDLIBS) -lcmocka

# ---- CUDA plugin --------------------------------------------------------
-include kernels/cuda/cuda.mk

# ---- tests --------------------------------------------------------------
unit: $(TEST_BINS)
	@tools/run_unit_tests.sh $(TEST_BINS)

# oneDNN picks other code (and other memory formats) per CPU: the unit tests
# and the conformance suite run again with each narrower ISA a user's CPU may
# have, so an AVX2-only or SSE4.1 machine's paths are tested on any machine.
# kiln's own kernels are compiled for x86-64-v2; the few built for wider
# vectors too pick theirs by oneDNN's effective ISA (dnnl_util_isa_level),
# so the cap reaches every path. Others: make isa ISAS='AVX AVX512_CORE'.
ISAS ?= AVX2 SSE41
isa: $(TEST_BINS) $(BUILD)/tests/conformance/runner
	@for isa in $(ISAS); do \
	    echo "isa: ONEDNN_MAX_CPU_ISA=$$isa"; \
	    ONEDNN_MAX_CPU_ISA=$$isa tools/run_unit_tests.sh $(TEST_BINS) || exit 1; \
	    ONEDNN_MAX_CPU_ISA=$$isa BUILD=$(BUILD) tools/conformance.sh >$(BUILD)/conformance-$$isa.log 2>&1 \
	        || { cat $(BUILD)/conformance-$$isa.log; exit 1; }; \
	    tail -1 $(BUILD)/conformance-$$isa.log; \
	done

conformance: bootstrap $(BIN)
	@BUILD=$(BUILD) tools/conformance.sh

e2e: bootstrap $(BIN)
	@KILN_BIN=$(BIN) tools/e2e.sh

# Three replicas, HAProxy and Redis under faults (part of e2e too); prints the report.
fleet-test: bootstrap $(BIN)
	@KILN_BIN=$(BIN) .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/e2e/test_fleet.py

# Builds docker/Dockerfile.cpu (Docker, else buildah), runs the image and the
# smoke tests against it; lints docker/Dockerfile (CUDA).
image-check: bootstrap
	@tools/image_check.sh

deploy-check:
	@tools/deploy_check.sh
	@tools/compose_check.sh

# No include points from a lower layer to a higher one (order in the script).
layers:
	@tools/layers.sh

# The whole suite again under ASan+UBSan (own build folder, no CUDA plugin),
# and the batcher's unit test under TSan: what CI runs after `make test`.
# Every suite runs with KILN_TEST_RUN set, and tools/procs.sh then fails the
# run if any process a test started (a kiln, a redis-server) is still alive.
sanitize: export KILN_TEST_RUN := sanitize-$(shell date +%s%N)
sanitize:
	@$(MAKE) --no-print-directory BUILD=build/asan SANITIZE=address,undefined CUDA=0 build/asan/kiln unit conformance e2e
	@$(MAKE) --no-print-directory BUILD=build/tsan SANITIZE=thread CUDA=0 build/tsan/tests/server/test_batcher
	@TSAN_OPTIONS="suppressions=$(CURDIR)/tools/tsan.supp $$TSAN_OPTIONS" build/tsan/tests/server/test_batcher
	@tools/procs.sh check

test: export KILN_TEST_RUN := test-$(shell date +%s%N)
test: bootstrap all
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory conformance
	@$(MAKE) --no-print-directory isa
	@$(MAKE) --no-print-directory layers
	@$(MAKE) --no-print-directory deploy-check
	@$(MAKE) --no-print-directory e2e
	@tools/procs.sh check

run: bootstrap all
	$(BIN) serve --model-repository model_repository --http-port 8000

bench: bootstrap all
	@bench/run.sh

fuzz: bootstrap
	@tools/fuzz.sh

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj $(BUILD)/tests -name '*.d' 2>/dev/null)

# ---- install (used by the container images) ----------------------------
PREFIX ?= /usr/local
.PHONY: install
install: $(BIN)
	install -d $(PREFIX)/bin
	install -m 755 $(BIN) $(PREFIX)/bin/kiln
	if [ -f $(BUILD)/libkiln_cuda.so ]; then install -m 755 $(BUILD)/libkiln_cuda.so $(PREFIX)/bin/; fi

# ---- conformance runner (tests/conformance/runner.c, built by the tests rule) ----
conformance: $(BUILD)/tests/conformance/runner

# ---- benchmark peers ----------------------------------------------------
$(BUILD)/ceiling: bench/ceiling.c
	@mkdir -p $(BUILD)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -levent -lpthread

# An AVX2-only CPU for one process tree (bench/cpuid_avx2.c, LD_PRELOAD).
$(BUILD)/libcpuid_avx2.so: bench/cpuid_avx2.c
	@mkdir -p $(BUILD)
	$(CC) -D_GNU_SOURCE -std=c11 $(WARN) -O2 -shared -fPIC -o $@ $<

# Cache key candidates (bench/hash.c); OpenSSL's SHA-256 is measured too when libcrypto is there.
HASH_OPENSSL := $(shell pkg-config --exists libcrypto 2>/dev/null && echo 1)
$(BUILD)/hash_bench: bench/hash.c
	@mkdir -p $(BUILD)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(if $(HASH_OPENSSL),-DHAVE_OPENSSL) -o $@ $< -lsodium $(if $(HASH_OPENSSL),-lcrypto)
