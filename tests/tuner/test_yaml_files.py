"""The one YAML reader: plain data only, bounded in bytes and in nodes after alias expansion, every
failure one line naming file, line and column."""

from __future__ import annotations

import ast
import importlib.resources
from pathlib import Path

import pytest

from moetune.kernels.errors import ConfigInvalid
from moetune.tuner import yaml_files
from moetune.tuner.yaml_files import load_yaml, read_yaml_file

# A few hundred bytes that yaml.safe_load expands to 9**9 strings (387 million).
BILLION_LAUGHS = b"""a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_plain_data_and_shared_aliases_load():
    assert load_yaml(b"a: &x [1, 2]\nb: *x\nc: {d: 2026-01-02}\n", "f.yaml")["b"] == [1, 2]
    assert load_yaml(b"", "f.yaml") is None


def test_an_alias_bomb_is_refused_before_it_is_built():
    with pytest.raises(ConfigInvalid, match=r"^f.yaml: the YAML expands to more than 10000 nodes"):
        load_yaml(BILLION_LAUGHS, "f.yaml")


def test_the_node_count_includes_every_expansion(monkeypatch):
    document = b"a: &a [1, 2, 3]\nb: [*a, *a, *a]\n"  # 1 + 2 keys + (4 + 1 + 3 * 4) nodes = 20
    monkeypatch.setattr(yaml_files, "MAX_YAML_NODES", 20)
    assert load_yaml(document, "f.yaml")["b"] == [[1, 2, 3]] * 3
    monkeypatch.setattr(yaml_files, "MAX_YAML_NODES", 19)
    with pytest.raises(ConfigInvalid, match="more than 19 nodes"):
        load_yaml(document, "f.yaml")


@pytest.mark.parametrize(
    ("document", "expect"),
    [
        (b"a: [1, 2\nb: 3\n", "f.yaml:2:2: expected ',' or ']', but got ':'"),
        (b"a: 1\n  b: 2\n", "f.yaml:2:4: mapping values are not allowed here"),
        (b"a: *nope\n", "f.yaml:1:4: found undefined alias 'nope'"),
        (b"a: 1\n---\nb: 2\n", "f.yaml:2:1: but found another document"),
        (b"!!python/object/apply:os.system [true]\n", "f.yaml:1:1: could not determine a constructor"),
        (b"a: &a [*a]\n", "f.yaml: a YAML alias refers to the node that contains it"),
        (b"a: " + b"[" * 5000 + b"]" * 5000, "f.yaml: YAML nested too deeply"),
        (b"a: 2026-13-01\n", "f.yaml: month must be in 1..12"),
        (b"a: \xff\n", "f.yaml: not UTF-8 text (byte 3)"),
        (b"#" * (yaml_files.MAX_YAML_BYTES + 1), f"bytes of YAML; the limit is {yaml_files.MAX_YAML_BYTES}"),
    ],
)
def test_failures_are_one_line(document, expect):
    with pytest.raises(ConfigInvalid) as caught:
        load_yaml(document, "f.yaml")
    assert str(caught.value).startswith(expect) or expect in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)


def test_files_are_read_through_the_capped_reader(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(ConfigInvalid, match="cannot read sweep file .*dir.yaml: it is a directory"):
        read_yaml_file(tmp_path / "dir.yaml", "sweep file")
    with pytest.raises(ConfigInvalid, match="it is a character device"):
        read_yaml_file("/dev/zero", "model file")


def test_every_yaml_read_of_the_package_goes_through_this_module():
    root = Path(str(importlib.resources.files("moetune.tuner"))).parent
    users = []
    for folder in ("kernels", "tuner", "db", "service", "integrations", "configs"):
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "yaml"
                ):
                    if node.attr in (
                        "load",
                        "safe_load",
                        "full_load",
                        "unsafe_load",
                        "load_all",
                        "safe_load_all",
                    ):
                        users.append(f"{path.relative_to(root)}: yaml.{node.attr}")
    assert users == [], users


CONTROLS = [chr(c) for c in [*range(0x00, 0x20), 0x7F] if chr(c) not in "\t\n\r"]


@pytest.mark.parametrize("char", CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
def test_every_control_character_is_one_line(char):
    """PyYAML's reader refuses these code points when the loader is made: one line naming the file too."""
    for text in (f"name: m{char}\n", f'name: "m{char}"\n', f"# {char}\nname: m\n"):
        with pytest.raises(ConfigInvalid, match=r"^m\.yaml: not valid YAML") as info:
            load_yaml(text.encode(), "m.yaml")
        assert "\n" not in str(info.value)
