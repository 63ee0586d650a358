// Reads logits from stdin and splits them, in order, into parts of the sizes
// given as arguments. Prints the log-sum-exp of all logits twice, from the merged
// states of the parts and from one state updated with every logit, then each
// part's share of the merged state, one number a line. Built and run by
// test_attention_state.py.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/attention_state.h"

int main(int argc, char** argv) {
  std::vector<float> logits;
  float logit;
  while (std::scanf("%f", &logit) == 1) {
    logits.push_back(logit);
  }
  specextend::AttentionState merged;
  specextend::AttentionState sequential;
  std::vector<specextend::AttentionState> parts;
  size_t next = 0;
  for (int i = 1; i < argc; ++i) {
    specextend::AttentionState part;
    for (const size_t end = next + std::strtoul(argv[i], nullptr, 10); next < end;
         ++next) {
      part.update(logits[next]);
      sequential.update(logits[next]);
    }
    merged.merge(part);
    parts.push_back(part);
  }
  std::printf("%.9g\n%.9g\n", merged.lse(), sequential.lse());
  for (const specextend::AttentionState& part : parts) {
    std::printf("%.9g\n", part.share_of(merged));
  }
  return 0;
}
