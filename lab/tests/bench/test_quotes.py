"""lab/baselines/quotes.py: figures in prose quoted from the baselines, on small synthetic baselines."""

from __future__ import annotations

import pytest
from tests.bench.test_baselines import data, entry

from moetune_lab.baselines import cli as baselines
from moetune_lab.baselines import quotes


def finegrained(tokens=4, ms=0.2, tuned=0.25, alternative=0.18, torch=0.3) -> dict:
    """A development-shape entry: 2 * 8 * 64 * 128 FLOPs; moetune 0.2 ms, its best 0.18 ms."""
    made = entry(
        name=f"finegrained/tiny/gate_up/T={tokens}",
        suite="finegrained",
        samples=(ms,),
        params={"model": "tiny", "gemm": "gate_up", "tokens": tokens, "m": 8, "k": 64, "n": 128, "g": 4},
        peers={
            "moetune_tuned": {"samples": [tuned], "median": tuned},
            "moetune_alternative": {"samples": [alternative], "median": alternative},
            "torch_grouped_mm": {"samples": [torch], "median": torch},
        },
        failed_peers={"xla_ragged_dot": "skipped: too large"},
        bounds={"hbm_roofline": 0.16},
    )
    del made["from_pack"]
    return made


def decode(tokens_per_s_bound=400.0) -> dict:
    made = entry(
        name="bench_model/tiny/decode",
        suite="bench_model",
        unit="s",
        samples=(0.04,),
        params={"model": "tiny", "layers": 2, "batch": 1, "prompt": 64, "gen": 8, "phase": "decode"}
        | {"tokens": 8, "stages_ms": {"route": 0.0123}},
        peers={"ragged": {"samples": [0.16], "median": 0.16}},
        bounds={"hbm_roofline_tokens_per_s": tokens_per_s_bound},
    )
    for gemm_only in ("config", "from_pack"):
        del made[gemm_only]
    return made


def tuner() -> dict:
    made = entry(
        name="tuner/two_gpus_vs_one",
        suite="tuner",
        unit="trials/min",
        samples=(400.0,),
        params={},
        peers={"one_gpu": {"samples": [200.0], "median": 200.0}},
    )
    for gemm_only in ("bounds", "config", "from_pack"):
        del made[gemm_only]
    return made


BASELINES = {
    "test_gpu": data(finegrained(), finegrained(16, ms=0.4, tuned=0.4, alternative=0.5), decode(), tuner())
}


def quoted(name: str, field: str, *options: str, baselines: dict | None = None) -> str:
    """What a quote of `name` `field` reads, rendered from `baselines` (default: BASELINES)."""
    page = f"<!-- q {name} {field}{''.join(' ' + o for o in options)} -->stale<!-- /q -->"
    rendered = quotes.render_quotes(page, BASELINES if baselines is None else baselines)
    return rendered.split("-->", 1)[1].removesuffix("<!-- /q -->")


@pytest.mark.parametrize(
    ("name", "field", "options", "text"),
    [
        ("finegrained/tiny/gate_up/T=4", "ms", (), "0.200 ms"),
        ("finegrained/tiny/gate_up/T=4", "ms:best", (), "0.180 ms"),  # moetune_alternative's
        ("finegrained/tiny/gate_up/T=4", "ms:torch_grouped_mm", (".2f",), "0.30 ms"),
        ("finegrained/tiny/gate_up/T=4", "us", (), "200.0 us"),
        ("finegrained/tiny/gate_up/T=4", "vs:torch_grouped_mm", (), "1.50x"),  # 0.3 / 0.2
        ("finegrained/tiny/gate_up/T=4", "vs:torch_grouped_mm/best", (".1f",), "1.7x"),  # 0.3 / 0.18
        ("finegrained/tiny/gate_up/T=4", "vs:moetune/moetune_tuned", (), "0.80x"),  # heuristic / tuned
        ("finegrained/tiny/gate_up/T=4", "vs:rival/best", (), "1.67x"),  # the faster peer, torch's 0.3
        ("finegrained/tiny/gate_up/T=4", "vs:best/torch_grouped_mm", (".0%",), "60%"),  # a share: no "x"
        ("finegrained/tiny/gate_up/T=4", "tfs", (".4f",), "0.0007 TF/s"),  # 131072 FLOPs in 0.2 ms
        ("finegrained/tiny/gate_up/T=4", "roof", (), "80%"),  # 0.16 / 0.2
        ("finegrained/tiny/gate_up/T=4", "roof:best", (".1%",), "88.9%"),
        ("finegrained/tiny/gate_up/T=4", "param:m", (), "8"),
        ("finegrained/tiny/gate_up/T=4", "vs:torch_grouped_mm", ("bare",), "1.50"),
        ("bench_model/tiny/decode", "tokps", (), "200.0 tokens/s"),  # 8 tokens in 0.04 s
        ("bench_model/tiny/decode", "tokps:ragged", (",.0f",), "50 tokens/s"),
        ("bench_model/tiny/decode", "roof", (), "50%"),  # 200 of the 400 tokens/s bound
        ("bench_model/tiny/decode", "s", (".3f",), "0.040 s"),
        ("bench_model/tiny/decode", "param:stages_ms.route", (".3f",), "0.012"),
        ("bench_model/tiny/decode", "bound:hbm_roofline_tokens_per_s", (".0f",), "400"),
        ("tuner/two_gpus_vs_one", "vs:one_gpu", (), "2.00x"),  # 400 trials/min against 200
        ("tuner/two_gpus_vs_one", "rate:one_gpu", (".0f",), "200"),
    ],
)
def test_each_field_is_derived_from_the_entry(name, field, options, text):
    assert quoted(name, field, *options) == text


def test_a_quote_of_several_entries_gives_the_range_of_their_values():
    # T=4: 0.2 ms, 0.80x the tuned; T=16: 0.4 ms, 1.00x.
    assert quoted("finegrained/tiny/gate_up/T=*", "ms") == "0.200-0.400 ms"
    assert quoted("finegrained/tiny/gate_up/T=16|finegrained/tiny/gate_up/T=4", "roof") == "40-80%"
    assert quoted("finegrained/tiny/gate_up/T=4|bench_model/tiny/decode", "roof") == "50-80%"
    assert quoted("finegrained/tiny/gate_up/T=*", "vs:moetune/moetune_tuned", ".1f") == "0.8-1.0x"
    assert quoted("finegrained/tiny/gate_up/T=*", "param:g") == "4"  # equal values: one figure
    assert quoted("test_gpu:finegrained/tiny/gate_up/T=4", "ms") == "0.200 ms"  # the GPU named


def test_render_rewrites_a_stale_quote_leaves_the_rest_and_is_stable(tmp_path):
    page = tmp_path / "page.md"
    quote = "<!-- q finegrained/tiny/gate_up/T=4 vs:torch_grouped_mm -->9.99x<!-- /q -->"
    text = f"Prose 9.9 ms stays.\n\n| a | {quote} |\n"
    page.write_text(text)
    assert baselines.render([page], BASELINES, check=True) == [page]
    assert page.read_text() == text  # --check writes nothing
    assert baselines.render([page], BASELINES, check=False) == [page]
    assert page.read_text() == text.replace("9.99x", "1.50x")
    assert baselines.render([page], BASELINES, check=True) == []


def test_render_check_on_the_command_line_fails_on_a_stale_quote(tmp_path, monkeypatch, capsys):
    page = tmp_path / "page.md"
    page.write_text("<!-- q finegrained/tiny/gate_up/T=4 ms -->0.100 ms<!-- /q -->\n")
    monkeypatch.setattr(baselines, "PAGES", (page,))
    monkeypatch.setattr(baselines, "load_all", lambda: BASELINES)
    assert baselines.main(["render", "--check"]) == 1
    assert "page.md is out of date" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("quote", "error"),
    [
        (
            "finegrained/tiny/gate_up/T=8 ms",
            "page.md:2: quote `finegrained/tiny/gate_up/T=8 ms`: no entry named "
            "'finegrained/tiny/gate_up/T=8' in the Test GPU baselines",
        ),
        ("finegrained/huge/* ms", "no entry matches 'finegrained/huge/*'"),
        ("finegrained/tiny/gate_up/T=4 vs:cublas_torch", "no peer 'cublas_torch' (peers: moetune_tuned, "),
        ("finegrained/tiny/gate_up/T=4 vs:xla_ragged_dot", "peer 'xla_ragged_dot' did not run: skipped: too"),
        ("finegrained/tiny/gate_up/T=4 speed", "unknown field 'speed': one of ms, us, s, vs, tfs, roof,"),
        ("finegrained/tiny/gate_up/T=4 vs", "vs needs an argument"),
        ("finegrained/tiny/gate_up/T=4 param:colour", "params have no 'colour'"),
        ("finegrained/tiny/gate_up/T=4 bound:hbm_ceiling", "bounds have no 'hbm_ceiling'"),
        ("finegrained/tiny/gate_up/T=4 ms .2q", "format spec '.2q'"),
        ("bench_model/tiny/decode roof:ragged .1f .2f", "at most one format spec"),
        ("tuner/two_gpus_vs_one ms", "unit 'trials/min' is a rate, not a time"),
    ],
)
def test_a_quote_of_what_the_baselines_do_not_hold_is_one_clear_error(quote, error, tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Page\nIt took <!-- q {quote} -->1 ms<!-- /q -->.\n")
    with pytest.raises(quotes.QuoteError, match="^page.md:2: ") as raised:
        baselines.render([page], BASELINES, check=True)
    assert error in str(raised.value) and "\n" not in str(raised.value)


def test_a_quote_without_its_closing_comment_is_an_error():
    with pytest.raises(quotes.QuoteError, match="a quote not written as"):
        quotes.render_quotes("<!-- q finegrained/tiny/gate_up/T=4 ms -->0.2 ms\n", BASELINES)


def test_an_unprefixed_name_needs_a_single_baselines_file():
    two = BASELINES | {"other_gpu": data()}
    with pytest.raises(quotes.QuoteError, match="name the GPU"):
        quotes.render_quotes("<!-- q finegrained/tiny/gate_up/T=4 ms -->x<!-- /q -->", two)
