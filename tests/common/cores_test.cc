// UsableCores (common/cores.h): the calling thread's affinity mask, not the
// machine's CPU count.
#include "common/cores.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <thread>

namespace strata {
namespace {

TEST(CoresTest, CountsTheCpusOfTheAffinityMask) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(UsableCores(), CPU_COUNT(&all));
  int seen = 0;
  // A thread confined to one CPU (its own mask: the caller's stays).
  std::thread([&] {
    int first = 0;
    while (!CPU_ISSET(first, &all)) ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    seen = UsableCores();
  }).join();
  EXPECT_EQ(seen, 1);
  if (CPU_COUNT(&all) == 1) {
    GTEST_SKIP() << "one CPU: a mask of one cannot differ from the machine";
  }
}

}  // namespace
}  // namespace strata
