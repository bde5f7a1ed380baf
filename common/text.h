// Text helpers shared by every strata component: byte counts for people,
// sizes from a command line, errno names. Depends on nothing in strata but
// strata/status.h; pure functions, thread-safe.
//
//   HumanBytes(1610612736)  -> "1.5 GiB"
//   SizeText(1 << 20)       -> "1M"      (SizeText(1000) -> "1000")
//   ParseSize("128K")       -> 131072    (ParseSize("1.5G") -> an error)
//   ErrnoText(ENOSPC)       -> "ENOSPC (No space left on device)"
//   SplitList("a:b", ':')   -> {"a", "b"}
#ifndef STRATA_COMMON_TEXT_H_
#define STRATA_COMMON_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata {

// Bytes in the largest binary unit that keeps them >= 1, one decimal:
// "512 B", "4.0 KiB", "1.5 GiB".
std::string HumanBytes(uint64_t bytes);

// Bytes as a whole K, M or G when they are one ("4K", "1M", "2G"), else
// the number of bytes; ParseSize reads it back.
std::string SizeText(uint64_t bytes);

// "4096", "128K", "1M", "2G", "1T" (binary units, case-insensitive, an
// optional "i" and "B": "1MiB", "1mb"). kInvalidArgument for anything else
// (a fraction, a minus sign, an unknown unit), naming the text and the
// forms.
Result<uint64_t> ParseSize(const std::string& text);

// "ENOSPC (No space left on device)"; "errno 4242 (Unknown error 4242)".
std::string ErrnoText(int err);

// The non-empty pieces of `text` between `separator`s, in order:
// SplitList("a,,b", ',') -> {"a", "b"}; SplitList("", ',') -> {}.
std::vector<std::string> SplitList(const std::string& text, char separator);

}  // namespace strata

#endif  // STRATA_COMMON_TEXT_H_
