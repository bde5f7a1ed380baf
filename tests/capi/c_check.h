/* Checks for the C ABI tests, which are C programs: a failed check prints
 * file:line, the expression and strata's last error, and exits 1. */
#ifndef STRATA_TESTS_CAPI_C_CHECK_H_
#define STRATA_TESTS_CAPI_C_CHECK_H_

#include <stdio.h>
#include <stdlib.h>

#include "strata/strata.h"

static void Die(const char* file, int line, const char* what,
                strata_status status) {
  fprintf(stderr, "%s:%d: FAILED: %s", file, line, what);
  if (status != STRATA_OK) {
    fprintf(stderr, " -> %s: %s", strata_status_name(status),
            strata_last_error());
  }
  fprintf(stderr, "\n");
  exit(1);
}

#define CHECK(cond)                                         \
  do {                                                      \
    if (!(cond)) Die(__FILE__, __LINE__, #cond, STRATA_OK); \
  } while (0)

#define CHECK_OK(call)                                                 \
  do {                                                                 \
    strata_status status_ = (call);                                    \
    if (status_ != STRATA_OK) Die(__FILE__, __LINE__, #call, status_); \
  } while (0)

/* The call fails with `want` and leaves a message. */
#define CHECK_FAILS(want, call)                                           \
  do {                                                                    \
    strata_status status_ = (call);                                       \
    if (status_ != (want) || strata_last_error()[0] == '\0') {            \
      Die(__FILE__, __LINE__, "expected " #want " from " #call, status_); \
    }                                                                     \
  } while (0)

/* Registers group `name` of one 1-D tensor "w" of `elements` in `dtype`
 * with `roles`; *id is set on success. */
static inline strata_status RegisterOne(strata_engine* engine, const char* name,
                                        int64_t elements, int32_t dtype,
                                        uint32_t roles, int32_t* id) {
  const int64_t shape[1] = {elements};
  strata_tensor_spec tensor = {"w", shape, 1, dtype, roles, 0};
  strata_group_spec spec;
  strata_status status = strata_group_spec_init(&spec);
  if (status != STRATA_OK) return status;
  spec.name = name;
  spec.tensors = &tensor;
  spec.num_tensors = 1;
  return strata_group_register(engine, &spec, id);
}

#endif /* STRATA_TESTS_CAPI_C_CHECK_H_ */
