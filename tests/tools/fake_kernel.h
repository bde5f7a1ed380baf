// A kernel huge page pool of a test's own: /proc/meminfo and
// vm.nr_hugepages as plain files, for tools/nvme_bench/huge_pages.h and the
// fio buffers built on it.
#ifndef STRATA_TESTS_TOOLS_FAKE_KERNEL_H_
#define STRATA_TESTS_TOOLS_FAKE_KERNEL_H_

#include <fstream>
#include <sstream>
#include <string>

#include "tests/testutil/testutil.h"
#include "tools/nvme_bench/huge_pages.h"

namespace strata::bench {

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `free_pages` free huge pages of 2 MiB (`reserved` of them promised) and
// a vm.nr_hugepages of `nr`.
struct FakeKernel {
  testutil::ScratchDir dir;
  HugePageFiles files{dir.File("meminfo"), dir.File("nr_hugepages"),
                      dir.File("lock")};

  FakeKernel(int free_pages, int reserved, int nr) {
    WriteText(
        files.meminfo,
        "MemTotal: 1000 kB\nHugePages_Free: " + std::to_string(free_pages) +
            "\nHugePages_Rsvd: " + std::to_string(reserved) +
            "\nHugepagesize:       2048 kB\n");
    WriteText(files.nr_hugepages, std::to_string(nr) + "\n");
  }
  std::string nr() const { return ReadText(files.nr_hugepages); }
};

}  // namespace strata::bench

#endif  // STRATA_TESTS_TOOLS_FAKE_KERNEL_H_
