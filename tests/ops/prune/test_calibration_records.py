"""Calibration from records (.jsonl, .parquet, .arrow) and chat messages: the same text, windows
and pruned weights as the equivalent text file; the text field, the chat template; the errors."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import transformers
from safetensors import safe_open

from sparsetool.errors import SparsetoolError
from sparsetool.ops.calibration import calibration_windows
from sparsetool.ops.prune import PruneOptions, prune_checkpoint
from sparsetool.ops.text import TextSource, read_text

from helpers import CALIB, hf_model, make_text, run, save_tokenizer, tensors

os.environ["HF_HUB_OFFLINE"] = "1"

CHAT = (  # a chat template of our own: each message as <|role|> content, one per line
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def docs() -> list[str]:
    """Documents: some lines of text, one holding a blank line and one empty."""
    lines = make_text(400, seed=3).split("\n")
    return [*lines[:200], "two\n\nparagraphs", "", *lines[200:]]


@pytest.fixture(scope="module")
def files(tmp_path_factory, docs) -> dict[str, object]:
    """The documents as a text file (joined by a newline) and as records in every format."""
    d = tmp_path_factory.mktemp("records")
    (d / "calib.txt").write_text("\n".join(docs))
    with open(d / "calib.jsonl", "w") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, "body": doc}) + "\n")
    table = pa.table({"id": list(range(len(docs))), "body": docs})
    pq.write_table(table, d / "calib.parquet", row_group_size=50)  # several row groups
    arrow = pa.OSFile(str(d / "calib.arrow"), "wb")
    with arrow as sink, pa.ipc.new_file(sink, table.schema) as writer:  # the IPC file format
        writer.write_table(table)
    (d / "stream").mkdir()
    stream = pa.OSFile(str(d / "stream" / "data.arrow"), "wb")
    with stream as sink, pa.ipc.new_stream(sink, table.schema) as writer:  # as datasets saves
        writer.write_table(table, max_chunksize=64)
    return {"dir": d, "docs": docs}


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny random Llama with a tokenizer trained here, given a chat template; and a copy of
    it whose tokenizer has none."""
    d = tmp_path_factory.mktemp("chat") / "model"
    torch.manual_seed(0)
    hf_model("llama").eval().save_pretrained(d)
    save_tokenizer(d, make_text(400) + "\nuser assistant system <|user|> <|assistant|>")
    plain = d.parent / "plain"
    plain.mkdir()
    for f in d.iterdir():
        (plain / f.name).write_bytes(f.read_bytes())
    tok = transformers.AutoTokenizer.from_pretrained(d)
    tok.chat_template = CHAT
    tok.save_pretrained(d)
    return d, plain


@pytest.mark.parametrize("name", ["calib.jsonl", "calib.parquet", "calib.arrow", "stream"])
def test_records_read_as_the_text_file_of_their_documents(files, name):
    d = files["dir"]
    text = read_text(d / "calib.txt")
    source = TextSource(d / name, "body")
    assert read_text(source, "--calibration") == text
    # the digest recorded for the output is the text's
    assert source.digest == hashlib.sha256(text.encode()).hexdigest()


def test_a_directory_reads_each_file_by_its_kind(files, tmp_path):
    d = files["dir"]
    (tmp_path / "a.txt").write_text("first file")
    (tmp_path / "b.jsonl").write_text((d / "calib.jsonl").read_text())
    got = read_text(TextSource(tmp_path, "body"))
    assert got == "first file\n" + read_text(d / "calib.txt")


def test_records_give_the_windows_and_pruned_weights_of_the_text_file(files, chat_model, tmp_path):
    """Wanda from the Parquet file and from the text file: the same windows, the same bytes
    written; the record names the text field and the text's digest."""
    model, _ = chat_model
    d = files["dir"]
    outs = {}
    for name, field in (("calib.txt", "text"), ("calib.parquet", "body")):
        out = tmp_path / name
        opts = PruneOptions(
            sparsity=0.5, method="wanda", calibration=str(d / name), text_field=field, **CALIB
        )
        prune_checkpoint(model, out, opts)
        with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
            outs[name] = (tensors(out), json.loads(f.metadata()["sparsetool"])["calibration"])
    (plain, rec_t), (from_records, rec_r) = outs["calib.txt"], outs["calib.parquet"]
    assert sorted(plain) == sorted(from_records)
    assert all(torch.equal(plain[n], from_records[n]) for n in plain)
    assert rec_r["text_field"] == "body" and "text_field" not in rec_t
    assert rec_r["sha256"] == rec_t["sha256"] and len(rec_t["sha256"]) == 64
    assert rec_r["text"] == str(d / "calib.parquet")


def test_chat_messages_go_through_the_models_chat_template(chat_model, tmp_path):
    model, _ = chat_model
    chats = [
        [{"role": "user", "content": f"what is {w}?"}, {"role": "assistant", "content": w * 3}]
        for w in ("sparse", "the mask", "a layer")
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    got = read_text(TextSource(path, "messages", model), "--calibration")
    by_hand = "\n".join(
        "".join(f"<|{m['role']}|> {m['content']}\n" for m in c) for c in chats
    )  # the template above, rendered by hand
    assert got == by_hand
    tok = transformers.AutoTokenizer.from_pretrained(model)
    assert got == "\n".join(tok.apply_chat_template(c, tokenize=False) for c in chats)


def test_prune_and_shrink_read_chat_records_on_the_command_line(chat_model, tmp_path):
    model, _ = chat_model
    words = make_text(300, seed=5).split("\n")
    path = tmp_path / "chat.jsonl"
    path.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": a}, {"role": "x", "content": b}]})
            + "\n"
            for a, b in zip(words[::2], words[1::2], strict=False)
        )
    )
    common = ("--calibration", path, "--text-field", "messages", "--samples", 4, "--seq", 32)
    r = run("prune", model, "-o", tmp_path / "p", "--sparsity", 0.5, "--method", "wanda", *common)
    assert r.exit_code == 0, r.output
    with safe_open(str(next((tmp_path / "p").glob("*.safetensors"))), "pt") as f:
        record = json.loads(f.metadata()["sparsetool"])["calibration"]
    assert record["text_field"] == "messages" and record["text"] == str(path)
    r = run("shrink", model, "-o", tmp_path / "s", "--blocks", 1, *common, "--json")
    assert r.exit_code == 0, r.output
    options = json.loads(r.stdout)["options"]
    assert options["text_field"] == "messages" and len(options["calibration_sha256"]) == 64


def test_the_same_windows_from_jsonl_as_from_text(files, chat_model):
    from sparsetool.models.open import open_model

    model = open_model(chat_model[0])
    try:
        d = files["dir"]
        for name in ("calib.txt", "calib.jsonl"):
            ids = model.encode(read_text(TextSource(d / name, "body"))).ids
            windows = calibration_windows(ids, 6, 32, 0, name)
            if name == "calib.txt":
                first = windows
        assert torch.equal(first, windows)
    finally:
        model.close()


# ----------------------------------------------------------------------------- errors
def test_a_missing_field_names_the_file_and_its_fields(files):
    d = files["dir"]
    for name in ("calib.jsonl", "calib.parquet", "calib.arrow"):
        with pytest.raises(SparsetoolError) as e:
            read_text(TextSource(d / name), "--calibration")
        msg = str(e.value)
        assert f"--calibration {d / name}: no field 'text' (it has: id, body)" in msg
        assert "--text-field NAME" in msg


def test_chat_messages_need_a_chat_template(chat_model, tmp_path):
    _, plain = chat_model
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(SparsetoolError, match=r"has no chat template") as e:
        read_text(TextSource(path, "messages", plain), "--calibration")
    assert str(path) in str(e.value) and str(plain) in str(e.value)
    with pytest.raises(SparsetoolError, match=r"only a model's chat template"):
        read_text(TextSource(path, "messages"), "--text")
    r = run("prune", plain, "-o", tmp_path / "o", "--sparsity", 0.5, "--method", "wanda",
            "--calibration", path, "--text-field", "messages")  # fmt: skip
    assert r.exit_code == 1 and "has no chat template" in r.output
    assert not (tmp_path / "o").exists()


def test_bad_records_are_one_error_each(tmp_path):
    cases = {
        "a.jsonl": ('{"text": "fine"}\n{"text": oops}\n', r"line 2 is not JSON"),
        "b.jsonl": ('["text"]\n', r"line 1 is a JSON list, not an object"),
        "c.jsonl": ('{"text": 3}\n', r"field 'text' holds a int, not text or a list of chat"),
        "d.parquet": ("not parquet", r"not a Parquet file"),
        "e.arrow": ("not arrow", r"not a Arrow IPC file"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(SparsetoolError, match=message):
            read_text(TextSource(tmp_path / name), "--calibration")


def test_reading_parquet_without_pyarrow_names_the_package(files, monkeypatch):
    for module in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    with pytest.raises(
        SparsetoolError,
        match=r"needs pyarrow, which is not installed: pip install .sparsetool\[records\].",
    ):
        read_text(TextSource(files["dir"] / "calib.parquet", "body"), "--calibration")
    # JSON lines need no pyarrow
    assert read_text(TextSource(files["dir"] / "calib.jsonl", "body")).startswith(files["docs"][0])


def test_text_field_usage_is_checked_before_anything_loads(files, tmp_path):
    d = files["dir"]
    base = ("prune", d / "nothing", "-o", tmp_path / "o", "--sparsity", 0.5)
    r = run(*base, "--method", "wanda", "--calibration", d / "calib.txt", "--text-field", "body")
    assert r.exit_code == 2 and "--text-field body names a field of records" in r.output
    r = run(*base, "--text-field", "body")
    assert r.exit_code == 2 and "--text-field is read by --method wanda or sparsegpt" in r.output
    r = run("shrink", d / "nothing", "-o", tmp_path / "s", "--experts", 0.5, "--criterion",
            "random", "--text-field", "body")  # fmt: skip
    assert r.exit_code == 2 and "--text-field names the text field" in r.output
