"""The check behind the warning that int8 layers may not pay on this CPU."""

from pathlib import Path

import pytest

from specextend_vllm.vllm_access import cpu_int8

ZEN3_FLAGS = "fpu vme sse sse2 avx avx2 fma bmi2 sha_ni vaes vpclmulqdq"


def cpuinfo(tmp_path: Path, flags: str, name: str = "cpuinfo") -> Path:
    path = tmp_path / name
    path.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\n"
        f"flags\t\t: {flags}\nbugs\t\t: sysret_ss_attrs\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    )
    return path


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    flags = cpu_int8.cpu_flags(cpuinfo(tmp_path, ZEN3_FLAGS))
    assert flags is not None and {"avx2", "fma"} <= flags and "sysret_ss_attrs" not in flags
    assert cpu_int8.has_int8_dot_products(flags) is False
    with_vnni = cpu_int8.cpu_flags(cpuinfo(tmp_path, ZEN3_FLAGS + " avx512f avx512_vnni", "vnni"))
    assert cpu_int8.has_int8_dot_products(with_vnni) is True
    assert cpu_int8.cpu_flags(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("flags", "warns"),
    [(ZEN3_FLAGS, True), (ZEN3_FLAGS + " avx512f avx512_vnni", False), (ZEN3_FLAGS + " amx_int8", False), (None, False)],
)
def test_warns_once_where_int8_has_no_dot_products(
    monkeypatch: pytest.MonkeyPatch, flags: str | None, warns: bool
) -> None:
    warnings: list[str] = []
    monkeypatch.setattr(cpu_int8.logger, "warning", lambda message, *args: warnings.append(message % args))
    cpu_int8.warn_int8_layers_without_dot_products.cache_clear()
    flag_set = None if flags is None else frozenset(flags.split())
    for _ in range(3):
        cpu_int8.warn_int8_layers_without_dot_products(flag_set)
    assert len(warnings) == int(warns)
    if warns:
        assert "avx512_vnni" in warnings[0] and "unquantized" in warnings[0]
