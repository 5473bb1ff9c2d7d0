from moetune.tuner.durations import MS, US, ms, unit_for


def test_ms_prints_four_significant_digits_and_a_dash_for_nothing():
    assert ms(0.00123) == "1.23" and ms(2.718281) == "2718" and ms(None) == "-"


def test_a_table_is_in_microseconds_only_when_every_time_is_tiny():
    assert unit_for([4.9e-5, 3.7e-5, None]) is US and US.format(4.889e-5) == "48.89"
    assert unit_for([4.9e-5, 2.1e-4]) is MS  # one larger time puts the whole table in ms
    assert unit_for([]) is MS and unit_for([None]) is MS
