// Names the calling thread for top, perf and gdb ("strata-optim"): the
// first 15 characters of `name`, the most Linux keeps. Best effort: a
// failure changes nothing else.
//
//   std::thread([] { NameThisThread("strata-writer"); ... });
#ifndef STRATA_COMMON_THREAD_NAME_H_
#define STRATA_COMMON_THREAD_NAME_H_

namespace strata {

void NameThisThread(const char* name);

}  // namespace strata

#endif  // STRATA_COMMON_THREAD_NAME_H_
