// QCodec: the 8-bit state's code books (cpu_adam/qmap.h) applied to W
// values at a time in a vector-traits class V (Note [One body, three ISAs]
// in cpu_adam/kernel_body.h, which lists what V provides), for the 8-bit
// kernel of kernel_body.h. Like it, everything here sits in an anonymous
// namespace: each ISA unit compiles its own copy with its own -m flags.
#ifndef STRATA_CPU_ADAM_QCODEC_H_
#define STRATA_CPU_ADAM_QCODEC_H_

#include "cpu_adam/qmap.h"

namespace strata::cpu_adam {
namespace {

// The codes of a QMap (cpu_adam/qmap.h) for W values at a time, in the
// fp32 expressions qmap.h defines; the region r of a value selects its
// decade's constants from registers (Lut8), not from memory. Copied by
// value into each loop: the codes' stores (bytes) could alias a member
// read through a reference, which would then be loaded again each vector.
template <class V, bool kSigned>
struct QCodec {
  using F = typename V::F;
  using I = typename V::I;
  using T = typename V::Table;

  explicit QCodec(const QMap& q)
      : a(V::MakeTable(q.a)),
        b(V::MakeTable(q.b)),
        inv_a(V::MakeTable(q.inv_a)),
        base(V::MakeTable(q.base)),
        next_edge(V::MakeTable(q.next_edge)),
        one_threshold(V::Set1(q.one_threshold)),
        one_index(V::Set1(q.one_index)),
        log_scale(V::Set1(q.log_scale)),
        log_offset(V::Set1(q.log_offset)) {}

  // Values relative to their block's scale (finite, |x| <= 1) to codes (as
  // floats): the region's first guess from the bits (QMap::log_scale), one
  // compare with the next region's edge, then the bucket.
  F Quantize(F x) const {
    const F xa = V::Abs(x);
    const F guess = V::Add(V::Mul(V::BitsToF(xa), log_scale), log_offset);
    I r = V::MaxI(V::MinI(V::TruncI(guess), V::SetI(7)), V::SetI(0));
    r = V::CountIf(r, V::Ge(xa, V::Lut8(next_edge, r)));
    const F j = V::Trunc(V::Mul(V::Sub(xa, V::Lut8(b, r)), V::Lut8(inv_a, r)));
    const F mag = V::Select(V::Ge(xa, one_threshold), one_index,
                            V::Add(V::Lut8(base, r), j));
    if constexpr (!kSigned) return mag;
    // 127 + mag, or 127 - min(mag, 127) for a negative value.
    return V::Max(V::Add(V::Set1(127.0f), V::CopySign(mag, x)), V::Set1(0.0f));
  }

  // Codes (as floats) to values relative to their block's scale. The
  // region of a magnitude index is a power of two's exponent: decade d
  // starts at index 2^(d+1) - 1 (unsigned) or 2^d (signed).
  F Dequantize(F code) const {
    const F d = kSigned ? V::Sub(code, V::Set1(127.0f)) : code;
    const F mag = kSigned ? V::Abs(d) : code;
    const I r = V::MinI(
        kSigned ? V::AddI(V::Exponent(V::Add(mag, V::Set1(0.5f))), V::SetI(1))
                : V::Exponent(V::Add(mag, V::Set1(1.0f))),
        V::SetI(7));
    F v = V::Add(V::Mul(V::Add(V::Sub(mag, V::Lut8(base, r)), V::Set1(0.5f)),
                        V::Lut8(a, r)),
                 V::Lut8(b, r));
    v = V::Select(V::Ge(mag, one_index), V::Set1(1.0f), v);
    if constexpr (!kSigned) return v;
    return V::CopySign(v, d);
  }

  T a, b, inv_a, base, next_edge;
  F one_threshold, one_index, log_scale, log_offset;
};

}  // namespace
}  // namespace strata::cpu_adam

#endif  // STRATA_CPU_ADAM_QCODEC_H_
