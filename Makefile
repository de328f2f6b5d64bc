# k3 — one Makefile. Objects go to build/ (build/san with SANITIZE=1); CUDA sources are
# compiled whenever nvcc exists, otherwise a CPU-only binary is built. The CUDA objects live in
# build/ for both: nvcc's flags do not change with SANITIZE, and compiling them twice cost CI
# ~3.5 minutes (2 cores).
# Every src/**/*.c (except src/cli) goes into build/libk3.a, every tests/test_*.c becomes
# one test binary, every fuzz/fuzz_*.c one libFuzzer target: adding a file needs no edit here.

CC       ?= cc
NVCC     ?= $(shell command -v nvcc 2>/dev/null)
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a
SANITIZE ?= 0
FUZZ_SECONDS ?= 60

BUILD := build
SANFLAGS :=
ifeq ($(SANITIZE),1)
BUILD := build/san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
endif

CFLAGS  ?= -O2 -g
override CFLAGS += -std=c11 -Wall -Wextra -Werror -Wshadow -Wvla -D_GNU_SOURCE -pthread \
           -Iinclude -Isrc -MMD -MP $(SANFLAGS)
LDLIBS  := -lcjson -lpcre2-8 -lm -pthread $(SANFLAGS)

LIB_C   := $(shell find src -name '*.c' -not -path 'src/cli/*' | sort)
CLI_C   := $(sort $(wildcard src/cli/*.c))
CU_SRC  := $(sort $(wildcard src/cuda/*.cu))
TEST_C  := $(sort $(wildcard tests/test_*.c))
TOOL_C  := $(sort $(wildcard tests/tools/*.c))
FUZZ_C  := $(sort $(wildcard fuzz/fuzz_*.c))

ifneq ($(NVCC),)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
override CFLAGS += -DK3_HAVE_CUDA=1
LIB_C  := $(filter-out src/cuda/cuda_absent.c,$(LIB_C))
CU_OBJ := $(patsubst %.cu,build/%.o,$(CU_SRC))
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
NVFLAGS := -O3 -std=c++17 $(CUDA_ARCH) -Isrc -Iinclude -Xcompiler -fPIC,-Wall \
           --resource-usage -lineinfo --compress-mode=size -MMD -MP
else
CU_OBJ :=
endif

LIB_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(LIB_C)) $(CU_OBJ)
CLI_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(CLI_C))
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_C))
TOOL_BIN := $(patsubst tests/tools/%.c,$(BUILD)/tests/tools/%,$(TOOL_C))
FUZZ_BIN := $(patsubst fuzz/%.c,build/fuzz/%,$(FUZZ_C))

.PHONY: all help test test-san demo format fuzz clean deps
all: $(BUILD)/k3 $(TEST_BIN) $(TOOL_BIN)

help:
	@echo "k3 targets:"
	@echo "  make            build build/k3, build/libk3.a and the test binaries"
	@echo "  make demo       the main job on the built-in tiny model (installs missing packages)"
	@echo "  make test       all tests: C (cmocka) and Python oracles (installs missing packages)"
	@echo "  make test-san   the whole test suite under ASan+UBSan (build/san)"
	@echo "  make fuzz       each libFuzzer target for FUZZ_SECONDS=$(FUZZ_SECONDS) s"
	@echo "  make format     clang-format every C, CUDA and header file"
	@echo "  make clean      remove build/"
	@echo "variables: SANITIZE=1  CUDA_ARCH='$(CUDA_ARCH)'  NVCC=path|''  CC=cc"

deps:
	@tools/install-deps

# Rebuilt from scratch: `ar r` keeps members no longer listed, so a CUDA build followed by an
# NVCC= build (or the reverse) would leave device code and its CPU stand-in in one archive.
$(BUILD)/libk3.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/k3: $(CLI_OBJ) $(BUILD)/libk3.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libk3.a $(LDLIBS)

# The build commit is baked into status.o, rebuilt only when the commit (or -dirty) changes.
K3_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
COMMIT_STAMP := $(BUILD)/commit.stamp
$(shell mkdir -p $(BUILD); [ "$$(cat $(COMMIT_STAMP) 2>/dev/null)" = '$(K3_COMMIT)' ] || printf '%s' '$(K3_COMMIT)' > $(COMMIT_STAMP))
$(BUILD)/src/base/status.o: override CFLAGS += -DK3_COMMIT='"$(K3_COMMIT)"'
$(BUILD)/src/base/status.o: $(COMMIT_STAMP)

# Objects depend on a stamp of the compiler and flags, so changing CC, CFLAGS, NVCC or
# CUDA_ARCH rebuilds what they affect instead of linking stale objects.
FLAGS_STAMP := $(BUILD)/flags.stamp
FLAGS_NOW := $(CC) $(CFLAGS)
$(shell mkdir -p $(BUILD); [ "$$(cat $(FLAGS_STAMP) 2>/dev/null)" = '$(FLAGS_NOW)' ] || printf '%s' '$(FLAGS_NOW)' > $(FLAGS_STAMP))
NV_STAMP := build/nvflags.stamp
NV_NOW := $(NVCC) $(NVFLAGS)
$(shell mkdir -p build; [ "$$(cat $(NV_STAMP) 2>/dev/null)" = '$(NV_NOW)' ] || printf '%s' '$(NV_NOW)' > $(NV_STAMP))

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

# tools/nvcc-checked fails a unit whose ptxas serialized a kernel's wgmma (C7512 or C7514).
build/%.o: %.cu $(NV_STAMP)
	@mkdir -p $(@D)
	tools/nvcc-checked $(NVCC) $(NVFLAGS) -c -o $@ $<

$(BUILD)/tests/%: tests/%.c $(BUILD)/libk3.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libk3.a -lcmocka $(LDLIBS)

# Helper programs the Python oracle tests drive (not run by the test runner themselves).
$(BUILD)/tests/tools/%: tests/tools/%.c $(BUILD)/libk3.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libk3.a $(LDLIBS)

# deps runs before anything is compiled, also under -j (a fresh machine has no headers yet).
test: deps
	@$(MAKE) --no-print-directory all
	@tools/run-tests $(BUILD)

test-san:
	@$(MAKE) --no-print-directory SANITIZE=1 test

demo: deps
	@$(MAKE) --no-print-directory $(BUILD)/k3
	@tools/demo $(BUILD)

# libFuzzer targets link the library sources, compiled once by clang with the fuzzer's
# instrumentation (build/fuzz/obj), with the fuzzer runtime. The CPU library only: cuda_absent.c
# stands in for the CUDA sources.
FUZZ_CFLAGS := -std=c11 -g -O1 -D_GNU_SOURCE -Iinclude -Isrc -fsanitize=fuzzer,address,undefined
FUZZ_OBJ := $(patsubst %.c,build/fuzz/obj/%.o,$(filter-out src/cuda/%,$(LIB_C)) src/cuda/cuda_absent.c)
FUZZ_STAMP := build/fuzz/flags.stamp
$(shell mkdir -p build/fuzz; [ "$$(cat $(FUZZ_STAMP) 2>/dev/null)" = '$(FUZZ_CFLAGS)' ] || printf '%s' '$(FUZZ_CFLAGS)' > $(FUZZ_STAMP))
build/fuzz/obj/%.o: %.c $(FUZZ_STAMP)
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -MMD -MP -c -o $@ $<

build/fuzz/%: fuzz/%.c $(FUZZ_OBJ)
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_OBJ) -lcjson -lpcre2-8 -lm -pthread

fuzz: deps
	@$(MAKE) --no-print-directory $(FUZZ_BIN)
	@for f in $(FUZZ_BIN); do n=$$(basename $$f); mkdir -p build/fuzz/corpus-$$n; \
	  echo "fuzz: $$n for $(FUZZ_SECONDS) s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 build/fuzz/corpus-$$n fuzz/corpus/$$n || exit 1; done

format:
	clang-format -i $$(find $(wildcard include src tests fuzz lab) -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh')

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)
