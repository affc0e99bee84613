# Entry points. `make test` and `make demo` do all set-up themselves on a fresh machine.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)

.PHONY: setup build test demo bench clean

# Each stage prints its time (CI reads them: the whole of .ci/run must stay under 60 minutes).
setup:
	@start=$$(date +%s); bash scripts/setup.sh; echo "stage setup: $$(( $$(date +%s) - start )) s"

build: setup
	@start=$$(date +%s); cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && \
	  cmake --build $(BUILD_DIR) -j $(JOBS) && echo "stage build: $$(( $$(date +%s) - start )) s"

test: build
	bash scripts/run_tests.sh $(BUILD_DIR)

demo: build
	bash scripts/demo.sh $(BUILD_DIR)

bench: build
	bash bench/fsdp_vs_torch.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
