// Online-softmax state of a set of attention logits: their maximum and the sum
// of exp(logit - maximum). Header-only, for host and device code alike.
//
// For the logits {0, 0, ln 2} in two parts, a = {0, 0} and b = {ln 2}:
//   a = {max_logit 0, denominator 2}, b = {ln 2, 1};
//   a.merge(b) gives {ln 2, 2 * exp(0 - ln 2) + 1 = 2}, lse() = 2 ln 2 = ln 4,
//   which is log(e^0 + e^0 + e^(ln 2)); a.share_of(merged) = 2 * exp(-ln 2) / 2
//   = 1/2, the softmax mass of the first two logits.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define SPECEXTEND_HOST_DEVICE __host__ __device__
#else
#define SPECEXTEND_HOST_DEVICE
#endif

namespace specextend {

struct AttentionState {
  float max_logit = -INFINITY;
  float denominator = 0.0f;  // sum of exp(logit - max_logit); 0 when empty

  // Adds one logit; -inf logits carry no mass and leave the state unchanged.
  SPECEXTEND_HOST_DEVICE void update(float logit) {
    if (logit > max_logit) {
      denominator = denominator * expf(max_logit - logit) + 1.0f;
      max_logit = logit;
    } else if (logit > -INFINITY) {
      denominator += expf(logit - max_logit);
    }
  }

  // Becomes the state of the union of both sets of logits.
  SPECEXTEND_HOST_DEVICE void merge(const AttentionState& other) {
    if (other.denominator == 0.0f) {
      return;
    }
    if (denominator == 0.0f) {
      *this = other;
      return;
    }
    const float merged_max = fmaxf(max_logit, other.max_logit);
    denominator = denominator * expf(max_logit - merged_max) +
                  other.denominator * expf(other.max_logit - merged_max);
    max_logit = merged_max;
  }

  // log(sum of exp(logit)); -inf when empty. exp(logit - lse()) is the softmax
  // probability of a logit.
  SPECEXTEND_HOST_DEVICE float lse() const {
    return max_logit + logf(denominator);
  }

  // The fraction of the softmax mass of `total`, a state that includes these
  // logits, held by these logits.
  SPECEXTEND_HOST_DEVICE float share_of(const AttentionState& total) const {
    return denominator * expf(max_logit - total.max_logit) / total.denominator;
  }
};

}  // namespace specextend
