"""Figures in prose, quoted from a GPU's baselines or the service's (lab/baselines/cli.py render).

A measured figure in the README or the docs is written as a quote of the entry it comes from, and
`render` writes its text from the baselines file, so prose cannot drift from the data:

    <!-- q finegrained/deepseek-v3/gate_up/T=4096 vs:torch_grouped_mm/best -->1.47x<!-- /q -->

HTML comments do not show in rendered Markdown; only the text between them does. The opening comment is
`q ENTRY FIELD [SPEC] [bare]`:

- ENTRY: an entry's name, or several names and fnmatch patterns joined by `|`
  (`finegrained/*/gate_up/T=16|finegrained/*/down/T=16`); a quote of more than one entry gives the
  range of its values, "648-755 TF/s". A name may start with its file's key (`nvidia_h200:bench_gemm/...`,
  `service_loopback:serve_load/...`); without one, the quote reads the only GPU's baselines file there is.
- FIELD: QUANTITY or QUANTITY:ARGUMENT, where a SUBJECT is `moetune` (the entry's own measurement, the
  default), `best` (the fastest of moetune's configs timed for the entry: its median and its peers
  moetune_tuned and moetune_alternative, as the tables' "best" columns), `rival` (the faster peer, as
  the tables' ratios take it: the fastest of torch_grouped_mm, tokamax_mosaic, mgpu_best, tokamax), or
  any peer's name:

      ms[:SUBJECT]          the subject's median time in ms (us[:SUBJECT] in us, s[:SUBJECT] in s)
      vs:A[/B]              time(A) / time(B), B moetune by default: above 1, B is faster ("1.57x");
                            of a rate, rate(B) / rate(A)
      tfs[:SUBJECT]         TF/s: the entry's FLOPs (params flops, gemm_flops or 2*m*k*n) over the time
      roof[:SUBJECT]        the HBM roofline's share: bounds.hbm_roofline over the time ("72%"), or for a
                            model's decode, its tokens/s over bounds.hbm_roofline_tokens_per_s
      tokps[:SUBJECT]       tokens/s: params tokens over the time
      rate[:SUBJECT]        the median of an entry measured as a rate, in its unit (trials/min)
      param:KEY[.KEY]       a number in the entry's params (rel_err, stages_ms.route, read_GBps, ...)
      bound:KEY             a number in the entry's bounds (hbm_roofline_tokens_per_s, ...)

  Of an entry of the service's load (service.py), these instead:

      p50[:ROUTE], p99[:ROUTE], max[:ROUTE]
                            latency in ms; ROUTE: that route within a mixed run (its by_target)
      rps                   requests/s
      errors                how many requests failed
      goal:p99              the route's p99 goal in ms
      over:p99              p99 minus its goal in ms ("+3.2 ms"; negative: met with that to spare)
      warmup                seconds until every client had its untimed first answers (first draws)

- SPEC: a Python format spec for the number (`.2f`, `,.0f`, `.1%`, `.1e`); each quantity has a default.
- `bare`: the number without its unit (a list of figures that names the unit once, after the last).

`render --check` fails on a quote whose text differs from what the baselines give; a quote of an entry,
peer, parameter or field that does not exist is an error naming it and the page.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable

QUOTE = re.compile(r"<!-- q ([^\s<>]+) ([^\s<>]+)((?: [^\s<>]+)*) -->(.*?)<!-- /q -->")
BEST_PEERS = ("moetune_tuned", "moetune_alternative")
# The peers the tables call "the faster peer": the fastest other grouped GEMM timed beside moetune.
RIVALS = ("torch_grouped_mm", "tokamax_mosaic", "mgpu_best", "tokamax")
# quantity -> (default spec, unit appended to the number)
QUANTITIES = {
    "ms": (".3f", " ms"),
    "us": (".1f", " us"),
    "s": (".2f", " s"),
    "vs": (".2f", "x"),
    "tfs": (".0f", " TF/s"),
    "roof": (".0%", ""),
    "tokps": (",.1f", " tokens/s"),
    "rate": (".1f", ""),
    "param": ("g", ""),
    "bound": ("g", ""),
    "p50": (".1f", " ms"),
    "p99": (".1f", " ms"),
    "max": (".1f", " ms"),
    "rps": (",.0f", " requests/s"),
    "errors": ("d", ""),
    "goal": (".0f", " ms"),
    "over": ("+.1f", " ms"),
    "warmup": (".1f", " s"),
}
# The quantities of the service's load entries (service.py); the others are a GPU entry's.
LOAD = ("p50", "p99", "max", "rps", "errors", "goal", "over", "warmup")


class QuoteError(ValueError):
    """A quote that names something the baselines do not hold, or is not written as a quote."""


def _seconds(entry: dict, subject: str) -> float:
    """The subject's median of `entry`, in seconds."""
    scale = {"ms": 1e-3, "s": 1.0}.get(entry["unit"])
    if scale is None:
        raise QuoteError(f"{entry['name']}: unit {entry['unit']!r} is a rate, not a time")
    peers = {name: peer["median"] for name, peer in entry.get("peers", {}).items()}
    if subject == "moetune":
        return entry["median"] * scale
    if subject == "best":
        return min([entry["median"]] + [peers[n] for n in BEST_PEERS if n in peers]) * scale
    if subject == "rival" and any(n in peers for n in RIVALS):
        return min(peers[n] for n in RIVALS if n in peers) * scale
    if subject in entry.get("failed_peers", {}):
        raise QuoteError(f"{entry['name']}: peer {subject!r} did not run: {entry['failed_peers'][subject]}")
    if subject not in peers:
        raise QuoteError(f"{entry['name']}: no peer {subject!r} (peers: {', '.join(peers) or 'none'})")
    return peers[subject] * scale


def _flops(entry: dict) -> float:
    p = entry["params"]
    if "flops" in p or "gemm_flops" in p:
        return p.get("flops", p.get("gemm_flops"))
    if {"m", "k", "n"} <= set(p):
        return 2 * p["m"] * p["k"] * p["n"]
    raise QuoteError(f"{entry['name']}: params name no FLOPs (flops, gemm_flops or m, k, n)")


def _param(entry: dict, path: str, where: str = "params") -> float:
    value: object = entry.get(where, {})
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise QuoteError(f"{entry['name']}: {where} have no {path!r}")
        value = value[key]
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise QuoteError(f"{entry['name']}: {where} {path!r} is not a number")
    return value


def _roof(entry: dict, subject: str) -> float:
    bounds = entry.get("bounds", {})
    if "hbm_roofline" in bounds:
        return bounds["hbm_roofline"] * 1e-3 / _seconds(entry, subject)
    if "hbm_roofline_tokens_per_s" in bounds:
        return entry["params"]["tokens"] / _seconds(entry, subject) / bounds["hbm_roofline_tokens_per_s"]
    raise QuoteError(f"{entry['name']}: no HBM roofline among its bounds")


def _rate(entry: dict, subject: str) -> float:
    """The subject's median of an entry measured as a rate (trials/min, variants/min)."""
    if entry["unit"] in ("ms", "s"):
        raise QuoteError(f"{entry['name']}: unit {entry['unit']!r} is a time, not a rate")
    peers = {name: peer["median"] for name, peer in entry.get("peers", {}).items()}
    if subject == "moetune":
        return entry["median"]
    if subject in entry.get("failed_peers", {}):
        raise QuoteError(f"{entry['name']}: peer {subject!r} did not run: {entry['failed_peers'][subject]}")
    if subject not in peers:
        raise QuoteError(f"{entry['name']}: no peer {subject!r} (peers: {', '.join(peers) or 'none'})")
    return peers[subject]


def _vs(entry: dict, argument: str) -> float:
    """time(A) / time(B): for an entry measured as a rate, rate(B) / rate(A), the same ratio."""
    a, _, b = argument.partition("/")
    if entry["unit"] not in ("ms", "s"):
        return _rate(entry, b or "moetune") / _rate(entry, a)
    return _seconds(entry, a) / _seconds(entry, b or "moetune")


VALUES: dict[str, Callable[[dict, str], float]] = {
    "ms": lambda e, s: _seconds(e, s or "moetune") * 1e3,
    "us": lambda e, s: _seconds(e, s or "moetune") * 1e6,
    "s": lambda e, s: _seconds(e, s or "moetune"),
    "vs": lambda e, a: _vs(e, a) if a else _missing("vs"),
    "tfs": lambda e, s: _flops(e) / _seconds(e, s or "moetune") / 1e12,
    "roof": lambda e, s: _roof(e, s or "moetune"),
    "tokps": lambda e, s: e["params"]["tokens"] / _seconds(e, s or "moetune"),
    "rate": lambda e, s: _rate(e, s or "moetune"),
    "param": lambda e, k: _param(e, k) if k else _missing("param"),
    "bound": lambda e, k: _param(e, k, "bounds") if k else _missing("bound"),
}


def _latency(entry: dict, which: str, route: str) -> float:
    """p50, p99 or max in ms of a load entry, or of one route within its mix."""
    if not route:
        return entry["figures"][f"{which}_ms"]
    by_target = entry.get("by_target", {})
    if route not in by_target:
        raise QuoteError(f"{entry['name']}: no route {route!r} in its mix ({', '.join(by_target) or 'none'})")
    return by_target[route][f"{which}_ms"]


def _goal(entry: dict, which: str) -> float:
    if which != "p99":
        raise QuoteError(f"goals bound p99 only (goal:p99, over:p99), not {which!r}")
    if "p99_ms" not in entry.get("goal", {}):
        raise QuoteError(f"{entry['name']}: no goal (its route has none, or it is a mix)")
    return entry["goal"]["p99_ms"]


VALUES |= {
    "p50": lambda e, r: _latency(e, "p50", r),
    "p99": lambda e, r: _latency(e, "p99", r),
    "max": lambda e, r: _latency(e, "max", r),
    "rps": lambda e, _: e["figures"]["requests_per_s"],
    "errors": lambda e, _: e["figures"]["errors"],
    "goal": lambda e, w: _goal(e, w),
    "over": lambda e, w: _latency(e, "p99", "") - _goal(e, w),
    "warmup": lambda e, _: _warmup(e),
}


def _warmup(entry: dict) -> float:
    if "warmup_s" not in entry["figures"]:
        raise QuoteError(f"{entry['name']}: its run kept no warmup_s (recorded before it was measured)")
    return entry["figures"]["warmup_s"]


def _missing(quantity: str) -> float:
    raise QuoteError(f"{quantity} needs an argument ({quantity}:...)")


def value(entry: dict, field: str) -> float:
    """The number `field` (QUANTITY[:ARGUMENT]) names in `entry`."""
    quantity, _, argument = field.partition(":")
    if quantity not in VALUES:
        raise QuoteError(f"unknown field {field!r}: one of {', '.join(VALUES)}, as QUANTITY[:ARGUMENT]")
    if ("figures" in entry) != (quantity in LOAD):
        kind = "the service's load" if "figures" in entry else "a GPU's measurement"
        raise QuoteError(
            f"{entry['name']}: {quantity} is not a figure of {kind} (the load's: {', '.join(LOAD)})"
        )
    return VALUES[quantity](entry, argument)


def entries_named(spec: str, baselines: dict[str, dict]) -> list[dict]:
    """The entries an ENTRY names: `|`-joined names or fnmatch patterns, optionally after a GPU key."""
    key, sep, names = spec.partition(":")
    gpus = [data for data in baselines.values() if "gpu" in data]
    if sep and key in baselines:
        data = baselines[key]
    elif len(gpus) == 1:
        data, names = gpus[0], spec
    else:
        raise QuoteError(f"{spec!r}: name the GPU ({', '.join(baselines) or 'no baselines file'}: KEY:NAME)")
    label = data.get("gpu") or f"service's {data.get('setting')}"
    by_name = {e["name"]: e for e in data["entries"]}
    out: list[dict] = []
    for name in names.split("|"):
        if any(c in name for c in "*?["):
            matched = [e for n, e in by_name.items() if fnmatch.fnmatchcase(n, name)]
            if not matched:
                raise QuoteError(f"no entry matches {name!r} in the {label} baselines")
        elif name in by_name:
            matched = [by_name[name]]
        else:
            raise QuoteError(f"no entry named {name!r} in the {label} baselines")
        out += [e for e in matched if e not in out]
    return out


def text(spec: str, field: str, options: list[str], baselines: dict[str, dict]) -> str:
    """What a quote reads: one value, or the range of its entries' values ('648-755 TF/s')."""
    quantity = field.partition(":")[0]
    default, unit = QUANTITIES.get(quantity, ("g", ""))
    formats = [o for o in options if o != "bare"]
    if len(formats) > 1 or any(o.startswith("bare") and o != "bare" for o in options):
        raise QuoteError(f"options {' '.join(options)!r}: at most one format spec, and `bare`")
    fmt = formats[0] if formats else default
    values = sorted(value(e, field) for e in entries_named(spec, baselines))
    try:
        low, high = (format(v, fmt) for v in (values[0], values[-1]))
    except ValueError as e:
        raise QuoteError(f"format spec {fmt!r}: {e}") from None
    if "bare" in options or fmt.endswith("%"):  # a share is its own unit
        unit = ""
    if low == high:
        return low + unit
    return f"{low.rstrip('%')}-{high}{unit}"


def render_quotes(page: str, baselines: dict[str, dict], where: str = "the page") -> str:
    """`page` with every quote's text written again from `baselines` (GPU key -> baselines data)."""

    def quote(match: re.Match) -> str:
        spec, field, options, _ = match.groups()
        try:
            new = text(spec, field, options.split(), baselines)
        except QuoteError as e:
            line = page.count("\n", 0, match.start()) + 1
            raise QuoteError(f"{where}:{line}: quote `{spec} {field}`: {e}") from None
        return f"<!-- q {spec} {field}{options} -->{new}<!-- /q -->"

    rendered = QUOTE.sub(quote, page)
    for line_number, line in enumerate(page.splitlines(), 1):
        line = re.sub(r"`[^`]*`", "", line)  # the syntax written out in a code span is not a quote
        if line.count("<!-- q ") != len(QUOTE.findall(line)):
            raise QuoteError(
                f"{where}:{line_number}: a quote not written as <!-- q ENTRY FIELD -->TEXT<!-- /q -->"
            )
    return rendered
