"""sparsetool convert: a GGUF file (written here by the gguf package from a random GPT-2, F32 and
Q8_0) becomes a Hugging Face directory whose model computes what transformers' own GGUF loading
computes; what transformers cannot map, a file that is not GGUF and outputs that must not be
written are refused in one line; an interrupted or failed write leaves nothing; a GGUF file given
to the other commands names convert; and examples/smollm2.py writes the README's three inputs."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys

import pytest
import real_model
import torch
import transformers
from gguf_models import tiny_gpt2_gguf, write_gguf_of
from safetensors import safe_open
from safetensors.torch import load_file

from sparsetool.errors import SparsetoolError
from sparsetool.ops.convert import convert_gguf

from helpers import ROOT, make_text, run

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """The random GPT-2 and its F32 and Q8_0 GGUF files, in one folder with their tokenizer."""
    root = tmp_path_factory.mktemp("gguf")
    model, f32 = tiny_gpt2_gguf(root, "F32")
    _, q8 = tiny_gpt2_gguf(root, "Q8_0")
    return {"root": root, "model": model, "F32": f32, "Q8_0": q8}


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(ids).logits


def one_line(r, code: int = 1) -> str:
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: "), r.stderr
    return r.stderr


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_the_converted_model_is_the_one_transformers_reads_from_the_file(files, tmp_path, qtype):
    source = files[qtype]
    result = convert_gguf(source, tmp_path / "hf")
    assert result.output == tmp_path / "hf" and result.model_class == "GPT2LMHeadModel"
    assert result.architecture == "gpt2" and result.dtype == "float32"
    assert result.ggml_types == ({"F32": 28} if qtype == "F32" else {"F32": 20, "Q8_0": 8})
    assert result.parameters == sum(p.numel() for p in files["model"].parameters())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(result.files)
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}

    ids = torch.randint(
        0, files["model"].config.vocab_size, (2, 48), generator=torch.manual_seed(1)
    )
    converted = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    from_file = transformers.AutoModelForCausalLM.from_pretrained(
        files["root"], gguf_file=source.name
    )
    assert torch.equal(logits(converted, ids), logits(from_file, ids))
    drift = (logits(converted, ids) - logits(files["model"], ids)).abs().max().item()
    if qtype == "F32":
        assert drift == 0.0
    else:  # 8-bit groups of 32: close to the original model, not equal to it
        assert 0.0 < drift < 0.02
    text = make_text(20, 5)
    ours = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(files["root"] / "tok")
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]


def test_the_command_writes_bfloat16_and_says_what_it_did(files, tmp_path):
    r = run("convert", files["Q8_0"], "-o", tmp_path / "bf16", "--dtype", "bfloat16")
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith(
        "converted tiny-Q8_0.gguf (gpt2; 20 F32, 8 Q8_0) into GPT2LMHeadModel: 184,832 "
        "parameters in bfloat16, "
    ), lines
    assert lines[1] == f"wrote {tmp_path / 'bf16'}"
    convert_gguf(files["Q8_0"], tmp_path / "f32")
    half, full = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("bf16", "f32"))
    assert half.keys() == full.keys()
    assert all(half[k].dtype == torch.bfloat16 for k in half)
    assert all(torch.equal(half[k], full[k].to(torch.bfloat16)) for k in half)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"

    r = run("convert", files["F32"], "-o", tmp_path / "j", "--json")
    assert r.exit_code == 0 and r.stderr == "", r.output
    out = json.loads(r.stdout)
    assert out == {
        "input": str(files["F32"]),
        "output": str(tmp_path / "j"),
        "architecture": "gpt2",
        "model_class": "GPT2LMHeadModel",
        "dtype": "float32",
        "parameters": 184_832,
        "ggml_types": {"F32": 28},
        "files": sorted(p.name for p in (tmp_path / "j").iterdir()),
        "bytes": out["bytes"],
    }
    assert out["bytes"] == sum(p.stat().st_size for p in (tmp_path / "j").iterdir())


def test_progress_goes_to_a_log_and_transformers_says_nothing(files, tmp_path, monkeypatch):
    """Not a terminal: plain progress lines (every step with an interval of 0), one per step of
    the load and the write, and none of transformers' own bars or notes."""
    monkeypatch.setenv("SPARSETOOL_PROGRESS_INTERVAL", "0")
    r = run("convert", files["Q8_0"], "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    steps = [line.split(" (")[0].split(" done in ")[0] for line in r.stderr.splitlines()]
    assert steps == [
        "progress: load 1/3",
        "progress: load 2/3",
        "progress: load 3/3",
        "progress: write 1/2",
        "progress: write 2/2",
    ], r.stderr
    assert r.stderr.count(" done in ") == 2  # each stage's end


def test_an_architecture_transformers_cannot_map_is_one_line(tmp_path):
    source = write_gguf_of(tmp_path / "rwkv.gguf", "rwkv6")
    r = run("convert", source, "-o", tmp_path / "out")
    line = one_line(r)
    assert line.startswith(f"error: {source}: GGUF architecture 'rwkv6' is not one transformers")
    assert "gpt2" in line and "llama" in line  # what it maps instead
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rwkv.gguf"]


def test_what_is_not_a_gguf_file_is_refused_before_anything_loads(tmp_path):
    tiny = ROOT / "fixtures" / "tiny-gpt2"
    line = one_line(run("convert", tiny / "model.safetensors", "-o", tmp_path / "o"))
    assert "not a GGUF file" in line and "is read by every command as it is" in line
    line = one_line(run("convert", tiny, "-o", tmp_path / "o"))  # a directory: into GGUF
    assert line.startswith(f"error: {tiny}: model_type 'gpt2' is not one convert writes as GGUF")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    line = one_line(run("convert", cut, "-o", tmp_path / "o"))
    assert (
        line == f"error: {cut}: the GGUF header is truncated or corrupt; download the file again\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_a_file_cut_inside_its_tensor_data_is_refused_from_its_header(files, tmp_path):
    """The header places every tensor's data, so a download that stopped partway is said at
    once, in bytes, before transformers reads a tensor and before anything is written."""
    from sparsetool.checkpoint.gguf_file import read_header

    whole = files["Q8_0"].read_bytes()
    header = read_header(files["Q8_0"])
    assert header.data_end == len(whole) and header.data_start % 32 == 0
    for size in ((header.data_start + len(whole)) // 2, len(whole) - 1):
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(whole[:size])
        line = one_line(run("convert", cut, "-o", tmp_path / "out"))
        assert line == (
            f"error: {cut}: truncated: {size:,} of {len(whole):,} bytes (the header places the "
            f"data of 28 tensors up to byte {len(whole):,}); download the file again\n"
        )
        assert cut.read_bytes() == whole[:size]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_the_header_is_read_without_the_gguf_package_or_torch(files):
    code = (
        "import sys; from sparsetool.checkpoint.gguf_file import read_header; "
        f"h = read_header({str(files['Q8_0'])!r}); "
        "print(h.architecture, h.version, len(h.tensors), h.parameters, "
        "h.metadata['tokenizer.ggml.tokens'], h.metadata['gpt2.block_count'], "
        "'gguf' in sys.modules, 'torch' in sys.modules); print(h.ggml_types())"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    vocab = files["model"].config.vocab_size
    assert r.stdout.splitlines() == [
        f"gpt2 3 28 184832 {vocab} 2 False False",
        "{'F32': 20, 'Q8_0': 8}",
    ], r.stderr


def test_outputs_that_must_not_be_written_are_refused(files, tmp_path):
    source = files["F32"]
    r = run("convert", source, "-o", source)
    assert "is the input itself" in one_line(r, code=2)
    existing = tmp_path / "file.txt"
    existing.write_text("keep")
    assert "is an existing file" in one_line(run("convert", source, "-o", existing))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep")
    (busy / "config.json").write_text("{}")
    line = one_line(run("convert", source, "-o", busy))
    assert "holding notes.txt, which the converted model would replace" in line
    assert sorted(p.name for p in busy.iterdir()) == ["config.json", "notes.txt"]
    line = one_line(run("convert", source, "-o", tmp_path / "no" / "such"))
    assert "does not exist; create it first" in line
    r = run("convert", source)
    assert "give -o OUTPUT" in one_line(r, code=2)
    r = run("convert", source, "-o", tmp_path / "x", "--dtype", "float16")
    assert "--dtype" in one_line(r, code=2)


def modes(directory) -> dict[str, int]:
    """The permission bits of a directory and of each file in it (the directory as ".")."""
    return {".": directory.stat().st_mode & 0o777} | {
        p.name: p.stat().st_mode & 0o777 for p in directory.iterdir()
    }


@pytest.mark.parametrize("bits", [0o644, 0o600])
def test_every_output_file_has_the_input_files_mode(files, tmp_path, bits):
    """transformers writes model.safetensors through a private (0600) temporary; convert gives
    every file the GGUF file's mode (the directory: with search where reading is allowed), and
    prune and shrink of that directory keep each input file's mode (umask 022 throughout)."""
    source = tmp_path / "model.gguf"
    source.write_bytes(files["F32"].read_bytes())
    source.chmod(bits)
    text = tmp_path / "text.txt"
    text.write_text(make_text(600))
    old = os.umask(0o022)
    try:
        convert_gguf(source, tmp_path / "hf")
        for command in (
            ["prune", tmp_path / "hf", "-o", tmp_path / "pruned", "--sparsity", "0.5"],
            ["shrink", tmp_path / "hf", "-o", tmp_path / "shrunk", "--blocks", "1"]
            + ["--calibration", text, "--samples", "4", "--seq", "64"],
        ):
            r = run(*command, "--quiet")
            assert r.exit_code == 0, r.output
    finally:
        os.umask(old)
    directory = 0o755 if bits == 0o644 else 0o700
    for out in ("hf", "pruned", "shrunk"):
        found = modes(tmp_path / out)
        assert "model.safetensors" in found and "tokenizer.json" in found, found
        assert found == {".": directory} | {name: bits for name in found if name != "."}, out


def test_an_earlier_conversion_is_replaced_whole(files, tmp_path):
    out = tmp_path / "out"
    convert_gguf(files["F32"], out, dtype="bfloat16")
    convert_gguf(files["Q8_0"], out)
    state = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in state.values()} == {torch.float32}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_ctrl_c_while_writing_leaves_nothing_and_the_old_output_as_it_was(files, tmp_path):
    out = tmp_path / "out"
    convert_gguf(files["Q8_0"], out, dtype="bfloat16")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupt(stage: str, done: int, total: int) -> None:
        if stage == "write" and done == 1:  # the weights are written, the tokenizer not yet
            raise KeyboardInterrupt

    for target in (out, tmp_path / "new"):
        with pytest.raises(KeyboardInterrupt):
            convert_gguf(files["F32"], target, progress=interrupt)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left


def test_a_write_that_fails_midway_is_one_line_and_leaves_nothing(files, tmp_path):
    """A file-size limit makes the system refuse the weights' file partway (EFBIG), as a full
    disk would; the command runs in its own process, which the limit applies to."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    r = subprocess.run(
        [sys.executable, "-m", "sparsetool", "convert", str(files["F32"]), "-o", "out"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        preexec_fn=limit,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 1 and r.stderr == (
        "error: writing out failed: File too large [EFBIG]; nothing was written. Check the "
        "output location or choose another -o\n"
    ), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_without_the_convert_extra_it_says_what_to_install(files, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError
    with pytest.raises(SparsetoolError) as e:
        convert_gguf(files["F32"], tmp_path / "out")
    assert str(e.value) == (
        "converting a GGUF file needs gguf, which is not installed: pip install -e '.[convert]' "
        "(source checkout) or pip install 'sparsetool[convert]'"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["report", "prune", "eval", "densify"])
def test_a_gguf_file_given_to_another_command_names_convert(files, tmp_path, command):
    source = files["F32"]
    text = tmp_path / "text.txt"
    text.write_text(make_text(50))
    args = {
        "report": [source],
        "prune": [source, "-o", tmp_path / "p", "--sparsity", "0.5"],
        "eval": [source, "--text", text],
        "densify": [source, "-o", tmp_path / "d"],
    }[command]
    line = one_line(run(command, *args))
    assert line == (
        f"error: {source}: a GGUF file (llama.cpp's format), not a safetensors checkpoint; "
        f"convert it once into a Hugging Face directory: sparsetool convert {source} -o "
        f"{source.with_suffix('')}\n"
    )


def test_a_directory_of_gguf_files_names_convert(files):
    line = one_line(run("report", files["root"]))
    assert line.startswith(
        f"error: {files['root']}: holds GGUF files (tiny-F32.gguf, tiny-Q8_0.gguf) and no "
        f".safetensors file; convert one into a Hugging Face directory: sparsetool convert "
        f"{files['F32']} -o "
    ), line


# --- examples/smollm2.py ----------------------------------------------------------------------


def _example(name: str):
    """A script of examples/ as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


smollm2 = _example("smollm2")


@pytest.mark.skipif(real_model.sciq_passages(1) is None, reason=real_model.REAL_PACKAGES)
def test_the_example_writes_the_model_and_the_tests_own_two_texts(
    files, tmp_path, monkeypatch, capsys
):
    """The script's main() as the README runs it, with the small GGUF file in place of
    SmolLM2's (its conversion is the real-model tests'): the texts are byte for byte the tests'
    own, and a second run keeps the model."""
    monkeypatch.chdir(tmp_path)
    assert smollm2.main(["out", "--gguf", str(files["F32"])]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["calib.txt", "heldout.txt", "smollm2"]
    assert transformers.AutoConfig.from_pretrained(out / "smollm2").model_type == "gpt2"
    calibration, heldout = real_model.split_text(tmp_path / "tests")
    assert (out / "calib.txt").read_bytes() == calibration.read_bytes()
    assert (out / "heldout.txt").read_bytes() == heldout.read_bytes()
    passages = len(real_model.sciq_passages())
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "wrote out/smollm2 (184,832 parameters, float32)",
        f"wrote out/calib.txt ({passages - 400} passages) and out/heldout.txt (400 passages)",
    ]
    assert smollm2.main(["out", "--gguf", str(files["Q8_0"])]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "kept out/smollm2"


def test_the_example_splits_the_passages_held_out_first(tmp_path):
    calib, heldout = smollm2.write_texts(tmp_path, ["one", "two", "three"], held_out=1)
    assert heldout.read_text() == "one\n" and calib.read_text() == "two\n\nthree\n"
    assert smollm2.installed_gguf() == real_model.gguf_file() or real_model.gguf_file() is None
