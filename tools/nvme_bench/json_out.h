// strata-nvme-bench --json FILE: opened before the first run, so that a
// path that cannot be written is found then, and removed again on the way
// out when this run created it and never wrote it.
//
// Thread safety: none; used from the thread that runs the sweep.
#ifndef STRATA_TOOLS_NVME_BENCH_JSON_OUT_H_
#define STRATA_TOOLS_NVME_BENCH_JSON_OUT_H_

#include <nlohmann/json.hpp>
#include <string>

#include "strata/status.h"

namespace strata::bench {

class JsonOut {
 public:
  // An empty path writes nothing.
  explicit JsonOut(std::string path) : path_(std::move(path)) {}
  ~JsonOut();
  JsonOut(const JsonOut&) = delete;
  JsonOut& operator=(const JsonOut&) = delete;

  // Creates the file, or opens an existing one for writing; the error names
  // the path and the fix.
  Status Open();
  // Replaces the file's contents with `records`.
  Status Write(const nlohmann::json& records);

 private:
  std::string path_;
  bool created_ = false;
  bool written_ = false;
};

}  // namespace strata::bench

#endif  // STRATA_TOOLS_NVME_BENCH_JSON_OUT_H_
