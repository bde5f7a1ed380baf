# Runs ${PROGRAM} with a new, empty directory as its one argument and
# removes the directory afterwards, whatever the program's exit. The
# directory is made under $STRATA_TEST_TMPDIR, else ${ROOT} (the build
# tree's test-scratch: a real disk, so O_DIRECT works), as
# tests/capi/c_scratch.h does for the C ABI tests.
#   cmake -DPROGRAM=<program> -DROOT=<dir> -P run_in_scratch.cmake
if(NOT "$ENV{STRATA_TEST_TMPDIR}" STREQUAL "")
  set(ROOT "$ENV{STRATA_TEST_TMPDIR}")
endif()
get_filename_component(name "${PROGRAM}" NAME)
string(RANDOM LENGTH 10 tag)
set(dir "${ROOT}/${name}-${tag}")
if(EXISTS "${dir}")
  message(FATAL_ERROR "${dir} exists already; run the test again")
endif()
file(MAKE_DIRECTORY "${dir}")
execute_process(COMMAND "${PROGRAM}" "${dir}" RESULT_VARIABLE rc)
file(REMOVE_RECURSE "${dir}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${name} ${dir} exited with ${rc}")
endif()
