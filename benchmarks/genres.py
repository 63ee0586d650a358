"""Long texts by genre, none of them used to tune the method, all available offline
(see `benchmarks.assets.TEXT_SOURCES`):

- fiction: two novels (Carroll's Alice, Soseki's Botchan) and Milton's Paradise Regained;
- dialogue: transcripts of human-to-human chats (chitchat-dataset), three sets;
- essays: Paul Graham's essays, three disjoint sets of them;
- code: modules of the running Python's standard library;
- docs: Docutils' reference manuals (reStructuredText, its directives, configuration).
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable
from pathlib import Path

FICTION = ("novels/alice29", "novels/botchan", "milton/paradise_regained")
DIALOGUE = ("chats/chats_1", "chats/chats_2", "chats/chats_3")
DOCS = ("docutils/restructuredtext", "docutils/directives", "docutils/config")
CODE_MODULES = ("argparse.py", "tarfile.py", "subprocess.py")
NUM_ESSAY_SETS = 3


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


def packaged_texts(names: tuple[str, ...]) -> dict[str, str]:
    from benchmarks.assets import long_texts

    texts = long_texts()
    return {name: texts[name] for name in names}


def essays() -> dict[str, str]:
    from benchmarks.assets import HAYSTACK_COLLECTION, long_texts

    prefix = f"{HAYSTACK_COLLECTION}/"
    return essay_sets({name: text for name, text in long_texts().items() if name.startswith(prefix)})


GENRES: dict[str, Callable[[], dict[str, str]]] = {
    "fiction": lambda: packaged_texts(FICTION),
    "dialogue": lambda: packaged_texts(DIALOGUE),
    "essays": essays,
    "code": python_sources,
    "docs": lambda: packaged_texts(DOCS),
}


def genre_texts(genres: list[str]) -> dict[str, dict[str, str]]:
    """Texts of these genres, by genre, then by name."""
    return {genre: GENRES[genre]() for genre in genres}
