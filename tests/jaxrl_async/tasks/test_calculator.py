"""The calculator task: safe evaluation, tool-call parsing, its replies and score on real message
lists, the held-out split, and whole episodes whose model turns the test writes."""

import asyncio

import pytest

from jaxrl_async.envs.episode import EpisodeResult
from jaxrl_async.envs.task import EnvReply, EpisodeContext
from jaxrl_async.tasks import build_task
from jaxrl_async.tasks.calculator import MAX_DIGITS, MAX_OPERANDS, TOOLS, Call, evaluate, run_python
from jaxrl_async.tokenizer import tiny_tokenizer
from tests.helpers.episodes import ScriptedTurnClient

TOK = tiny_tokenizer()
CALC, PYTHON = TOOLS["calc"], TOOLS["python"]
IM_END = TOK.token_to_id("<|im_end|>")


@pytest.mark.parametrize("expression, value", [
    ("123*456", 56088), (" 12 * 34 ", 408), ("2+3*4", 14), ("2*3+4*5", 26), ("10-2*3", 4), ("2-3-4", -5),
    ("-5*3", -15), ("12 - -3", 15), ("7x8", 56), ("7 × 8", 56), ("42", 42), ("0*99", 0),
])
def test_evaluate_follows_the_usual_precedence(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, reason", [
    ("", "empty"), ("  ", "empty"), ("1+", "expected a number at the end"), ("*3", "expected a number"),
    ("1/2", "only whole numbers"), ("(1+2)*3", "expected a number"), ("2**8", "expected a number"),
    ("1.5*2", "only whole numbers"), ("__import__('os')", "expected a number"), ("1 2", "only whole numbers"),
    ("9" * (MAX_DIGITS + 1), f"more than {MAX_DIGITS} digits"), ("*".join(["2"] * (MAX_OPERANDS + 1)), "more than"),
])
def test_evaluate_refuses_anything_but_whole_numbers_and_plus_minus_times(expression, reason):
    with pytest.raises(ValueError, match=reason):
        evaluate(expression)


def test_calls_are_read_in_order_and_an_unclosed_one_is_malformed():
    calls = CALC.calls("First <calc>12*3</calc>, then <calc>1/0</calc> and <calc>4 * 4")
    assert [c.output for c in calls] == ["12*3 = 36", None, None]
    assert calls[1].error.startswith("'1/0': unexpected")
    assert calls[2] == Call("4 * 4", error="the call is not closed")
    assert CALC.calls("The answer is 408.") == []
    assert Call("12*34", output="12*34 = 408").reply_line() == "12*34 = 408"


def test_the_final_answer_is_the_last_number_outside_the_tool_calls():
    assert CALC.final_answer("<calc>12*34</calc> so 408, I think") == 408
    assert CALC.final_answer("It is 408 <calc>12*34</calc>") == 408  # never the call's own numbers
    assert CALC.final_answer("<calc>56088</calc>") is None
    assert CALC.final_answer("It is 408 <calc>12*34") == 408  # an unclosed call's text is a call too
    assert PYTHON.final_answer("So 408.\n```python\nprint(12*34)\n```") == 408


@pytest.mark.parametrize("code, output", [
    ("print(12*34)", "408"), ("result = 230 * 868\nprint(result)", "199640"), ("12*34", "408"),
    ("a = 3\nb = a * 4 - 2\nb", "10"), ("print(1 + 2)\nprint(-3)", "3\n-3"), ("x = 1", "(no output)"),
    ("\n    print(2 * 3)\n", "6"), ("print(2, 3)", "2 3"),
])
def test_a_python_block_runs_by_walking_its_syntax_tree(code, output):
    assert run_python(code) == output


@pytest.mark.parametrize("code, reason", [
    ("import os", "only assignments"), ("print(__import__('os').getcwd())", "is not whole numbers"),
    ("print(math.pow(12, 34))", "is not whole numbers"), ("print(12 / 34)", "is not whole numbers"),
    ("2 ** 100", "is not whole numbers"), ("print(y)", "is not whole numbers"), ("print(1.5)", "is not whole numbers"),
    ("print(True)", "is not whole numbers"), ("for i in range(3): print(i)", "only assignments"),
    ("print(12*", "syntax error"), ("9" * (MAX_DIGITS + 1), "more than"),
    ("x = 999999999999\nx = x*x*x*x*x*x*x*x*x", "too large"), ("1+" * 600 + "1", "more than 1000 characters"),
])
def test_a_python_block_refuses_anything_but_whole_number_arithmetic(code, reason):
    with pytest.raises(ValueError, match=reason):
        run_python(code)


def test_an_error_line_quotes_at_most_a_few_dozen_characters_of_the_code():
    with pytest.raises(ValueError, match=r"^'import os, sys, json, math, random, time\.\.\.': only assignments"):
        run_python("import os, sys, json, math, random, time, subprocess, shutil")


def test_python_blocks_are_calls_with_or_without_the_language_tag():
    text = "Let me compute.\n```python\nprint(12*34)\n```\nand\n```\n2+2\n```\n```py\nimport os\n```"
    assert [c.reply_line() for c in PYTHON.calls(text)] == [
        "408", "4", "error: 'import os': only assignments, print(...) and expressions are allowed"]
    assert PYTHON.calls("```python\nprint(1)")[0].error == "the call is not closed"


def test_every_pair_is_in_exactly_one_split_and_the_entry_names_it():
    task = build_task({"name": "calculator", "num_prompts": 50, "num_test_prompts": 10})
    train, test = task.split_examples("train"), task.split_examples("test")
    assert len(train) == 40 and len(test) == 10
    assert not {e.prompt_id for e in train} & {e.prompt_id for e in test}
    for e in train + test:
        a, b = e.meta["a"], e.meta["b"]
        assert 100 <= a <= 999 and 100 <= b <= 999 and e.answer == e.meta["product"] == a * b
        assert e.content == PYTHON.prompt.format(a=a, b=b)  # the default tool's prompt
    assert {e.meta["split"] for e in test} == {"test"}
    again = build_task({"name": "calculator", "num_prompts": 50, "num_test_prompts": 10})
    assert again.split_examples("test") == test  # data_seed fixes the draw
    two = build_task({"name": "calculator", "a_digits": 3, "b_digits": 2, "num_prompts": 20, "num_test_prompts": 1})
    assert all(10 <= e.meta["b"] <= 99 for e in two.examples())


def conversation(*turns: str) -> list[dict]:
    """A user question, then the turns alternating assistant / tool reply (role user)."""
    roles = ["assistant", "user"]
    return [{"role": "user", "content": "What is 123 * 456?"}] + [
        {"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


def test_step_answers_a_call_with_its_result_and_ends_on_a_turn_without_one():
    task = build_task({"name": "calculator", "tool": "calc"})
    assert task.step(56088, conversation("<calc>123*456</calc>")) == EnvReply(
        [{"role": "user", "content": "123*456 = 56088"}])
    both = task.step(56088, conversation("<calc>123*456</calc> <calc>2+</calc>"))
    assert both.messages[0]["content"] == "123*456 = 56088\nerror: '2+': expected a number at the end"
    assert not both.done  # a malformed call is the model's mistake: the episode goes on
    assert task.step(56088, conversation("The answer is 56088.")) == EnvReply([], done=True)
    assert build_task({"name": "calculator", "tool": "calc", "tool_role": "tool"}).step(
        1, conversation("<calc>1</calc>")).messages[0]["role"] == "tool"


def test_score_counts_the_calls_and_rewards_the_final_number_only():
    task = build_task({"name": "calculator", "tool": "calc"})
    good = task.score_episode(56088, conversation("<calc>123*456</calc>", "123*456 = 56088", "It is 56088."))
    assert (good.reward, good.terms, good.extracted_answer) == (
        1.0, {"correct": 1.0, "tool_calls": 1.0, "tool_errors": 0.0}, "56088")
    wrong = task.score_episode(56088, conversation("<calc>123*45</calc><calc>x</calc>", "...", "It is 5535."))
    assert (wrong.reward, wrong.terms) == (0.0, {"correct": 0.0, "tool_calls": 2.0, "tool_errors": 1.0})
    guessed = task.score_episode(56088, conversation("56088"))
    assert guessed.reward == 1.0 and guessed.terms["tool_calls"] == 0.0  # right without the tool still counts
    silent = task.score_episode(56088, conversation("I do not know"))
    assert (silent.reward, silent.extracted_answer) == (0.0, None)


def play(task, example, texts, stop=IM_END):
    """One episode of `example` with the model turns `texts`: (client, result)."""
    prompt = task.encoder(TOK, TOK.chat_template)(example)
    client = ScriptedTurnClient(TOK, texts, stop)
    result = asyncio.run(task.run_episode(prompt, client, EpisodeContext(TOK, (IM_END,))))
    return prompt, client, result


def test_a_tool_using_episode_scores_one_and_its_tokens_are_the_turns_and_the_tool_reply():
    task = build_task({"name": "calculator", "tool": "calc", "num_prompts": 10, "num_test_prompts": 2})
    example = task.examples()[0]
    a, b = example.meta["a"], example.meta["b"]
    prompt, client, result = play(task, example, [f"<calc>{a}*{b}</calc>", f"The answer is {a * b}."])
    assert isinstance(result, EpisodeResult) and result.reward == 1.0
    assert result.terms == {"correct": 1.0, "tool_calls": 1.0, "tool_errors": 0.0}
    tool = {"role": "user", "content": f"{a}*{b} = {a * b}"}
    assert result.messages == [{"role": "user", "content": example.content},
                               {"role": "assistant", "content": f"<calc>{a}*{b}</calc>"}, tool,
                               {"role": "assistant", "content": f"The answer is {a * b}."}]
    # Token-in, token-out: the prompt, the first turn as sampled, the bridge, the second turn.
    first, second = (t.token_ids for t in client.turns)
    (bridge,) = client.env_tokens
    assert client.token_ids == prompt.prompt_ids + first + bridge + second
    assert client.loss_mask == [0] * len(prompt.prompt_ids) + [1] * len(first) + [0] * len(bridge) + [1] * len(second)
    # The bridge is the template's tool message: what the turn's stop token leaves of its end of turn.
    assert TOK.decode(bridge, skip_special_tokens=False) == (
        f"\n<|im_start|>user\n{a}*{b} = {a * b}<|im_end|>\n<|im_start|>assistant\n")
    rendered = TOK.apply_chat_template(result.messages, add_generation_prompt=False)
    assert TOK.decode(client.token_ids, skip_special_tokens=False) == rendered.removesuffix("\n")


def test_a_python_episode_that_prints_the_product_and_answers_it_scores_one():
    task = build_task({"name": "calculator", "num_prompts": 10, "num_test_prompts": 2})
    example = task.examples()[0]
    a, b = example.meta["a"], example.meta["b"]
    prompt, client, result = play(task, example, [f"Let me compute.\n```python\nprint({a} * {b})\n```",
                                                  f"So {a} * {b} = {a * b}."])
    assert result.reward == 1.0 and result.terms == {"correct": 1.0, "tool_calls": 1.0, "tool_errors": 0.0}
    assert TOK.decode(client.env_tokens[0], skip_special_tokens=False) == (
        f"\n<|im_start|>user\n{a * b}<|im_end|>\n<|im_start|>assistant\n")
    _, _, again = play(task, example, [f"```python\nprint(math.prod([{a}, {b}]))\n```", "I cannot tell."])
    assert again.reward == 0.0 and again.terms == {"correct": 0.0, "tool_calls": 1.0, "tool_errors": 1.0}
    assert again.messages[2]["content"].startswith("error: 'math.prod(")


def test_a_wrong_episode_scores_zero_and_a_malformed_call_gets_an_error_back():
    task = build_task({"name": "calculator", "tool": "calc", "num_prompts": 10, "num_test_prompts": 2})
    example = task.examples()[0]
    a, b = example.meta["a"], example.meta["b"]
    _, _, result = play(task, example, [f"<calc>{a}/{b}</calc>", f"<calc>{a}+{b}</calc>", f"It is {a + b}."])
    assert result.reward == 0.0
    assert result.terms == {"correct": 0.0, "tool_calls": 2.0, "tool_errors": 1.0}
    assert result.messages[2]["content"].startswith(f"error: '{a}/{b}': unexpected '/")
    assert result.messages[4]["content"] == f"{a}+{b} = {a + b}"


def test_the_episode_ends_after_max_turns_even_while_the_model_calls_the_tool():
    task = build_task({"name": "calculator", "tool": "calc", "max_turns": 2, "num_prompts": 10, "num_test_prompts": 2})
    example = task.examples()[0]
    a, b = example.meta["a"], example.meta["b"]
    _, client, result = play(task, example, [f"<calc>{a}*{b}</calc>", f"<calc>{a}*{b}</calc>", "unused"])
    assert len(client.turns) == 2 and len(client.env_tokens) == 1
    assert result.reward == 0.0 and result.terms["tool_calls"] == 2.0  # the call is not the answer


def test_a_turn_cut_at_the_length_limit_gets_the_whole_end_of_turn_in_its_bridge():
    task = build_task({"name": "calculator", "tool": "calc", "num_prompts": 10, "num_test_prompts": 2})
    example = task.examples()[0]
    a, b = example.meta["a"], example.meta["b"]
    _, client, result = play(task, example, [f"<calc>{a}*{b}</calc>", f"{a * b}"], stop=None)
    assert TOK.decode(client.env_tokens[0], skip_special_tokens=False).startswith("<|im_end|>\n<|im_start|>user\n")
    assert result.reward == 1.0


@pytest.mark.parametrize("values, field", [
    ({"a_digits": 0}, "task.a_digits"), ({"b_digits": 7}, "task.b_digits"),
    ({"a_digits": 1, "b_digits": 1, "num_prompts": 82}, "task.num_prompts"),
    ({"num_prompts": 10, "num_test_prompts": 10}, "task.num_test_prompts"),
    ({"tool_role": ""}, "task.tool_role"), ({"max_turns": 0}, "task.max_turns"),
    ({"prompt": "What is {a} squared?"}, "task.prompt"), ({"prompt": "{a} * {b} = {c}"}, "task.prompt"),
    ({"prompt": "{a} * {b} {"}, "task.prompt"), ({"tool": "shell"}, "task.tool"),
])
def test_bad_settings_name_the_key(values, field):
    with pytest.raises(ValueError, match=field):
        build_task({"name": "calculator", **values})


def test_no_held_out_pairs_is_a_clear_error_for_split_test():
    with pytest.raises(ValueError, match="task.num_test_prompts=0"):
        build_task({"name": "calculator", "num_prompts": 10, "num_test_prompts": 0}).split_examples("test")
