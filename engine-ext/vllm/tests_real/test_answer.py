"""How answers are compared (``fleet.Answer``): bit-exact for a restore against a hit,
within float error for a cold prefill — and a different token is never "close"."""

from fleet import LOGPROB_TOL, Answer


TWO = (("a", -1.0, [("a", -1.0), ("b", -2.0)]), ("b", -0.5, [("b", -0.5)]))


def answer(text="ab", lps=TWO):
    return Answer(text, list(lps) if lps is not None else None, 0, 4, "")


def test_an_identical_answer_is_the_same_and_agrees():
    assert answer().same_as(answer()) and answer().agrees_with(answer())


def test_a_last_bit_difference_agrees_but_is_not_the_same():
    near = answer(lps=(("a", -1.0 + LOGPROB_TOL / 10, [("a", -1.0 + LOGPROB_TOL / 10), ("b", -2.0)]),
                       ("b", -0.5, [("b", -0.5)])))
    assert near.agrees_with(answer()) and not near.same_as(answer())


def test_another_token_text_or_a_far_logprob_disagrees():
    other_token = answer(lps=(("c", -1.0, [("c", -1.0)]), ("b", -0.5, [("b", -0.5)])))
    far = answer(lps=(("a", -1.1, [("a", -1.1)]), ("b", -0.5, [("b", -0.5)])))
    far_alt = answer(lps=(("a", -1.0, [("a", -1.0), ("b", -2.5)]), ("b", -0.5, [("b", -0.5)])))
    shorter = answer(lps=(("a", -1.0, [("a", -1.0)]),))
    for bad in (other_token, far, far_alt, shorter, answer(text="ac")):
        assert not bad.agrees_with(answer()), bad


def test_messages_answers_without_logprobs_agree_on_text():
    assert answer(lps=None).agrees_with(answer(lps=None))
    assert not answer(lps=None).agrees_with(answer())
