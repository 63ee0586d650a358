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
from collections.abc import Callable, Sequence
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


CODE_PREFIX = "code/"


def python_source(name: str) -> str:
    """`code/MODULE` -> the running Python's standard library module MODULE.py."""
    module = name.removeprefix(CODE_PREFIX)
    return (Path(sysconfig.get_paths()["stdlib"]) / f"{module}.py").read_text()


def python_sources() -> dict[str, str]:
    names = [CODE_PREFIX + module.removesuffix(".py") for module in CODE_MODULES]
    return {name: python_source(name) for name in names}


def named_texts(names: Sequence[str]) -> dict[str, str]:
    """Texts by name, in order: `code/MODULE` a module of the standard library (any of
    them, not only the code genre's), every other name a packaged text
    (`benchmarks.assets.long_texts`)."""
    packaged = [name for name in names if not name.startswith(CODE_PREFIX)]
    texts = packaged_texts(tuple(packaged)) if packaged else {}
    return {
        name: python_source(name) if name.startswith(CODE_PREFIX) else texts[name]
        for name in names
    }


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


def prompt_texts(
    names: Sequence[str], genres: Sequence[str] | None, skip_texts: int, per_genre: int
) -> list[tuple[str | None, str, str]]:
    """(genre, name, text) of each text to prompt with: `per_genre` texts of each of
    `genres`, each genre's first `skip_texts` left out; without genres, `names` by name
    (`named_texts`), their genre None."""
    if genres:
        return [
            (genre, name, text)
            for genre, by_name in genre_texts(list(genres)).items()
            for name, text in list(by_name.items())[skip_texts : skip_texts + per_genre]
        ]
    return [(None, name, text) for name, text in named_texts(names).items()]
