// strata-nvme-bench's signal handling (tools/nvme_bench/interrupt.h), in
// children of the test, as the bench runs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/testutil/testutil.h"
#include "tests/tools/fake_kernel.h"
#include "tools/nvme_bench/huge_pages.h"
#include "tools/nvme_bench/interrupt.h"

namespace strata::bench {
namespace {

// In a child, as strata-nvme-bench runs: its Ctrl-C handler, a huge page
// reservation over it, then SIGINT. The reservation's handler gives the
// pages back and passes the signal on to the bench's, which sets the flag;
// the reservation's end then gives back nothing more.
void InterruptWhileReserved(const HugePageFiles& files) {
  const std::atomic<bool>* interrupted = InstallInterruptHandler();
  auto nr = [&] {
    const std::string text = ReadText(files.nr_hugepages);
    return text.substr(0, text.find('\n'));
  };
  std::string pool;
  {
    auto reservation = HugePageReservation::Reserve(19, files);
    pool = "raised to " + nr();
    raise(SIGINT);
    pool += ", after SIGINT " + nr();
  }
  pool += ", at the end " + nr();
  std::fprintf(stderr, "interrupted %d by signal %d; pool %s",
               interrupted->load() ? 1 : 0, InterruptSignal(), pool.c_str());
  _exit(0);
}

TEST(InterruptTest, SigintSetsTheFlagAndReservedPagesGoBackOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeKernel kernel(0, 0, 10);
  EXPECT_EXIT(InterruptWhileReserved(kernel.files),
              ::testing::ExitedWithCode(0),
              "interrupted 1 by signal 2; pool raised to 29, after SIGINT 10, "
              "at the end 10");
}

// A closed output (SIGPIPE) stops the run and stays caught, since every
// later write raises it again; a SIGHUP that nohup ignores stays ignored.
TEST(InterruptTest, SigpipeStopsTheRunAndNohupsSighupStaysIgnored) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        signal(SIGHUP, SIG_IGN);
        signal(SIGPIPE, SIG_DFL);
        const std::atomic<bool>* flag = InstallInterruptHandler();
        raise(SIGHUP);
        if (flag->load()) std::exit(3);
        raise(SIGPIPE);
        raise(SIGPIPE);
        std::fprintf(stderr, "flag %d by signal %d", flag->load() ? 1 : 0,
                     InterruptSignal());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "closed; stopping\nflag 1 by signal 13");
}

// The first SIGINT asks the run to stop; a second one, for a stop that
// takes too long, ends the process.
TEST(InterruptTest, ASecondSigintEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const std::atomic<bool>* flag = InstallInterruptHandler();
        raise(SIGINT);
        if (!flag->load()) std::exit(3);
        std::this_thread::sleep_for(std::chrono::milliseconds(1100));
        raise(SIGINT);
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "quits at once");
}

// timeout(1) signals its child and then the child's process group: the
// two signals at once are one request to stop, not a second one.
TEST(InterruptTest, TwoSignalsAtOnceAreOneStop) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const std::atomic<bool>* flag = InstallInterruptHandler();
        raise(SIGTERM);
        raise(SIGTERM);
        std::fprintf(stderr, "flag %d by signal %d", flag->load() ? 1 : 0,
                     InterruptSignal());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "flag 1 by signal 15");
}

}  // namespace
}  // namespace strata::bench
