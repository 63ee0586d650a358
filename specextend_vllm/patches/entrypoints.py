"""Entrypoint seams."""

from __future__ import annotations

import argparse
from typing import Any

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.input_processor import InputProcessor

from specextend_vllm.config import METHOD_NAME, SpecExtendConfigError
from specextend_vllm.patches.base import VllmPatch
from specextend_vllm.trees.verification import sampling_params_unsupported_with_trees
from specextend_vllm.vllm_access.config import specextend_config


class ServeReportsConfigErrors(VllmPatch):
    """`vllm serve` with a bad `--speculative-config` for the method exits at startup with
    the one-line message naming the key, not a traceback."""

    target = ServeSubcommand
    attribute = "cmd"

    @staticmethod
    def replacement(args: argparse.Namespace) -> None:
        # A module-level function: with several API servers (data parallelism) vLLM pickles
        # the parsed arguments, this command included, into each server process.
        try:
            ServeReportsConfigErrors.original(args)
        except SpecExtendConfigError as error:
            raise SystemExit(f"vllm serve: {error}") from None

    @classmethod
    def new_attribute(cls) -> Any:
        return staticmethod(cls.replacement)


class TreesRefuseUnsupportedSamplingParams(VllmPatch):
    """With a token tree, a request asking for sampling parameters the tree verifier does
    not apply is refused (HTTP 400 behind `vllm serve`) naming them, before it runs."""

    target = InputProcessor
    attribute = "_validate_params"

    @staticmethod
    def replacement(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        resolved = TreesRefuseUnsupportedSamplingParams.original(self, params, *args, **kwargs)
        uses_tree = getattr(self, "_specextend_uses_tree", None)
        if uses_tree is None:
            config = specextend_config(self.vllm_config)
            uses_tree = config is not None and config.tree != "chain"
            self._specextend_uses_tree = uses_tree
        if uses_tree:
            unsupported = sampling_params_unsupported_with_trees(params)
            if unsupported:
                raise VLLMValidationError(
                    f"{unsupported} cannot be used with method '{METHOD_NAME}' and "
                    "speculative_config['tree']: a tree is verified with temperature, "
                    "top_k and top_p only.",
                    parameter=unsupported[0],
                )
        return resolved
