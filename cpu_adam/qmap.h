// The code books of 8-bit state (Note [8-bit state] in strata/cpu_adam.h)
// and the arithmetic every ISA uses to quantize to them, without a table
// lookup in memory.
//
// A code book covers magnitudes in [0, 1] relative to a block's scale:
// index 0 is 0, then 7 decades d = 0..6 (magnitudes [10^(d-7), 10^(d-6))),
// each cut into n_d buckets of equal width, then 1. A magnitude falls in
// the bucket whose lower edge T(d, j) = fl(fl(j * a_d) + b_d) it reaches
// and the next it does not (b_d = fl(10^(d-7)), a_d = fl(0.9 * 10^(d-6) /
// n_d)), and is stored as the bucket's middle, fl(fl((j + 0.5) * a_d) +
// b_d): so every value comes back within half a bucket of itself, and
// scalar, AVX2 and AVX-512, which evaluate the same fp32 expressions, agree
// bit for bit. Magnitudes below b_0 are 0; from `one_threshold` on, 1.
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
  float a[8];  // bucket width (0 for r = 0)
  float b[8];  // lower edge (0 for r = 0)
  // fl(1 / width) made a little smaller (by 2^-20), so that the first guess
  // of a bucket, trunc((x - b) * inv_a), is the bucket or the one below.
  float inv_a[8];
  float last[8];        // n_d - 1: the last bucket's index
  float base[8];        // the magnitude index of the region's first bucket
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
