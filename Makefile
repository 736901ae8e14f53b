# twinloop: the two commands a newcomer needs are `make demo` and `make test`; both set
# up the workspace first (tools/setup.sh is idempotent and returns in about a second
# when nothing changed).
.PHONY: setup demo test bench clean

setup:
	@bash tools/setup.sh

demo: setup
	@tools/in_env.sh twinloop loop

test: setup
	@tools/run_tests.sh

clean:
	rm -rf build install log .venv .pytest_cache
