"""values.schema.json: a valid draft-07 schema that accepts the defaults and real-world overrides
and rejects bad values, both in Helm and in any standard JSON Schema validator."""

from __future__ import annotations

import json

import helm_python as helm
import jsonschema
import pytest
import yaml

from conftest import CHART_DIR, render

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART_DIR / "values.yaml").read_text())

BAD = {
    "unknown-top-level-key": {"schedules": "* * * * *"},
    "unknown-nested-key": {"rbac": {"namespace": ["a"]}},
    "output-format": {"output": "xml"},
    "dryRun-string": {"dryRun": "true"},
    "dryRun-number": {"dryRun": 1},
    "negative-success-history": {"successfulJobsHistoryLimit": -1},
    "negative-failed-history": {"failedJobsHistoryLimit": -3},
    "history-not-int": {"failedJobsHistoryLimit": "3"},
    "namespaces-string": {"rbac": {"namespaces": "team-a"}},
    "namespaces-numbers": {"rbac": {"namespaces": [1, 2]}},
    "namespaces-invalid-name": {"rbac": {"namespaces": ["Team_A"]}},
    "namespaces-duplicated": {"rbac": {"namespaces": ["a", "a"]}},
    "schedule-four-fields": {"schedule": "*/15 * * *"},
    "schedule-number": {"schedule": 15},
    "maxBounces-zero": {"maxBounces": 0},
    "maxBounces-string": {"maxBounces": "3"},
    "rolloutTimeout-no-unit": {"rolloutTimeout": "600"},
    "activeDeadline-zero": {"activeDeadlineSeconds": 0},
    "pullPolicy": {"image": {"pullPolicy": "Sometimes"}},
    "image-repository-empty": {"image": {"repository": ""}},
    "digest-malformed": {"image": {"digest": "latest"}},
    "eviction-enabled-string": {"eviction": {"enabled": "no"}},
    "toolhive-enabled-string": {"toolhive": {"enabled": "yes"}},
    "lease-name-invalid": {"lease": {"name": "Bouncer Lock"}},
    "policies-bad-file-name": {"policies": {"nightly": "kind: BouncePolicy\n"}},
    "policies-bad-content": {"policies": {"nightly.yaml": 42}},
    "policies-list-of-strings": {"policies": ["kind: BouncePolicy"]},
    "policies-list-item-missing-spec": {"policies": [{"apiVersion": "bouncer.dev/v1alpha1",
                                                      "kind": "BouncePolicy",
                                                      "metadata": {"name": "x"}}]},
    "resources-bad-quantity": {"resources": {"limits": {"memory": "lots"}}},
    "extraEnv-not-list": {"extraEnv": {"RUST_LOG": "debug"}},
    "extraEnv-missing-name": {"extraEnv": [{"value": "debug"}]},
    "serviceAccount-create-string": {"serviceAccount": {"create": "yes"}},
    "notify-when": {"notify": {"when": "sometimes"}},
    "notify-retries-too-many": {"notify": {"retries": 6}},
    "notify-timeout-no-unit": {"notify": {"timeout": "5"}},
    "notify-mountAs": {"notify": {"mountAs": "volume"}},
    "notify-secret-name-invalid": {"notify": {"slack": {"secretName": "Slack URL"}}},
    "notify-url-as-value": {"notify": {"slack": {"url": "https://hooks.slack.com/x"}}},
    "pushgateway-no-scheme": {"metrics": {"pushgatewayUrl": "pushgateway:9091"}},
    "prometheusRule-missedRuns-zero": {"prometheusRule": {"missedRuns": 0}},
    "prometheusRule-interval-string": {"prometheusRule": {"scheduleIntervalSeconds": "15m"}},
}

GOOD = {
    "defaults": {},
    "dry-run-namespaced": {"dryRun": True, "rbac": {"namespaces": ["team-a", "kube-system"]}},
    "macro-schedule": {"schedule": "@hourly"},
    "tz-schedule": {"schedule": "CRON_TZ=Europe/Berlin 0 3 * * *"},
    "durations": {"rolloutTimeout": "1h 30m", "activeDeadlineSeconds": 7200},
    "history-zero": {"successfulJobsHistoryLimit": 0, "failedJobsHistoryLimit": 0},
    "digest": {"image": {"repository": "ghcr.io/x/bouncer", "digest": "sha256:" + "0" * 64}},
    "policies-map": {"policies": {"a.yaml": "kind: BouncePolicy\n", "b.yml": {"kind": "BouncePolicy"}}},
    "policies-list": {"policies": [{"apiVersion": "bouncer.dev/v1alpha1", "kind": "BouncePolicy",
                                    "metadata": {"name": "x"}, "spec": {}}]},
    "extraEnv": {"extraEnv": [{"name": "A", "value": "1"},
                              {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
    "resources-numbers": {"resources": {"requests": {"cpu": 0.5, "memory": "1.5Gi"}}},
    "global": {"global": {"imageRegistry": "x"}},
    "notifications": {"clusterName": "prod-eu",
                      "notify": {"when": "always", "timeout": "1500ms", "retries": 0, "mountAs": "env",
                                 "slack": {"secretName": "bouncer-notify", "secretKey": "slack-url"},
                                 "webhook": {"secretName": "hooks", "secretKey": "report.url"}},
                      "metrics": {"pushgatewayUrl": "http://pushgateway.monitoring:9091"},
                      "prometheusRule": {"enabled": True, "missedRuns": 2,
                                         "scheduleIntervalSeconds": 3600,
                                         "labels": {"release": "kube-prometheus-stack"},
                                         "alertLabels": {"severity": "critical", "team": "ops"}}},
}


def test_schema_is_valid_draft_07():
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert SCHEMA["additionalProperties"] is False
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_schema_and_values_yaml_describe_the_same_keys():
    assert set(SCHEMA["properties"]) - {"global"} == set(DEFAULTS)


def test_defaults_pass_both_validators():
    jsonschema.Draft7Validator(SCHEMA).validate(DEFAULTS)
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(chart.values)


@pytest.mark.parametrize("values", BAD.values(), ids=BAD.keys())
def test_bad_values_are_rejected(values):
    with helm.Chart.load(CHART_DIR) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)
    # An install renders with the same check, so a bad value never reaches a manifest.
    with pytest.raises(helm.HelmValuesError):
        render(values)
    with helm.Chart.load(CHART_DIR) as chart:
        merged = chart.merge_values(values)
    errors = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(merged))
    assert errors, merged


@pytest.mark.parametrize("values", GOOD.values(), ids=GOOD.keys())
def test_good_values_are_accepted(values):
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(values)
        merged = chart.merge_values(values)
    jsonschema.Draft7Validator(SCHEMA).validate(merged)
    assert render(values)
