"""A frequency-ranked draft vocabulary for `speculative_config['draft_vocab']`.

    python -m benchmarks.draft_vocab --size 32768 [--output FILE]

Counts the draft tokenizer's tokens over a corpus held out from every benchmark text:
Shakespeare's plays but Hamlet and King Lear (the demo's and the trees' texts), and the
modules of the running Python's standard library but the three the `code` genre uses.
Writes the `--size` most frequent token ids, most frequent first (ties by id), as a JSON
list. Fiction, dialogue, essays, docs and the benchmark's code modules are not in it, so
acceptance measured on them is acceptance on text the vocabulary never saw.
"""

from __future__ import annotations

import argparse
import collections
import json
import sysconfig
from pathlib import Path
from typing import Any

from benchmarks.genres import CODE_MODULES

HELD_OUT_PLAYS = ("shakespeare/hamlet", "shakespeare/lear")
CODE_CORPUS_CHARS = 3_000_000


def corpus() -> list[str]:
    from benchmarks.assets import long_texts

    plays = [
        text
        for name, text in sorted(long_texts().items())
        if name.startswith("shakespeare/") and name not in HELD_OUT_PLAYS
    ]
    code: list[str] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        if path.name in CODE_MODULES:
            continue
        code.append(path.read_text(errors="replace"))
        if sum(map(len, code)) >= CODE_CORPUS_CHARS:
            break
    return plays + code


def ranked_token_ids(tokenizer: Any, texts: list[str], size: int) -> list[int]:
    """The `size` most frequent token ids over `texts`, most frequent first, ties by id."""
    counts: collections.Counter[int] = collections.Counter()
    for text in texts:
        counts.update(tokenizer(text)["input_ids"])
    ranked = sorted(counts, key=lambda token: (-counts[token], token))
    return ranked[:size]


def main() -> None:
    from transformers import AutoTokenizer

    from benchmarks.assets import draft_vocab, qwen_pair

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=32768)
    parser.add_argument("--tokenizer", type=Path, help="default: the Qwen2.5-Coder draft's")
    parser.add_argument("--output", type=Path, help="default: the assets' cached file")
    args = parser.parse_args()
    if args.tokenizer is None and args.output is None:
        print(draft_vocab(args.size))
        return
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or qwen_pair()[0])
    ids = ranked_token_ids(tokenizer, corpus(), args.size)
    output = args.output or Path(f"draft_vocab_{len(ids)}.json")
    output.write_text(json.dumps(ids) + "\n")
    print(f"{len(ids)} token ids written to {output}")


if __name__ == "__main__":
    main()
