"""The tree verifier's step bookkeeping on CPU tensors: positions by depth and masks
after vLLM's layout, and the step left as the chain of the accepted path, KV included,
in both cache layouts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specextend_vllm.algorithm import kv_cache_layout
from specextend_vllm.algorithm.token_tree import TokenTree
from specextend_vllm.final_layer_query import FinalLayerQuery
from specextend_vllm.trees.verification import TreeVerifier

TREE = TokenTree.from_paths([[0], [1], [0, 0]])
BLOCK_SIZE = 4
NUM_KV_HEADS, HEAD_DIM = 2, 8


def step_metadata() -> tuple[SimpleNamespace, torch.Tensor]:
    """Request 0 verifies the whole tree from position 40 (rows 0-3); request 1 is a
    prompt chunk (rows 4-8); request 2 verifies the first two nodes from position 10."""
    positions = torch.tensor([40, 41, 42, 43, 0, 1, 2, 3, 4, 10, 11, 12])
    metadata = SimpleNamespace(
        num_draft_tokens=[3, 0, 2],
        logits_indices=torch.tensor([0, 1, 2, 3, 8, 9, 10, 11], dtype=torch.int32),
        cu_num_sampled_tokens=torch.tensor([4, 5, 8], dtype=torch.int32),
    )
    return metadata, positions


def new_verifier(caches: list[torch.Tensor] | None = None) -> TreeVerifier:
    return TreeVerifier(
        TREE.num_drafts, TREE.max_depth, torch.device("cpu"), lambda: caches or [],
        FinalLayerQuery(2, HEAD_DIM), BLOCK_SIZE,
    )


def static_parents(num_reqs: int) -> torch.Tensor:
    return torch.tensor(TREE.parents).expand(num_reqs, -1)


def test_plan_puts_nodes_at_positions_by_depth_and_masks_trees_only() -> None:
    verifier = new_verifier()
    metadata, positions = step_metadata()
    verifier.plan(metadata, positions, static_parents)
    assert positions.tolist() == [40, 41, 41, 42, 0, 1, 2, 3, 4, 10, 11, 11]
    step = verifier.step
    assert step.step_rows[0].tolist() == [0, 1, 2, 3] and step.step_rows[2, :3].tolist() == [9, 10, 11]
    attention = verifier.attention_step()
    assert attention.tree_requests.tolist() == [0, 2]
    assert torch.equal(attention.masks[0], TREE.ancestor_mask())
    assert torch.equal(attention.masks[1], torch.ones(4, 4, dtype=torch.bool).tril())
    verifier.plan(None, positions, static_parents)
    assert verifier.attention_step() is None


def test_a_step_where_no_request_drafted_has_no_tree_attention() -> None:
    verifier = new_verifier()
    metadata = SimpleNamespace(
        num_draft_tokens=[0, 0],
        logits_indices=torch.tensor([0, 1], dtype=torch.int32),
        cu_num_sampled_tokens=torch.tensor([1, 2], dtype=torch.int32),
    )
    verifier.plan(metadata, torch.tensor([7, 9]), static_parents)
    assert verifier.step is not None and verifier.attention_step() is None


@pytest.mark.parametrize("layout", ["cpu_vec", "flash_attn"])
def test_leave_chain_moves_the_accepted_path_into_the_first_slots(layout: str) -> None:
    generator = torch.Generator().manual_seed(0)
    num_blocks = 8
    if layout == "cpu_vec":
        raw = torch.randn(num_blocks, NUM_KV_HEADS, BLOCK_SIZE, 2 * HEAD_DIM, generator=generator)
    else:
        raw = torch.randn(2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=generator)
    keys, values = kv_cache_layout.key_cache_view(raw), kv_cache_layout.value_cache_view(raw)
    verifier = new_verifier([raw])
    metadata, positions = step_metadata()
    verifier.plan(metadata, positions, static_parents)
    # The target's choices: request 0 accepts node 2 (a leaf), request 2 node 1.
    input_ids = torch.tensor([5, 11, 12, 13, 0, 0, 0, 0, 0, 6, 21, 22])
    slot_mapping = torch.tensor([9, 10, 11, 12, 0, 1, 2, 3, 4, 17, 18, 19])
    choice_per_logit_row = torch.tensor([12, 0, 0, 0, 99, 21, 0, 0])
    logits = torch.nn.functional.one_hot(choice_per_logit_row, 100).float()
    query = torch.randn(12, 2, HEAD_DIM, generator=generator)
    verifier.final_layer_query.observe(query)
    query_before = query.clone()
    sampler = SimpleNamespace(logprobs_mode="raw_logprobs")
    output, paths = verifier.sample(
        logits, metadata.cu_num_sampled_tokens, SimpleNamespace(all_greedy=True, max_num_logprobs=None),
        sampler, input_ids,
    )
    assert output.sampled_token_ids.tolist() == [[12, 0, -1, -1], [99, -1, -1, -1], [21, 0, -1, -1]]
    source_slot, destination_slot = 11, 10  # request 0: node 2 (row 2) to the first slot
    key_before = keys[source_slot // BLOCK_SIZE, source_slot % BLOCK_SIZE].clone()
    value_before = values[source_slot // BLOCK_SIZE, source_slot % BLOCK_SIZE].clone()
    untouched = keys[18 // BLOCK_SIZE, 18 % BLOCK_SIZE].clone()  # request 2's node 1 stays

    verifier.leave_chain(paths, input_ids, positions, slot_mapping)

    assert input_ids.tolist() == [5, 12, 11, 13, 0, 0, 0, 0, 0, 6, 21, 22]
    assert positions.tolist() == [40, 41, 41, 42, 0, 1, 2, 3, 4, 10, 11, 11]
    kept_query = verifier.final_layer_query.query
    assert torch.equal(kept_query[1], query_before[2]) and torch.equal(kept_query[2], query_before[1])
    block, offset = destination_slot // BLOCK_SIZE, destination_slot % BLOCK_SIZE
    assert torch.equal(keys[block, offset], key_before)
    assert torch.equal(values[block, offset], value_before)
    assert torch.equal(keys[18 // BLOCK_SIZE, 18 % BLOCK_SIZE], untouched)


def test_each_request_verifies_its_own_tree() -> None:
    """Request 0's tree has two children under node 1, request 2's is a star: positions
    and masks follow each."""
    verifier = new_verifier()
    metadata, positions = step_metadata()
    parents = torch.tensor([[-1, 0, 1, 1], [-1, 0, 0, 1], [-1, 0, 0, 0]])
    verifier.plan(metadata, positions, lambda num_reqs: parents)
    assert positions.tolist() == [40, 41, 42, 42, 0, 1, 2, 3, 4, 10, 11, 11]
    masks = verifier.attention_step().masks
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(masks[0], expected)
    star = torch.eye(4, dtype=torch.bool)
    star[:, 0] = True
    assert torch.equal(masks[2], star)
