# cuda.mk - the CUDA plugin (build/libkiln_cuda.so), the CUDA-on-CPU
# emulation test of its kernels, and `make gpu-check`'s bundle.
# Included by the top Makefile; CUDA=1 when nvcc exists (CUDA=0 skips the
# plugin; the emulated kernel test needs no CUDA and is always built).

CUDA_ARCHS ?= 75 80 86 89 90
CUDA_PTX ?= 90
CUDA_KERNELS = $(wildcard kernels/cuda/k_*.cu)
CUDA_HOST_SRCS = kernels/cuda/dispatch.cpp kernels/cuda/backend.cpp kernels/cuda/blas.cpp kernels/cuda/doctor_gpu.cpp \
	kernels/cuda/ipc.cpp
CUDA_PLUGIN = $(BUILD)/libkiln_cuda.so

CUDA_DEFS = -DKILN_CUDA_ARCHS='"$(CUDA_ARCHS)"' -DKILN_CUDA_PTX=$(CUDA_PTX)
CUDA_GENCODE = $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
	-gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX)
# Warnings are errors on both sides: host code through -Xcompiler, device
# code through nvcc's own -Werror all-warnings.
NVCCFLAGS ?= -std=c++17 -O3 -lineinfo $(CUDA_GENCODE) -Werror all-warnings \
	-Xcompiler -fPIC,-Wall,-Wextra,-Werror,-Wno-unused-parameter
CUDA_CXXFLAGS = -std=c++17 $(WARN) -Wno-deprecated-declarations $(OPT) $(DEBUG) -fPIC -pthread \
	-I$(CUDA_HOME)/include $(CUDA_DEFS)
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -lcublasLt -lcudnn -lcudart_static -ldl -lrt -lpthread \
	-Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(CUDA_HOME)/lib64

CUDA_KOBJS = $(CUDA_KERNELS:kernels/cuda/%.cu=$(BUILD)/obj/cuda/%.o)
CUDA_HOBJS = $(CUDA_HOST_SRCS:kernels/cuda/%.cpp=$(BUILD)/obj/cuda/%.o)

# ---- emulation harness: the same kernels as host C++ --------------------
EMU_CXXFLAGS = -std=c++17 $(WARN) $(OPT) $(DEBUG) $(SANFLAGS) -pthread -DKILN_CUDA_EMU
EMU_OBJS = $(CUDA_KERNELS:kernels/cuda/%.cu=$(BUILD)/obj/emu/%.o) $(BUILD)/obj/emu/dispatch.o $(BUILD)/obj/emu/emu.o
EMU_TEST = $(BUILD)/tests/kernels/test_cuda_emu
TEST_BINS += $(EMU_TEST)

$(BUILD)/obj/emu/%.o: kernels/cuda/%.cu | $(BUILD)/gen/onnx/onnx.pb-c.h
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(EMU_CXXFLAGS) -x c++ -c $< -o $@

$(BUILD)/obj/emu/dispatch.o: kernels/cuda/dispatch.cpp | $(BUILD)/gen/onnx/onnx.pb-c.h
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(EMU_CXXFLAGS) -c $< -o $@

$(BUILD)/obj/emu/emu.o: kernels/cuda/emu/emu.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(EMU_CXXFLAGS) -c $< -o $@

$(BUILD)/obj/emu/test_cuda_emu.o: tests/kernels/test_cuda_emu.cpp | $(BUILD)/gen/onnx/onnx.pb-c.h
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(EMU_CXXFLAGS) -c $< -o $@

$(EMU_TEST): $(BUILD)/obj/emu/test_cuda_emu.o $(EMU_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) -o $@ $^ $(LDFLAGS) $(LDLIBS) -lcmocka

# ---- the plugin ----------------------------------------------------------
.PHONY: cuda gpu-bundle
ifeq ($(CUDA),1)
cuda: $(CUDA_PLUGIN)

$(BUILD)/obj/cuda/%.o: kernels/cuda/%.cu | $(BUILD)/gen/onnx/onnx.pb-c.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CUDA_DEFS) -I. -I$(BUILD)/gen -D_GNU_SOURCE -MMD -MP -c $< -o $@

$(BUILD)/obj/cuda/%.o: kernels/cuda/%.cpp | $(BUILD)/gen/onnx/onnx.pb-c.h
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CUDA_CXXFLAGS) -c $< -o $@

# kiln's own helpers (op_error, node_attr_*, log_write...) stay undefined
# here: kiln is linked with -rdynamic and provides them at dlopen time.
$(CUDA_PLUGIN): $(CUDA_KOBJS) $(CUDA_HOBJS)
	$(CXX) -shared -o $@ $^ $(CUDA_LIBS)

# The kernel test on a real GPU: the same test source, real kernels.
CUDA_GPU_TEST = $(BUILD)/tests/kernels/test_cuda_gpu
$(BUILD)/obj/cuda/test_cuda_gpu.o: tests/kernels/test_cuda_emu.cpp | $(BUILD)/gen/onnx/onnx.pb-c.h
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CUDA_CXXFLAGS) -c $< -o $@

$(CUDA_GPU_TEST): $(BUILD)/obj/cuda/test_cuda_gpu.o $(CUDA_KOBJS) $(CUDA_HOBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) -o $@ $^ $(LDFLAGS) $(LDLIBS) -lcmocka $(CUDA_LIBS)

gpu-bundle: $(BIN) $(CUDA_PLUGIN) $(CUDA_GPU_TEST) $(EMU_TEST) $(BUILD)/tests/conformance/runner
	@tools/gpu_check.sh --bundle

gpu-check: bootstrap gpu-bundle
	@tools/gpu_check.sh --dry-run
else
cuda:
	@echo "cuda: CUDA=0 (no nvcc): the CUDA plugin is not built"

gpu-bundle gpu-check:
	@echo "gpu-check needs the CUDA toolkit (nvcc) to build the plugin; CUDA=0 here" >&2; exit 1
endif

# ---- GPU metrics test: a fake NVML beside the test binary ------------------
$(BUILD)/tests/server/libfake_nvml.so: tests/server/fake_nvml.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -o $@ $<

$(BUILD)/tests/server/test_gpu_metrics: $(BUILD)/tests/server/libfake_nvml.so
