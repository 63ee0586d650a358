#!/usr/bin/env bash
# Sets up the environment, builds the offline models and texts (cached outside the repo),
# then rebuilds benchmarks/results/: one command per saved result, exactly as it was made.
# With arguments, only the results named (for example `bash scripts/bench.sh lossless
# long_inputs_needle_chunk32`); without, all of them (about 6 hours on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
python="${SPECEXTEND_VENV:-.venv}/bin/python"
"$python" -m benchmarks.assets
source scripts/cpu_allocator.sh

long_inputs=("$python" -m benchmarks.long_inputs)
declare -A commands=(
  [demo]="${python} -m benchmarks.demo"
  [demo_amx_lengths]="${python} -m benchmarks.demo --methods draft_model,specextend --repeats 5 --output benchmarks/results/demo_amx_lengths.json"
  [demo_amx_int8_head]="${python} -m benchmarks.demo --methods draft_model,specextend,specextend_always,specextend_always_head_as_loaded --repeats 5 --output benchmarks/results/demo_amx_int8_head.json"
  [demo_amx_margin]="${python} -m benchmarks.demo --methods draft_model,specextend --repeats 5 --output benchmarks/results/demo_amx_margin.json"
  [demo_amx_small_batch_int8]="${python} -m benchmarks.demo --methods draft_model,specextend --repeats 5 --output benchmarks/results/demo_amx_small_batch_int8.json"
  [demo_amx_small_batch_int8_again]="${python} -m benchmarks.demo --methods draft_model,specextend --repeats 5 --output benchmarks/results/demo_amx_small_batch_int8_again.json"
  [demo_amx_tcmalloc]="${python} -m benchmarks.demo --methods draft_model,specextend --repeats 5 --output benchmarks/results/demo_amx_tcmalloc.json"
  [demo_amx_512]="${python} -m benchmarks.demo --methods draft_model,specextend --repeats 5 --output benchmarks/results/demo_amx_512.json"
  [demo_amx_ops]="${python} -m benchmarks.demo --methods draft_model,specextend --repeats 5 --output benchmarks/results/demo_amx_ops.json"
  [demo_amd_eager]="${python} -m benchmarks.demo --methods draft_model,specextend --output benchmarks/results/demo_amd_eager.json"
  [demo_amd_compiled]="${python} -m benchmarks.demo --compiled --methods draft_model,specextend --output benchmarks/results/demo_amd_compiled.json"
  [demo_amd_compiled_repeats]="${python} -m benchmarks.demo --compiled --repeats 5 --methods draft_model,specextend,specextend_always --output benchmarks/results/demo_amd_compiled_repeats.json"
  [demo_amd_compiled_query_copy]="${python} -m benchmarks.demo --compiled --methods draft_model,specextend --output benchmarks/results/demo_amd_compiled_query_copy.json"
  [demo_amd_compiled_per_draft]="${python} -m benchmarks.demo --compiled --repeats 5 --methods draft_model,specextend --output benchmarks/results/demo_amd_compiled_per_draft.json"
  [demo_amd_compiled_again]="${python} -m benchmarks.demo --compiled --repeats 5 --methods draft_model,specextend --output benchmarks/results/demo_amd_compiled_again.json"
  [demo_amd_compiled_again_2]="${python} -m benchmarks.demo --compiled --repeats 5 --methods draft_model,specextend --output benchmarks/results/demo_amd_compiled_again_2.json"
  [demo_amd_compiled_decode_kernel]="${python} -m benchmarks.demo --compiled --repeats 5 --methods draft_model,specextend --output benchmarks/results/demo_amd_compiled_decode_kernel.json"
  [draft_length_modes_amd_8k_compiled]="${python} -m benchmarks.draft_length_modes --compiled --output draft_length_modes_amd_8k_compiled"
  [draft_length_modes_amd_8k_fiction_code]="${python} -m benchmarks.draft_length_modes --compiled --genres fiction code --output draft_length_modes_amd_8k_fiction_code"
  [draft_length_modes_amd_8k_code_fiction]="${python} -m benchmarks.draft_length_modes --compiled --genres code fiction --output draft_length_modes_amd_8k_code_fiction"
  [draft_length_modes_amd_8k_code_fiction_again]="${python} -m benchmarks.draft_length_modes --compiled --genres code fiction --output draft_length_modes_amd_8k_code_fiction_again"
  [draft_cost]="${python} -m benchmarks.draft_cost"
  [draft_cost_avx2]="${python} -m benchmarks.draft_cost --lengths 1024 4096 --models 'target fp32 (1.5B)' 'draft fp32 (0.5B)' 'draft int8 (0.5B)' --output draft_cost_avx2"
  [draft_cost_in_method]="${python} -m benchmarks.draft_cost_in_method"
  [lossless]="VLLM_CPU_KVCACHE_SPACE=5 ${python} -m benchmarks.lossless"
  [long_inputs_speed]="${long_inputs[*]} speed --texts-per-length 1 && ${long_inputs[*]} speed --append --texts paul_graham_essays --texts-per-length 1 --lengths 4096 8192"
  [long_inputs_speed_defaults]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres fiction essays code dialogue docs --texts-per-length 1 --lengths 4096 --repeats 3 --output long_inputs_speed_defaults && ${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres fiction essays code --texts-per-length 1 --lengths 8192 --repeats 3 --output long_inputs_speed_defaults --append"
  [long_inputs_speed_amx_lengths]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres fiction essays code dialogue docs --texts-per-length 1 --lengths 4096 --repeats 3 --output long_inputs_speed_amx_lengths && ${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres fiction essays code --texts-per-length 1 --lengths 8192 --repeats 3 --output long_inputs_speed_amx_lengths --append"
  [long_inputs_speed_amx_short]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres fiction essays code dialogue docs --texts-per-length 1 --lengths 1024 2048 --repeats 3 --output long_inputs_speed_amx_short"
  [long_inputs_speed_amx_16k_compiled]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --genres essays --texts-per-length 1 --lengths 16384 --repeats 3 --output long_inputs_speed_amx_16k_compiled && ${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --genres code --texts-per-length 1 --lengths 16384 --repeats 3 --output long_inputs_speed_amx_16k_compiled --append && ${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --genres fiction --texts-per-length 1 --lengths 16384 --repeats 3 --output long_inputs_speed_amx_16k_compiled --append && ${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --genres dialogue --texts-per-length 1 --lengths 16384 --repeats 3 --output long_inputs_speed_amx_16k_compiled --append && ${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --genres docs --texts-per-length 1 --lengths 16384 --repeats 3 --output long_inputs_speed_amx_16k_compiled --append"
  [long_inputs_speed_amx_16k_code_again]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --genres code --texts-per-length 1 --lengths 16384 --repeats 3 --output long_inputs_speed_amx_16k_code_again"
  [long_inputs_speed_amx_1k_margin]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres essays fiction code dialogue docs --texts-per-length 1 --lengths 1024 --repeats 3 --output long_inputs_speed_amx_1k_margin"
  [long_inputs_speed_amx_8k_tcmalloc]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres essays code --texts-per-length 1 --lengths 8192 --repeats 3 --output long_inputs_speed_amx_8k_tcmalloc"
  [long_inputs_speed_amx_8k_window]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres essays code --texts-per-length 1 --lengths 8192 --repeats 3 --output long_inputs_speed_amx_8k_window"
  [long_inputs_speed_amx_8k_512]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres essays code --texts-per-length 1 --lengths 8192 --repeats 3 --output long_inputs_speed_amx_8k_512"
  [long_inputs_speed_amx_8k_more]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres dialogue docs --texts-per-length 1 --lengths 8192 --repeats 3 --output long_inputs_speed_amx_8k_more"
  [long_inputs_speed_amx_8k_continuation]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --genres essays fiction code --skip-texts 1 --texts-per-length 1 --lengths 8192 --repeats 3 --specextend-engines '{\"continuation\": {\"chunk_ranking\": \"continuation\"}}' --output long_inputs_speed_amx_8k_continuation"
  [long_inputs_speed_amd_8k_compiled]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --genres essays fiction code dialogue --skip-texts 2 --texts-per-length 1 --lengths 8192 --repeats 3 --specextend-engines '{\"fixed\": {\"drafting\": \"always\", \"retrieval\": \"always\"}}' --output long_inputs_speed_amd_8k_compiled"
  [long_inputs_speed_amd_8k_unseen]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --texts milton/areopagitica milton/comus --texts-per-length 2 --lengths 8192 --repeats 3 --output long_inputs_speed_amd_8k_unseen"
  [long_inputs_speed_amd_short_unseen]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --texts shakespeare/coriolanus shakespeare/twelfth_night paul_graham/worked paul_graham/wisdom --texts-per-length 4 --lengths 2048 4096 --repeats 3 --specextend-engines '{\"fixed\": {\"drafting\": \"always\", \"retrieval\": \"always\"}}' --output long_inputs_speed_amd_short_unseen"
  [long_inputs_speed_amd_8k_unseen_more]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --texts shakespeare/richard_iii paul_graham/popular --texts-per-length 2 --lengths 8192 --repeats 3 --output long_inputs_speed_amd_8k_unseen_more"
  [long_inputs_speed_amd_16k_unseen]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --texts shakespeare/winters_tale paul_graham/worked --texts-per-length 2 --lengths 16384 --repeats 3 --specextend-engines '{\"fixed\": {\"drafting\": \"always\", \"retrieval\": \"always\"}}' --output long_inputs_speed_amd_16k_unseen"
  [long_inputs_speed_amd_16k_unseen_plays]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --texts shakespeare/othello shakespeare/antony_and_cleopatra --texts-per-length 2 --lengths 16384 --repeats 3 --output long_inputs_speed_amd_16k_unseen_plays"
  [long_inputs_speed_amd_16k_antony_again]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --texts shakespeare/antony_and_cleopatra --texts-per-length 1 --lengths 16384 --repeats 3 --output long_inputs_speed_amd_16k_antony_again"
  [plain_decode_kernel_amd]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --methods no_speculation --texts shakespeare/macbeth --texts-per-length 1 --lengths 8192 16384 --repeats 3 --specextend-engines '{\"plain_kernel\": {\"drafting\": \"always\", \"num_speculative_tokens_per_batch_size\": [[1, 1, 0]]}, \"plain_native\": {\"drafting\": \"always\", \"num_speculative_tokens_per_batch_size\": [[1, 1, 0]], \"verification_attention\": \"native\"}}' --output plain_decode_kernel_amd"
  [plain_decode_attention_amd_8k]="${python} -m benchmarks.draft_length_modes --genres fiction essays --length 8192 --rounds 6 --modes plain plain_vllm_attention --compiled --output plain_decode_attention_amd_8k"
  [plain_decode_attention_amd_16k]="${python} -m benchmarks.draft_length_modes --genres fiction essays --length 16384 --rounds 6 --modes plain plain_vllm_attention --compiled --output plain_decode_attention_amd_16k"
  [long_inputs_speed_amd_16k_winters_again]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --texts shakespeare/winters_tale --texts-per-length 1 --lengths 16384 --repeats 3 --output long_inputs_speed_amd_16k_winters_again"
  [long_inputs_speed_amd_8k_compiled_noise]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --genres essays fiction code dialogue --skip-texts 2 --texts-per-length 1 --lengths 8192 --repeats 3 --specextend-engines '{\"fixed\": {\"drafting\": \"always\", \"retrieval\": \"always\"}}' --output long_inputs_speed_amd_8k_compiled_noise"
  [long_inputs_speed_amd_8k_compiled_lengths]="${long_inputs[*]} speed --draft-precision int8 --at-defaults --compiled --genres essays fiction code dialogue --skip-texts 2 --texts-per-length 1 --lengths 8192 --repeats 3 --specextend-engines '{\"fixed\": {\"drafting\": \"always\", \"retrieval\": \"always\"}}' --output long_inputs_speed_amd_8k_compiled_lengths"
  [long_inputs_speed_amx_4k_fp32]="${long_inputs[*]} speed --draft-precision fp32 --at-defaults --genres fiction essays code dialogue docs --texts-per-length 1 --lengths 4096 --repeats 3 --output long_inputs_speed_amx_4k_fp32"
  [long_inputs_speed_avx2_lengths]="${long_inputs[*]} speed --at-defaults --genres essays code --texts-per-length 1 --lengths 4096 --repeats 3 --output long_inputs_speed_avx2_lengths"
  [method_cost]="${python} -m benchmarks.method_cost"
  [prefill_cost]="${python} -m benchmarks.prefill_cost"
  [prefill_window]="${python} -m benchmarks.prefill_cost --lengths 8192 --windows whole 2048 1024 --max-tokens 64 --every-step --output prefill_window"
  [prefill_window_16k]="${python} -m benchmarks.prefill_cost --lengths 16384 --windows whole 1024 --max-tokens 64 --every-step --output prefill_window_16k"
  [prefill_window_amd]="${python} -m benchmarks.prefill_cost --lengths 8192 --windows 1024 512 256 --max-tokens 128 --every-step --text-index 2 --output prefill_window_amd"
  [prefill_cost_system_malloc]="LD_PRELOAD= ${python} -m benchmarks.prefill_cost --output prefill_cost_system_malloc"
  [prefill_cost_cached]="${python} -m benchmarks.prefill_cost --cached --output prefill_cost_cached"
  [prefill_cost_cached_before_twins]="${python} -m benchmarks.prefill_cost --cached --output prefill_cost_cached_before_twins"
  [draft_int8_kernel]="${python} -m benchmarks.draft_int8_kernel"
  [long_inputs_tiny_draft]="${long_inputs[*]} tiny_draft --texts-per-length 1"
  [long_inputs_tiny_draft_hybrid]="${long_inputs[*]} tiny_draft --lengths 16384 --texts-per-length 1 --methods no_speculation specextend --output long_inputs_tiny_draft_hybrid"
  [long_inputs_needle]="${long_inputs[*]} needle --specextend-keys '{\"chunk_size\": 128}'"
  [long_inputs_needle_chunk32]="${long_inputs[*]} needle --specextend-keys '{\"chunk_size\": 32}' --block-size 32 --output long_inputs_needle_chunk32"
  [long_inputs_needle_window]="${long_inputs[*]} needle --specextend-keys '{\"chunk_size\": 32, \"draft_prefill_window\": 256}' --block-size 32 --output long_inputs_needle_window"
  [long_inputs_needle_whole_prefill]="${long_inputs[*]} needle --specextend-keys '{\"chunk_size\": 32, \"draft_prefill_window\": null}' --block-size 32 --output long_inputs_needle_whole_prefill"
  [long_inputs_batch]="${long_inputs[*]} batch"
  [long_inputs_draft_step]="${long_inputs[*]} draft_step"
  [long_inputs_verification]="${long_inputs[*]} verification --texts-per-length 1 --max-tokens 64 --methods no_speculation specextend"
  [long_inputs_verification_int8_ops]="${long_inputs[*]} verification --texts-per-length 1 --max-tokens 64 --methods no_speculation specextend --draft-precision int8 --lengths 4096 8192 16384 --output long_inputs_verification_int8_ops"
  [long_inputs_trees]="${long_inputs[*]} trees --lengths 4096 --max-tokens 48 --texts paul_graham_essays milton/paradise_lost_no_introduction --texts-per-length 2"
  [long_inputs_trees_8k]="${long_inputs[*]} trees --lengths 8192 --max-tokens 48 --texts shakespeare/lear --texts-per-length 1 --tree-settings chain dynamic16 --output long_inputs_trees_8k"
  [long_inputs_trees_8k_int8]="${long_inputs[*]} trees --lengths 8192 --max-tokens 48 --texts shakespeare/lear --texts-per-length 1 --tree-settings chain dynamic16 --draft-precision int8 --repeats 3 --output long_inputs_trees_8k_int8"
  [long_inputs_trees_8k_int8_512]="${long_inputs[*]} trees --lengths 8192 --max-tokens 48 --texts shakespeare/lear --texts-per-length 1 --tree-settings chain dynamic8 dynamic16 --draft-precision int8 --repeats 3 --output long_inputs_trees_8k_int8_512"
  [retrieval_accuracy_8k_continuation]="VLLM_CPU_KVCACHE_SPACE=2 ${python} -m benchmarks.retrieval_accuracy --lengths 8192 --skip-texts 1 --texts-per-genre 2 --settings full cmr_chunk32 cmr_chunk32_continuation cmr_chunk128 --output retrieval_accuracy_8k_continuation"
  [retrieval_accuracy]="VLLM_CPU_KVCACHE_SPACE=2 ${python} -m benchmarks.retrieval_accuracy --lengths 4096 && VLLM_CPU_KVCACHE_SPACE=2 ${python} -m benchmarks.retrieval_accuracy --append --lengths 8192 --texts-per-genre 1 --settings full streaming cmr_chunk32 cmr_chunk128"
  [scorer_cpu]="${python} -m benchmarks.kernels.bench_chunk_scores"
  [prefix_attention_cpu]="${python} -m benchmarks.kernels.bench_prefix_attention"
  [prefix_attention_cpu_512]="${python} -m benchmarks.kernels.bench_prefix_attention --output benchmarks/results/prefix_attention_cpu_512.json"
  [tree_attention_cpu]="${python} -m benchmarks.kernels.bench_tree_attention"
  [prefix_attention_cpu_layers]="${python} -m benchmarks.kernels.bench_prefix_attention --layers 28 --prefix-lens 4096 8192 16384 --batches 1 --query-lens 3 5 9 17 --threads 2 --output benchmarks/results/prefix_attention_cpu_layers.json"
  [draft_vocab_logits]="${python} -m benchmarks.kernels.bench_draft_vocab_logits"
  [int8_linear_cpu]="${python} -m benchmarks.kernels.bench_int8_linear"
  [working_copies_cpu]="${python} -m benchmarks.kernels.bench_working_copies"
  [serving]="${python} -m benchmarks.serving"
  [serving_int8]="${python} -m benchmarks.serving --draft-precision int8 --methods no_speculation draft_model specextend specextend_deferred_prefill --output serving_int8"
  [serving_int8_lengths]="${python} -m benchmarks.serving --draft-precision int8 --output serving_int8_lengths"
  [serving_int8_compiled]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation draft_model specextend specextend_deferred_prefill --output serving_int8_compiled"
  [serving_int8_compiled_choices]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_choices"
  [serving_int8_compiled_small_batch]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_small_batch"
  [serving_int8_compiled_small_batch_again]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_small_batch_again"
  [serving_int8_compiled_tcmalloc]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_tcmalloc"
  [serving_int8_compiled_ops]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_ops"
  [serving_int8_compiled_fresh_c4_before]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_before"
  [serving_int8_compiled_fresh_c4]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4"
  [serving_int8_compiled_fresh_c8]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 8 --num-prompts 16 --methods no_speculation specextend --output serving_int8_compiled_fresh_c8"
  [serving_int8_compiled_fresh_c4_prompt_work]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_prompt_work"
  [serving_int8_compiled_fresh_c4_before_prompt_work]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_before_prompt_work"
  [serving_int8_compiled_fresh_c4_prompt_work_bounded]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_prompt_work_bounded"
  [serving_int8_compiled_fresh_c4_prompt_work_bounded_2]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_prompt_work_bounded_2"
  [serving_int8_compiled_fresh_c8_prompt_work]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 8 --num-prompts 16 --methods no_speculation specextend --output serving_int8_compiled_fresh_c8_prompt_work"
  [serving_int8_compiled_fresh_c4_before_prompt_work_2]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_before_prompt_work_2"
  [serving_int8_compiled_fresh_c4_before_priced]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_before_priced"
  [serving_int8_compiled_fresh_c4_priced]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_priced"
  [serving_int8_compiled_fresh_c8_before_priced]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 8 --num-prompts 16 --methods no_speculation specextend --output serving_int8_compiled_fresh_c8_before_priced"
  [serving_int8_compiled_fresh_c8_priced]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 8 --num-prompts 16 --methods no_speculation specextend --output serving_int8_compiled_fresh_c8_priced"
  [serving_int8_compiled_fresh_c4_priced_2]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_priced_2"
  [serving_int8_compiled_fresh_c4_priced_tenth]="${python} -m benchmarks.serving --draft-precision int8 --compiled --concurrency 4 --num-prompts 12 --methods no_speculation specextend --output serving_int8_compiled_fresh_c4_priced_tenth"
  [serving_int8_compiled_twins]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_twins"
  [serving_int8_compiled_twins_2]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_twins_2"
  [serving_int8_compiled_twins_3]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_twins_3"
  [serving_int8_compiled_twins_4]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_twins_4"
  [serving_int8_compiled_before_twins]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_before_twins"
  [serving_int8_compiled_before_twins_2]="${python} -m benchmarks.serving --draft-precision int8 --compiled --methods no_speculation specextend --output serving_int8_compiled_before_twins_2"
)
order=(
  demo demo_amx_lengths demo_amx_int8_head demo_amx_margin demo_amx_small_batch_int8 demo_amx_small_batch_int8_again demo_amx_tcmalloc demo_amx_512 demo_amx_ops demo_amd_eager demo_amd_compiled demo_amd_compiled_repeats demo_amd_compiled_query_copy demo_amd_compiled_per_draft demo_amd_compiled_again demo_amd_compiled_again_2 demo_amd_compiled_decode_kernel draft_cost draft_cost_avx2 draft_cost_in_method method_cost prefill_cost prefill_cost_system_malloc prefill_cost_cached prefill_cost_cached_before_twins prefill_window prefill_window_16k prefill_window_amd draft_int8_kernel lossless long_inputs_speed long_inputs_speed_defaults long_inputs_speed_amx_lengths long_inputs_speed_amx_short long_inputs_speed_amx_1k_margin long_inputs_speed_amx_16k_compiled long_inputs_speed_amx_16k_code_again long_inputs_speed_amx_8k_more long_inputs_speed_amx_8k_tcmalloc long_inputs_speed_amx_8k_window long_inputs_speed_amx_8k_512 long_inputs_speed_amx_8k_continuation long_inputs_speed_amd_8k_compiled long_inputs_speed_amd_8k_unseen long_inputs_speed_amd_8k_unseen_more long_inputs_speed_amd_short_unseen long_inputs_speed_amd_16k_unseen long_inputs_speed_amd_16k_winters_again long_inputs_speed_amd_16k_unseen_plays long_inputs_speed_amd_16k_antony_again plain_decode_kernel_amd plain_decode_attention_amd_8k plain_decode_attention_amd_16k long_inputs_speed_amd_8k_compiled_noise long_inputs_speed_amd_8k_compiled_lengths draft_length_modes_amd_8k_compiled draft_length_modes_amd_8k_fiction_code draft_length_modes_amd_8k_code_fiction draft_length_modes_amd_8k_code_fiction_again long_inputs_speed_amx_4k_fp32 long_inputs_speed_avx2_lengths long_inputs_tiny_draft long_inputs_tiny_draft_hybrid
  long_inputs_needle long_inputs_needle_chunk32 long_inputs_needle_window long_inputs_needle_whole_prefill long_inputs_batch long_inputs_draft_step
  long_inputs_verification long_inputs_verification_int8_ops long_inputs_trees long_inputs_trees_8k long_inputs_trees_8k_int8 long_inputs_trees_8k_int8_512 retrieval_accuracy retrieval_accuracy_8k_continuation
  scorer_cpu prefix_attention_cpu prefix_attention_cpu_512 prefix_attention_cpu_layers tree_attention_cpu draft_vocab_logits int8_linear_cpu working_copies_cpu serving serving_int8 serving_int8_lengths serving_int8_compiled serving_int8_compiled_choices serving_int8_compiled_small_batch serving_int8_compiled_small_batch_again serving_int8_compiled_tcmalloc serving_int8_compiled_ops serving_int8_compiled_fresh_c4_before serving_int8_compiled_fresh_c4 serving_int8_compiled_fresh_c8 serving_int8_compiled_fresh_c4_prompt_work serving_int8_compiled_fresh_c4_before_prompt_work serving_int8_compiled_fresh_c4_prompt_work_bounded serving_int8_compiled_fresh_c4_prompt_work_bounded_2 serving_int8_compiled_fresh_c8_prompt_work serving_int8_compiled_fresh_c4_before_prompt_work_2 serving_int8_compiled_fresh_c4_before_priced serving_int8_compiled_fresh_c4_priced serving_int8_compiled_fresh_c8_before_priced serving_int8_compiled_fresh_c8_priced serving_int8_compiled_fresh_c4_priced_2 serving_int8_compiled_fresh_c4_priced_tenth serving_int8_compiled_twins serving_int8_compiled_twins_2 serving_int8_compiled_twins_3 serving_int8_compiled_twins_4 serving_int8_compiled_before_twins serving_int8_compiled_before_twins_2
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${order[@]}")
for name in "${names[@]}"; do
  if [ -z "${commands[$name]+set}" ]; then
    echo "unknown result '$name'; known: ${order[*]}" >&2
    exit 2
  fi
done
for name in "${names[@]}"; do
  echo "== $name: ${commands[$name]}"
  bash -c "set -euo pipefail; ${commands[$name]}"
done
