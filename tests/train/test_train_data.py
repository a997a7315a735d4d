"""Data for sparsetool train: the built-in corpus split and the resumable sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparsetool.errors import ConfigError
from sparsetool.train.data import Sampler, eval_batches
from sparsetool.util.corpus import is_validation, load_corpus, stdlib_files


def test_stdlib_corpus_is_sorted_and_excludes_tests_site_packages_and_pydoc_data():
    root, files = stdlib_files()
    assert files == sorted(files) and len(files) > 100
    for rel in files:
        parts = rel.split("/")[:-1]
        skipped = {"site-packages", "dist-packages", "test", "tests", "idle_test", "pydoc_data"}
        assert not skipped & set(parts)
        assert rel.endswith(".py")
    assert "json/decoder.py" in files


def test_split_by_file_is_deterministic_and_disjoint():
    _, files = stdlib_files()
    val = [f for f in files if is_validation(f)]
    assert 0.05 < len(val) / len(files) < 0.15
    assert val == [f for f in files if is_validation(f)]  # a pure function of the path


def test_every_window_is_served_once_per_epoch():
    data = np.arange(1000, dtype=np.int64).astype(np.uint8)
    s = Sampler(data, context=16, seed=3)
    n = s.windows_per_epoch
    starts = s.starts(0, n)
    assert len(set(starts.tolist())) == n  # no window twice within an epoch
    assert (np.diff(np.sort(starts)) == 16).all()  # non-overlapping
    nxt = s.starts(n, n)
    assert not np.array_equal(nxt, starts)  # the next epoch is reshuffled


def test_batches_depend_only_on_seed_and_position():
    data = np.frombuffer(bytes(range(256)) * 8, dtype=np.uint8)
    a = Sampler(data, context=8, seed=1)
    b = Sampler(data, context=8, seed=1)
    b.batch(500, 4)  # a different history must not matter
    xa, ya = a.batch(37, 5)
    xb, yb = b.batch(37, 5)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(Sampler(data, context=8, seed=2).batch(37, 5)[0], xa)
    assert torch.equal(xa[:, 1:], ya[:, :-1])


def test_single_file_splits_its_tail_and_tiny_data_is_refused(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"abcdefghij" * 100)
    c = load_corpus(f, min_bytes=9)
    assert c.train.size == 900 and c.val.size == 100
    assert bytes(c.val[:10]) == b"abcdefghij"
    with pytest.raises(ConfigError, match="fewer than"):
        load_corpus(f, min_bytes=200)
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus(tmp_path / "missing")


def test_eval_set_is_fixed_and_spread_over_the_stream():
    data = np.arange(200, dtype=np.uint8)
    x, y = eval_batches(data, context=10, n_sequences=5)
    assert x.shape == (5, 10) and x[0, 0] == 0 and y[-1, -1] == 199


def test_builtin_english_corpus_is_split_by_topic_name():
    from pydoc_data.topics import topics

    from sparsetool.util.corpus import ENGLISH

    c = load_corpus(ENGLISH, min_bytes=65)
    val = [k for k in sorted(topics) if is_validation(k)]
    assert 0 < len(val) < len(topics) and c.val_files == len(val)
    assert c.train_files + c.val_files == len(topics)
    assert bytes(c.val) == b"".join(topics[k].encode() + b"\n" for k in val)
    train = bytes(c.train)
    assert all(topics[k].encode() not in train for k in val)  # no topic on both sides
    assert "help topics" in c.source and ENGLISH in c.source


def test_builtin_corpus_is_read_once_and_cannot_be_changed_through_a_copy():
    a, b = load_corpus(None), load_corpus(None)
    assert a is not b and a.train is b.train  # one read per process, shared arrays
    assert not a.train.flags.writeable and not a.val.flags.writeable
    with pytest.raises(ValueError):
        a.train[0] = 0
    a.train = a.train[:10]  # rebinding a field of one copy leaves the next load whole
    assert load_corpus(None).train.size == b.train.size > 10
