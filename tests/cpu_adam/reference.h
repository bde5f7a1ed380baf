// A float64 reference of one optimizer step for one element, with an error
// bound for the fp32 kernels.
//
// Note [Tolerances]
// The kernels evaluate each formula in fp32 with correctly rounded add, mul,
// div and sqrt (no FMA), and the step scalars are fp32 values, which the
// reference uses too (the header documents that rounding). Each rounding
// errs by at most half an ulp of its own result, and no result is larger
// than the largest term of its formula, so k roundings err by at most k/2
// ulps of that largest term. The longest chain is v with L2 weight decay:
// unscale, L2 product, L2 sum, (1 - beta2) * g, * g, beta2 * v, sum: 7
// roundings, 3.5 ulps, plus the relative error of g entering g * g twice.
// We allow 5 ulps of the largest term for every state output and every
// parameter update term, and propagate the allowed error of m, v and g into
// the parameter bound (d update / dm = update / m, d update / dv <=
// update / (2 v)). A wrong constant, a wrong operation order beyond
// rounding, or a bf16/fp16 conversion error exceeds this by orders of
// magnitude. The outputs must additionally be bit-identical across ISAs,
// which the tests check separately.
#ifndef STRATA_TESTS_CPU_ADAM_REFERENCE_H_
#define STRATA_TESTS_CPU_ADAM_REFERENCE_H_

#include <algorithm>
#include <cmath>

#include "strata/cpu_adam.h"

namespace strata::test {

constexpr double kTolUlps = 5.0;

// The spacing of fp32 numbers at |x| (2^-149 for the subnormal range).
inline double UlpF32(double x) {
  x = std::fabs(x);
  if (x < 0x1p-126) return 0x1p-149;
  return std::ldexp(1.0, std::ilogb(x) - 23);
}
inline double UlpBf16(double x) {
  x = std::fabs(x);
  if (x < 0x1p-126) return 0x1p-133;
  return std::ldexp(1.0, std::ilogb(x) - 7);
}

inline double Tol(std::initializer_list<double> terms) {
  double m = 0;
  for (double t : terms) m = std::max(m, std::fabs(t));
  return kTolUlps * UlpF32(m);
}

// The fp32 step scalars, derived independently of the library from the
// documented semantics.
struct RefConsts {
  double grad_mul, decay, l2, b1, omb1, b2, omb2, inv_bc2, neg_lr, eps;
  bool l2_on;
};

inline RefConsts MakeRefConsts(const StepOptions& o) {
  const OptimHyper& h = o.hyper;
  auto f = [](double x) { return static_cast<double>(static_cast<float>(x)); };
  RefConsts c{};
  c.grad_mul = f(o.prep.grad_scale * o.prep.clip_coef);
  bool decoupled = o.algo == OptimAlgo::kAdamW || o.algo == OptimAlgo::kLion;
  c.decay = decoupled ? f(1 - h.lr * h.weight_decay) : 1.0;
  c.l2_on = !decoupled && h.weight_decay != 0;
  c.l2 = f(h.weight_decay);
  c.b1 = f(h.beta1);
  c.omb1 = f(1 - h.beta1);
  c.b2 = f(h.beta2);
  c.omb2 = f(1 - h.beta2);
  c.eps = f(h.eps);
  double t = static_cast<double>(h.step);
  c.inv_bc2 = f(1 / std::sqrt(1 - std::pow(h.beta2, t)));
  switch (o.algo) {
    case OptimAlgo::kAdam:
    case OptimAlgo::kAdamW:
      c.neg_lr = f(-(h.lr / (1 - std::pow(h.beta1, t))));
      break;
    case OptimAlgo::kAdagrad:
      c.neg_lr = f(-(h.lr / (1 + (t - 1) * h.lr_decay)));
      break;
    case OptimAlgo::kLion:
      c.neg_lr = f(-h.lr);
      break;
  }
  return c;
}

struct RefOut {
  double p, s1, s2;  // new values
  double tol_p, tol_s1, tol_s2;
  bool p_sign_ambiguous = false;  // Lion: sign(c) within rounding of 0
};

// One element: p, g (already decoded to double), s1, s2.
inline RefOut RefStep(OptimAlgo algo, const RefConsts& c, double p, double g,
                      double s1, double s2) {
  RefOut r{};
  double gs = g * c.grad_mul;
  double tol_g = Tol({gs});
  if (c.l2_on && (algo == OptimAlgo::kAdam || algo == OptimAlgo::kAdagrad)) {
    double l2p = c.l2 * p;
    tol_g += Tol({gs, l2p, gs + l2p});
    gs += l2p;
  }
  if (algo == OptimAlgo::kAdam || algo == OptimAlgo::kAdamW) {
    double pd = p * c.decay;
    r.s1 = s1 * c.b1 + c.omb1 * gs;
    r.tol_s1 = Tol({s1 * c.b1, c.omb1 * gs, r.s1}) + c.omb1 * tol_g;
    r.s2 = s2 * c.b2 + c.omb2 * gs * gs;
    r.tol_s2 = Tol({s2 * c.b2, c.omb2 * gs * gs, r.s2}) +
               2 * c.omb2 * std::fabs(gs) * tol_g;
    double denom = std::sqrt(r.s2) * c.inv_bc2 + c.eps;
    double upd = c.neg_lr * r.s1 / denom;
    r.p = pd + upd;
    r.tol_p = Tol({pd, upd, r.p}) + std::fabs(c.neg_lr) * r.tol_s1 / denom +
              (r.s2 > 0 ? std::fabs(upd) * r.tol_s2 / (2 * r.s2) : 0);
  } else if (algo == OptimAlgo::kAdagrad) {
    r.s1 = s1 + gs * gs;
    r.tol_s1 = Tol({s1, gs * gs, r.s1}) + 2 * std::fabs(gs) * tol_g;
    double denom = std::sqrt(r.s1) + c.eps;
    double upd = c.neg_lr * gs / denom;
    r.p = p + upd;
    r.tol_p = Tol({p, upd, r.p}) + std::fabs(c.neg_lr) * tol_g / denom +
              (r.s1 > 0 ? std::fabs(upd) * r.tol_s1 / (2 * r.s1) : 0);
  } else {
    double pd = p * c.decay;
    double mix = s1 * c.b1 + c.omb1 * gs;
    double tol_mix = Tol({s1 * c.b1, c.omb1 * gs, mix}) + c.omb1 * tol_g;
    // Zero momentum and a zero gradient give an exact 0 in fp32 too, whose
    // sign (0) is not ambiguous.
    r.p_sign_ambiguous = std::fabs(mix) <= tol_mix && (s1 != 0 || gs != 0);
    double sign = mix > 0 ? 1 : (mix < 0 ? -1 : 0);
    r.p = pd + c.neg_lr * sign;
    r.tol_p = Tol({pd, c.neg_lr, r.p});
    r.s1 = s1 * c.b2 + c.omb2 * gs;
    r.tol_s1 = Tol({s1 * c.b2, c.omb2 * gs, r.s1}) + c.omb2 * tol_g;
  }
  return r;
}

}  // namespace strata::test

#endif  // STRATA_TESTS_CPU_ADAM_REFERENCE_H_
