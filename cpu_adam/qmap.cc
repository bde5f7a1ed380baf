// The code books of 8-bit state: their constants, in double rounded once
// to fp32, and their values from the fp32 expressions the kernels use
// (qmap.h).
#include "cpu_adam/qmap.h"

#include <cfloat>
#include <cmath>

namespace strata::cpu_adam {
namespace {

// The dequantization of magnitude index `mag` (qmap.h), in the fp32
// operations every ISA's Dequant performs.
float Magnitude(const QMap& q, float mag) {
  int r = 0;
  for (int k = 1; k < 8; ++k) r += mag >= q.base[k];
  if (mag >= q.one_index) return 1.0f;
  return ((mag - q.base[r]) + 0.5f) * q.a[r] + q.b[r];
}

QMap Build(bool is_signed) {
  QMap q{};
  q.is_signed = is_signed;
  double base = 1;
  for (int d = 0; d < 7; ++d) {
    const double top = std::pow(10.0, d - 6);
    const double n = is_signed ? 1 << d : 2 << d;
    q.a[d + 1] = static_cast<float>(0.9 * top / n);
    q.b[d + 1] = static_cast<float>(0.1 * top);
    q.inv_a[d + 1] = static_cast<float>(n / (0.9 * top) * (1 - 0x1p-20));
    q.base[d + 1] = static_cast<float>(base);
    q.next_edge[d] = q.b[d + 1];
    base += n;
  }
  q.next_edge[7] = FLT_MAX;
  q.log_scale = static_cast<float>(std::log10(2.0) / 0x1p23);
  q.log_offset = static_cast<float>(8 - 127 * std::log10(2.0) - 1e-4);
  q.one_index = static_cast<float>(base);
  const float below_one = Magnitude(q, q.one_index - 1);
  q.one_threshold = (below_one + 1.0f) * 0.5f;
  if (is_signed) {
    for (int k = 0; k < 256; ++k) {
      q.code[k] = k >= 127 ? Magnitude(q, static_cast<float>(k - 127))
                           : -Magnitude(q, static_cast<float>(127 - k));
    }
  } else {
    for (int k = 0; k < 256; ++k) {
      q.code[k] = Magnitude(q, static_cast<float>(k));
    }
  }
  return q;
}

}  // namespace

const QMap& SignedMap() {
  static const QMap map = Build(true);
  return map;
}

const QMap& UnsignedMap() {
  static const QMap map = Build(false);
  return map;
}

}  // namespace strata::cpu_adam
