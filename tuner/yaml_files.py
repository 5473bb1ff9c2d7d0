"""The one YAML reader for sweep and model files: safe, bounded, and failing in one line.

yaml.safe_load builds no Python objects beyond plain data, but it bounds nothing: a 385-byte document
of nested aliases ("billion laughs") expands to millions of nodes, and a parse error prints a caret
block over several lines. Here a document is at most MAX_YAML_BYTES of UTF-8 and MAX_YAML_NODES nodes
once every alias is expanded (counted before anything is built), no mapping gives a key twice, and
every failure is a ConfigInvalid of one line: "file:line:column: problem".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from moetune.kernels.errors import ConfigInvalid
from moetune.kernels.input_files import read_input_file

# The shipped sweep and model files are under 1 kB and 100 nodes.
MAX_YAML_BYTES = 256 << 10
MAX_YAML_NODES = 10_000


def read_yaml_file(path: str | Path, what: str) -> Any:
    """The document in the regular file `path` (`what` names it in errors: "sweep file")."""
    data = read_input_file(path, limit=MAX_YAML_BYTES, what=what, error=ConfigInvalid)
    return load_yaml(data, str(path))


def load_yaml(data: bytes, source: str) -> Any:
    """The plain data of one YAML document; None for an empty one."""
    if len(data) > MAX_YAML_BYTES:
        raise ConfigInvalid(f"{source}: {len(data)} bytes of YAML; the limit is {MAX_YAML_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigInvalid(f"{source}: not UTF-8 text (byte {e.start})") from None
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses control characters here, at once
    except yaml.YAMLError as e:
        raise ConfigInvalid(f"{source}: not valid YAML ({' '.join(str(e).split())})") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, source)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        raise ConfigInvalid(_one_line(e, source)) from None
    except yaml.YAMLError as e:
        raise ConfigInvalid(f"{source}: not valid YAML ({' '.join(str(e).split())})") from None
    except ConfigInvalid:  # _check_size's, already naming the file
        raise
    except RecursionError:
        raise ConfigInvalid(f"{source}: YAML nested too deeply") from None
    except ValueError as e:  # a scalar the constructor cannot convert: an int of 5,000 digits, 2026-13-01
        raise ConfigInvalid(f"{source}: {' '.join(str(e).split())}") from None
    finally:
        loader.dispose()


def _one_line(error: yaml.MarkedYAMLError, source: str) -> str:
    mark = error.problem_mark or error.context_mark
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    problem = error.problem or error.context or "not valid YAML"
    return f"{where}: {' '.join(problem.split())}"


def _check_size(root: yaml.Node, source: str) -> None:
    """Refuse a document of more than MAX_YAML_NODES nodes with every alias expanded, or one whose
    aliases refer to themselves. Each distinct node is sized once (aliases share node objects), so the
    count costs time in the size of the text, not of the expansion."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = _children(node)
        if children_done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[key] > MAX_YAML_NODES:
                raise ConfigInvalid(
                    f"{source}: the YAML expands to more than {MAX_YAML_NODES} nodes (aliases included)"
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ConfigInvalid(f"{source}: a YAML alias refers to the node that contains it")
        _check_unique_keys(node, source)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


def _check_unique_keys(node: yaml.Node, source: str) -> None:
    """Refuse a mapping that gives a key twice: PyYAML keeps the last silently, so `experts: 8` added
    below a model's `experts: 4` would win unseen. Keys are compared as scalars of one type ("1" and 1
    differ); merge keys (<<) are YAML's own."""
    if not isinstance(node, yaml.MappingNode):
        return
    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        if (key.tag, key.value) in seen:
            mark = key.start_mark
            raise ConfigInvalid(
                f"{source}:{mark.line + 1}:{mark.column + 1}: key {key.value!r} is given twice"
            )
        seen.add((key.tag, key.value))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
