#include "tools/nvme_bench/json_out.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "common/text.h"
#include "strata/aio.h"

namespace strata::bench {

JsonOut::~JsonOut() {
  if (created_ && !written_) unlink(path_.c_str());
}

Status JsonOut::Open() {
  if (path_.empty()) return Status::Ok();
  int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  created_ = fd >= 0;
  if (fd < 0 && errno == EEXIST) fd = open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Status(aio::ErrnoStatus(err, "").code(),
                  "cannot write --json file '" + path_ +
                      "': " + ErrnoText(err) +
                      "; pass a --json path in a directory you can write");
  }
  close(fd);
  return Status::Ok();
}

Status JsonOut::Write(const nlohmann::json& records) {
  if (path_.empty()) return Status::Ok();
  std::ofstream out(path_);
  out << records.dump(2) << "\n";
  written_ = true;
  if (!out) return Status::IoError("cannot write --json file '" + path_ + "'");
  return Status::Ok();
}

}  // namespace strata::bench
