// strata/state_format.h: how optimizer state (Adam's m and v) is stored, in
// the engine's state roles, its checkpoints and cpu_adam's buffers.
//
//   kF32   4 bytes an element (the default, exact).
//   kBF16  2 bytes, rounded stochastically after every step (cpu_adam.h).
//   kQ8    1 byte an element plus a scale per block (Note [8-bit state] in
//          cpu_adam.h); the engine keeps tensors under 4096 elements in
//          fp32 (src/store/layout.h).
//
//   StateFormat f = *ParseStateFormat("bf16");  // StateFormatName(f) == "bf16"
#ifndef STRATA_STATE_FORMAT_H_
#define STRATA_STATE_FORMAT_H_

#include <cstdint>
#include <string_view>

#include "strata/export.h"
#include "strata/status.h"

namespace strata {

enum class StateFormat : uint8_t { kF32, kBF16, kQ8 };

// "fp32", "bf16" or "int8": the values of strata.state_dtype.
STRATA_EXPORT std::string_view StateFormatName(StateFormat format);
// kInvalidArgument naming the three values for any other name.
STRATA_EXPORT Result<StateFormat> ParseStateFormat(std::string_view name);

}  // namespace strata

#endif  // STRATA_STATE_FORMAT_H_
