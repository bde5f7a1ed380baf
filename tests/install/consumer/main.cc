// Opens an engine through the installed headers and library.
#include <cstdio>
#include <string>

#include "strata/aio.h"

int main() {
  auto engine = strata::aio::Engine::Open(strata::aio::EngineOptions{});
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "consumer: strata aio backend %s\n",
      std::string(strata::aio::BackendName((*engine)->info().backend)).c_str());
  return 0;
}
