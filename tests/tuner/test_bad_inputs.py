"""Every bad input to the command line, in one table: one line on stderr starting with `error:`, the
documented exit code, no traceback, and nothing written.

CASES is the one list. A case is a command line, the files to create before it runs, the database it
meets ("absent": --db names a file that does not exist; "tuned": a database holding the winners of the
shipped pack) and its exit code. Each runs through Typer's CliRunner (or, for a few, the real
interpreter) in a folder of its own, which is also the working directory and the home of the default
database; afterwards every file there, the database included, must be as it was, and no case may have
started Ray. The same list renders
docs/bad-inputs.md, and a test fails when that file differs: regenerate it with

    python -m tests.tuner.test_bad_inputs > docs/bad-inputs.md
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.resources
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

SHIPPED_PACK = importlib.resources.files("moetune.configs") / "tuned" / "nvidia_h200__mosaic_gpu.json"
PROBLEM_ARGS = "k=64,n=64,g=1"  # completes a --problem beside the m under test


class Special(enum.Enum):
    """Files that are not plain bytes."""

    DIRECTORY = "a directory"
    FIFO = "a FIFO"
    HUGE = "a sparse file past the pack size cap"
    SYMLINK = "a symlink to a file beside it"
    DEVICE = "a character device node like /dev/null (made where the test runs as root)"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # after `moetune`; {tmp} is the case's folder, {db} its SQLite URL
    files: Mapping[str, str | bytes | Special] = dataclasses.field(default_factory=dict)
    db: str = "absent"  # or "tuned"
    code: int = 2
    subprocess: bool = False  # run `python -m moetune.cli` instead of CliRunner
    slow: bool = False  # in the slow tier: the refusal comes after tracing a MaxText model (about 10 s)


CATEGORIES: dict[str, list[Case]] = {}


def cases(category: str, *items: Case) -> None:
    CATEGORIES.setdefault(category, []).extend(items)


def c(name: str, *argv: str, **options: Any) -> Case:
    return Case(name, argv, **options)


# --- file contents ---------------------------------------------------------------------------------


def _shipped() -> dict:
    return json.loads(_SHIPPED_TEXT)  # a fresh copy: parsing is many times faster than copy.deepcopy


def pack(mutate: Callable[[dict], Any]) -> str:
    """The shipped pack, changed by `mutate` (which edits the dict in place)."""
    data = _shipped()
    mutate(data)
    return json.dumps(data)


_SHIPPED_TEXT = SHIPPED_PACK.read_text()


def _entry(data: dict) -> dict:
    return data["entries"][0]


def _problem(data: dict) -> dict:
    return _entry(data)["problem"]


def _config(data: dict) -> dict:
    return _entry(data)["config"]


def _device(data: dict) -> dict:
    return data["device"]


def _pack(data: dict) -> dict:
    return data


def change(part: Callable[[dict], dict], **fields: Any) -> Callable[[dict], None]:
    """Set `fields` in one part of the pack: _pack, _device, _entry, _problem or _config."""
    return lambda d: part(d).update(fields)


def drop(part: Callable[[dict], dict], field: str) -> Callable[[dict], None]:
    return lambda d: part(d).pop(field)


# The "billion laughs" document: 385 bytes that safe_load expands to millions of strings.
ALIAS_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)
LONG_PATH = "d/" * 600 + "p.json"  # past the 1024 characters of Sweep.sweep_file
MODEL = "name: m\nexperts: 4\ntop_k: 2\nhidden: 64\nffn: 128\n"


def model(**change: Any) -> str:
    """A valid model file with some fields replaced (None drops a field)."""
    fields = {"name": "m", "experts": 4, "top_k": 2, "hidden": 64, "ffn": 128} | change
    return "".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items() if v is not None)


def sweep(text: str) -> dict[str, str]:
    return {"s.yaml": text}


def tune_sweep(name: str, text: str | bytes | Special, **options: Any) -> Case:
    return c(name, "tune", "--sweep", "{tmp}/s.yaml", "--db", "{db}", files={"s.yaml": text}, **options)


def tune_model(name: str, text: str | bytes | Special, **options: Any) -> Case:
    return c(name, "tune", "--model", "{tmp}/m.yaml", "--db", "{db}", files={"m.yaml": text}, **options)


def tune_problem(name: str, text: str) -> Case:
    return c(name, "tune", "--problem", text, "--db", "{db}")


def tune_flags(name: str, *flags: str) -> Case:
    return c(name, "tune", "--model", "tiny", *flags, "--db", "{db}")


def import_pack(name: str, text: str | bytes | Special, **options: Any) -> Case:
    return c(name, "import", "{tmp}/p.json", "--db", "{db}", files={"p.json": text}, **options)


# --- the cases -------------------------------------------------------------------------------------

cases(
    "command line (usage errors)",
    c("unknown command", "nosuch"),
    c("unknown option", "tune", "--bogus"),
    c("budget not an integer", "tune", "--budget", "x"),
    c("seed not an integer", "tune", "--seed", "1.5"),
    c("minutes not a number", "tune", "--minutes", "soon"),
    c("resume not an integer", "tune", "--resume", "last"),
    c("limit not an integer", "trials", "--limit", "x"),
    c("sweep id not an integer", "trials", "--sweep", "x"),
    c("m not an integer", "best", "--m", "x"),
    c("option without its value", "best", "--gpu"),
    c("misses: unknown option", "misses", "--bogus"),
    c("export without --gpu and --backend", "export"),
    c("export without --backend", "export", "--gpu", "NVIDIA H200"),
    c("import without a file", "import"),
    c("import with two files", "import", "a.json", "b.json"),
    c("rollback without options", "rollback"),
    c("report without a sweep id", "report"),
    c("report: sweep id not an integer", "report", "x"),
    c("db: unknown subcommand", "db", "nosuch"),
    c("db downgrade without a revision", "db", "downgrade"),
    c("db upgrade: unknown option", "db", "upgrade", "--bogus"),
    c("db current: extra argument", "db", "current", "extra"),
    c("doctor: unknown option", "doctor", "--bogus"),
    c("explain without its shape", "explain"),
    c("explain: k not an integer", "explain", "--m", "1", "--k", "x", "--n", "64", "--g", "1"),
    c("bench: unknown subcommand", "bench", "nosuch"),
    c("bench tuner: budget not an integer", "bench", "tuner", "--budget", "x"),
    c("pack-schema: extra argument", "pack-schema", "extra"),
    c("pack-schema: unknown option", "pack-schema", "--bogus"),
    c("usage error from the installed interpreter", "tune", "--bogus", subprocess=True),
)

cases(
    "tune: flags",
    c("nothing to tune", "tune", "--db", "{db}"),
    tune_flags("unknown backend", "--backend", "nosuch"),
    tune_flags("unknown strategy", "--strategy", "nosuch"),
    tune_flags("zero budget", "--budget", "0"),
    tune_flags("budget past 32 bits", "--budget", "99999999999"),
    tune_flags("zero workers", "--workers", "0"),
    tune_flags("a billion workers (more than the CPUs)", "--workers", "1000000000"),
    tune_flags("zero minutes", "--minutes", "0"),
    tune_flags("infinite minutes", "--minutes", "inf"),
    tune_flags("NaN minutes", "--minutes", "nan"),
    tune_flags("zero timeout", "--timeout-s", "0"),
    tune_flags("infinite timeout", "--timeout-s", "inf"),
    tune_flags("too few runs", "--runs", "5"),
    tune_flags("min gain of 150%", "--min-gain", "1.5"),
    tune_flags("negative seed", "--seed", "-1"),
    tune_flags("seed past 32 bits", "--seed", "99999999999"),
    tune_flags("buckets not integers", "--buckets", "x,y"),
    tune_flags("zero bucket", "--buckets", "0"),
    tune_flags("unknown routing", "--routing", "bogus"),
    tune_flags("zipf exponent not a number", "--routing", "zipf:x"),
    tune_flags("negative zipf exponent", "--routing", "zipf:-1"),
    tune_flags("the same routing twice", "--routing", "balanced,balanced"),
    tune_flags("empty routing", "--routing", ","),
    tune_flags("missing routing file", "--routing", "{tmp}/missing.npy"),
    tune_flags("a plan for a backend this machine cannot run", "--backend", "mosaic_gpu", "--dry-run"),
    tune_flags("compile-only without a backend", "--compile-only"),
    tune_flags("compile-only on a backend without it", "--compile-only", "--backend", "xla"),
    tune_flags("compile-only with tpe", "--compile-only", "--strategy", "tpe", "--backend", "xla"),
    tune_flags("fp8 experts in an unknown scale layout", "--fp8", "per_row"),
    tune_flags("fp8 experts with a backward", "--fp8", "tensor", "--with-backward"),
    c(
        "fp8 experts of no model",
        "tune",
        "--problem",
        "m=8,k=128,n=128,g=2",
        "--fp8",
        "tensor",
        "--db",
        "{db}",
    ),
    c("backward of missed problems only", "tune", "--misses", "--with-backward", "--db", "{db}"),
    c(
        "backward of a gradient op",
        "tune",
        "--problem",
        "op=grouped_matmul_drhs,m=8,k=8,n=8,g=2",
        "--with-backward",
        "--db",
        "{db}",
    ),
    c("resume sweep 0", "tune", "--resume", "0", "--db", "{db}"),
    c("resume with other settings", "tune", "--resume", "1", "--model", "tiny", "--db", "{db}"),
    c("resume a sweep of a database not created", "tune", "--resume", "99", "--db", "{db}"),
    c("resume a sweep that is not there", "tune", "--resume", "99", "--db", "{db}", db="tuned"),
    c("resume a sweep tune did not start", "tune", "--resume", "1", "--db", "{db}", db="tuned"),
    c("unknown shipped sweep", "tune", "--sweep", "nosuch", "--db", "{db}"),
    c("unknown model", "tune", "--model", "nosuch", "--db", "{db}"),
    c("model name climbing out of configs/models", "tune", "--model", "../../etc/passwd", "--db", "{db}"),
    c("model file missing", "tune", "--model", "{tmp}/missing.yaml", "--db", "{db}"),
    c("model file /dev/zero", "tune", "--model", "/dev/zero", "--db", "{db}"),
)

cases(
    "tune: --problem",
    tune_problem("missing dimensions", "m=1"),
    tune_problem("not name=value", "m=1,k"),
    tune_problem("m not an integer", f"m=x,{PROBLEM_ARGS}"),
    tune_problem("m of 2^63", f"m=9223372036854775808,{PROBLEM_ARGS}"),
    tune_problem("m of 2^31", f"m=2147483648,{PROBLEM_ARGS}"),
    tune_problem("m of 0", f"m=0,{PROBLEM_ARGS}"),
    tune_problem("negative m", f"m=-1,{PROBLEM_ARGS}"),
    tune_problem("m in other digits", f"m=١٢,{PROBLEM_ARGS}"),
    tune_problem("unknown dtype", f"m=1,{PROBLEM_ARGS},dtype=int8"),
    tune_problem("markup for an op", f"m=1,{PROBLEM_ARGS},op=<script>"),
    tune_problem("unknown op", f"m=1,{PROBLEM_ARGS},op=attention"),
    tune_problem("transpose flag not a flag", f"m=1,{PROBLEM_ARGS},t=maybe"),
    tune_problem("unknown field", f"m=1,{PROBLEM_ARGS},foo=1"),
    tune_problem("odd n for swiglu", "op=grouped_matmul_swiglu,m=1,k=64,n=63,g=1"),
    tune_problem("every dimension 2^31-1", "m=2147483647,k=2147483647,n=2147483647,g=2147483647"),
    tune_problem("operands past 1 TiB", "m=2147483647,k=256,n=64,g=1"),
    tune_problem("experts past 65,536", "m=8,k=64,n=64,g=65537"),
    tune_problem("m twice", f"m=8,m=16,{PROBLEM_ARGS}"),
    tune_problem("dtype twice", f"m=8,{PROBLEM_ARGS},dtype=bf16,dtype=fp16"),
    tune_problem("t and transpose_rhs both", f"m=8,{PROBLEM_ARGS},t=1,transpose_rhs=0"),
)


def tune_maxtext(name: str, *args: str, text: str = "base_config: base.yml\n", slow: bool = False) -> Case:
    files = {"m.yml": text}
    return c(name, "tune", "--maxtext-config", "{tmp}/m.yml", *args, "--db", "{db}", files=files, slow=slow)


cases(
    "tune: --maxtext-config",
    c("config file missing", "tune", "--maxtext-config", "{tmp}/missing.yml", "--db", "{db}"),
    c("overrides without a config", "tune", "num_experts=8", "--db", "{db}"),
    c("devices without a config", "tune", "--model", "tiny", "--maxtext-devices", "8", "--db", "{db}"),
    tune_maxtext("override not key=value", "num_experts"),
    tune_maxtext("unknown workload", "--maxtext-workloads", "serve"),
    tune_maxtext("zero devices", "--maxtext-devices", "0"),
    tune_maxtext(
        "a config with no routed experts", text="base_config: base.yml\nnum_experts: 1\n", slow=True
    ),
    tune_maxtext(
        "MaxText's dense einsum",
        "num_experts=4",
        "num_experts_per_tok=2",
        "base_moe_mlp_dim=7168",
        "sparse_matmul=False",
        slow=True,
    ),
    tune_sweep("maxtext not a mapping", "maxtext: base.yml\n"),
    tune_sweep("maxtext with an unknown field", "maxtext: {config: base.yml, mesh: 8}\n"),
)

cases(
    "tune: sweep files",
    tune_sweep("a directory", Special.DIRECTORY),
    tune_sweep("a FIFO", Special.FIFO),
    c("/dev/zero", "tune", "--sweep", "/dev/zero", "--db", "{db}"),
    tune_sweep("not UTF-8", b"models: [tiny]\nseed: \xff\n"),
    tune_sweep("YAML error (a caret block from PyYAML)", "models: [tiny\nseed: 1\n"),
    tune_sweep("bad indentation", "models: [tiny]\n  seed: 1\n"),
    tune_sweep("alias bomb", ALIAS_BOMB),
    tune_sweep("alias to itself", "models: &a [tiny, *a]\n"),
    tune_sweep("undefined alias", "models: *nope\n"),
    tune_sweep("nested 5000 deep", "models: " + "[" * 5000 + "]" * 5000 + "\n"),
    tune_sweep("past the size cap", "models: [tiny]\n" + "#" * (300 << 10) + "\n"),
    tune_sweep("two documents", "models: [tiny]\n---\nseed: 1\n"),
    tune_sweep("a Python object tag", '!!python/object/apply:os.system ["true"]\n'),
    tune_sweep("a list, not a mapping", "- tiny\n"),
    tune_sweep("seed a string", 'models: [tiny]\nseed: "x"\n'),
    tune_sweep("negative seed", "models: [tiny]\nseed: -1\n"),
    tune_sweep("integer of 5000 digits", "models: [tiny]\nseed: " + "9" * 5000 + "\n"),
    tune_sweep("budget a fraction", "models: [tiny]\nbudget: 1.5\n"),
    tune_sweep("budget a bool", "models: [tiny]\nbudget: true\n"),
    tune_sweep("minutes infinite", "models: [tiny]\nminutes: .inf\n"),
    tune_sweep("timeout a string", 'models: [tiny]\ntimeout_s: "5"\n'),
    tune_sweep("runs too few", "models: [tiny]\nruns: 3\n"),
    tune_sweep("models not a list", "models: tiny\n"),
    tune_sweep("models holding a number", "models: [1]\n"),
    tune_sweep("unknown field", "models: [tiny]\nbogus: 1\n"),
    tune_sweep("unknown strategy", "models: [tiny]\nstrategy: nope\n"),
    tune_sweep("unknown backend", "models: [tiny]\nbackend: nope\n"),
    tune_sweep("unknown routing in a list", "models: [tiny]\nrouting: [balanced, nope]\n"),
    tune_sweep("space not a mapping", "models: [tiny]\nspace: 5\n"),
    tune_sweep("a bad problem", 'problems: ["m=1"]\n'),
    tune_sweep("a date that is not one", "models: [tiny]\narch: 2026-13-01\n"),
    tune_sweep("a database URL with a newline", 'models: [tiny]\ndb: "sqlite:///a\\nb"\n'),
    tune_sweep("a path past 4096 characters", f"models: [{'x' * 5000}]\n"),
    tune_sweep("seed twice", "models: [tiny]\nseed: 1\nseed: 2\n"),
    tune_sweep("a key twice in a nested mapping", "models: [tiny]\nspace: {block_m: [64], block_m: [128]}\n"),
    tune_sweep("an escape character", "models: [tiny]\nseed: 1\x1b\n"),
    tune_sweep("a control character in a comment", "models: [tiny]  # \x08\n"),
)

cases(
    "tune: model files",
    tune_model("a directory", Special.DIRECTORY),
    tune_model("a FIFO", Special.FIFO),
    tune_model("not UTF-8", b"name: \xff\n"),
    tune_model("YAML error", "name: [m\nexperts: 4\n"),
    tune_model("alias bomb", ALIAS_BOMB),
    tune_model("nested 5000 deep", "name: " + "[" * 5000 + "]" * 5000 + "\n"),
    tune_model("past the size cap", MODEL + "#" * (300 << 10) + "\n"),
    tune_model("a list, not a mapping", "- m\n"),
    tune_model("empty", ""),
    tune_model("unknown field", MODEL + "layers: 32\n"),
    tune_model("missing field", model(ffn=None)),
    tune_model("experts a string", model(experts="8")),
    tune_model("experts a fraction", model(experts=4.5)),
    tune_model("zero experts", model(experts=0)),
    tune_model("top_k above experts", model(top_k=5)),
    tune_model("hidden past 32 bits", model(hidden=2**40)),
    tune_model("gate_up's N past 32 bits", model(ffn=2**30 + 1)),
    tune_model("65,537 experts", model(experts=65537)),
    tune_model("M past 32 bits", model(top_k=2) + f"token_buckets: [{2**31 - 1}]\n"),
    tune_model("name of 100 characters", model(name="m" * 100)),
    tune_model("name with an escape sequence", model(name="\x1b[31mred")),
    tune_model("name with a newline", model(name="a\nb")),
    tune_model("empty name", model(name=" ")),
    tune_model("name a number", model(name=7)),
    tune_model("token_buckets not a list", MODEL + "token_buckets: 8\n"),
    tune_model("zero token bucket", MODEL + "token_buckets: [0]\n"),
    tune_model("unknown dtype", MODEL + "dtype: int8\n"),
    tune_model("unknown activation", MODEL + "activation: relu6\n"),
    tune_model("transpose_rhs a string", MODEL + 'transpose_rhs: "no"\n'),
    tune_model("experts twice", MODEL + "experts: 8\n"),
    tune_model("a key twice, quoted once", MODEL + '"hidden": 32\n'),
    tune_model("a NUL in a value", MODEL.replace("name: m", "name: m\x00")),
    tune_model("a control character in a quoted value", MODEL.replace("name: m", 'name: "m\x01"')),
    tune_model("DEL in a key", MODEL + "top\x7f: 1\n"),
)


def tune_hf(name: str, text: str | bytes | Special, **options: Any) -> Case:
    return c(name, "tune", "--hf-config", "{tmp}/config.json", "--db", "{db}", files={"config.json": text})


cases(
    "tune: --hf-config files",
    tune_hf("a directory", Special.DIRECTORY),
    tune_hf("a FIFO", Special.FIFO),
    c("/dev/zero", "tune", "--hf-config", "/dev/zero", "--db", "{db}"),
    tune_hf("past the size cap", Special.HUGE),
    tune_hf("not UTF-8", b'{"model_type": "\xff"}'),
    tune_hf("not JSON", "{ model_type: mixtral"),
    tune_hf("integer of 5000 digits", '{"model_type": "mixtral", "hidden_size": ' + "9" * 5000 + "}"),
    tune_hf("nested 100,000 deep", "[" * 100_000 + "]" * 100_000),
    tune_hf("an object nested 100,000 deep", '{"a":' * 100_000 + "1" + "}" * 100_000),
)

cases(
    "database commands",
    c("trials: unknown status", "trials", "--status", "bogus", "--db", "{db}"),
    c("trials: negative limit", "trials", "--limit", "-1", "--db", "{db}"),
    c("trials: limit past 32 bits", "trials", "--limit", "99999999999", "--db", "{db}"),
    c("trials: sweep 0", "trials", "--sweep", "0", "--db", "{db}"),
    c("trials: sweep id past 64 bits", "trials", "--sweep", "99999999999999999999", "--db", "{db}"),
    c("trials: no such sweep", "trials", "--sweep", "99", "--db", "{db}", db="tuned"),
    c("trials: no such gpu", "trials", "--gpu", "NVIDIA B200", "--db", "{db}", db="tuned"),
    c("trials: no such backend", "trials", "--backend", "nope", "--db", "{db}", db="tuned"),
    c("trials: no such problem", "trials", "--problem", "nokey", "--db", "{db}", db="tuned"),
    c("not a database URL", "trials", "--db", "definitely not a url"),
    c("unknown URL scheme", "best", "--db", "nosuch://x/y"),
    c("SQLite file in a missing folder", "trials", "--db", "sqlite:////nonexistent-dir/x.db"),
    c("best: m of 0", "best", "--m", "0", "--db", "{db}"),
    c("best: negative k", "best", "--k", "-5", "--db", "{db}"),
    c("best: n of 2^66", "best", "--n", "73786976294838206464", "--db", "{db}"),
    c("best: g past 32 bits", "best", "--g", "2147483648", "--db", "{db}"),
    c("best: no such gpu", "best", "--gpu", "H200", "--db", "{db}", db="tuned"),
    c("best: no such backend", "best", "--backend", "nope", "--db", "{db}", db="tuned"),
    c("misses: no such gpu", "misses", "--gpu", "nope", "--db", "{db}", db="tuned"),
    c("misses: no such backend", "misses", "--backend", "nope", "--db", "{db}", db="tuned"),
    c(
        "export: no winners for that gpu",
        *("export", "--gpu", "NVIDIA B200", "--backend", "mosaic_gpu", "-o", "{tmp}/out.json"),
        *("--db", "{db}"),
        db="tuned",
    ),
    c(
        "export into a missing folder",
        *("export", "--gpu", "NVIDIA H200", "--backend", "mosaic_gpu", "-o", "{tmp}/nodir/out.json"),
        *("--db", "{db}"),
        db="tuned",
    ),
    *(
        c(
            f"export onto {kind.value.split(' (')[0]}",
            *("export", "--gpu", "NVIDIA H200", "--backend", "mosaic_gpu", "-o", "{tmp}/out"),
            *("--db", "{db}"),
            files={"out": kind},
            db="tuned",
        )
        for kind in (Special.FIFO, Special.SYMLINK, Special.DEVICE)
    ),
    c(
        "export onto a folder",
        *("export", "--gpu", "NVIDIA H200", "--backend", "mosaic_gpu", "-o", "{tmp}", "--db", "{db}"),
    ),
    c("rollback: neither --gpu nor --fingerprint", "rollback", "--backend", "x", "--problem", "y"),
    c(
        "rollback: both --gpu and --fingerprint",
        *("rollback", "--backend", "x", "--problem", "y", "--gpu", "a", "--fingerprint", "b"),
    ),
    c(
        "rollback: no such problem",
        *("rollback", "--gpu", "NVIDIA H200", "--backend", "mosaic_gpu", "--problem", "nokey"),
        *("--db", "{db}"),
        db="tuned",
    ),
    c(
        "rollback of a database not created",
        *("rollback", "--gpu", "NVIDIA H200", "--backend", "mosaic_gpu", "--problem", "nokey"),
        *("--db", "{db}"),
    ),
    c("db upgrade: unknown revision", "db", "upgrade", "--revision", "nosuch", "--db", "{db}"),
    c("db upgrade: not a URL", "db", "upgrade", "--db", "not a url"),
    c("db downgrade without --yes", "db", "downgrade", "base", "--db", "{db}", db="tuned"),
    c("db downgrade: unknown revision", "db", "downgrade", "nosuch", "--yes", "--db", "{db}", db="tuned"),
    c("db downgrade of a database not created", "db", "downgrade", "base", "--yes", "--db", "{db}"),
    c("report: sweep 0", "report", "0", "--db", "{db}"),
    c("report: no such sweep", "report", "99", "--out", "{tmp}/r.html", "--db", "{db}", db="tuned"),
    c("report into a missing folder", "report", "1", "--out", "{tmp}/nodir/r.html", "--db", "{db}"),
    c("report onto a folder", "report", "1", "--out", "{tmp}", "--db", "{db}"),
    c("doctor: not a database URL", "doctor", "--db", "not a url"),
    c("sweeps: limit not an integer", "sweeps", "--limit", "x"),
    c("sweeps: negative limit", "sweeps", "--limit", "-1", "--db", "{db}", db="tuned"),
    c("sweeps of a database not created", "sweeps", "--db", "{db}"),
    c("export-optuna without a sweep id", "export-optuna", "--storage", "sqlite:///{tmp}/o.db"),
    c("export-optuna: sweep id not an integer", "export-optuna", "x", "--storage", "sqlite:///{tmp}/o.db"),
    c("export-optuna without a storage", "export-optuna", "1", "--db", "{db}", db="tuned"),
    c(
        "export-optuna: a password in the storage URL",
        *("export-optuna", "1", "--storage", "postgresql://u:secret@localhost/optuna", "--db", "{db}"),
        db="tuned",
    ),
    c(
        "export-optuna: a password in the storage URL's query",
        *(
            "export-optuna",
            "1",
            "--storage",
            "postgresql://u@localhost/optuna?password=secret",
            "--db",
            "{db}",
        ),
        db="tuned",
    ),
    c(
        "export-optuna: no such sweep",
        *("export-optuna", "99", "--storage", "sqlite:///{tmp}/o.db", "--db", "{db}"),
        db="tuned",
    ),
    c("explain: m of 0", "explain", "--m", "0", "--k", "64", "--n", "64", "--g", "1"),
    c("explain: m past 32 bits", "explain", "--m", "2147483648", "--k", "64", "--n", "64", "--g", "1"),
    c(
        "explain: unknown dtype",
        "explain",
        "--m",
        "1",
        "--k",
        "64",
        "--n",
        "64",
        "--g",
        "1",
        "--dtype",
        "int8",
    ),
    c(
        "explain: unknown out dtype",
        *("explain", "--m", "1", "--k", "64", "--n", "64", "--g", "1", "--out-dtype", "x"),
    ),
    c(
        "explain: unknown backend",
        *("explain", "--m", "1", "--k", "64", "--n", "64", "--g", "1", "--backend", "nosuch", "--db", "{db}"),
    ),
    c(
        "explain: unknown op",
        *("explain", "--m", "1", "--k", "64", "--n", "64", "--g", "1", "--op", "attention"),
    ),
    c("pack-schema is not export's option", "export", "--schema"),
)

cases(
    "a database password on the command line",
    *(
        c(f"a password holding {char}", "trials", "--db", f"postgresql://moetune:s3cr{char}t@127.0.0.1:1/x")
        for char in "/?#@:%"
    ),
    c("a password in the query", "trials", "--db", "postgresql://moetune@127.0.0.1:1/x?password=s3cr3t"),
)

cases(
    "benchmarks",
    c("bench tuner: unknown model", "bench", "tuner", "--model", "nosuch"),
    c("bench tuner: buckets not integers", "bench", "tuner", "--buckets", "x"),
    c("bench tuner: unknown backend", "bench", "tuner", "--backend", "nosuch"),
    c("bench tuner: zero budget", "bench", "tuner", "--budget", "0"),
    c("bench tuner: unknown routing", "bench", "tuner", "--routing", "bogus"),
    c("bench tuner: zero sequential budget", "bench", "tuner", "--sequential-budget", "0"),
    c("bench tuner: zero timeout", "bench", "tuner", "--timeout-s", "0"),
    c("bench tuner: output in a missing folder", "bench", "tuner", "--out", "{tmp}/nodir/x.json"),
)

cases(
    "import: pack files",
    import_pack("not JSON", "{ this is not json"),
    import_pack("empty file", ""),
    import_pack("a JSON list", "[]"),
    import_pack("NaN", pack(change(_entry, median_s=0.5)).replace("0.5", "NaN")),
    import_pack("Infinity", pack(change(_entry, median_s=0.5)).replace("0.5", "Infinity")),
    import_pack("a key twice", pack(lambda d: None)[:-1] + ', "backend": "xla"}'),
    import_pack("not UTF-8", b'{"schema": "\xff"}'),
    import_pack("nested 100,000 deep", "[" * 100_000 + "]" * 100_000),
    import_pack("an integer of 5000 digits", "9" * 5000),
    import_pack("a directory", Special.DIRECTORY),
    import_pack("a FIFO", Special.FIFO),
    import_pack("past the 16 MiB cap", Special.HUGE),
    c("/dev/zero", "import", "/dev/zero", "--db", "{db}"),
    c("/dev/zero from the installed interpreter", "import", "/dev/zero", "--db", "{db}", subprocess=True),
    c("missing file", "import", "{tmp}/missing.json", "--db", "{db}"),
    c(
        "a path longer than the database records",
        *("import", "{tmp}/" + LONG_PATH, "--db", "{db}"),
        files={LONG_PATH: _SHIPPED_TEXT},
    ),
)

cases(
    "import: pack fields",
    import_pack("another schema", pack(change(_pack, schema="moetune.pack.v2"))),
    import_pack("schema_version 4", pack(change(_pack, schema_version=4))),
    import_pack("schema_version a string", pack(change(_pack, schema_version="1"))),
    import_pack("unknown top-level field", pack(change(_pack, extra={}))),
    import_pack("entries a mapping", pack(change(_pack, entries={}))),
    import_pack("created not a time", pack(change(_pack, created="yesterday"))),
    import_pack("created in month 13", pack(change(_pack, created="2026-13-40T00:00:00Z"))),
    import_pack("backend with spaces", pack(change(_pack, backend="Mosaic GPU"))),
    import_pack("backend of 65 characters", pack(change(_pack, backend="b" * 65))),
    import_pack("backend not registered", pack(change(_pack, backend="nosuchbackend"))),
    import_pack("source hash with spaces", pack(change(_pack, kernel_source_hash="ab cd"))),
    import_pack("empty source hash", pack(change(_pack, kernel_source_hash=""))),
    import_pack("device_kind of 129 characters", pack(change(_device, device_kind="x" * 129))),
    import_pack("empty device_kind", pack(change(_device, device_kind=""))),
    import_pack("driver with a newline", pack(change(_device, driver="580\n.1"))),
    import_pack("platform with an escape sequence", pack(change(_device, platform="\x1b[31mgpu"))),
    import_pack("core_count past 32 bits", pack(change(_device, core_count=2**31))),
    import_pack("negative core_count", pack(change(_device, core_count=-1))),
    import_pack("memory past 64 bits", pack(change(_device, memory_bytes=2**63))),
    import_pack("core_count a string", pack(change(_device, core_count="132"))),
    import_pack("unknown device field", pack(change(_device, gpu_count=8))),
    import_pack("missing device field", pack(drop(_device, "driver"))),
    import_pack("markup for an op", pack(change(_problem, op="<script>alert(1)</script>"))),
    import_pack("unknown op", pack(change(_problem, op="attention"))),
    import_pack("m of 2^63", pack(change(_problem, m=2**63))),
    import_pack("m of 2^31", pack(change(_problem, m=2**31))),
    import_pack("k of 0", pack(change(_problem, k=0))),
    import_pack("n a string", pack(change(_problem, n="4096"))),
    import_pack("g a float", pack(change(_problem, g=8.0))),
    import_pack("m a bool", pack(change(_problem, m=True))),
    import_pack("dtype alias", pack(change(_problem, lhs_dtype="bf16"))),
    import_pack("unknown dtype", pack(change(_problem, out_dtype="int8"))),
    import_pack("transpose_rhs an integer", pack(change(_problem, transpose_rhs=0))),
    import_pack("missing problem field", pack(drop(_problem, "g"))),
    import_pack("unknown problem field", pack(change(_problem, group_sizes=[1, 2]))),
    import_pack("problem schema_version 2 without scales", pack(change(_problem, schema_version=2))),
    import_pack(
        "a problem with scales in a schema_version 1 pack",
        pack(
            change(
                _problem,
                schema_version=2,
                op="grouped_matmul_fp8",
                lhs_dtype="float8_e4m3fn",
                rhs_dtype="float8_e4m3fn",
                scale_layout="tensor",
            )  # fmt: skip
        ),
    ),
    import_pack("odd n for swiglu", pack(change(_problem, op="grouped_matmul_swiglu", n=28673))),
    import_pack("median 0", pack(change(_entry, median_s=0))),
    import_pack("median negative", pack(change(_entry, median_s=-1e-3))),
    import_pack("median a string", pack(change(_entry, median_s="fast"))),
    import_pack("missing median", pack(drop(_entry, "median_s"))),
    import_pack("unknown entry field", pack(change(_entry, note="x"))),
    import_pack("an entry twice", pack(lambda d: d["entries"].append(d["entries"][0]))),
    import_pack(
        "a float32 problem mosaic_gpu declines",
        pack(change(_problem, lhs_dtype="float32", rhs_dtype="float32")),
    ),
    import_pack("into a tuned database", pack(change(_problem, op="<script>")), db="tuned"),
)

cases(
    "import: configs",
    import_pack("block_m of 8e30", pack(change(_config, block_m=8 * 10**30))),
    import_pack("block_m past 32 bits", pack(change(_config, block_m=2**31))),
    import_pack("block_m a float", pack(change(_config, block_m=64.0))),
    import_pack("block_m a string", pack(change(_config, block_m="64"))),
    import_pack("block_m a list", pack(change(_config, block_m=[64]))),
    import_pack("persistent an integer", pack(change(_config, persistent=1))),
    import_pack("block_m the Config refuses", pack(change(_config, block_m=96))),
    import_pack("unknown config field", pack(change(_config, tile_q=1))),
    import_pack("config field name with a dash", pack(change(_config, **{"block-m": 64}))),
    import_pack("70 config fields", pack(change(_config, **{f"p{i}": 1 for i in range(70)}))),
    import_pack("config text of 65 characters", pack(change(_config, wg_split="n" * 65))),
    import_pack("config text with a newline", pack(change(_config, wg_split="n\n"))),
    import_pack("config the kernel cannot run", pack(change(_config, block_k=128, split_k=64))),
    import_pack("config over the registers", pack(change(_config, block_m=128, epi_tile_m=128))),
    import_pack("into a tuned database", pack(change(_config, block_m=96)), db="tuned"),
)


def xla_pack(items_per_step: int) -> Callable[[dict], None]:
    """The shipped pack as an xla pack: every entry chunked, the first with `items_per_step`."""

    def mutate(data: dict) -> None:
        data["backend"] = "xla"
        for entry in data["entries"]:
            entry["config"] = {"strategy": "chunked", "chunk_m": 128, "items_per_step": 8}
        _config(data)["items_per_step"] = items_per_step

    return mutate


cases(
    "import: configs outside their domain",
    import_pack("items_per_step of 10^6", pack(xla_pack(10**6))),
    import_pack("items_per_step of 3", pack(xla_pack(3))),
    import_pack("grid_tile_width of 10^6", pack(change(_config, grid_tile_width=10**6))),
    import_pack("split_k of 3", pack(change(_config, split_k=3))),
)

cases(
    "the tuning queue",
    c("submit: nothing to tune", "submit", "--db", "{db}"),
    c("submit: a problem without k, n, g", "submit", "--problem", "m=16", "--db", "{db}"),
    c(
        "submit: priority past 32 bits",
        "submit",
        "--problem",
        f"m=16,{PROBLEM_ARGS}",
        "--priority",
        "2199023255552",
    ),
    c("jobs list: negative limit", "jobs", "list", "--limit", "-1", "--db", "{db}", db="tuned"),
    c("jobs list: unknown state", "jobs", "list", "--state", "paused", "--db", "{db}", db="tuned"),
    c("jobs list of a database not created", "jobs", "list", "--db", "{db}"),
    c("jobs show: no such job", "jobs", "show", "9", "--db", "{db}", db="tuned"),
    c("jobs cancel: no such job", "jobs", "cancel", "9", "--db", "{db}", db="tuned"),
    c("jobs cancel of a database not created", "jobs", "cancel", "1", "--db", "{db}"),
    c("worker: not a database URL", "worker", "--once", "--db", "not a url"),
    c("worker --once of a database not created", "worker", "--once", "--db", "{db}"),
    c("worker: an empty device kind", "worker", "--once", "--device-kind", "", "--db", "{db}", db="tuned"),
    c("worker: a blank device kind", "worker", "--once", "--device-kind", "  ", "--db", "{db}", db="tuned"),
)

cases(
    "the server",
    c("serve: port past 65535", "serve", "--port", "70000", "--db", "{db}"),
    c("serve: not a database URL", "serve", "--db", "not a url"),
    c("serve: a token file others can read", "serve", "--token-file", "{tmp}/t", files={"t": "x" * 32}),
    c(
        "serve: a token file that is a directory",
        "serve",
        "--token-file",
        "{tmp}/t",
        files={"t": Special.DIRECTORY},
    ),
    c("serve: tune on miss, negative", "serve", "--tune-misses", "-1", "--db", "{db}"),
)

CASES = [case for items in CATEGORIES.values() for case in items]


# --- running a case --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tuned_database(tmp_path_factory) -> Path:
    """A database holding the shipped pack's winners: sweep 1 (an import), its trials and winners."""
    from moetune.db import open_store
    from moetune.kernels import packs

    path = tmp_path_factory.mktemp("tuned") / "moetune.db"
    with open_store(f"sqlite:///{path}") as store:
        store.import_pack(packs.load(SHIPPED_PACK), source="nvidia_h200__mosaic_gpu.json")
    return path


def _materialise(case: Case, folder: Path) -> None:
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is Special.DIRECTORY:
            path.mkdir()
        elif content is Special.FIFO:
            os.mkfifo(path)
        elif content is Special.SYMLINK:
            (folder / "target").write_text("kept\n")
            path.symlink_to(folder / "target")
        elif content is Special.DEVICE:
            if os.geteuid() != 0:
                pytest.skip("making a device node takes root")
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        elif content is Special.HUGE:
            with open(path, "wb") as f:
                f.truncate((16 << 20) + 1)
        else:
            path.write_bytes(content.encode() if isinstance(content, str) else content)


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every file under `folder` with its bytes (a FIFO or folder by its kind): what 'nothing written'
    compares."""
    found: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            found[key] = f"symlink to {os.readlink(path)}"
        elif path.is_char_device():
            found[key] = f"device {path.stat().st_rdev}"
        elif path.is_fifo():
            found[key] = "fifo"
        elif path.is_dir():
            found[key] = "dir"
        elif path.stat().st_size > (1 << 20):
            found[key] = f"{path.stat().st_size} bytes"  # the sparse file: its size tells
        else:
            found[key] = path.read_bytes()
    return found


def _argv(case: Case, folder: Path) -> list[str]:
    url = f"sqlite:///{folder / 'moetune.db'}"
    return [a.replace("{db}", url).replace("{tmp}", str(folder)) for a in case.argv]


def _run(case: Case, folder: Path) -> tuple[int, str, str]:
    if case.subprocess:
        env = {k: v for k, v in os.environ.items() if k != "MOETUNE_DB"} | {"JAX_PLATFORMS": "cpu"}
        done = subprocess.run(
            [sys.executable, "-m", "moetune.cli", *_argv(case, folder)],
            capture_output=True,
            text=True,
            cwd=folder,
            env=env,
            timeout=300,
        )
        return done.returncode, done.stdout, done.stderr
    from typer.testing import CliRunner

    from moetune.cli import _load_commands, app

    _load_commands()
    result = CliRunner().invoke(app, _argv(case, folder))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        detail = "".join(traceback.format_exception(result.exception))
        return result.exit_code, result.stdout, result.stderr + "\nTraceback:\n" + detail
    return result.exit_code, result.stdout, result.stderr


def _no_ray(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a bad input started Ray: it was checked too late")


@pytest.mark.parametrize(
    "case", [pytest.param(case, id=case.name, marks=[pytest.mark.slow] * case.slow) for case in CASES]
)
def test_bad_input(case, tmp_path, monkeypatch, tuned_database):
    from moetune.tuner import ray_pool

    monkeypatch.setattr(ray_pool, "connect", _no_ray)
    folder = tmp_path / "case"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("XDG_DATA_HOME", str(folder / "xdg"))  # the default database lives here too
    if case.db == "tuned":
        shutil.copy(tuned_database, folder / "moetune.db")
    _materialise(case, folder)
    before = _snapshot(folder)
    environment = dict(os.environ)  # commands set defaults for jax (setdefault); undo them

    try:
        code, stdout, stderr = _run(case, folder)
    finally:
        os.environ.clear()
        os.environ.update(environment)

    lines = stderr.splitlines()
    assert "Traceback" not in stdout + stderr, stderr
    assert code == case.code, (code, stdout, stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    after = _snapshot(folder)
    # A read-only SQLite reader of a WAL database creates the write-ahead log (empty) and its shared-memory
    # index beside the file, and cannot remove them (that takes a checkpoint, a write): SQLite's own side
    # files, not data. Anything else, or a log holding a byte, is a write.
    for side in [key for key in after.keys() - before.keys() if key.endswith(("-wal", "-shm"))]:
        if side.endswith("-wal"):
            assert after[side] == b"", f"{side} holds data: the command wrote to the database"
        assert side.removesuffix("-wal").removesuffix("-shm") in before
        del after[side]
    assert after == before, "the command wrote or created a file"


# --- the table in docs/bad-inputs.md ---------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "bad-inputs.md"


def render() -> str:
    out = [
        "# Bad inputs",
        "",
        "Every bad input to `moetune` ends the same way: one line on stderr that starts with `error:`, exit",
        "code 2, no traceback, and nothing written: no database created, migrated or changed, no other file",
        "created. Each row below is a case of tests/tuner/test_bad_inputs.py, which runs it and checks",
        "exactly that; this file is generated from the same list, and a test fails when they differ.",
        "`{tmp}` is the case's own folder (also its working directory), `{db}` a SQLite file in it. The",
        "database is *absent* (the file does not exist, and must not afterwards) or *tuned* (it holds the",
        "shipped pack's winners, and must be byte-identical afterwards).",
        "",
        "",
        "Some inputs are well-formed but too large to tune, and are refused the same way before a database,",
        "a sweep row or a Ray cluster exists (moetune.tuner.sweep_setup):",
        "",
        "- `g` past 65,536 experts: the driver draws every routing (one group size per expert, for each",
        "  routing and verification draw) and keeps the draws in the sweep's row;",
        "- operands and output past 1 TiB (`Problem.bytes_touched`: lhs, rhs and the output in their",
        "  dtypes), which no accelerator holds; once the workers report their device, past its memory;",
        "- `--workers` above the CPUs of the cluster (each worker holds one CPU; Ray would wait for ever for",
        "  the rest): this machine's for the local cluster, before it starts; the joined cluster's for",
        "  `--ray-address`, before any worker or row. A `--dry-run` plans for any number.",
        "",
        f"{len(CASES)} cases.",
    ]
    for category, items in CATEGORIES.items():
        out += [
            "",
            f"## {category}",
            "",
            "| case | command | files | database | exit | stderr lines | written |",
        ]
        out.append("|---|---|---|---|---|---|---|")
        for case in items:
            command = "moetune " + " ".join(shlex.quote(a) for a in case.argv)
            files = ", ".join(
                f"{name} ({content.value})" if isinstance(content, Special) else name
                for name, content in case.files.items()
            )
            via = " (subprocess)" * case.subprocess + " (slow tier)" * case.slow
            cells = [
                _md(case.name) + via,
                f"`{_md(_short(command))}`",
                _md(_short(files, 40)),
                case.db,
                str(case.code),
            ]
            out.append("| " + " | ".join([*cells, "1", "nothing"]) + " |")
    return "\n".join(out) + "\n"


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def test_the_documented_table_is_the_list_of_cases():
    assert DOC.read_text() == render(), (
        "regenerate: python -m tests.tuner.test_bad_inputs > docs/bad-inputs.md"
    )


def test_the_list_covers_every_command():
    from typer.main import get_command

    from moetune.cli import _load_commands, app

    _load_commands()
    root = get_command(app)
    commands = {
        f"{name} {sub}" if hasattr(group, "commands") else name
        for name, group in root.commands.items()
        for sub in getattr(group, "commands", {None: None})
    }
    covered = {
        " ".join(case.argv[:2]) if case.argv[0] in ("db", "bench", "jobs") else case.argv[0] for case in CASES
    }
    assert commands <= covered, sorted(commands - covered)


if __name__ == "__main__":
    sys.stdout.write(render())
