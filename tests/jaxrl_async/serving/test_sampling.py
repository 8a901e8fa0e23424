"""jaxrl_async/serving/sampling.py: vLLM's defaults, and every key either read, harmless, or refused."""

import pytest

from jaxrl_async.engines.base import RequestLimits, SamplingParams
from jaxrl_async.serving.sampling import check_fits, check_known, read_sampling

LIMITS = RequestLimits(context=64, context_key="engine.max_len", samples=4, samples_key="engine.num_slots",
                       vocab_size=300)


def test_vllms_defaults_fill_the_context_sample_at_temperature_one_and_stop_at_the_models_eos():
    got = read_sampling({}, "sampling_params.", prompt_len=10, context=64, stop_token_ids=(257, 260))
    assert got == SamplingParams(max_new_tokens=54, temperature=1.0, stop_token_ids=(257, 260))
    got = read_sampling({"top_k": -1, "stop_token_ids": [7, 257], "max_tokens": 5, "ignore_eos": True}, "",
                        prompt_len=10, context=64, stop_token_ids=(257, 260))
    assert got.top_k == 0 and got.stop_token_ids == (7, 257) and got.max_new_tokens == 5


def test_formatting_keys_and_neutral_values_pass_but_an_active_unsupported_key_is_refused():
    check_known({"skip_special_tokens": False, "logprobs": 1, "repetition_penalty": 1.0, "stop": []}, "sp.")
    with pytest.raises(ValueError, match=r"^sp\.min_p=0\.1: not supported by this server"):
        check_known({"min_p": 0.1}, "sp.")
    with pytest.raises(ValueError, match=r"^sp\.guided_json=\{\}: unknown key"):
        check_known({"guided_json": {}}, "sp.")


@pytest.mark.parametrize(("values", "message"), [
    ({"n": True}, "n=True: must be an int >= 1"),
    ({"top_k": -2}, "top_k=-2: must be an int >= 1, or 0 or -1 (off)"),
    ({"temperature": float("nan")}, "temperature=nan: must be a number >= 0"),
    ({"stop_token_ids": [1, "x"]}, "stop_token_ids=[1, 'x']: must be a list of token ids"),
    ({"ignore_eos": 1}, "ignore_eos=1: must be true or false"),
])
def test_a_bad_value_names_its_key_under_the_prefix(values, message):
    with pytest.raises(ValueError, match="^" + __import__("re").escape("p." + message)):
        read_sampling(values, "p.", prompt_len=1, context=64, stop_token_ids=())


def test_fits_names_max_tokens_and_n_with_the_engine_key_that_limits_them():
    with pytest.raises(ValueError, match=r"^x\.max_tokens=60: .* = 65 exceeds the context engine.max_len=64"):
        check_fits(SamplingParams(max_new_tokens=60), 5, "x.", LIMITS)
    with pytest.raises(ValueError, match=r"^n=5: exceeds engine.num_slots=4"):
        check_fits(SamplingParams(max_new_tokens=1, n=5), 5, "", LIMITS)
    check_fits(SamplingParams(max_new_tokens=59, n=4), 5, "", LIMITS)  # exactly full is fine
