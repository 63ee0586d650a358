"""The `specextend` method's own configuration keys, their defaults and validation."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from specextend_vllm.algorithm.selection import ChunkRanking, RetrievalPolicy
from specextend_vllm.algorithm.token_tree import MAX_TREE_NODES, TokenTree, TokenTreeError

METHOD_NAME = "specextend"

DraftPositions = Literal["auto", "absolute", "compact"]
RetrievalTrigger = Literal["interval", "adaptive"]
VerificationAttention = Literal["auto", "hybrid", "native"]
Drafting = Literal["auto", "always"]
Retrieval = Literal["auto", "always"]
DraftPrefill = Literal["eager", "deferred"]
DraftLmHead = Literal["auto", "as_loaded", "int8"]
CHOICE_KEYS: Mapping[str, Any] = {
    "policy": RetrievalPolicy,
    "chunk_ranking": ChunkRanking,
    "positions": DraftPositions,
    "retrieval_trigger": RetrievalTrigger,
    "verification_attention": VerificationAttention,
    "drafting": Drafting,
    "retrieval": Retrieval,
    "draft_prefill": DraftPrefill,
    "draft_lm_head": DraftLmHead,
}

# Keys a running engine cannot change (`specextend_vllm.reconfigure`): they shape what the
# scheduler and the draft's LM head were built for.
KEYS_FIXED_AT_LOAD = ("drafting", "tree", "draft_vocab")

# How the target verifies: hybrid attention, vLLM's, or the faster of the two as measured.
Verification = Literal["hybrid", "native", "measured"]
# What `verification_attention: auto` means per device type; see `SpecExtendConfig`.
AUTO_VERIFICATION_ATTENTION: Mapping[str, Verification] = {
    "cpu": "measured",
    "cuda": "native",
}

# RoPE variants whose angles are the position times fixed frequencies: a key moved to
# another position is re-rotated by the difference (compact positions). vLLM's plain,
# linear-scaling and Llama 3 RoPE (vllm_access/rotary.py checks the loaded layers too).
COMPOSABLE_ROPE_TYPES = ("default", "linear", "llama3")

# Keys of vLLM's SpeculativeConfig that the plugin cannot honour with `specextend`.
INCOMPATIBLE_SPECULATIVE_KEYS: Mapping[str, Any] = {
    "parallel_drafting": False,
    "disable_padded_drafter_batch": False,
}


class SpecExtendConfigError(ValueError):
    """A `speculative_config` the method cannot run with; the message names the key."""


@dataclasses.dataclass(frozen=True)
class SpecExtendConfig:
    """What `specextend` adds to vLLM's `speculative_config`.

    chunk_size: tokens per retrieval chunk; a divisor or a multiple of the KV cache block
        size. Chunks smaller than a block are packed side by side into a working copy.
    token_budget: tokens of selected chunks the draft attends to, besides the newest
        tokens; rounded down to whole KV blocks (and whole chunks).
    retrieval_interval: draft steps between two selections of chunks for a request.
    activation_length: context length from which a request may draft on a reduced cache;
        shorter requests draft on the full cache.
    retrieval: `auto` drafts on the reduced cache where that gives more tokens per second
        than the full cache, per bucket of context lengths (from `activation_length` to
        twice it, to four times it, ...) and number of drafts per step, from the measured
        step times and acceptance of each, explored in turn and re-explored; `always`
        drafts on the reduced cache from `activation_length` on.
    policy: `cmr` (chunks ranked by the target's final-layer attention), `streaming`
        (the first chunk and the most recent ones) or `full` (no reduction).
    chunk_ranking: how `cmr` ranks chunks. `attention`: by the target's attention to each.
        `continuation`: by the larger of its own attention and its predecessor's, so the
        chunk after an attended one is kept with it (a draft that copies from an earlier
        passage needs what follows the attended tokens).
    positions: where the draft sees its kept chunks. `absolute`: at their places in the
        prompt. `compact`: side by side right before the newest tokens, so the draft's
        attention spans no more than the kept tokens plus the tail, as if the prompt were
        that short. `auto`: compact for requests longer than the draft's trained length.
    retrieval_trigger: `interval` selects every `retrieval_interval` draft steps;
        `adaptive` also selects as soon as a verification accepts no draft token or the
        kept chunks' share of the target's attention falls well below its share when
        they were selected, and at the latest every `retrieval_interval` steps.
    verification_attention: how the target's attention layers verify drafts. `hybrid`:
        hybrid tree attention (the drafted tokens attend to the cached prefix through one
        paged kernel that returns its log-sum-exp, to each other under a causal mask, and
        the two parts merge exactly). `native`: vLLM's attention backend. `auto`: on
        CPU, whichever of the two measures faster per size of the batch's context (vLLM's
        kernel does not split a multi-token query over a long prefix across threads:
        hybrid wins on long contexts, vLLM's on short ones; `algorithm.verification_choice`),
        and, with a choice of its own, the faster of the plugin's prefix kernel and vLLM's
        decode attention for plain decoding steps (no drafts); native on GPU, where
        FlashAttention already verifies a chain causally at full speed. Token trees are
        verified by hybrid attention.
    drafting: `auto` drafts, per batch size, the number of tokens per step (0 to
        `num_speculative_tokens`; a tree all or none) that decodes most tokens per second,
        from the measured step times and acceptance (vLLM's
        `num_speculative_tokens_per_batch_size` schedule instead, where one is given);
        `always` drafts `num_speculative_tokens` every step. Either way a step that drafts
        nothing does not run the draft; the next step that drafts first writes the
        draft's KV of the tokens it missed, in one pass.
    draft_prefill: when the draft writes its KV of a prompt. `eager`: with the target's
        prefill, before the first token, unless that step drafts nothing (then as
        `deferred`). `deferred`: not in steps that only prefill; the request's first
        drafting step writes it, after the first token (the first token comes as soon as
        without speculation; the second one later by the draft's prefill).
    draft_prefill_window: how much of a prompt the draft attends to while it writes its
        KV of the prompt (its passes over more than `num_speculative_tokens` + 1 tokens of
        a request: prefills and catch-up passes). A number W: each piece of 4 KV blocks
        attends to the prompt's first KV block (an attention sink) and to the W tokens
        before it (whole blocks), so a long prompt's draft prefill costs linearly, not
        quadratically (`algorithm.prefill_window`). None: the whole prompt before each
        token. Only the draft's KV differs, so only its proposals: the target verifies.
        Applied on vLLM's CPU attention backend (others keep buffers sized by the batch,
        which the pass's extra rows could overrun; there the draft attends whole prompts).
    tree: the shape of each step's drafts. `chain`: `num_speculative_tokens` tokens one
        after the other. A list of paths of child ranks, such as `[[0], [1], [0, 0]]`:
        a static token tree of `num_speculative_tokens` nodes (`[1]` is the root's second
        most probable child, `[0, 0]` the first child of its first child), drafted one
        depth per pass and verified in one target pass through hybrid tree attention.
        `dynamic`: a tree of `num_speculative_tokens` nodes grown per request and step from
        the draft's confidences (EAGLE-2), at most `tree_max_depth` deep.
    tree_max_depth: the depth limit of dynamic trees.
    draft_vocab: a JSON file holding a list of the draft's token ids (most frequent
        first, as `python -m benchmarks.draft_vocab` writes it); the draft's LM head keeps
        only their rows, and the draft proposes only those tokens (FR-Spec). Unset: the
        whole vocabulary.
    draft_lm_head: the weights the draft's logits come from. `as_loaded`: its LM head as
        vLLM loaded it. `int8`: its rows (those `draft_vocab` keeps) in int8 with one
        scale per row, multiplied with the hidden states quantized per token on vLLM's
        CPU int8 kernel (CPU only): a quarter of the bytes, and a small draft's LM head is
        most of its weights (vLLM loads no int8 LM head for a Qwen2 W8A8 checkpoint).
        `auto`: int8 on CPU when the draft's linear layers are int8 and the CPU has int8
        dot products, as loaded otherwise. Only the proposal changes: the target verifies.
    """

    chunk_size: int = 32
    token_budget: int = 1024
    retrieval_interval: int = 4
    activation_length: int = 2048
    policy: RetrievalPolicy = "cmr"
    chunk_ranking: ChunkRanking = "attention"
    positions: DraftPositions = "auto"
    retrieval_trigger: RetrievalTrigger = "interval"
    verification_attention: VerificationAttention = "auto"
    drafting: Drafting = "auto"
    retrieval: Retrieval = "auto"
    draft_prefill: DraftPrefill = "eager"
    draft_prefill_window: int | None = 1024
    tree: str | tuple[tuple[int, ...], ...] = "chain"
    tree_max_depth: int = 5
    draft_vocab: str | None = None
    draft_lm_head: DraftLmHead = "auto"

    def __post_init__(self) -> None:
        self._check_tree()
        self.draft_vocab_ids()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("tree", "draft_vocab") or (
                field.name == "draft_prefill_window" and value is None
            ):
                continue
            if field.name in CHOICE_KEYS:
                allowed = get_args(CHOICE_KEYS[field.name])
                if value not in allowed:
                    raise SpecExtendConfigError(
                        f"speculative_config['{field.name}'] must be one of {list(allowed)}, "
                        f"got {value!r}."
                    )
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecExtendConfigError(
                    f"speculative_config['{field.name}'] must be an integer, "
                    f"got {value!r} ({type(value).__name__})."
                )
            if value < 1:
                raise SpecExtendConfigError(f"speculative_config['{field.name}'] must be >= 1, got {value}.")
        if self.activation_length < self.token_budget:
            raise SpecExtendConfigError(
                "speculative_config['activation_length'] must be >= "
                f"speculative_config['token_budget'] ({self.token_budget}), "
                f"got {self.activation_length}: a request shorter than the budget "
                "has nothing to leave out."
            )

    def _check_tree(self) -> None:
        if self.tree in ("chain", "dynamic"):
            return
        if isinstance(self.tree, str) or not isinstance(self.tree, (list, tuple)):
            raise SpecExtendConfigError(
                "speculative_config['tree'] must be 'chain', 'dynamic' or a list of paths of "
                f"child ranks such as [[0], [1], [0, 0]], got {self.tree!r}."
            )
        try:
            TokenTree.from_paths(self.tree)
        except TokenTreeError as error:
            raise SpecExtendConfigError(f"speculative_config['tree']: {error}.") from None
        object.__setattr__(self, "tree", tuple(tuple(path) for path in self.tree))

    def draft_vocab_ids(self) -> list[int] | None:
        """The token ids `draft_vocab` names, checked: a non-empty list of distinct ids."""
        if self.draft_vocab is None:
            return None
        key = "speculative_config['draft_vocab']"
        if not isinstance(self.draft_vocab, str):
            raise SpecExtendConfigError(
                f"{key} must be the path of a JSON file of token ids, got {self.draft_vocab!r}."
            )
        try:
            ids = json.loads(Path(self.draft_vocab).read_text())
        except (OSError, ValueError) as error:
            raise SpecExtendConfigError(
                f"{key}: cannot read a JSON list of token ids from {self.draft_vocab!r} ({error})."
            ) from None
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
        ):
            raise SpecExtendConfigError(
                f"{key}: {self.draft_vocab!r} must hold a non-empty JSON list of token ids "
                "(integers >= 0)."
            )
        if len(set(ids)) != len(ids):
            raise SpecExtendConfigError(f"{key}: {self.draft_vocab!r} lists a token id twice.")
        return ids

    def check_draft_vocab(self, vocab_size: int) -> None:
        """Every kept token id must be one of the draft's."""
        ids = self.draft_vocab_ids()
        if ids is not None and max(ids) >= vocab_size:
            raise SpecExtendConfigError(
                f"speculative_config['draft_vocab']: {self.draft_vocab!r} holds token id "
                f"{max(ids)}, and the draft's vocabulary has {vocab_size} tokens (ids 0 to "
                f"{vocab_size - 1})."
            )

    def check_draft_lm_head(self, device_type: str) -> None:
        """An int8 LM head runs on vLLM's CPU int8 kernel.

        >>> SpecExtendConfig(draft_lm_head="int8").check_draft_lm_head("cuda")
        Traceback (most recent call last):
        ...
        specextend_vllm.config.SpecExtendConfigError: speculative_config['draft_lm_head'] 'int8' runs on CPU only (vLLM's CPU int8 kernel); this engine runs on 'cuda'. Use 'auto' or 'as_loaded'.
        """
        if self.draft_lm_head == "int8" and device_type != "cpu":
            raise SpecExtendConfigError(
                "speculative_config['draft_lm_head'] 'int8' runs on CPU only (vLLM's CPU "
                f"int8 kernel); this engine runs on {device_type!r}. Use 'auto' or 'as_loaded'."
            )

    def token_tree(self) -> TokenTree | None:
        """The static tree, or None for a chain or a dynamic tree."""
        return None if self.tree in ("chain", "dynamic") else TokenTree.from_paths(self.tree)

    def dynamic_tree_shape(self, num_nodes: int) -> tuple[int, int, int]:
        """(branching, width, depth) of dynamic trees of `num_nodes` nodes: each expanded
        node keeps its `branching` most probable children, `width` nodes are expanded per
        depth, and trees are at most `depth` deep.

        >>> SpecExtendConfig(tree="dynamic", tree_max_depth=5).dynamic_tree_shape(16)
        (4, 4, 5)
        """
        depth = min(self.tree_max_depth, num_nodes)
        branching = num_nodes if depth == 1 else min(num_nodes, 4)
        return branching, min(branching, 4), depth

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def split_speculative_config(
        cls, speculative_config: Mapping[str, Any], vllm_keys: frozenset[str]
    ) -> tuple[SpecExtendConfig, dict[str, Any]]:
        """Separates the method's own keys from vLLM's and validates both sets of names.

        Returns the method's config and vLLM's keys, with `method` set to vLLM's
        `draft_model`, which `specextend` extends. `drafting: auto` turns on vLLM's dynamic
        speculation (one draft length for every batch size, which the method then
        changes), or becomes `always` where the user gives a batch-size schedule.
        """
        own_keys = set(cls.keys())
        unknown = sorted(set(speculative_config) - own_keys - vllm_keys - {"method"})
        if unknown:
            raise SpecExtendConfigError(
                f"speculative_config has unknown key(s) {unknown} for method "
                f"'{METHOD_NAME}'. Its own keys are {sorted(own_keys)}; the other "
                f"allowed keys are vLLM's: {sorted(vllm_keys)}."
            )
        if not speculative_config.get("model"):
            raise SpecExtendConfigError(
                f"speculative_config['model'] is required for method '{METHOD_NAME}': "
                "the path or name of the draft model."
            )
        if speculative_config.get("num_speculative_tokens") is None:
            raise SpecExtendConfigError(
                "speculative_config['num_speculative_tokens'] is required for method "
                f"'{METHOD_NAME}': a positive integer."
            )
        for key, supported in INCOMPATIBLE_SPECULATIVE_KEYS.items():
            if key in speculative_config and speculative_config[key] != supported:
                raise SpecExtendConfigError(
                    f"speculative_config['{key}'] must be {supported} with method "
                    f"'{METHOD_NAME}', got {speculative_config[key]!r}."
                )
        method_config = cls(
            **{key: speculative_config[key] for key in own_keys & set(speculative_config)}
        )
        if speculative_config.get("drafting") == "auto" and speculative_config.get(
            "num_speculative_tokens_per_batch_size"
        ):
            raise SpecExtendConfigError(
                "speculative_config['drafting'] 'auto' chooses the number of draft tokens "
                "itself and cannot follow speculative_config"
                "['num_speculative_tokens_per_batch_size'] too: give one of them (or "
                "drafting 'always' with the schedule)."
            )
        method_config.check_tree_combination(speculative_config)
        vllm_config = {
            key: value for key, value in speculative_config.items() if key not in own_keys
        }
        vllm_config["method"] = "draft_model"
        if method_config.drafting == "auto":
            if vllm_config.get("num_speculative_tokens_per_batch_size"):
                method_config = dataclasses.replace(method_config, drafting="always")
            else:
                # vLLM's dynamic speculation, which the method's choices then drive.
                vllm_config["num_speculative_tokens_per_batch_size"] = [
                    [1, 1, vllm_config["num_speculative_tokens"]]
                ]
        return method_config, vllm_config

    def check_tree_combination(self, speculative_config: Mapping[str, Any]) -> None:
        """A static tree holds `num_speculative_tokens` nodes, verified on hybrid tree
        attention, and is drafted whole or not at all."""
        if self.tree == "chain":
            return
        num_speculative_tokens = speculative_config["num_speculative_tokens"]
        tree = self.token_tree()
        if tree is None:
            branching, width, depth = self.dynamic_tree_shape(num_speculative_tokens)
            candidates = branching + (depth - 1) * width * branching
            if not 1 <= num_speculative_tokens <= min(MAX_TREE_NODES, candidates):
                raise SpecExtendConfigError(
                    "speculative_config['num_speculative_tokens'] must be between 1 and "
                    f"{min(MAX_TREE_NODES, candidates)} for a dynamic tree with "
                    f"speculative_config['tree_max_depth'] {self.tree_max_depth}, got "
                    f"{num_speculative_tokens}."
                )
        elif tree.num_drafts != num_speculative_tokens:
            raise SpecExtendConfigError(
                f"speculative_config['tree'] has {tree.num_drafts} nodes, and "
                f"speculative_config['num_speculative_tokens'] must equal that, got "
                f"{num_speculative_tokens!r}."
            )
        if self.verification_attention == "native":
            raise SpecExtendConfigError(
                "speculative_config['verification_attention'] 'native' cannot verify a "
                "speculative_config['tree']: vLLM's attention backends mask a chain only; "
                "use 'hybrid' or 'auto'."
            )
        if speculative_config.get("num_speculative_tokens_per_batch_size"):
            raise SpecExtendConfigError(
                "speculative_config['num_speculative_tokens_per_batch_size'] cannot be "
                "combined with speculative_config['tree']: a tree is drafted whole or not "
                "at all; drafting 'auto' chooses between the two per batch size."
            )

    def check_block_size(self, block_size: int) -> SpecExtendConfig:
        """Checks the chunk size and the budget against the KV cache block size, known once
        vLLM's cache config is final."""
        chunk_size = self.chunk_size
        if block_size % chunk_size and chunk_size % block_size:
            raise SpecExtendConfigError(
                f"speculative_config['chunk_size'] must divide the KV cache block size "
                f"({block_size}) or be a multiple of it, got {chunk_size}."
            )
        granularity = max(chunk_size, block_size)
        if self.token_budget < granularity:
            raise SpecExtendConfigError(
                f"speculative_config['token_budget'] must be >= {granularity} (the larger of "
                f"the chunk size and the KV cache block size), got {self.token_budget}."
            )
        return self

    def check_draft_trained_length(self, trained_length: int) -> None:
        """With compact positions, a request past the draft's trained length must draft on
        the reduced cache, and the kept tokens must fit in that length."""
        if self.positions == "absolute" or self.policy == "full":
            return
        if self.activation_length > trained_length:
            raise SpecExtendConfigError(
                f"speculative_config['activation_length'] ({self.activation_length}) must be "
                f"<= the draft's trained length ({trained_length} positions) with positions "
                f"{self.positions!r}, so that requests past that length draft on compact "
                "positions; lower it, or set positions 'absolute'."
            )
        if self.token_budget >= trained_length:
            raise SpecExtendConfigError(
                f"speculative_config['token_budget'] ({self.token_budget}) must be below the "
                f"draft's trained length ({trained_length} positions) with positions "
                f"{self.positions!r}."
            )

    def check_draft_rope(self, rope_type: str) -> None:
        """Compact positions re-rotate kept keys, which needs a RoPE whose angles add up;
        `auto` drafts on absolute positions where the draft's RoPE does not allow it.

        >>> SpecExtendConfig(positions="compact").check_draft_rope("yarn")
        Traceback (most recent call last):
        ...
        specextend_vllm.config.SpecExtendConfigError: speculative_config['positions'] 'compact' needs a draft whose RoPE composes by adding positions (one of ['default', 'linear', 'llama3']); this draft's is 'yarn'. Use positions 'auto' or 'absolute'.
        """
        if self.positions == "compact" and self.policy != "full" and (
            rope_type not in COMPOSABLE_ROPE_TYPES
        ):
            raise SpecExtendConfigError(
                "speculative_config['positions'] 'compact' needs a draft whose RoPE composes "
                f"by adding positions (one of {list(COMPOSABLE_ROPE_TYPES)}); this draft's is "
                f"{rope_type!r}. Use positions 'auto' or 'absolute'."
            )

    def verification_attention_on(self, device_type: str) -> Verification:
        """`auto` is hybrid for trees on every device."""
        if self.verification_attention != "auto":
            return self.verification_attention
        if self.tree != "chain":
            return "hybrid"
        return AUTO_VERIFICATION_ATTENTION.get(device_type, "native")

    def exact_verification_attention(
        self, blockers: Sequence[str], device_type: str
    ) -> Verification:
        """The verification attention that verifies exactly on a target whose attention
        does `blockers` (what hybrid attention does not reproduce: a sliding window, a
        quantized KV cache, ...). vLLM's attention verifies a chain exactly, never a tree:
        a tree, or `hybrid` asked for by name, on such a target is refused.

        >>> SpecExtendConfig().exact_verification_attention(["sliding window"], "cpu")
        'native'
        >>> SpecExtendConfig().exact_verification_attention([], "cpu")
        'measured'
        """
        wanted = self.verification_attention_on(device_type)
        if wanted == "native" or not blockers:
            return wanted
        if self.tree != "chain":
            raise SpecExtendConfigError(
                "speculative_config['tree'] is verified exactly only by hybrid tree "
                f"attention, which cannot serve this target: its attention uses "
                f"{list(blockers)}. Use tree 'chain' (verified on vLLM's attention)."
            )
        if self.verification_attention == "hybrid":
            raise SpecExtendConfigError(
                "speculative_config['verification_attention'] 'hybrid' cannot verify for "
                f"this target, whose attention uses {list(blockers)}; use 'native' or 'auto'."
            )
        return "native"

    def uses_compact_positions(self) -> bool:
        return self.policy != "full" and self.positions != "absolute"

    def prefill_window(self) -> int | None:
        """The window the draft's passes over prompts attend through; None for the whole
        prompt (`policy: full` drafts as vLLM's `draft_model` does).

        >>> SpecExtendConfig(draft_prefill_window=2048, policy="full").prefill_window() is None
        True
        """
        return None if self.policy == "full" else self.draft_prefill_window

    def uses_working_copies(self, block_size: int) -> bool:
        """Whether the draft reads its kept chunks from working copies: on compact
        positions, or when chunks are smaller than a KV block."""
        return self.policy != "full" and (
            self.positions != "absolute" or self.chunk_size % block_size != 0
        )

    def max_kept_tokens(self, block_size: int) -> int:
        """The budget in whole blocks and whole chunks, so kept tokens end where a block
        of newest tokens starts.

        >>> SpecExtendConfig(chunk_size=32, token_budget=1000).max_kept_tokens(128)
        896
        """
        granularity = max(self.chunk_size, block_size)
        return self.token_budget // granularity * granularity

    def num_kept_chunks(self, block_size: int) -> int:
        return self.max_kept_tokens(block_size) // self.chunk_size

    def to_dict(self) -> dict[str, Any]:
        keys = dataclasses.asdict(self)
        if not isinstance(self.tree, str):
            keys["tree"] = [list(path) for path in self.tree]
        return keys
