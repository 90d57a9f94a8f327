"""The chart's generated files, from their sources:

- values.schema.json: the hand-written schema of the chart's own values, with the policy schema
  that `bouncer schema` prints embedded under definitions (so `helm install` and `helm upgrade`
  check policies given as objects the way `bouncer validate` does, minus what a schema cannot
  say, such as cron syntax);
- README.md: README.tpl.md with the chart's metadata and a table of every value (key, type from
  the schema, default from values.yaml, description from the comment above the key).

    python3 tests/helm/chartgen.py SCHEMA_JSON   # rewrite both (scripts/chart-gen runs this)

The tests (test_generated.py) regenerate both in memory and compare them with the files.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "bouncer"
SCHEMA_FILE = CHART_DIR / "values.schema.json"
README_FILE = CHART_DIR / "README.md"
README_TEMPLATE = CHART_DIR / "README.tpl.md"

# The embedded policy schema: its root under this name, its $defs under POLICY + "." + name.
POLICY = "bouncePolicy"


def embed_policy_schema(values_schema: dict[str, Any], policy_schema: dict[str, Any]) -> dict[str, Any]:
    """values_schema with its embedded policy schema replaced by policy_schema.

    The policy schema is draft 2020-12 but uses only keywords draft-07 reads the same way; its
    `$defs` become draft-07 `definitions` and its references follow them."""
    defs = dict(policy_schema.get("$defs", {}))
    root = {k: v for k, v in policy_schema.items() if k not in ("$schema", "$defs")}

    def moved(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "$ref":
                    match = re.fullmatch(r"#/\$defs/(.+)", value)
                    if not match:
                        raise ValueError(f"unexpected $ref in the policy schema: {value}")
                    value = f"#/definitions/{POLICY}.{match.group(1)}"
                out[key] = moved(value)
            return out
        if isinstance(node, list):
            return [moved(v) for v in node]
        return node

    kept = {name: d for name, d in values_schema.get("definitions", {}).items()
            if name != POLICY and not name.startswith(POLICY + ".")}
    kept[POLICY] = moved(root)
    for name in sorted(defs):
        kept[f"{POLICY}.{name}"] = moved(defs[name])
    return {**values_schema, "definitions": kept}


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# --- README ------------------------------------------------------------------------------------

KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?: |$)")


def value_comments(text: str) -> dict[str, list[str]]:
    """The comment block right above each key of values.yaml, by dotted path. A blank line ends a
    block that belongs to no key (the file's header). A key without a comment right under a
    commented sibling (no blank line between) shares that sibling's comment: it points to it."""
    comments: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    previous: tuple[int, str] | None = None  # the key on the line just above: indent, path
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped[1:][1:] if stripped.startswith("# ") else stripped[1:])
            previous = None
            continue
        if not stripped:
            block, previous = [], None
            continue
        match = KEY.match(line)
        if not match:  # a list item or a flow value's continuation
            block = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        path = ".".join(k for _, k in stack)
        if not block and previous and previous[0] == indent:
            comments[path] = [f"See `{previous[1]}`."]
        else:
            comments[path] = block
            previous = (indent, path) if block else None
        block = []
    return comments


def schema_at(schema: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node = schema
    for key in path:
        node = resolve(schema, node).get("properties", {}).get(key, {})
    return resolve(schema, node)


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["definitions"][node["$ref"].split("/")[-1]]
    return node


def type_of(schema: dict[str, Any], node: dict[str, Any], value: Any) -> str:
    if "enum" in node:
        return " \\| ".join(json.dumps(v) for v in node["enum"])
    kinds = node.get("type")
    if kinds is None and "anyOf" in node:
        kinds = sorted({resolve(schema, n).get("type", "string") for n in node["anyOf"]})
    if kinds is None and "oneOf" in node:
        kinds = [resolve(schema, n).get("type") for n in node["oneOf"]]
    if kinds is None:
        kinds = {bool: "boolean", int: "integer", str: "string", list: "array", dict: "object",
                 type(None): "null"}.get(type(value), "")
    return " \\| ".join(kinds) if isinstance(kinds, list) else str(kinds)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def describe(lines: list[str]) -> str:
    """A comment block as one table cell: prose joined into sentences, indented example lines
    (two spaces or more after the `#`) as code, one per line."""
    parts: list[str] = []
    prose: list[str] = []
    for line in lines:
        if line.startswith("  "):
            if prose:
                parts.append(" ".join(prose))
                prose = []
            parts.append("`" + line.rstrip().replace("`", "'") + "`")
        else:
            prose.append(line.strip())
    if prose:
        parts.append(" ".join(prose))
    return "<br>".join(cell(p) for p in parts)


def leaves(values: Any, comments: dict[str, list[str]], path: list[str]):
    """(path, value) of every documented setting: a map with keys is walked into, anything else
    (a scalar, a list, an empty map) is one setting."""
    if isinstance(values, dict) and values and (not path or any(
            comments.get(".".join(path + [k])) for k in values)):
        for key, value in values.items():
            yield from leaves(value, comments, path + [key])
    else:
        yield path, values


def values_table(values_text: str, schema: dict[str, Any]) -> str:
    """One row per setting; a group whose settings are listed one by one (a map with commented
    keys) gets a row of its own comment before its first setting."""
    values = yaml.safe_load(values_text)
    comments = value_comments(values_text)
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    groups_shown: set[str] = set()
    for path, value in leaves(values, comments, []):
        for depth in range(1, len(path)):
            group = ".".join(path[:depth])
            if group not in groups_shown and comments.get(group):
                rows.append(f"| `{group}` | object | | {describe(comments[group])} |")
                groups_shown.add(group)
        dotted = ".".join(path)
        default = json.dumps(value, ensure_ascii=False)
        text = comments.get(dotted) or []
        node = schema_at(schema, path)
        if not text and node.get("description"):
            text = [node["description"]]
        rows.append(f"| `{dotted}` | {type_of(schema, node, value)} | `{cell(default)}` | "
                    f"{describe(text)} |")
    return "\n".join(rows) + "\n"


def readme(template: str, chart: dict[str, Any], values_text: str, schema: dict[str, Any]) -> str:
    fields = {
        "name": chart["name"],
        "description": chart["description"],
        "version": chart["version"],
        "appVersion": chart["appVersion"],
        "kubeVersion": chart["kubeVersion"],
        "home": chart.get("home", ""),
        "sources": "\n".join(f"- <{s}>" for s in chart.get("sources", [])),
        "values": values_table(values_text, schema).rstrip("\n"),
    }
    text = template
    for key, value in fields.items():
        text = text.replace("{{ " + key + " }}", value)
    leftover = re.findall(r"\{\{ \w+ \}\}", text)
    if leftover:
        raise ValueError(f"README.tpl.md: unknown placeholders {leftover}")
    return text


def generated(policy_schema: dict[str, Any]) -> dict[Path, str]:
    """Every generated file's expected content."""
    schema = embed_policy_schema(json.loads(SCHEMA_FILE.read_text()), policy_schema)
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    text = readme(README_TEMPLATE.read_text(), chart, (CHART_DIR / "values.yaml").read_text(),
                  schema)
    return {SCHEMA_FILE: dump_json(schema), README_FILE: text}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} POLICY_SCHEMA_JSON (the output of `bouncer schema`)",
              file=sys.stderr)
        return 2
    policy_schema = json.loads(Path(argv[1]).read_text())
    for path, content in generated(policy_schema).items():
        changed = not path.exists() or path.read_text() != content
        path.write_text(content)
        print(f"{path.name}: {'updated' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
