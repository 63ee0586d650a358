"""The patch mechanism: one declarative class per seam in vLLM."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NoReturn


class PatchTargetMissing(RuntimeError):
    """A patch's target is not in the installed vLLM (a release moved or renamed it)."""


def describe(target: Any, attribute: str) -> str:
    module = getattr(target, "__module__", None) or getattr(target, "__name__", "?")
    name = getattr(target, "__qualname__", None)
    return f"{module}.{name}.{attribute}" if name and isinstance(target, type) else f"{module}.{attribute}"


class VllmPatch:
    """Replaces `target.attribute` with `replacement`, keeping the original.

    A patch that `adds` an attribute (a worker method called by name) requires it absent;
    every other patch requires it present, on the target itself (not inherited), so
    that a vLLM release that moves or renames it fails at plugin load, naming it.
    Applying twice is harmless.
    """

    target: ClassVar[Any]
    attribute: ClassVar[str]
    adds: ClassVar[bool] = False
    original: ClassVar[Any]

    @classmethod
    def replacement(cls, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{cls.__name__} defines no replacement")

    @classmethod
    def check_target(cls) -> None:
        """Raises PatchTargetMissing if the target is not as the patch expects."""
        present = cls.attribute in vars(cls.target)
        if cls.adds == present:
            import vllm

            where = describe(cls.target, cls.attribute)
            state = "already exists" if present else "does not exist"
            raise PatchTargetMissing(
                f"specextend-vllm: patch {cls.__name__} needs {where}, which {state} in "
                f"vLLM {vllm.__version__}. Install a supported vLLM, or set "
                "SPECEXTEND_DISABLE=1 to run vLLM without the plugin."
            )

    @classmethod
    def is_applied(cls) -> bool:
        return "original" in cls.__dict__

    @classmethod
    def apply(cls) -> None:
        if cls.is_applied():
            return
        cls.check_target()
        cls.original = None if cls.adds else vars(cls.target)[cls.attribute]
        setattr(cls.target, cls.attribute, cls.new_attribute())

    @classmethod
    def new_attribute(cls) -> Any:
        return cls.replacement


class VllmDataclassField(VllmPatch):
    """Adds an optional field, None by default, to one of vLLM's dataclasses, so that it
    travels wherever vLLM sends the object: pickled between processes, and through msgspec
    (engine core -> front end), which encodes and decodes the fields the dataclass declares.
    It is not an `__init__` argument, so vLLM's constructors and `dataclasses.replace` leave
    it None. Applied before msgspec first decodes the class (plugin load), as msgspec keeps
    the fields it saw then."""

    adds = True
    field_type: ClassVar[Any]

    @classmethod
    def check_target(cls) -> None:
        if not dataclasses.is_dataclass(cls.target):
            raise PatchTargetMissing(
                f"specextend-vllm: patch {cls.__name__} needs "
                f"{cls.target.__module__}.{cls.target.__qualname__} to be a dataclass."
            )
        super().check_target()

    @classmethod
    def new_attribute(cls) -> None:
        return None

    @classmethod
    def apply(cls) -> None:
        if cls.is_applied():
            return
        super().apply()
        declared = dataclasses.make_dataclass(
            cls.__name__,
            [(cls.attribute, cls.field_type, dataclasses.field(default=None, init=False))],
        )
        cls.target.__dataclass_fields__[cls.attribute] = dataclasses.fields(declared)[0]
        cls.target.__annotations__[cls.attribute] = cls.field_type


class VllmOverrides(VllmPatch):
    """The methods a subclass of a vLLM class overrides (`methods`, on `target`): a vLLM
    release that renames one would leave the subclass's method uncalled, silently, so each
    is checked at plugin load like a patch target, and so is every abstract method of the
    target (a release that adds one would make the subclass fail where it is first built).
    `newer_methods` are overrides of methods that only later supported releases have.
    `subclass` ("module:Class") names the subclass for the test that keeps the lists
    complete; nothing is replaced."""

    subclass: ClassVar[str]
    methods: ClassVar[tuple[str, ...]]
    newer_methods: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check_target(cls) -> None:
        missing = [name for name in cls.methods if not hasattr(cls.target, name)]
        abstract = getattr(cls.target, "__abstractmethods__", frozenset())
        unimplemented = sorted(abstract - {*cls.methods, *cls.newer_methods})
        if unimplemented:
            cls._refuse(unimplemented, "does not implement {where}, abstract in")
        if missing:
            cls._refuse(missing, "overrides {where}, which does not exist in")

    @classmethod
    def _refuse(cls, names: list[str], problem: str) -> NoReturn:
        import vllm

        where = ", ".join(describe(cls.target, name) for name in names)
        raise PatchTargetMissing(
            f"specextend-vllm: {cls.subclass} {problem.format(where=where)} vLLM "
            f"{vllm.__version__}. Install a supported vLLM, or set SPECEXTEND_DISABLE=1 to run "
            "vLLM without the plugin."
        )

    @classmethod
    def is_applied(cls) -> bool:
        return False

    @classmethod
    def apply(cls) -> None:
        cls.check_target()
