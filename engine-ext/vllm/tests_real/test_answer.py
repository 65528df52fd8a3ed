"""How answers are compared (``fleet.Answer``): bit-exact for a restore against a hit,
within float error for a cold prefill — a different token is never "close" unless the
reference had a near tie there, and then nothing after it is compared."""

from fleet import LOGPROB_TOL, Answer

# Position 0 sure of "a" (margin 1.0 > 2 × tol), position 1 a near tie of "b" and "c".
TWO = (("a", -1.0, [("a", -1.0), ("b", -2.0)]), ("b", -0.70, [("b", -0.70), ("c", -0.72)]))


def answer(text="ab", lps=TWO):
    return Answer(text, list(lps) if lps is not None else None, 0, 4, "")


def test_an_identical_answer_is_the_same_and_agrees():
    assert answer().same_as(answer()) and answer().agrees_with(answer())


def test_a_last_bit_difference_agrees_but_is_not_the_same():
    d = LOGPROB_TOL / 10
    near = answer(lps=(("a", -1.0 + d, [("a", -1.0 + d), ("b", -2.0)]), TWO[1]))
    assert near.agrees_with(answer()) and not near.same_as(answer())


def test_another_token_where_the_reference_was_sure_or_a_far_logprob_disagrees():
    other_token = answer(lps=(("c", -1.0, [("c", -1.0)]), TWO[1]))
    far = answer(lps=(("a", -2.0, [("a", -2.0)]), TWO[1]))
    far_alt = answer(lps=(("a", -1.0, [("a", -1.0), ("b", -2.0 - 2 * LOGPROB_TOL)]), TWO[1]))
    shorter = answer(lps=(TWO[0],))
    for bad in (other_token, far, far_alt, shorter):
        assert not bad.agrees_with(answer()), bad


def test_a_near_tie_may_go_the_other_way_and_ends_the_comparison():
    flipped = answer(text="ac", lps=(TWO[0], ("c", -0.69, [("c", -0.69), ("b", -0.71)])))
    assert flipped.agrees_with(answer()) and not flipped.same_as(answer())


def test_messages_answers_without_logprobs_agree_on_text():
    assert answer(lps=None).agrees_with(answer(lps=None))
    assert not answer(text="ac", lps=None).agrees_with(answer(lps=None))
    assert not answer(lps=None).agrees_with(answer())
