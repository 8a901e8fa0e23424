"""The arithmetic task: disjoint train / held-out pairs, the last number of the answer scored."""

import pytest

from jaxrl_async.tasks import build_task
from jaxrl_async.tasks.arithmetic import last_number
from tests.helpers.tasks import score


def test_every_pair_is_in_exactly_one_split():
    task = build_task({"name": "arithmetic", "min_operand": 1, "max_operand": 9, "num_test_prompts": 20})
    train, test = task.split_examples("train"), task.split_examples("test")
    assert len(test) == 20 and len(train) == 81 - 20
    assert not {e.prompt_id for e in train} & {e.prompt_id for e in test}
    assert all(e.answer == eval(e.content.split("What is ")[1].split("?")[0]) for e in train + test)  # noqa: S307


def test_the_reward_reads_the_last_number_only():
    task = build_task({"name": "arithmetic", "operation": "+"})
    answer = task.examples()[0].answer
    assert score(task, answer, f"Let me think: 3 + 4 = 7, so the answer is {answer}.") == 1.0
    assert score(task, answer, f"{answer}, or maybe {answer + 1}") == 0.0
    assert score(task, answer, "no idea") == 0.0
    assert last_number("it is 1,234") == 1234 and last_number("-12") == -12


@pytest.mark.parametrize("values, field", [
    ({"operation": "/"}, "task.operation"),
    ({"min_operand": 5, "max_operand": 4}, "task.max_operand"),
    ({"max_operand": 2, "num_test_prompts": 4}, "task.num_test_prompts"),
])
def test_bad_settings_name_the_key(values, field):
    with pytest.raises(ValueError, match=field):
        build_task({"name": "arithmetic", **values})
