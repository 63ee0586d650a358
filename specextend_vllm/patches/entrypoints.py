"""Entrypoint seams."""

from __future__ import annotations

import argparse
from typing import Any

from vllm.entrypoints.cli.serve import ServeSubcommand

from specextend_vllm.config import SpecExtendConfigError
from specextend_vllm.patches.base import VllmPatch


class ServeReportsConfigErrors(VllmPatch):
    """`vllm serve` with a bad `--speculative-config` for the method exits at startup with
    the one-line message naming the key, not a traceback."""

    target = ServeSubcommand
    attribute = "cmd"

    @classmethod
    def new_attribute(cls) -> Any:
        serve = cls.original

        def cmd(args: argparse.Namespace) -> None:
            try:
                serve(args)
            except SpecExtendConfigError as error:
                raise SystemExit(f"vllm serve: {error}") from None

        return staticmethod(cmd)
