"""Every seam: its target exists in the installed vLLM, applying it twice is harmless,
a missing target fails at load naming it, and the plugin can be switched off. Every
method our subclasses of vLLM classes override is declared and exists in vLLM."""

from __future__ import annotations

import abc
import importlib
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from specextend_vllm import register
from specextend_vllm.patches import registry
from specextend_vllm.vllm_access.attention_seam import AttentionLayerSeam, attention_layer_seam
from specextend_vllm.patches.base import PatchTargetMissing, VllmOverrides, VllmPatch

OVERRIDES = [patch for patch in registry.ALL_PATCHES if issubclass(patch, VllmOverrides)]
PATCH_NAMES = [patch.__name__ for patch in registry.ALL_PATCHES if patch not in OVERRIDES]

CHECK_IN_FRESH_PROCESS = """
import json
from specextend_vllm.patches import registry
missing = {}
for patch in registry.ALL_PATCHES:
    try:
        patch.check_target()
    except Exception as error:
        missing[patch.__name__] = str(error)
print(json.dumps(missing))
"""


def test_every_patch_target_exists_in_the_installed_vllm() -> None:
    """Checked before any patch is applied, in a process of its own."""
    result = subprocess.run(
        [sys.executable, "-c", CHECK_IN_FRESH_PROCESS],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SPECEXTEND_DISABLE": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}


@pytest.mark.parametrize("name", PATCH_NAMES)
def test_applying_a_patch_twice_is_harmless(name: str) -> None:
    patch = next(p for p in registry.ALL_PATCHES if p.__name__ == name)
    patch.apply()
    installed, original = vars(patch.target)[patch.attribute], patch.original
    patch.apply()
    assert vars(patch.target)[patch.attribute] is installed
    assert patch.original is original
    assert patch.adds or original is not None


class BaseOfMoved:
    def method_that_moved(self) -> None: ...


class Moved(BaseOfMoved):
    pass


class Renamed:
    pass


@pytest.mark.parametrize("target", [Renamed, Moved], ids=["renamed", "moved_to_a_base_class"])
def test_a_missing_target_fails_naming_it(target: type) -> None:
    """A method vLLM renamed, or moved to a base class (still reachable on the target, but
    not the target's own, which the patch keeps as its original): refused by name."""

    class NeedsMethod(VllmPatch):
        attribute = "method_that_moved"

    NeedsMethod.target = target
    with pytest.raises(
        PatchTargetMissing, match=f"{target.__name__}.method_that_moved.*does not exist"
    ):
        NeedsMethod.apply()
    assert not NeedsMethod.is_applied()


@pytest.mark.parametrize("overrides", OVERRIDES, ids=lambda overrides: overrides.__name__)
def test_every_overridden_method_is_declared(overrides: type[VllmOverrides]) -> None:
    """A method the subclass defines and its vLLM base has is an override: an undeclared
    one would escape the check at load."""
    module, name = overrides.subclass.split(":")
    subclass = getattr(importlib.import_module(module), name)
    assert issubclass(subclass, overrides.target)
    defined = {
        name
        for name, value in vars(subclass).items()
        if callable(value) or isinstance(value, (property, staticmethod, classmethod))
    }
    newer = {name for name in overrides.newer_methods if hasattr(overrides.target, name)}
    expected = {*overrides.methods, *newer}
    assert {name for name in defined if hasattr(overrides.target, name)} == expected
    assert not getattr(subclass, "__abstractmethods__", None)


def test_a_renamed_overridden_method_fails_naming_it() -> None:
    class Base:
        def renamed_upstream(self) -> None: ...

    class DraftsRoots(VllmOverrides):
        target = Base
        subclass = "tests:Proposer"
        methods = ("renamed_upstream", "sample_draft_tokens")

    with pytest.raises(PatchTargetMissing, match="tests:Proposer overrides .*Base.sample_draft_tokens"):
        DraftsRoots.apply()


def test_a_new_abstract_method_of_the_base_fails_naming_it() -> None:
    class Output(abc.ABC):
        @abc.abstractmethod
        def get_output(self) -> None: ...

        @abc.abstractmethod
        def get_kv_connector_output(self) -> None: ...

    class WrapsOutput(VllmOverrides):
        target = Output
        subclass = "tests:Wrapper"
        methods = ("get_output",)

    with pytest.raises(PatchTargetMissing, match="does not implement .*Output.get_kv_connector_output"):
        WrapsOutput.apply()


def test_an_added_attribute_must_not_exist_yet() -> None:
    class Worker:
        def specextend_stats(self) -> None: ...

    class AddsStats(VllmPatch):
        target = Worker
        attribute = "specextend_stats"
        adds = True

    with pytest.raises(PatchTargetMissing, match="already exists"):
        AddsStats.apply()


def test_the_plugin_switch_leaves_vllm_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECEXTEND_DISABLE", "1")
    applied: list[str] = []
    monkeypatch.setattr(registry, "apply_all", lambda: applied.append("all"))
    register()
    assert applied == []
    monkeypatch.setenv("SPECEXTEND_DISABLE", "0")
    register()
    assert applied == ["all"]


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0"])
def test_a_vllm_outside_the_supported_range_is_refused_naming_the_range(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    import vllm

    monkeypatch.setenv("SPECEXTEND_DISABLE", "0")
    monkeypatch.setattr(vllm, "__version__", version)
    with pytest.raises(RuntimeError, match=rf"supports vLLM 0\.32\.x, 0\.33\.x; this is vLLM {version}"):
        register()


def test_the_cpu_expand_patch_replaces_vllms() -> None:
    register()
    from vllm.v1.sample import rejection_sampler

    expanded = rejection_sampler.expand_batch_to_tokens(
        torch.tensor([0.5, 2.0]), torch.tensor([3, 5], dtype=torch.int32), 5
    )
    assert expanded.tolist() == [0.5, 0.5, 0.5, 2.0, 2.0]


class FakeImpl:
    def forward(self, layer: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return query * 2


class FakeLayer:
    def __init__(self) -> None:
        self.impl = FakeImpl()


def test_one_attention_seam_per_layer_serves_every_observer() -> None:
    layer = FakeLayer()
    seen: list[torch.Tensor] = []
    attention_layer_seam(layer).observe_query(seen.append)
    attention_layer_seam(layer).observe_query(lambda q: seen.append(q + 1))
    assert isinstance(layer.impl.forward, AttentionLayerSeam)
    assert layer.impl.forward.backend_forward.__func__ is FakeImpl.forward
    output = layer.impl.forward(layer, torch.ones(1), None, None, None, None)
    assert output.tolist() == [2.0] and [s.item() for s in seen] == [1.0, 2.0]


class VerificationBatchesOnly:
    def handles(self, attn_metadata: Any) -> bool:
        return attn_metadata == "verification"

    def __call__(self, query: torch.Tensor, *args: Any) -> torch.Tensor:
        backend = args[-1]
        assert callable(backend)
        return query * 3


def test_an_alternative_path_computes_the_batches_it_handles_and_observers_still_see_them() -> None:
    layer = FakeLayer()
    seen: list[torch.Tensor] = []
    seam = attention_layer_seam(layer)
    seam.observe_query(seen.append)
    seam.compute_with(VerificationBatchesOnly())
    output = torch.empty(1)
    assert layer.impl.forward(layer, torch.ones(1), None, None, None, "verification", output=output).tolist() == [3.0]
    assert layer.impl.forward(layer, torch.ones(1), None, None, None, "prefill", output=output).tolist() == [2.0]
    assert len(seen) == 2


def test_an_attention_layer_without_impl_forward_fails_naming_it() -> None:
    layer = FakeLayer()
    layer.impl = object()
    with pytest.raises(PatchTargetMissing, match="impl.forward"):
        attention_layer_seam(layer)
