# Runs the Python package's pytest suite with ${PYTHON} on ${PYTEST_ARGS}
# (paths and options, separated by spaces), or fails naming the step that
# makes that Python (scripts/setup.sh, strata_torch_venv).
if(NOT EXISTS "${PYTHON}")
  message(FATAL_ERROR "python.pytest: ${PYTHON} does not exist; run "
    "`source scripts/setup.sh && strata_torch_venv` (scripts/test.sh does) "
    "or configure with -DSTRATA_PYTHON=<a python with torch>=2.1 and pytest>")
endif()
separate_arguments(args UNIX_COMMAND "${PYTEST_ARGS}")
execute_process(COMMAND "${PYTHON}" -m pytest -q -p no:cacheprovider ${args}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "python.pytest: pytest exited with ${rc}")
endif()
