// The NVMe tier's swap directory: the checks on it before strata writes
// there, the lock that keeps a second engine out, and the names of the
// swap files (Note [Files strata creates] and Note [Lock file lifetime] in
// swap_dir.cc). NvmeStore::Open is the user:
//
//   STRATA_RETURN_IF_ERROR(CheckSwapDirectory(dir));
//   STRATA_ASSIGN_OR_RETURN(int lock_fd, LockSwapDirectory(dir));
//   ReclaimStaleSwapFiles(dir);  // with the lock held
//   ... create and use SwapFilePath(dir, 0), SwapFilePath(dir, 1) ...
//   UnlockSwapDirectory(dir, lock_fd);
#ifndef STRATA_SRC_TIER_SWAP_DIR_H_
#define STRATA_SRC_TIER_SWAP_DIR_H_

#include <string>

#include "strata/status.h"

namespace strata::tier {

// An existing directory strata may write to: not writable by other users
// unless it has the sticky bit. The error names the directory and the fix.
Status CheckSwapDirectory(const std::string& dir);
// Takes the directory's lock file (strata.lock, holding this pid); the
// descriptor that holds it. kFailedPrecondition naming the holder's pid
// when another engine has it.
Result<int> LockSwapDirectory(const std::string& dir);
// Removes the lock file and releases the lock.
void UnlockSwapDirectory(const std::string& dir, int lock_fd);
// Deletes the swap files a run that died left (every one is stale while
// the lock is held), saying on stderr how many and how large.
void ReclaimStaleSwapFiles(const std::string& dir);
// Swap file `file`'s path: dir/strata-swap-<file>.bin.
std::string SwapFilePath(const std::string& dir, int file);

}  // namespace strata::tier

#endif  // STRATA_SRC_TIER_SWAP_DIR_H_
