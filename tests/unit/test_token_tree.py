import random

import pytest
import torch
from scipy import stats

from specextend_vllm.algorithm.token_tree import (
    DynamicTreeGrowth,
    TokenTree,
    TokenTreeError,
    accept_paths,
    ancestors_from_parents,
    masks_from_ancestors,
)


def random_tree(rng: random.Random, num_nodes: int, max_children: int = 3) -> TokenTree:
    paths: list[list[int]] = []
    while len(paths) < num_nodes:
        parent = rng.choice([[], *paths])
        ranks = {path[-1] for path in paths if path[:-1] == parent}
        free = [rank for rank in range(max_children) if rank not in ranks]
        if free:
            paths.append([*parent, rng.choice(free)])
    return TokenTree.from_paths(paths)


def children(tree: TokenTree, node: int) -> list[int]:
    return [child for child, parent in enumerate(tree.parents) if parent == node and child]


def brute_force(tree: TokenTree, tokens: list[int], choices: list[int]) -> list[int]:
    """Walks down from the root into the child matching the target's choice."""
    output, node = [], 0
    while True:
        match = [child for child in children(tree, node) if tokens[child] == choices[node]]
        if not match:
            return [*output, choices[node]]
        node = match[0]
        output.append(tokens[node])


def distinct_sibling_tokens(tree: TokenTree, rng: random.Random, vocab: int) -> list[int]:
    tokens = [0] * (tree.num_drafts + 1)
    for node in range(tree.num_drafts + 1):
        for child, token in zip(children(tree, node), rng.sample(range(vocab), vocab)):
            tokens[child] = token
    return tokens


def test_topology_of_a_small_tree():
    tree = TokenTree.from_paths([[1], [0, 0], [0]])  # given in any order
    assert tree.parents == (-1, 0, 0, 1)
    assert tree.ranks == (0, 0, 1, 0)
    assert tree.depths == (0, 1, 1, 2)
    assert tree.ancestors_by_depth().tolist() == [[0, -1, -1], [0, 1, -1], [0, 2, -1], [0, 1, 3]]
    expansions = tree.expansions()
    assert [e.nodes.tolist() for e in expansions] == [[0], [1]]
    assert [e.child_of_rank.tolist() for e in expansions] == [[[1, 2]], [[3]]]


def test_chain_mask_is_causal():
    chain = TokenTree.from_paths([[0] * depth for depth in range(1, 5)])
    assert torch.equal(chain.ancestor_mask(), torch.ones(5, 5).tril().bool())


@pytest.mark.parametrize(
    "paths, message",
    [
        ([[0], [0, 0, 1]], "no parent"),
        ([[0], [0]], "distinct"),
        ([[0], []], "non-empty"),
        ([[0], [-1]], ">= 0"),
        ([[0], ["a"]], "child ranks"),
        ([[0] * depth for depth in range(1, 66)], "at most 64"),
    ],
)
def test_bad_trees_are_refused(paths, message):
    with pytest.raises(TokenTreeError, match=message):
        TokenTree.from_paths(paths)


def test_skipped_ranks_leave_empty_candidate_columns():
    expansion = TokenTree.from_paths([[0], [2]]).expansions()[0]
    assert expansion.child_of_rank.tolist() == [[1, -1, 2]]


@pytest.mark.parametrize("seed", range(20))
def test_acceptance_matches_brute_force_on_random_trees(seed):
    rng = random.Random(seed)
    tree = random_tree(rng, rng.randint(1, 20))
    vocab, num_reqs = 4, 16
    tokens = [distinct_sibling_tokens(tree, rng, vocab) for _ in range(num_reqs)]
    # Choices drawn to match the children often, so that paths go deep.
    choices = [
        [rng.choice([tokens[r][c] for c in children(tree, node)] or [0]) if rng.random() < 0.8
         else rng.randrange(vocab) for node in range(tree.num_drafts + 1)]
        for r in range(num_reqs)
    ]
    # Some requests verify no drafts, some a breadth-first prefix of the tree.
    num_drafts = torch.tensor(
        [0 if r % 5 == 4 else tree.num_drafts - (r % 3 == 2) for r in range(num_reqs)]
    )
    paths = accept_paths(
        torch.tensor(tokens),
        torch.tensor(choices),
        tree.ancestors_by_depth().expand(num_reqs, -1, -1),
        torch.tensor(tree.parents).expand(num_reqs, -1),
        num_drafts,
    )
    for r in range(num_reqs):
        kept = int(num_drafts[r])
        pruned = TokenTree(tree.parents[: kept + 1], tree.ranks[: kept + 1])
        expected = brute_force(pruned, tokens[r][: kept + 1], choices[r][: kept + 1])
        row = paths.output_tokens[r].tolist()
        assert row[: len(expected)] == expected
        assert all(token == -1 for token in row[len(expected):])
        assert paths.num_accepted[r] == len(expected) - 1
        order = paths.chain_order[r].tolist()
        assert sorted(order) == list(range(tree.num_drafts + 1))
        path_nodes = order[: len(expected)]
        assert [tokens[r][node] for node in path_nodes[1:]] == expected[:-1]
        assert [tree.depths[node] for node in path_nodes] == list(range(len(expected)))
        rest = order[len(expected):]
        assert rest == sorted(rest)


def test_a_chain_shaped_tree_accepts_as_the_chain_does():
    tree = TokenTree.from_paths([[0] * depth for depth in range(1, 5)])
    drafts = torch.tensor([[0, 3, 4, 5, 6], [0, 3, 4, 5, 6]])
    choices = torch.tensor([[3, 4, 9, 0, 0], [3, 4, 5, 6, 7]])
    paths = accept_paths(
        drafts, choices, tree.ancestors_by_depth().expand(2, -1, -1),
        torch.tensor(tree.parents).expand(2, -1), torch.tensor([4, 4]),
    )
    assert paths.output_tokens.tolist() == [[3, 4, 9, -1, -1], [3, 4, 5, 6, 7]]
    assert paths.chain_order.tolist() == [[0, 1, 2, 3, 4]] * 2


def test_sampling_on_a_tree_follows_the_target_distribution():
    """A target over 5 tokens conditioned on the previous token; draft tokens fixed.
    Sampling the target at every node and descending where the sample is a child gives
    first tokens ~ p(. | root) and second tokens ~ p(. | first)."""
    generator = torch.Generator().manual_seed(0)
    vocab, num_samples = 5, 20000
    conditional = torch.softmax(
        torch.randn(vocab, vocab, generator=generator, dtype=torch.float64) * 1.5, dim=1
    )
    tree = TokenTree.from_paths([[0], [1], [0, 0], [0, 1], [1, 0]])
    root_token = 2
    node_tokens = torch.tensor([root_token, 0, 1, 3, 4, 1])
    previous = node_tokens.clone()
    choices = torch.multinomial(
        conditional[previous], num_samples, replacement=True, generator=generator
    ).T
    paths = accept_paths(
        node_tokens.expand(num_samples, -1), choices,
        tree.ancestors_by_depth().expand(num_samples, -1, -1),
        torch.tensor(tree.parents).expand(num_samples, -1),
        torch.full((num_samples,), tree.num_drafts),
    )
    first = paths.output_tokens[:, 0]
    observed = torch.bincount(first, minlength=vocab).double()
    assert stats.chisquare(observed, conditional[root_token] * num_samples).pvalue > 1e-3
    for token in (0, 1):  # first tokens the tree holds drafts for
        rows = (first == token) & (paths.num_accepted >= 1)
        second = torch.bincount(paths.output_tokens[rows, 1], minlength=vocab).double()
        expected = conditional[token] * second.sum()
        assert stats.chisquare(second, expected).pvalue > 1e-3


@pytest.mark.parametrize("seed", range(5))
def test_per_request_ancestors_and_masks_match_the_static_topology(seed):
    trees = [random_tree(random.Random(seed * 10 + r), 12) for r in range(3)]
    parents = torch.tensor([tree.parents for tree in trees])
    depth = max(tree.max_depth for tree in trees)
    ancestors = ancestors_from_parents(parents, depth)
    for r, tree in enumerate(trees):
        expected = tree.ancestors_by_depth()
        assert torch.equal(ancestors[r, :, : expected.shape[1]], expected)
        assert (ancestors[r, :, expected.shape[1]:] == -1).all()
    masks = masks_from_ancestors(ancestors)
    for r, tree in enumerate(trees):
        assert torch.equal(masks[r], tree.ancestor_mask())


def brute_force_dynamic_tree(root_logprobs, logprobs_of, num_nodes, branching, width, depth):
    """The same growth one request at a time with Python lists: candidates are
    (score, path of tokens); returns the chosen paths."""
    candidates = []
    frontier = [(float(s), (int(t),)) for s, t in zip(*root_logprobs.topk(branching))]
    candidates += frontier
    for _ in range(depth - 1):
        expanded = sorted(frontier, key=lambda c: -c[0])[:width]
        frontier = []
        for score, path in expanded:
            values, tokens = logprobs_of(path).topk(branching)
            frontier += [(score + float(v), (*path, int(t))) for v, t in zip(values, tokens)]
        candidates += frontier
    return {path for _, path in sorted(candidates, key=lambda c: -c[0])[:num_nodes]}


@pytest.mark.parametrize("seed", range(5))
def test_dynamic_growth_keeps_the_most_probable_paths(seed):
    generator = torch.Generator().manual_seed(seed)
    vocab, num_reqs, depth, branching, width, num_nodes = 12, 3, 4, 3, 2, 9
    # The draft's log-probabilities at a node depend on the path's last two tokens.
    table = torch.log_softmax(torch.randn(vocab, vocab, vocab, generator=generator) * 2, dim=-1)
    roots = torch.log_softmax(torch.randn(num_reqs, vocab, generator=generator) * 2, dim=-1)

    def logprobs_of(request, path):
        return table[path[-2] if len(path) > 1 else request, path[-1]]

    growth = DynamicTreeGrowth(num_nodes, branching, width)
    growth.start(roots)
    paths_of_candidates = [[(int(t),) for t in row] for row in growth.tokens[0]]
    for _ in range(depth - 1):
        expanded = growth.expand()
        expanded_paths = [[paths_of_candidates[r][i] for i in expanded[r].tolist()] for r in range(num_reqs)]
        growth.add_children(torch.stack([
            torch.stack([logprobs_of(r, path) for path in expanded_paths[r]]) for r in range(num_reqs)
        ]))
        tokens = growth.tokens[-1].view(num_reqs, width, branching)
        paths_of_candidates = [
            [(*expanded_paths[r][w], int(tokens[r, w, c])) for w in range(width) for c in range(branching)]
            for r in range(num_reqs)
        ]
    node_tokens, parents = growth.tree()
    for r in range(num_reqs):
        paths = {}
        for node in range(1, num_nodes + 1):
            parent = int(parents[r, node])
            assert parent < node
            paths[node] = (*paths.get(parent, ()), int(node_tokens[r, node - 1]))
        expected = brute_force_dynamic_tree(
            roots[r], lambda path: logprobs_of(r, path), num_nodes, branching, width, depth
        )
        assert set(paths.values()) == expected
        depths = [len(path) for path in paths.values()]
        assert depths == sorted(depths)
