/* A scratch directory for the C ABI tests, which are C programs: a fresh
 * directory under $STRATA_TEST_TMPDIR, else STRATA_TEST_SCRATCH_ROOT (the
 * build tree: a real disk, so O_DIRECT works), removed at exit, also after
 * a failed check. Define _XOPEN_SOURCE 700 before any include. */
#ifndef STRATA_TESTS_CAPI_C_SCRATCH_H_
#define STRATA_TESTS_CAPI_C_SCRATCH_H_

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char scratch[4096];

static int RemoveEntry(const char* path, const struct stat* st, int flag,
                       struct FTW* ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void RemoveScratch(void) {
  if (scratch[0] != '\0') nftw(scratch, RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Creates the directory into `scratch`. */
static void MakeScratch(void) {
  const char* root = getenv("STRATA_TEST_TMPDIR");
  if (root == NULL || root[0] == '\0') root = STRATA_TEST_SCRATCH_ROOT;
  if (mkdir(root, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "cannot create %s: %s\n", root, strerror(errno));
    exit(1);
  }
  snprintf(scratch, sizeof(scratch), "%s/capi-XXXXXX", root);
  if (mkdtemp(scratch) == NULL) {
    fprintf(stderr, "mkdtemp %s: %s\n", scratch, strerror(errno));
    scratch[0] = '\0';
    exit(1);
  }
  atexit(RemoveScratch);
}

#endif /* STRATA_TESTS_CAPI_C_SCRATCH_H_ */
