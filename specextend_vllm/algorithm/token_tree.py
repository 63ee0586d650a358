"""Token trees: the topology of a static draft tree and the acceptance of its longest
verified path.

Node 0 is the root, the last token the target produced; nodes 1..N are the draft tokens
in breadth-first order (N = num_speculative_tokens). A tree is given as paths of child
ranks: `[0, 1]` is the second most probable child (rank 1) of the most probable child of
the root. The target verifies all N + 1 nodes in one pass, node i at position
`root position + depth(i)`, attending to its ancestors only; a node is accepted when its
token is the target's choice at its parent and its parent is accepted.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import torch

MAX_TREE_NODES = 64


class TokenTreeError(ValueError):
    """A tree that is not a tree of child ranks."""


@dataclasses.dataclass(frozen=True)
class DepthExpansion:
    """Which nodes of one depth the draft runs, and where their candidates go.

    nodes: [W] the nodes of this depth that have children (the root alone at depth 0).
    child_of_rank: [W, C] the child holding each node's rank-c candidate, -1 where the
        tree keeps no child of that rank; C = 1 + the largest rank kept.
    """

    nodes: torch.Tensor
    child_of_rank: torch.Tensor


@dataclasses.dataclass(frozen=True)
class TokenTree:
    """parents[i]: the parent of node i (-1 for the root); ranks[i]: the rank of node i's
    token among the draft's candidates at its parent (0 for the root).

    >>> tree = TokenTree.from_paths([[0], [1], [0, 0]])
    >>> tree.parents, tree.depths
    ((-1, 0, 0, 1), (0, 1, 1, 2))
    >>> tree.ancestor_mask().int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    """

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> TokenTree:
        """Nodes ordered by depth, then by their paths; raises TokenTreeError naming the
        first path that does not fit."""
        keys: list[tuple[int, ...]] = []
        for path in paths:
            if (
                not isinstance(path, (list, tuple))
                or not path
                or not all(isinstance(rank, int) and not isinstance(rank, bool) for rank in path)
                or min(path) < 0
            ):
                raise TokenTreeError(
                    f"each path must be a non-empty list of child ranks >= 0, got {path!r}"
                )
            keys.append(tuple(path))
        if len(set(keys)) != len(keys):
            raise TokenTreeError("paths must be distinct")
        if len(keys) > MAX_TREE_NODES:
            raise TokenTreeError(f"at most {MAX_TREE_NODES} nodes, got {len(keys)}")
        ordered = sorted(keys, key=lambda key: (len(key), key))
        index = {(): 0} | {key: i + 1 for i, key in enumerate(ordered)}
        for key in ordered:
            if key[:-1] not in index:
                raise TokenTreeError(
                    f"path {list(key)} has no parent: {list(key[:-1])} is missing"
                )
        return cls(
            parents=(-1, *(index[key[:-1]] for key in ordered)),
            ranks=(0, *(key[-1] for key in ordered)),
        )

    @property
    def num_drafts(self) -> int:
        return len(self.parents) - 1

    @functools.cached_property
    def depths(self) -> tuple[int, ...]:
        depths = [0]
        for parent in self.parents[1:]:
            depths.append(depths[parent] + 1)
        return tuple(depths)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def ancestors_by_depth(self) -> torch.Tensor:
        """[N + 1, max_depth + 1] long: column d holds node i's ancestor at depth d (node i
        itself at its own depth), -1 past its depth."""
        table = torch.full((len(self.parents), self.max_depth + 1), -1, dtype=torch.long)
        for node in range(len(self.parents)):
            ancestor = node
            while ancestor >= 0:
                table[node, self.depths[ancestor]] = ancestor
                ancestor = self.parents[ancestor]
        return table

    def ancestor_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[N + 1, N + 1] bool: node i attends to node j where True (j an ancestor of i,
        or i itself)."""
        ancestors = self.ancestors_by_depth()
        mask = torch.zeros(len(self.parents), len(self.parents) + 1, dtype=torch.bool)
        mask.scatter_(1, torch.where(ancestors < 0, len(self.parents), ancestors), True)
        return mask[:, :-1].to(device)

    def expansions(self, device: torch.device | str = "cpu") -> list[DepthExpansion]:
        """One entry per depth 0..max_depth-1: the draft runs the listed nodes and fills
        their children from its most probable tokens, one depth per pass."""
        expansions = []
        for depth in range(self.max_depth):
            nodes = sorted(
                {self.parents[child] for child in range(1, len(self.parents))
                 if self.depths[child] == depth + 1}
            )
            width = 1 + max(
                self.ranks[child] for child in range(1, len(self.parents))
                if self.parents[child] in nodes
            )
            child_of_rank = torch.full((len(nodes), width), -1, dtype=torch.long)
            for row, node in enumerate(nodes):
                for child in range(1, len(self.parents)):
                    if self.parents[child] == node:
                        child_of_rank[row, self.ranks[child]] = child
            expansions.append(
                DepthExpansion(torch.tensor(nodes, device=device), child_of_rank.to(device))
            )
        return expansions


@dataclasses.dataclass(frozen=True)
class AcceptedPaths:
    """output_tokens: [R, N + 1] the accepted drafts along the path, then the target's
        choice at the deepest accepted node, then -1 (vLLM's chain output layout);
    num_accepted: [R] accepted drafts;
    chain_order: [R, N + 1] the nodes as the chain the step leaves behind: the root, the
        accepted path by depth, then the other nodes in their order."""

    output_tokens: torch.Tensor
    num_accepted: torch.Tensor
    chain_order: torch.Tensor


def accept_paths(
    node_tokens: torch.Tensor,
    target_choices: torch.Tensor,
    ancestors_by_depth: torch.Tensor,
    parents: torch.Tensor,
    num_drafts: torch.Tensor,
) -> AcceptedPaths:
    """The longest root-to-node path whose every draft is the target's choice at its
    parent. With `target_choices` the argmax this is greedy verification; with one
    sample of the target's distribution per node it is exact sampling (only the samples
    along the path are read, and siblings hold distinct tokens, so at most one child
    of an accepted node matches).

    node_tokens, target_choices: [R, N + 1] (node_tokens[:, 0], the root, is not read);
    ancestors_by_depth: [R, N + 1, D + 1] from `ancestors_from_parents` (or
    `TokenTree.ancestors_by_depth` expanded); parents: [R, N + 1] long (column 0
    ignored); num_drafts: [R] the nodes each request
    verifies this step: N, or fewer where vLLM's scheduler cut the drafts short (a
    breadth-first prefix of a tree is a tree), 0 where it verifies none.

    Tree [[0], [1], [0, 0]], drafts (-, 5, 6, 7), target choices (6, 9, 7, 2): node 2
    (token 6) matches the choice at the root, node 1 does not, so node 3 is out too;
    output = 6 then the choice at node 2:

    >>> tree = TokenTree.from_paths([[0], [1], [0, 0]])
    >>> paths = accept_paths(
    ...     torch.tensor([[0, 5, 6, 7]]), torch.tensor([[6, 9, 7, 2]]),
    ...     tree.ancestors_by_depth()[None], torch.tensor([tree.parents]), torch.tensor([3]))
    >>> paths.output_tokens.tolist(), paths.num_accepted.tolist(), paths.chain_order.tolist()
    ([[6, 7, -1, -1]], [1], [[0, 2, 1, 3]])
    """
    node_tokens, target_choices = node_tokens.long(), target_choices.long()
    num_nodes = node_tokens.shape[1]
    columns = torch.arange(num_nodes, device=node_tokens.device)[None, :]
    num_reqs = node_tokens.shape[0]
    depths = (ancestors_by_depth >= 0).sum(dim=2) - 1  # [R, N + 1]
    parent_choice = target_choices.gather(1, parents.long().clamp(min=0))
    matches = (node_tokens == parent_choice) & (columns <= num_drafts[:, None])
    matches[:, 0] = True
    path_matches = matches.gather(
        1, ancestors_by_depth.clamp(min=0).flatten(1)
    ).view_as(ancestors_by_depth)
    accepted = path_matches.all(dim=2)
    deepest = torch.where(accepted, depths, -1).argmax(dim=1)  # [R]
    num_accepted = depths.gather(1, deepest[:, None]).squeeze(1)
    path = ancestors_by_depth[torch.arange(num_reqs, device=deepest.device), deepest]  # [R, D + 1]

    path_tokens = node_tokens.gather(1, path[:, 1:].clamp(min=0))
    output_tokens = torch.full_like(node_tokens, -1)
    width = path_tokens.shape[1]
    output_tokens[:, :width] = torch.where(
        columns[:, :width] < num_accepted[:, None], path_tokens, -1
    )
    output_tokens.scatter_(
        1, num_accepted[:, None], target_choices.gather(1, deepest[:, None])
    )

    on_path = torch.zeros_like(accepted)
    on_path.scatter_(1, path.clamp(min=0), True)  # -1 entries clamp to the root
    order_key = torch.where(on_path, depths, num_nodes + columns)
    return AcceptedPaths(output_tokens, num_accepted, order_key.argsort(dim=1))


def ancestors_from_parents(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[R, N + 1, max_depth + 1] the per-request form of `TokenTree.ancestors_by_depth`,
    from parents [R, N + 1] (breadth-first: each parent before its children; column 0,
    the root, ignored).

    >>> ancestors_from_parents(torch.tensor([[-1, 0, 0, 2]]), 2).tolist()
    [[[0, -1, -1], [0, 1, -1], [0, 2, -1], [0, 2, 3]]]
    """
    num_reqs, num_nodes = parents.shape
    columns = torch.arange(num_nodes, device=parents.device).expand(num_reqs, -1)
    parents = torch.where(columns == 0, 0, parents.long())
    depths = torch.zeros_like(parents)
    for _ in range(max_depth):
        depths = torch.where(columns == 0, 0, depths.gather(1, parents) + 1)
    ancestors = torch.full(
        (num_reqs, num_nodes, max_depth + 2), -1, dtype=torch.long, device=parents.device
    )
    current = columns.clone()
    for _ in range(max_depth + 1):
        depth = torch.where(current >= 0, depths.gather(1, current.clamp(min=0)), max_depth + 1)
        ancestors.scatter_(2, depth[..., None], current[..., None])
        current = torch.where(current > 0, parents.gather(1, current.clamp(min=0)), -1)
    return ancestors[..., :-1]


def masks_from_ancestors(ancestors_by_depth: torch.Tensor) -> torch.Tensor:
    """[R, N + 1, N + 1] bool ancestor masks (node i attends to j) from [R, N + 1, D + 1]."""
    num_reqs, num_nodes, _ = ancestors_by_depth.shape
    masks = torch.zeros(
        num_reqs, num_nodes, num_nodes + 1, dtype=torch.bool, device=ancestors_by_depth.device
    )
    masks.scatter_(2, torch.where(ancestors_by_depth < 0, num_nodes, ancestors_by_depth), True)
    return masks[..., :-1]


@dataclasses.dataclass
class DynamicTreeGrowth:
    """A tree grown for each request from the draft's confidences, as EAGLE-2 does: the
    root's `branching` most probable tokens are the first candidates; at each depth the
    `width` candidates with the highest path probability (product of the draft's
    probabilities from the root) are expanded into their `branching` most probable
    children; the `num_nodes` candidates with the highest path probability make the tree
    (a child is never more probable than its parent, so each chosen node's parent is
    chosen too).

    Per depth d (1-based), kept in lists: tokens, scores (log path probability) and
    parent candidates (index into depth d - 1's candidates, -1 for the root), [R, C_d];
    expanded: [R, width] the candidates of depth d that the draft runs.
    """

    num_nodes: int
    branching: int
    width: int
    tokens: list[torch.Tensor] = dataclasses.field(default_factory=list)
    scores: list[torch.Tensor] = dataclasses.field(default_factory=list)
    parent_candidates: list[torch.Tensor] = dataclasses.field(default_factory=list)
    expanded: list[torch.Tensor] = dataclasses.field(default_factory=list)

    def start(self, root_logprobs: torch.Tensor) -> None:
        """root_logprobs: [R, V] the draft's log-probabilities at each root."""
        scores, tokens = root_logprobs.float().topk(self.branching, dim=-1)
        self.tokens.append(tokens)
        self.scores.append(scores)
        self.parent_candidates.append(torch.full_like(tokens, -1))

    def expand(self) -> torch.Tensor:
        """Chooses the newest depth's candidates to run: returns [R, width] indices."""
        expanded = self.scores[-1].topk(self.width, dim=-1).indices
        self.expanded.append(expanded)
        return expanded

    def add_children(self, logprobs: torch.Tensor) -> None:
        """logprobs: [R, width, V] the draft's log-probabilities at the expanded nodes."""
        num_reqs = logprobs.shape[0]
        child_logprobs, tokens = logprobs.float().topk(self.branching, dim=-1)
        parent_scores = self.scores[-1].gather(1, self.expanded[-1])
        self.tokens.append(tokens.reshape(num_reqs, -1))
        self.scores.append((parent_scores[..., None] + child_logprobs).reshape(num_reqs, -1))
        self.parent_candidates.append(
            self.expanded[-1].repeat_interleave(self.branching, dim=1)
        )

    def tree(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [R, num_nodes], parents [R, num_nodes + 1]) in breadth-first order."""
        sizes = [tokens.shape[1] for tokens in self.tokens]
        offsets = [sum(sizes[:depth]) for depth in range(len(sizes))]
        tokens = torch.cat(self.tokens, dim=1)
        scores = torch.cat(self.scores, dim=1)
        parents = torch.cat(
            [
                torch.where(parent >= 0, parent + offsets[depth - 1] if depth else parent, -1)
                for depth, parent in enumerate(self.parent_candidates)
            ],
            dim=1,
        )
        # Candidates are laid out depth by depth, so a stable sort puts a parent before a
        # child of equal score.
        order = scores.sort(dim=1, descending=True, stable=True).indices
        chosen = order[:, : self.num_nodes].sort(dim=1).values  # breadth-first
        node_of_candidate = torch.zeros_like(scores, dtype=torch.long)
        node_of_candidate.scatter_(
            1, chosen, torch.arange(1, self.num_nodes + 1, device=scores.device).expand_as(chosen)
        )
        chosen_parents = parents.gather(1, chosen)
        node_parents = torch.where(
            chosen_parents >= 0, node_of_candidate.gather(1, chosen_parents.clamp(min=0)), 0
        )
        root = torch.full_like(node_parents[:, :1], -1)
        return tokens.gather(1, chosen), torch.cat([root, node_parents], dim=1)
