from moetune.tuner.durations import ms


def test_ms_prints_four_significant_digits_and_a_dash_for_nothing():
    assert ms(0.00123) == "1.23" and ms(2.718281) == "2718" and ms(None) == "-"
