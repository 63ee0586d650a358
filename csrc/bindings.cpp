// The specextend_vllm._C module: every op schema, the CPU implementations, and
// the Python module whose import registers them. CUDA implementations register
// themselves next to their kernels (csrc/<op>/cuda_op.cpp), when built.
#include <Python.h>

#include <torch/library.h>

#include "chunk_scores/cpu.h"
#include "int8_linear/cpu.h"
#include "merge_attention_states/cpu.h"
#include "paged_prefix_attention/cpu.h"
#include "tree_attention/cpu.h"

namespace specextend {

TORCH_LIBRARY(specextend, m) {
  // Each op's fake (meta) implementation is registered in Python, in the module
  // named before its schema.
  m.set_python_module("specextend_vllm.ops.chunk_scores");
  m.def(
      "chunk_scores(Tensor query, Tensor key_cache, Tensor block_table, "
      "Tensor context_lens, int chunk_size, float scale, int num_chunks) "
      "-> Tensor");
  m.set_python_module("specextend_vllm.ops.int8_linear");
  m.def(
      "int8_linear(Tensor input, Tensor weight, Tensor weight_scales, "
      "Tensor? bias) -> Tensor");
  m.set_python_module("specextend_vllm.ops.paged_prefix_attention");
  m.def(
      "paged_prefix_attention(Tensor query, Tensor key_cache, "
      "Tensor value_cache, Tensor block_table, Tensor prefix_lens, "
      "Tensor query_start_loc, float scale) -> (Tensor, Tensor)");
  m.set_python_module("specextend_vllm.ops.tree_attention");
  m.def(
      "tree_attention(Tensor query, Tensor key, Tensor value, "
      "Tensor query_start_loc, int max_query_len, float scale, "
      "Tensor? ancestor_mask) -> (Tensor, Tensor)");
  m.set_python_module("specextend_vllm.ops.merge_attention_states");
  m.def(
      "merge_attention_states(Tensor(a!) output, Tensor prefix_output, "
      "Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse) -> ()");
}

TORCH_LIBRARY_IMPL(specextend, CPU, m) {
  m.impl("chunk_scores", &chunk_scores_cpu);
  m.impl("int8_linear", &int8_linear_cpu);
  m.impl("paged_prefix_attention", &paged_prefix_attention_cpu);
  m.impl("tree_attention", &tree_attention_cpu);
  m.impl("merge_attention_states", &merge_attention_states_cpu);
}

}  // namespace specextend

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1,
                                   nullptr};
  return PyModule_Create(&module_def);
}
