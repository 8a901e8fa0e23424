"""`python -m jaxrl_async.eval`: a model scored on a task's held-out split."""

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from jaxrl_async.cli.eval import main
from jaxrl_async.runtime.evaluation import summarize
from jaxrl_async.models.loading import load_model
from jaxrl_async.tasks import RewardResult
from jaxrl_async.tasks.synthetic import RepeatLetterConfig, RepeatLetterTask


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def status_and_error(err: str) -> tuple[list[str], str | None]:
    """stderr split into the status lines (`... ...`) and the one `error:` line that may end it."""
    lines = err.splitlines()
    error = lines.pop() if lines and lines[-1].startswith("error: ") else None
    assert all(line.endswith(" ...") for line in lines), err
    return lines, error


def answer_is_greedy_reward(prompt_text: str, completion_text: str, answer) -> float:
    """A user reward that passes exactly the completions this test module precomputed. It runs in
    a reward worker process (tasks/reward_pool.py), so it reads them from EXPECTED_FILE."""
    return float(completion_text == json.loads(EXPECTED_FILE.read_text()).get(prompt_text))


# Named in the environment at import, before any reward worker starts, so that workers inherit it.
EXPECTED_FILE = Path(os.environ.setdefault(
    "JAXRL_ASYNC_TEST_EVAL_EXPECTED", str(Path(tempfile.gettempdir()) / f"jaxrl_async_eval_expected_{os.getpid()}.json")))
EXPECTED: dict[str, str] = {}


def test_json_is_one_object_of_the_held_out_split_scored_by_the_task(capsys):
    code, out, err = run_main(capsys, "task=copy_string", "limit=6", "max_new_tokens=4", "output=json")
    assert code == 0 and out.count("\n") == 1  # stdout: exactly the JSON object
    # stderr says what the silent seconds are spent on; nothing else.
    assert err == "loading model tiny ...\ncompiling and decoding 6 prompts greedily ...\n"
    result = json.loads(out)
    assert {"pass_at_1", "mean_reward", "n", "reward_errors", "samples", "split"} <= set(result)
    assert (result["greedy_pass_at_1"], result["greedy_mean_reward"]) == (result["pass_at_1"], result["mean_reward"])
    assert not {"pass_at_k", "sampled_pass_at_k"} & set(result)  # samples=1: the greedy pass only
    assert result["n"] == 6 and result["split"] == "test" and result["reward_errors"] == 0
    # The random `tiny` model: a byte-level near-uniform guess almost never matches.
    assert 0 <= result["pass_at_1"] <= result["mean_reward"] + 1e-9 and result["mean_reward"] < 0.2


def test_greedy_pass_at_1_counts_the_completions_whose_reward_reaches_the_threshold(capsys):
    """The greedy completions are the model's argmax continuations: a reward that passes exactly
    those (and the expected texts of half the prompts swapped for wrong ones) gives pass@1 = 1/2."""
    loaded = load_model("tiny")
    tok = loaded.tokenizer
    task = RepeatLetterTask(RepeatLetterConfig(alphabet="abcd"))
    encode = task.encoder(tok, loaded.chat_template)
    for i, example in enumerate(task.test_examples()):
        ids = list(encode(example).prompt_ids)
        for _ in range(3):  # greedy by the uncached forward
            logits = loaded.model(np.asarray([ids], np.int32), np.arange(len(ids), dtype=np.int32)[None])
            ids.append(int(np.argmax(logits[0, -1])))
        EXPECTED[example.content] = tok.decode(ids[-3:]) if i % 2 == 0 else "wrong"
    EXPECTED_FILE.write_text(json.dumps(EXPECTED))
    code, out, err = run_main(
        capsys, "task.alphabet=abcd", f"+task.reward_fn={__name__}:answer_is_greedy_reward", "max_new_tokens=3",
        "samples=3", "output=json")
    assert code == 0, err
    result = json.loads(out)
    assert result["n"] == 4 and result["pass_at_1"] == pytest.approx(0.5) and result["mean_reward"] == pytest.approx(0.5)
    assert 0 <= result["mean_at_k"] <= 1 and result["samples"] == 3
    # The old keys are the clear ones under their §8.7 names.
    assert result["sampled_mean_reward"] == result["mean_at_k"] and result["sampled_pass_at_k"] == result["pass_at_k"]
    assert status_and_error(err)[0][-1] == "sampling 3 completions per prompt at temperature=1.0 ..."


def test_summary_of_greedy_and_sampled_rewards():
    ok, half, bad = RewardResult(1.0), RewardResult(0.5), RewardResult(0.0, "reward f raised KeyError: x")
    greedy = [[ok], [half], [bad], [ok]]
    sampled = [[bad, half, ok], [half, half, half], [bad, bad, bad], [ok, ok, ok]]
    r = summarize(greedy, sampled, threshold=1.0)
    assert (r.greedy_pass_at_1, r.greedy_mean_reward, r.n) == (0.5, 0.625, 4)
    assert r.sampled_pass_at_k == 0.5 and r.sampled_mean_reward == pytest.approx(sum([1.5, 1.5, 0, 3]) / 12)
    assert r.sampled_pass_at_1 == pytest.approx(4 / 12)  # 1 + 0 + 0 + 3 passing samples of 12
    assert r.reward_errors == 1 + 4
    assert summarize(greedy, None, threshold=0.5).greedy_pass_at_1 == 0.75  # a dense reward may pass below 1


def test_sampled_pass_at_k_below_greedy_pass_at_1_is_two_decoders_not_a_bug():
    """Greedy passes where the samples at temperature 1 all fail: pass@k counts samples only."""
    ok, bad = RewardResult(1.0), RewardResult(0.0)
    r = summarize([[ok], [ok]], [[bad, bad], [ok, bad]], threshold=1.0)
    assert r.greedy_pass_at_1 == 1.0 and r.sampled_pass_at_k == 0.5 and r.sampled_pass_at_1 == 0.25
    assert r.to_json()["pass_at_1"] == 1.0 and r.to_json()["pass_at_k"] == 0.5


def test_the_table_names_each_figure_by_what_it_measures(capsys):
    code, out, err = run_main(capsys, "limit=2", "max_new_tokens=2", "samples=2")
    assert code == 0 and status_and_error(err)[1] is None
    assert "greedy_pass_at_1" in out and "sampled_pass_at_k" in out and "prompts with >= 1 passing sample" in out
    assert "pass_at_k " not in out.replace("sampled_pass_at_k", "")  # the old names are JSON-only


@pytest.mark.parametrize("args, message", [
    (["task=gsm8k"], "task.test_path=None: split=test needs a held-out GSM8K-format JSONL"),
    (["split=validation"], "split='validation': must be one of ('train', 'test')"),
    (["samples=0"], "samples=0: must be an int >= 1"),
    (["max_len=1"], "max_len=1: must be an int >= 2"),
    (["max_len=20", "max_new_tokens=8"], "max_len=20: must hold the longest prompt + max_new_tokens=8 ="),
    (["temperatur=0.5"], "temperatur"),
    (["model=nope"], "model"),
])
def test_bad_input_is_one_line_and_status_1(capsys, args, message):
    code, out, err = run_main(capsys, *args)
    _, error = status_and_error(err)
    assert code == 1 and out == "" and error is not None and message in error, err


def test_the_training_split_is_available_too(capsys):
    code, out, _ = run_main(capsys, "split=train", "limit=3", "max_new_tokens=2", "output=json")
    assert code == 0 and json.loads(out)["n"] == 3


def test_model_adapter_evaluates_the_base_with_the_adapter_merged(capsys, tmp_path):
    """A LoRA run's hf/ (base + PEFT adapter) scored with model.adapter= equals its merged weights
    scored alone; an adapter of another model is one error line."""
    import jax
    from flax import nnx

    from jaxrl_async.models.config import ModelConfig
    from jaxrl_async.models.hf_weights import save_hf
    from jaxrl_async.models.lora import LoraAdapter, init_adapter, merged_params
    from jaxrl_async.models.peft_adapter import save_peft
    from jaxrl_async.models.transformer import Transformer, layer_shapes

    loaded = load_model("tiny")
    params = init_adapter(layer_shapes(loaded.cfg), 4, ("q_proj", "v_proj", "down_proj"), jax.random.key(1))
    params = jax.tree.map(lambda x: x + 0.2, params)  # a trained adapter moves the model
    adapter = LoraAdapter(params, 2.0)
    save_hf(loaded.model, loaded.cfg, tmp_path / "hf", loaded.tokenizer)
    save_peft(adapter, loaded.cfg, tmp_path / "hf", alpha=8.0, base_model="tiny")
    graphdef, state = nnx.split(loaded.model, nnx.Param)
    merged = nnx.merge(graphdef, merged_params(nnx.to_pure_dict(state), adapter))
    save_hf(merged, loaded.cfg, tmp_path / "merged", loaded.tokenizer)
    common = ("task=repeat_letter", "limit=8", "max_new_tokens=8", "output=json")  # a dense reward
    scored = {}
    for name, args in {"adapter": (f"model.source={tmp_path / 'hf'}", f"model.adapter={tmp_path / 'hf'}"),
                       "merged": (f"model.source={tmp_path / 'merged'}",),
                       "base": (f"model.source={tmp_path / 'hf'}",)}.items():
        code, out, err = run_main(capsys, *args, *common)
        assert code == 0, err
        scored[name] = json.loads(out)["greedy_mean_reward"]
    assert scored["adapter"] == scored["merged"] != scored["base"], scored
    other = ModelConfig.tiny(hidden_size=32)
    save_hf(Transformer(other, rngs=nnx.Rngs(0)), other, tmp_path / "other", loaded.tokenizer)
    code, out, err = run_main(capsys, f"model.source={tmp_path / 'other'}", f"model.adapter={tmp_path / 'hf'}", *common)
    _, error = status_and_error(err)
    assert code == 1 and out == "" and error.startswith(f"error: model.adapter='{tmp_path / 'hf'}': tensor "), err


# ------------------------------------------------------------------ multi-turn tasks: episodes
EPISODES = ("task=guess_number", "task.num_test_prompts=3", "task.max_turns=2", "max_new_tokens=4", "max_len=256",
            "num_slots=4", "output=json")


def figures(out: str) -> dict:
    return {k: v for k, v in json.loads(out).items() if k != "elapsed_s"}


def test_a_multi_turn_task_plays_every_held_out_prompt_as_an_episode_the_same_each_run(capsys):
    code, out, err = run_main(capsys, *EPISODES)
    assert code == 0, err
    assert status_and_error(err)[0] == ["loading model tiny ...", "compiling and playing 3 prompts greedily ..."]
    first = figures(out)
    assert first["n"] == 3 and first["samples"] == 1 and first["reward_errors"] == 0  # every episode ran to its end
    code, out, err = run_main(capsys, *EPISODES)
    assert code == 0 and figures(out) == first  # greedy episodes: the same figures


def test_an_episode_that_outgrows_max_len_is_a_reward_error_of_each_pass_not_a_crash(capsys):
    """The prompt fits max_len (151 tokens of 160) but the environment's first reply does not:
    every episode, greedy and sampled, ends with a `too_long` fault, counted and scored 0."""
    code, out, err = run_main(capsys, *EPISODES, "max_len=160", "samples=2")
    assert code == 0, err
    result = json.loads(out)
    assert result["reward_errors"] == 3 + 3 * 2 and result["mean_reward"] == 0.0 and result["sampled_mean_reward"] == 0.0


def test_an_episode_s_reward_is_its_result_s(capsys, tmp_path):
    """A model whose argmax is always "7777" finds the secret 7777 in its one turn and no other: the
    greedy pass@1 is the share of held-out secrets that are 7777 (the environment's own rule);
    its samples at temperature 100 are near-uniform bytes that find nothing (the passes differ)."""
    from jaxrl_async.models.config import ModelConfig
    from jaxrl_async.models.hf_weights import save_hf
    from jaxrl_async.tasks import build_task
    from tests.helpers.episodes import constant_token_model

    cfg = ModelConfig.tiny()
    save_hf(constant_token_model(cfg, ord("7")), cfg, tmp_path / "sevens", load_model("tiny").tokenizer)
    keys = {"lo": 7770, "hi": 7779, "num_test_prompts": 9, "max_turns": 1}
    secrets = [e.answer for e in build_task({"name": "guess_number", **keys}).test_examples()]
    assert 7777 in secrets  # the data seed's split: the test can tell a found secret from none
    code, out, err = run_main(capsys, f"model.source={tmp_path / 'sevens'}", "task=guess_number", "max_new_tokens=4",
                              "max_len=200", "num_slots=4", "output=json", "samples=2", "temperature=100",
                              *(f"task.{k}={v}" for k, v in keys.items()))
    assert code == 0, err
    result = json.loads(out)
    assert result["n"] == 9 and result["reward_errors"] == 0
    assert result["pass_at_1"] == pytest.approx(1 / 9) and result["mean_reward"] == pytest.approx(1 / 9)
    assert result["sampled_mean_reward"] == 0.0


def test_max_len_that_cannot_hold_a_prompt_is_one_error_line(capsys):
    code, out, err = run_main(capsys, *EPISODES[:-2], "max_len=100")
    _, error = status_and_error(err)
    assert code == 1 and out == "" and error.startswith("error: max_len=100: must hold the longest prompt + 1 ="), err


def test_max_len_of_a_single_turn_task_sizes_the_engine_not_the_figures(capsys):
    args = ("task=copy_string", "limit=4", "max_new_tokens=4", "output=json")
    code, out, err = run_main(capsys, *args)
    code2, out2, err2 = run_main(capsys, *args, "max_len=120")
    assert code == code2 == 0, err + err2
    assert figures(out) == figures(out2)
