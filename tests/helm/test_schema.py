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

POLICY = {
    "apiVersion": "bouncer.dev/v1alpha1",
    "kind": "BouncePolicy",
    "metadata": {"name": "nightly"},
    "spec": {
        "target": {"namespaces": ["team-a"], "selector": {"matchLabels": {"app": "api"}},
                   "kinds": ["Deployment"]},
        "triggers": {"schedule": {"cron": "0 3 * * *"}},
        "cooldown": "6h",
    },
}

# Every example policy the repository ships, as objects.
EXAMPLES = [doc for path in sorted((CHART_DIR.parents[1] / "policies").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]

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
    # The time zone goes in timeZone: current API servers refuse a TZ prefix in the schedule.
    "schedule-cron-tz-prefix": {"schedule": "CRON_TZ=Europe/Berlin 0 3 * * *"},
    "schedule-cron-tz-prefix-four-fields": {"schedule": "CRON_TZ=UTC 0 3 * *"},
    "schedule-tz-prefix": {"schedule": "TZ=UTC 0 3 * * *"},
    "timeZone-spaces": {"timeZone": "Europe Berlin"},
    "timeZone-number": {"timeZone": 1},
    "ttl-negative": {"ttlSecondsAfterFinished": -1},
    "ttl-string": {"ttlSecondsAfterFinished": "1h"},
    "extraArgs-number": {"extraArgs": ["--max-bounces", 5]},
    "extraArgs-string": {"extraArgs": "--dry-run"},
    "extraVolumes-no-name": {"extraVolumes": [{"emptyDir": {}}]},
    "extraVolumeMounts-no-path": {"extraVolumeMounts": [{"name": "x"}]},
    "extraVolumeMounts-relative-path": {"extraVolumeMounts": [{"name": "x", "mountPath": "etc"}]},
    "envFrom-unknown-key": {"envFrom": [{"configMap": {"name": "x"}}]},
    "securityContext-typo": {"securityContext": {"runAsUserr": 1000}},
    "securityContext-user-string": {"securityContext": {"runAsUser": "65532"}},
    "podSecurityContext-negative-user": {"podSecurityContext": {"runAsUser": -1}},
    "podSecurityContext-container-only-key": {"podSecurityContext": {"readOnlyRootFilesystem": True}},
    "policiesConfigMap-invalid": {"policiesConfigMap": "My Policies"},
    # Policies given as objects are checked against the policy schema (`bouncer schema`).
    "policy-misspelt-field": {"policies": [{**POLICY, "spec": {**POLICY["spec"], "cooldwn": "6h"}}]},
    "policy-wrong-api-version": {"policies": [{**POLICY, "apiVersion": "bouncer.dev/v1"}]},
    "policy-wrong-type": {"policies": [{**POLICY, "spec": {**POLICY["spec"], "target": {
        **POLICY["spec"]["target"], "kinds": "Deployment"}}}]},
    "policy-in-map-misspelt": {"policies": {"p.yaml": {**POLICY, "spec": {
        **POLICY["spec"], "triggers": {"schedule": {"crn": "0 3 * * *"}}}}}},
    "policy-missing-triggers": {"policies": [{**POLICY, "spec": {"target": POLICY["spec"]["target"]}}]},
}

GOOD = {
    "defaults": {},
    "dry-run-namespaced": {"dryRun": True, "rbac": {"namespaces": ["team-a", "kube-system"]}},
    "macro-schedule": {"schedule": "@hourly"},
    "timeZone": {"schedule": "0 3 * * *", "timeZone": "Europe/Berlin"},
    "timeZone-utc": {"timeZone": "UTC"},
    "timeZone-three-parts": {"timeZone": "America/Argentina/Buenos_Aires"},
    "ttl": {"ttlSecondsAfterFinished": 0},
    "extras": {"extraArgs": ["--max-bounces", "5"], "envFrom": [{"secretRef": {"name": "s"}}],
               "extraVolumes": [{"name": "team-policies", "configMap": {"name": "team"}}],
               "extraVolumeMounts": [{"name": "team-policies", "mountPath": "/etc/team"}]},
    "openshift-restricted": {"podSecurityContext": {"runAsUser": None, "runAsGroup": None},
                             "securityContext": {"runAsUser": None, "runAsGroup": None}},
    "securityContext-other-user": {"podSecurityContext": {"runAsUser": 1000, "fsGroup": 1000},
                                   "securityContext": {"runAsUser": 1000}},
    "policiesConfigMap": {"policiesConfigMap": "team-policies"},
    "policies-examples-as-list": {"policies": EXAMPLES},
    "policies-examples-as-map": {"policies": {f"p{i}.yaml": p for i, p in enumerate(EXAMPLES)}},
    "durations": {"rolloutTimeout": "1h 30m", "activeDeadlineSeconds": 7200},
    "history-zero": {"successfulJobsHistoryLimit": 0, "failedJobsHistoryLimit": 0},
    "digest": {"image": {"repository": "ghcr.io/x/bouncer", "digest": "sha256:" + "0" * 64}},
    # A string is only read by the run; an object is checked here.
    "policies-map": {"policies": {"a.yaml": "kind: BouncePolicy\n", "b.yml": POLICY}},
    "policies-list": {"policies": [POLICY]},
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


def test_a_broken_policy_is_named_by_its_path_in_the_install_error():
    bad = {"policies": [POLICY, {**POLICY, "spec": {**POLICY["spec"], "cooldwn": "6h"}}]}
    with pytest.raises(helm.HelmValuesError) as err:
        render(bad)
    assert "/policies/1/spec" in str(err.value), err.value
    assert "cooldwn" in str(err.value), err.value

