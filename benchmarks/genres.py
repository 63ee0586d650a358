"""Long texts by genre, none of them used to tune the method, all available offline.

- fiction: Project Gutenberg novels (see `benchmarks.assets.TEXT_SOURCES`);
- dialogue: plays, nearly all lines spoken (Shakespeare);
- essays: Paul Graham's essays, three disjoint sets of them;
- code: modules of the running Python's standard library;
- docs: the Python language reference as `pydoc` ships it (`pydoc_data.topics`), in three parts.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

FICTION = ("novels/pride_and_prejudice", "novels/sherlock_holmes", "novels/tale_of_two_cities")
DIALOGUE = ("shakespeare/coriolanus", "shakespeare/much_ado_about_nothing", "shakespeare/twelfth_night")
CODE_MODULES = ("argparse.py", "tarfile.py", "subprocess.py")
NUM_ESSAY_SETS = 3
NUM_DOC_PARTS = 3


def essay_sets(essays: dict[str, str]) -> dict[str, str]:
    """Essays dealt round-robin into `NUM_ESSAY_SETS` disjoint sets, each one text.

    >>> sorted(essay_sets({"a": "A", "b": "B", "c": "C", "d": "D"}).items())
    [('essays/set_1', 'A\\n\\nD'), ('essays/set_2', 'B'), ('essays/set_3', 'C')]
    """
    names = sorted(essays)
    return {
        f"essays/set_{index + 1}": "\n\n".join(essays[name] for name in names[index::NUM_ESSAY_SETS])
        for index in range(NUM_ESSAY_SETS)
    }


def python_sources() -> dict[str, str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return {f"code/{name.removesuffix('.py')}": (stdlib / name).read_text() for name in CODE_MODULES}


def language_reference_parts() -> dict[str, str]:
    """`pydoc`'s topics in name order, cut into `NUM_DOC_PARTS` consecutive parts."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    size = -(-len(names) // NUM_DOC_PARTS)
    return {
        f"docs/reference_part_{index + 1}": "\n\n".join(
            topics[name] for name in names[index * size : (index + 1) * size]
        )
        for index in range(NUM_DOC_PARTS)
    }


def genre_texts() -> dict[str, dict[str, str]]:
    """Texts by genre, then by name."""
    from benchmarks.assets import HAYSTACK_COLLECTION, long_texts

    texts = long_texts()
    prefix = f"{HAYSTACK_COLLECTION}/"
    essays = {name: text for name, text in texts.items() if name.startswith(prefix)}
    return {
        "fiction": {name: texts[name] for name in FICTION},
        "dialogue": {name: texts[name] for name in DIALOGUE},
        "essays": essay_sets(essays),
        "code": python_sources(),
        "docs": language_reference_parts(),
    }
