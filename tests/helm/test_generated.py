"""The chart's generated files are current (scripts/chart-gen rewrites them), the generator does
what it says, and Chart.yaml carries the metadata chart indexes show."""

from __future__ import annotations

import json
import subprocess

import jsonschema
import yaml

import chartgen
from conftest import CHART_DIR
from test_cluster import bouncer_binary

STALE = "stale: run scripts/chart-gen and commit the result"


def current_policy_schema() -> dict:
    run = subprocess.run([bouncer_binary(), "schema"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_values_schema_embeds_the_policy_schema_bouncer_prints():
    expected = chartgen.generated(current_policy_schema())[chartgen.SCHEMA_FILE]
    assert chartgen.SCHEMA_FILE.read_text() == expected, f"values.schema.json is {STALE}"


def test_readme_is_generated_from_values_yaml():
    expected = chartgen.readme(chartgen.README_TEMPLATE.read_text(),
                               yaml.safe_load((CHART_DIR / "Chart.yaml").read_text()),
                               (CHART_DIR / "values.yaml").read_text(),
                               json.loads(chartgen.SCHEMA_FILE.read_text()))
    assert chartgen.README_FILE.read_text() == expected, f"helm/bouncer/README.md is {STALE}"


def test_readme_lists_every_value_with_its_default_and_comment():
    text = chartgen.README_FILE.read_text()
    assert "| `schedule` | string | `\"*/15 * * * *\"` | CronJob schedule:" in text
    assert "| `timeZone` | string | `\"\"` | IANA time zone" in text
    assert "| `notify.slack.secretName` | string | `\"\"` | The Secret's name" in text
    assert "| `securityContext` | object | `{\"runAsNonRoot\": true, \"runAsUser\": 65532," in text
    assert "| `ttlSecondsAfterFinished` | integer \\| null | `null` |" in text
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for key in values:
        assert f"| `{key}" in text, key


def test_comment_parser_reads_blocks_and_nesting():
    text = ("# header\n\n# About a.\na:\n  # About b,\n  # two lines.\n  b: 1\n  c: [x]\n"
            "  e: 3\n\n  f: 4\n# Example:\n#   d: 2\nd: {}\n")
    assert chartgen.value_comments(text) == {
        "a": ["About a."], "a.b": ["About b,", "two lines."], "a.c": ["See `a.b`."],
        "a.e": ["See `a.b`."], "a.f": [], "d": ["Example:", "  d: 2"]}
    assert chartgen.describe(["Example:", "  d: 2 | 3"]) == "Example:<br>`  d: 2 \\| 3`"


def test_embedding_moves_defs_and_rewrites_references():
    policy = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "P",
              "properties": {"spec": {"$ref": "#/$defs/Spec"}},
              "$defs": {"Spec": {"type": "object", "properties": {"t": {"$ref": "#/$defs/T"}}},
                        "T": {"type": "string"}}}
    old = {"definitions": {"keep": {"type": "string"}, "bouncePolicy.Gone": {}},
           "properties": {"p": {"$ref": "#/definitions/bouncePolicy"}}}
    out = chartgen.embed_policy_schema(old, policy)
    assert out["definitions"] == {
        "keep": {"type": "string"},
        "bouncePolicy": {"title": "P", "properties": {"spec": {"$ref": "#/definitions/bouncePolicy.Spec"}}},
        "bouncePolicy.Spec": {"type": "object",
                              "properties": {"t": {"$ref": "#/definitions/bouncePolicy.T"}}},
        "bouncePolicy.T": {"type": "string"},
    }
    validator = jsonschema.Draft7Validator({**out, "$schema": "http://json-schema.org/draft-07/schema#"})
    assert validator.is_valid({"p": {"spec": {"t": "x"}}})
    assert not validator.is_valid({"p": {"spec": {"t": 1}}})


def test_chart_yaml_metadata():
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["home"].startswith("https://")
    assert chart["sources"] and all(s.startswith("https://") for s in chart["sources"])
    assert {"restart", "memory-leak", "cronjob"} <= set(chart["keywords"])
    assert chart["maintainers"] and all(m["name"] for m in chart["maintainers"])
    # The template stays out of the packaged chart; the README goes in (helm show readme).
    assert "README.tpl.md" in (CHART_DIR / ".helmignore").read_text().splitlines()
