// The code books of 8-bit state (Note [8-bit state] in strata/cpu_adam.h)
// and the arithmetic every ISA uses to quantize to them, without a table
// lookup in memory.
//
// A code book covers magnitudes in [0, 1] relative to a block's scale:
// index 0 is 0, then 7 decades d = 0..6 (magnitudes [10^(d-7), 10^(d-6))),
// each cut into n_d buckets of equal width, then 1. A magnitude x in
// decade d (b_d <= x < b_(d+1), b_d = fl(10^(d-7))) falls in bucket
// j = trunc(fl(fl(x - b_d) * inv_a_d)), where inv_a_d is 1 / a_d made
// smaller by 2^-20 (a_d = fl(0.9 * 10^(d-6) / n_d)), so that j never
// reaches n_d; it is stored as the bucket's middle, fl(fl((j + 0.5) * a_d)
// + b_d): every value comes back within half a bucket (and 2^-20 of its
// decade) of itself, and scalar, AVX2 and AVX-512, which evaluate the same
// fp32 expressions, agree bit for bit. Magnitudes below b_0 are 0; from
// `one_threshold` on, 1.
// m's book is signed (n_d = 2^d: 127 magnitudes besides 0 and 1; code 127
// + magnitude index, or 127 - index for a negative value, whose magnitude
// index stops at 127: there is no -1), v's unsigned (n_d = 2^(d+1): 254
// besides 0 and 1; code = magnitude index). Both are the dynamic tree maps
// of Dettmers et al. that bitsandbytes and torchao use, with each value
// quantized to its bucket rather than to the nearest value (the same
// within a decade; at a decade's edge a value may go to the bucket above
// where the nearest value was below, still within half a bucket).
//
//   const QMap& m = SignedMap();
//   float back = m.code[code] * scale;  // what the kernels dequantize to
#ifndef STRATA_CPU_ADAM_QMAP_H_
#define STRATA_CPU_ADAM_QMAP_H_

namespace strata::cpu_adam {

struct QMap {
  // Indexed by region r: 0 for the magnitude 0, 1 + d for decade d.
  float a[8];          // bucket width (0 for r = 0)
  float b[8];          // lower edge (0 for r = 0)
  float inv_a[8];      // fl(1 / width) made smaller by 2^-20 (above)
  float base[8];       // the magnitude index of the region's first bucket
  float next_edge[8];  // b of region r + 1 (FLT_MAX for the last)
  // The region's first guess, trunc(fl(fl(fl(bits) * log_scale) +
  // log_offset)) clamped to 0..7, with bits the float's bit pattern as an
  // integer: bits / 2^23 - 127 is log2(x) or up to 0.087 below it, so the
  // guess, log10(x) + 8 less 0.026 and a margin for fp32 rounding, is the
  // region or the one below; one compare with next_edge decides.
  float log_scale, log_offset;
  float one_threshold;  // from here on the magnitude is 1
  float one_index;      // its magnitude index (128 signed, 255 unsigned)
  bool is_signed;
  // Every code's value (its dequantization at scale 1), ascending.
  float code[256];
};

const QMap& SignedMap();    // m
const QMap& UnsignedMap();  // v

}  // namespace strata::cpu_adam

#endif  // STRATA_CPU_ADAM_QMAP_H_
