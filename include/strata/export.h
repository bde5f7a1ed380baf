// strata/export.h: symbol visibility. Libraries build with
// -fvisibility=hidden; only declarations marked STRATA_EXPORT are part of
// the shared-library ABI.
#ifndef STRATA_EXPORT_H_
#define STRATA_EXPORT_H_

#define STRATA_EXPORT __attribute__((visibility("default")))

#endif  // STRATA_EXPORT_H_
