"""Unit tests of node/model/router.py and node/app/swarm_init.py: features, k-means fit, routing, init report."""

import dataclasses
import math
from collections import Counter

import numpy as np
import pytest

from pathswarm.node.app.swarm_init import format_init_report, init_spec
from pathswarm.node.model.data import Document, load_bbc, split, synthetic_corpus
from pathswarm.node.model.router import (
    CENTROID_DECIMALS,
    assignment_table,
    documents_by_path,
    documents_of_path,
    features,
    features_many,
    fit_router,
    route,
    route_many,
)
from pathswarm.protocol.spec import DataSpec, RouterSpec, SwarmSpec, loads_spec


@pytest.fixture(scope="module")
def synthetic():
    return synthetic_corpus(200, seed=0)


@pytest.fixture(scope="module")
def fitted(synthetic):
    """A 2x2 spec whose router is fitted on the synthetic corpus's training split."""
    return init_spec(SwarmSpec(levels=(2, 2), data=DataSpec(corpus="synthetic")), synthetic)


# ---- features --------------------------------------------------------------------------------
def test_features_golden_value_is_stable_across_processes():
    # Computed once and pasted: a salted hash (Python's `hash`) would change it in every process.
    f = features("pathswarm routes bytes", RouterSpec(features=64, ngram=3))
    assert f.dtype == np.float32 and f.shape == (64,)
    assert np.flatnonzero(f).tolist() == [2, 3, 5, 9, 22, 23, 25, 26, 27, 30, 32, 36, 45, 51, 53, 55, 57, 61]
    # 20 trigrams: 16 buckets hold one, buckets 3 and 36 hold two; values are L2-normalised log1p counts.
    norm = math.sqrt(16 * math.log(2) ** 2 + 2 * math.log(3) ** 2)
    expected = np.where(np.isin(np.arange(64), [3, 36]), math.log(3), math.log(2)) / norm
    np.testing.assert_allclose(f[f > 0], expected[f > 0], rtol=1e-6)


def test_features_unit_norm_prefix_only_and_short_text():
    router = RouterSpec(features=128, ngram=3, prefix_bytes=100)
    text = "x" * 40 + "the quick brown fox " * 3
    f = features(text, router)
    assert abs(np.linalg.norm(f) - 1) < 1e-6
    assert np.array_equal(f, features(text + "anything after the prefix" * 20, router))
    assert not np.any(features("ab", router))  # shorter than one trigram: all zeros
    assert features_many(["ab", text], router).shape == (2, 128)


# ---- fit -------------------------------------------------------------------------------------
def test_fit_router_is_deterministic_rounded_and_biggest_first(synthetic):
    router = RouterSpec(seed=7)
    a, b = fit_router(synthetic, router, 4), fit_router(synthetic, router, 4)
    assert a == b
    assert len(a.centroids) == 4 and all(len(c) == router.features for c in a.centroids)
    assert all(type(v) is float and v == round(v, CENTROID_DECIMALS) for c in a.centroids for v in c)
    sizes = np.bincount(route_many([d.text for d in synthetic], a), minlength=4)
    assert list(sizes) == sorted(sizes, reverse=True)
    assert dataclasses.replace(a, centroids=()) == router


def test_fit_router_needs_a_document_per_path():
    with pytest.raises(ValueError, match="at least one document per path"):
        fit_router(synthetic_corpus(3), RouterSpec(), 4)
    with pytest.raises(ValueError, match="distinct"):
        fit_router([Document("same text")] * 5, RouterSpec(), 4)


def test_synthetic_domains_route_to_their_own_paths(fitted, synthetic):
    _, val = split(synthetic, fitted.data.val_fraction)
    for docs in (synthetic, val):  # also documents the router never saw
        table = assignment_table(docs, fitted.router, fitted)
        assert table["purity"] >= 0.9
        dominant = {label: max(table["paths"], key=lambda p, lb=label: p["labels"][lb])["index"]
                    for label in table["labels"]}
        assert sorted(dominant.values()) == [0, 1, 2, 3]  # one domain per path


# ---- route -----------------------------------------------------------------------------------
def test_route_matches_route_many_and_accepts_spec_or_router(fitted, synthetic):
    texts = [d.text for d in synthetic[:12]]
    many = route_many(texts, fitted)
    assert many.tolist() == [route(t, fitted) for t in texts] == [route(t, fitted.router) for t in texts]
    assert route_many([], fitted).shape == (0,)
    by_path = documents_by_path(fitted, synthetic)
    assert list(by_path) == fitted.paths()
    for i, path in enumerate(fitted.paths()):
        assert all(route(d.text, fitted) == i for d in by_path[path])
        assert documents_of_path(fitted, synthetic, path) == by_path[path]
    assert sum(len(docs) for docs in by_path.values()) == len(synthetic)
    assert sorted(synthetic, key=lambda d: d.text) == sorted(sum(by_path.values(), []), key=lambda d: d.text)


def test_a_path_no_document_goes_to_is_empty_or_an_error(fitted, synthetic):
    sent_to_0 = documents_of_path(fitted, synthetic, (0, 0))
    assert documents_of_path(fitted, sent_to_0, (1, 1), allow_empty=True) == []
    with pytest.raises(ValueError, match="no documents are routed to path 1.1"):
        documents_of_path(fitted, sent_to_0, (1, 1))
    with pytest.raises(ValueError, match="does not fit levels"):
        documents_of_path(fitted, synthetic, (2, 0))


def test_route_ties_go_to_lowest_index_and_unfitted_router_is_refused():
    router = RouterSpec(features=8, ngram=1)
    twin = tuple([0.0] * 8)
    assert route("abc", dataclasses.replace(router, centroids=(twin, twin))) == 0
    with pytest.raises(ValueError, match="no centroids"):
        route("abc", router)


def test_spec_toml_round_trip_keeps_centroids_and_swarm_id(fitted):
    again = loads_spec(fitted.to_toml())
    assert again.router.centroids == fitted.router.centroids
    assert again.swarm_id == fitted.swarm_id
    assert again.swarm_id != SwarmSpec(levels=(2, 2), data=DataSpec(corpus="synthetic")).swarm_id


def test_assignment_table_counts(fitted, synthetic):
    table = assignment_table(synthetic, fitted.router, fitted)
    assert table["n_docs"] == 200 and table["labels"] == ["code", "dna", "prose", "table"]
    assert [p["path"] for p in table["paths"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert sum(p["docs"] for p in table["paths"]) == 200
    for label in table["labels"]:
        assert sum(p["labels"][label] for p in table["paths"]) == 50


# ---- swarm init ------------------------------------------------------------------------------
def test_init_spec_fits_on_the_train_split_and_reports(fitted, synthetic):
    train, _ = split(synthetic, fitted.data.val_fraction)
    assert fitted.router == fit_router(train, fitted.router, 4)
    report = format_init_report(fitted, synthetic)
    assert fitted.swarm_id in report
    assert "levels 2x2 -> 4 paths" in report
    for label in ("code", "dna", "prose", "table"):
        assert label in report
    for path in ("0.0", "0.1", "1.0", "1.1"):
        assert path in report
    with pytest.raises(ValueError, match="fewer than the 4 paths"):
        init_spec(fitted, synthetic[:3])


def test_bbc_topics_fall_onto_coherent_paths():
    docs = load_bbc()
    spec = init_spec(SwarmSpec(levels=(2, 2), router=RouterSpec(features=1024, ngram=3, prefix_bytes=2048)),
                     docs)
    table = assignment_table(docs, spec.router, spec)
    assert table["purity"] >= 0.65
    per_topic = Counter()
    for label in table["labels"]:
        counts = [p["labels"][label] for p in table["paths"]]
        per_topic[label] = max(counts) / sum(counts)
    # Sports, politics and entertainment each get a path of their own; business and tech share one.
    assert min(per_topic.values()) >= 0.7, per_topic
    assert max(p["docs"] for p in table["paths"]) <= 0.5 * len(docs)
