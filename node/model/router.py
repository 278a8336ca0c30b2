"""The document router of DiPaCo (Douillard et al. 2024): cheap features -> nearest k-means centroid -> path.

A document's features are the hashed byte n-grams of its first `prefix_bytes` bytes: each n-gram is
hashed with FNV-1a and MurmurHash3's finaliser (stable across processes and machines, unlike Python's
salted `hash`) into one of `features` buckets; the counts are log1p-damped and L2-normalised, so long
and short documents compare. `swarm init` fits one k-means centroid per path on the training documents
and stores them, rounded, in the spec; from then on routing is a fixed nearest-centroid lookup every
peer computes identically. Clusters are numbered by size (path 0 gets the most documents), path
index = mixed radix over the levels as in `SwarmSpec.path_of_index`.

Measured on BBC News, 2x2 paths (NMI of path vs topic, mean of 3 k-means seeds): byte 3-grams of the
first 2048 bytes into 1024 buckets 0.62 (business+tech share a path, the other 3 topics get one each);
256 buckets 0.45-0.48, 2-grams 0.50, 4-grams 0.55, prefix 1024 0.55, prefix 4096 0.53, hashed words
0.51 (words of 5+ letters 0.66, but that is English-specific; byte n-grams also separate code, tables, DNA).

Pure code: numpy and scikit-learn only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from pathswarm.node.model.data import Document
from pathswarm.protocol.spec import RouterSpec, SwarmSpec, format_path

CENTROID_DECIMALS = 6
"""Centroids are rounded to this many decimals, so the TOML stays readable and round-trips exactly."""

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser: FNV-1a's low bits depend only on the bytes' low bits, and the
    bucket is taken from the low bits, so mix every bit of the hash into them first."""
    h = h ^ (h >> np.uint64(33))
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def features(text: str, router: RouterSpec) -> np.ndarray:
    """float32 vector of dim router.features: L2-normalised log1p counts of hashed byte n-grams
    of the first router.prefix_bytes bytes (all zeros for a text shorter than one n-gram)."""
    data = np.frombuffer(text.encode("utf-8")[:router.prefix_bytes], dtype=np.uint8).astype(np.uint64)
    n_grams = len(data) - router.ngram + 1
    if n_grams <= 0:
        return np.zeros(router.features, dtype=np.float32)
    h = np.full(n_grams, _FNV_OFFSET, dtype=np.uint64)
    for j in range(router.ngram):  # FNV-1a over the n bytes of every n-gram at once (uint64 wraps)
        h ^= data[j:j + n_grams]
        h *= _FNV_PRIME
    bucket = _fmix64(h) % np.uint64(router.features)
    counts = np.log1p(np.bincount(bucket.astype(np.int64), minlength=router.features).astype(np.float64))
    return (counts / np.linalg.norm(counts)).astype(np.float32)


def features_many(texts: Sequence[str], router: RouterSpec) -> np.ndarray:
    """[len(texts), router.features] float32 matrix of `features`."""
    if not texts:
        return np.zeros((0, router.features), dtype=np.float32)
    return np.stack([features(t, router) for t in texts])


def _nearest(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    # Exact squared distances per centroid (not the |x|^2 - 2xc + |c|^2 shortcut), so a tie really is
    # a tie; argmin keeps the lowest index on ties.
    x = x.astype(np.float64)
    dist = np.stack([((x - c) ** 2).sum(axis=1) for c in centroids], axis=1)
    return dist.argmin(axis=1)


def fit_router(docs: Sequence[Document], router: RouterSpec, n_paths: int) -> RouterSpec:
    """`router` with one k-means centroid per path fitted on `docs` (seeded by router.seed),
    rounded to CENTROID_DECIMALS and ordered by the number of `docs` they receive, biggest first
    (ties by the centroid values), so the result depends only on the documents and the seed."""
    if n_paths <= 0:
        raise ValueError(f"n_paths must be positive, got {n_paths}")
    if len(docs) < n_paths:
        raise ValueError(f"cannot fit {n_paths} router centroids on {len(docs)} documents: "
                         f"need at least one document per path")
    x = features_many([d.text for d in docs], router).astype(np.float64)
    if len(np.unique(x, axis=0)) < n_paths:
        raise ValueError(f"the {len(docs)} documents have fewer than {n_paths} distinct feature vectors: "
                         f"too few distinct documents to fit {n_paths} paths")
    from sklearn.cluster import KMeans  # here, not at the top: importing sklearn costs a node ~3 s at start

    km = KMeans(n_clusters=n_paths, random_state=router.seed, n_init=10).fit(x)
    centroids = np.round(km.cluster_centers_, CENTROID_DECIMALS)
    sizes = np.bincount(_nearest(x, centroids), minlength=n_paths)
    order = sorted(range(n_paths), key=lambda i: (-sizes[i], tuple(centroids[i])))
    rows = tuple(tuple(round(float(v), CENTROID_DECIMALS) for v in centroids[i]) for i in order)
    return dataclasses.replace(router, centroids=rows)


def _fitted_router(spec_or_router: SwarmSpec | RouterSpec) -> RouterSpec:
    router = spec_or_router.router if isinstance(spec_or_router, SwarmSpec) else spec_or_router
    if not router.fitted:
        raise ValueError("the router has no centroids: fit it first (`pathswarm swarm init`)")
    return router


def route_many(texts: Sequence[str], spec_or_router: SwarmSpec | RouterSpec) -> np.ndarray:
    """Path index (int64) of every text: its nearest centroid, lowest index on ties."""
    router = _fitted_router(spec_or_router)
    if not texts:
        return np.zeros(0, dtype=np.int64)
    return _nearest(features_many(texts, router), np.asarray(router.centroids, dtype=np.float64))


def route(text: str, spec_or_router: SwarmSpec | RouterSpec) -> int:
    """Path index of one document (see SwarmSpec.path_of_index for its module tuple)."""
    return int(route_many([text], spec_or_router)[0])


def documents_by_path(spec: SwarmSpec, docs: Sequence[Document]) -> dict[tuple[int, ...], list[Document]]:
    """Every path of the spec (in canonical order) → the documents the router sends to it, in their
    original order; a path no document goes to gets an empty list. One routing pass over `docs`."""
    by_path: dict[tuple[int, ...], list[Document]] = {p: [] for p in spec.paths()}
    for d, index in zip(docs, route_many([d.text for d in docs], spec), strict=True):
        by_path[spec.path_of_index(int(index))].append(d)
    return by_path


def documents_of_path(spec: SwarmSpec, docs: Sequence[Document], path: tuple[int, ...],
                      allow_empty: bool = False) -> list[Document]:
    """The documents a node serving `path` trains on (or is scored on), in their original order.
    ValueError when the router sends none there, unless `allow_empty`."""
    spec.check_path(path)
    mine = documents_by_path(spec, docs)[tuple(path)]
    if not mine and not allow_empty:
        raise ValueError(f"no documents are routed to path {format_path(path)} in this corpus")
    return mine


def assignment_table(docs: Sequence[Document], router: RouterSpec, spec: SwarmSpec) -> dict:
    """How `docs` fall onto the paths: {"n_docs", "labels" (sorted), "paths": [{"index", "path",
    "docs", "labels": {label: count}} per path in index order], "purity"}. purity = share of documents
    whose label is the most common label of their path (1.0 = every path holds one label)."""
    if len(router.centroids) != spec.n_paths:
        raise ValueError(f"the router has {len(router.centroids)} centroids, the spec {spec.n_paths} paths")
    assigned = route_many([d.text for d in docs], router)
    labels = sorted({d.label for d in docs})
    paths: list[dict[str, Any]] = []
    for i in range(spec.n_paths):
        counts = {label: 0 for label in labels}
        for d, p in zip(docs, assigned, strict=True):
            if p == i:
                counts[d.label] += 1
        paths.append({"index": i, "path": spec.path_of_index(i), "docs": sum(counts.values()), "labels": counts})
    majority = sum(max(p["labels"].values(), default=0) for p in paths)
    return {"n_docs": len(docs), "labels": labels, "paths": paths,
            "purity": majority / len(docs) if docs else 0.0}
