"""`sparsetool flops` end to end: tables, --json, errors, and --checkpoint on real safetensors."""

from __future__ import annotations

import json

import pytest

from sparsetool.flops import account, get_preset

from helpers import runner_for, whole_json

SPEC_KEYS = {
    "forward_flops_per_seq",
    "train_flops_per_seq",
    "total_train_flops",
    "dense_total_train_flops",
    "train_flops_ratio",
    "inference_flops_ratio",
    "params",
    "nonzero_params",
}


run = runner_for("flops", columns=200)


def ok_json(*args: str):
    """The one run of a single-sparsity invocation, else the list of runs."""
    runs = whole_json(*args)["runs"]
    return runs[0] if len(runs) == 1 else runs


def test_table_gpt3_xl_75():
    r = run("--model", "gpt3-xl", "--sparsity", "0.75")
    assert r.exit_code == 0, r.output
    for text in (
        "forward FLOPs / sequence",
        "training FLOPs / sequence",
        "inference FLOPs / token",
        "non-zero parameters",
        "236.09 EFLOP",
        "94.76 EFLOP",
        "18.60 TFLOP",
        "7.464 TFLOP",
        "2.49x",
        "26B training tokens (20 tokens/param, Chinchilla)",
    ):
        assert text in r.stdout, text
    assert r.stdout.count("gpt3-xl: 24 layers") == 1


def test_json_single_sparsity_has_spec_keys_and_values():
    whole = whole_json("--model", "gpt3-xl", "--sparsity", "0.75")
    d = whole["runs"][0]
    assert set(d) >= SPEC_KEYS
    ref = account(get_preset("gpt3-xl"), sparsity=0.75)
    for k in SPEC_KEYS:
        assert d[k] == pytest.approx(ref[k]), k
    assert d["train_flops_ratio"] == pytest.approx(
        d["total_train_flops"] / d["dense_total_train_flops"]
    )
    assert whole["config"]["d_model"] == 2048 and d["sparsity"] == 0.75


def test_several_sparsities_one_table_and_one_run_each():
    r = run("-m", "gpt2-small", "-s", "0,0.5,0.75")
    assert r.exit_code == 0, r.output
    # the SPDF table's 2.43, 1.79 and 1.47 exaFLOPs, to four digits
    for text in (
        "1.987 TFLOP",
        "1.465 TFLOP",
        "1.204 TFLOP",
        "0.737x",
        "1.221e+06 sequences",
        "2.426 EFLOP",
        "1.789 EFLOP",
        "1.470 EFLOP",
    ):
        assert text in r.stdout, text
    d = ok_json("-m", "gpt2-small", "-s", "0,0.5,0.75")
    assert [x["sparsity"] for x in d] == [0, 0.5, 0.75]
    assert all(set(x) >= SPEC_KEYS for x in d)


def test_default_sparsities_are_the_papers():
    d = ok_json("-m", "gpt3-xl")
    assert [x["sparsity"] for x in d] == [0, 0.5, 0.75]


def test_stages_report_effective_sparsity():
    args = ("-m", "cerebras-gpt-256m", "--stage", "0.9:0.8333", "--stage", "0:0.1667")
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert "Variable SPDF stages" in r.stdout and "effective 75.0%" in r.stdout
    d = ok_json(*args)
    assert d["effective_sparsity"] == pytest.approx(0.75, abs=1e-4) and len(d["stages"]) == 2


def test_finetuning_end_to_end():
    d = ok_json(
        "-m",
        "gpt3-xl",
        "-s",
        "0.75",
        "--finetune-tokens",
        "64.512M",
        "--finetune-seq-len",
        "512",
        "--tokens",
        "26B",
    )
    assert f"{1 / d['end_to_end_ratio']:.2f}" == "2.48"  # SPDF Table 2, E2E
    assert d["finetune_seq_len"] == 512
    r = run(
        "-m", "gpt3-xl", "-s", "0,0.75", "--finetune-tokens", "64.512M", "--finetune-seq-len", "512"
    )
    assert r.exit_code == 0 and "236.62 EFLOP" in r.stdout and "2.48x" in r.stdout


def test_breakdown_shows_each_term_with_its_formula():
    r = run("-m", "gpt3-xl", "-s", "0.75", "--breakdown")
    assert r.exit_code == 0, r.output
    for text in (
        "24*2*3*2048*2048*(128*16)",
        "24*3*16*2048*2048",
        "2*2048*2048*50257",
        "attn_logits",
        "excluded",
        "3 x forward",
    ):
        assert text in r.stdout, text


def test_overrides_and_embeddings():
    base = ok_json("-m", "gpt2-small", "-s", "0.5")
    d = ok_json(
        "-m",
        "gpt2-small",
        "-s",
        "0.5",
        "--seq-len",
        "1024",
        "--vocab",
        "50304",
        "--embeddings",
        "--tokens",
        "1e9",
    )
    assert (d["seq_len"], d["vocab"], d["tokens"]) == (1024, 50304, 1e9)
    assert d["forward_terms"]["embeddings"] == 2 * 1024 * 50304 * 768
    assert base["forward_terms"]["embeddings"] == 0


def test_config_file(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text(
        "n_layers = 24\nd_model = 2048\nn_heads = 16\nd_ff = 8192\nvocab = 50257\n"
        "seq_len = 2048\nnominal_params = 1.3e9\n"
    )
    d = ok_json("--config", str(p), "-s", "0.75")
    assert d["model"] == "m"
    assert d["total_train_flops"] == pytest.approx(
        ok_json("-m", "gpt3-xl", "-s", "0.75")["total_train_flops"]
    )


def test_list_presets():
    r = run("--list")
    assert r.exit_code == 0 and "cerebras-gpt-13b" in r.stdout and "SwiGLU" in r.stdout
    r = run("--list", "--json")
    assert set(json.loads(r.stdout)) >= {"gpt2-small", "gpt3-xl", "llama-1.3b", "cerebras-gpt-111m"}


# Bad option values and combinations are usage errors: exit 2 (they exited 1 before the CLI
# had one vocabulary); a file that cannot be read is a runtime error: exit 1.
@pytest.mark.parametrize(
    "args,match",
    [
        ((), "exactly one of --model"),
        (("-m", "gpt3-xl", "--config", "x.toml"), "exactly one of"),
        (
            (
                "-m",
                "gpt-9",
            ),
            "'gpt-9' is not one of",
        ),
        (("-m", "gpt3-xl", "-s", "75"), "write 75% as 0.75"),
        (("-m", "gpt3-xl", "-s", "0.5,x"), "not a number"),
        (("-m", "gpt3-xl", "--stage", "0.9:0.5"), "sum to 0.5"),
        (("-m", "gpt3-xl", "--stage", "0.9:1", "-s", "0.5"), "--stage replaces --sparsity"),
        (("-m", "gpt3-xl", "--tokens", "many"), "not a number"),
        (("-m", "gpt3-xl", "--tokens", "0"), "positive"),
        (("-m", "gpt3-xl", "--seq-len", "0"), "greater than or equal to 1"),
        (("-m", "gpt3-xl", "--include", "*wte*"), "only apply with --checkpoint"),
    ],
)
def test_bad_usage_exits_2(args, match):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    assert r.stderr.startswith("error: ") and match in r.stderr.replace("\n", " ")


@pytest.mark.parametrize(
    "args,match",
    [
        (("--config", "/nonexistent/m.toml"), "not found"),
        (("--checkpoint", "/nonexistent/model.safetensors"), "not found"),
    ],
)
def test_bad_input_is_one_clean_error(args, match):
    r = run(*args)
    assert r.exit_code == 1, r.output
    assert r.stdout == ""
    assert r.stderr.startswith("error: ") and match in r.stderr.replace("\n", " ")
