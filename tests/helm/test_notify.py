"""Notifications and metrics in the chart: the webhook URLs from Secrets (as files or env, never
read by bouncer's ServiceAccount), the Pushgateway URL and cluster name, and the PrometheusRule,
rendered only where the Prometheus Operator's CRD is served, from files/prometheus-rules.yaml."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from conftest import CHART_DIR, NAMESPACE, V1_30, container, env_of, manifests, notes, objects_of, one, render

PROM_RULE_API = "monitoring.coreos.com/v1/PrometheusRule"
WITH_OPERATOR = {**V1_30, "api_versions": V1_30["api_versions"] + ["monitoring.coreos.com/v1", PROM_RULE_API]}
RULES_FILE = CHART_DIR / "files" / "prometheus-rules.yaml"
NOTIFY_ENV = {"BOUNCER_NOTIFY_ON", "BOUNCER_NOTIFY_TIMEOUT", "BOUNCER_NOTIFY_RETRIES"}

SECRETS = {
    "notify": {"slack": {"secretName": "bouncer-notify"},
               "teams": {"secretName": "bouncer-teams"},
               "webhook": {"secretName": "automation", "secretKey": "url"}},
}
RULE_VALUES = {
    "metrics": {"pushgatewayUrl": "http://pushgateway.monitoring:9091"},
    "prometheusRule": {"enabled": True},
}


def pod_spec(cronjob):
    return cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def cronjob(values=None, **caps):
    return one(manifests(render(values, **(caps or V1_30))), "CronJob")


def test_defaults_notify_nobody():
    cj = cronjob()
    env = env_of(cj)
    assert not {k for k in env if "NOTIFY" in k or "PUSHGATEWAY" in k or "CLUSTER_NAME" in k}, env
    assert [v["name"] for v in pod_spec(cj)["volumes"]] == ["policies", "tmp"]
    assert not objects_of(manifests(render(**WITH_OPERATOR)), "PrometheusRule")


def test_webhook_urls_are_files_from_a_projected_secret_volume():
    cj = cronjob(SECRETS)
    env = env_of(cj)
    assert env["BOUNCER_NOTIFY_SLACK_URL_FILE"] == "/etc/bouncer/notify/slack-url"
    assert env["BOUNCER_NOTIFY_TEAMS_URL_FILE"] == "/etc/bouncer/notify/teams-url"
    assert env["BOUNCER_NOTIFY_WEBHOOK_URL_FILE"] == "/etc/bouncer/notify/webhook-url"
    assert not {"BOUNCER_NOTIFY_SLACK_URL", "BOUNCER_NOTIFY_TEAMS_URL", "BOUNCER_NOTIFY_WEBHOOK_URL"} & set(env)
    assert {k: env[k] for k in NOTIFY_ENV} == {
        "BOUNCER_NOTIFY_ON": "changes", "BOUNCER_NOTIFY_TIMEOUT": "5s", "BOUNCER_NOTIFY_RETRIES": "2"}
    mount = next(m for m in container(cj)["volumeMounts"] if m["name"] == "notify")
    assert mount == {"name": "notify", "mountPath": "/etc/bouncer/notify", "readOnly": True}
    volume = next(v for v in pod_spec(cj)["volumes"] if v["name"] == "notify")
    assert volume["projected"]["sources"] == [
        {"secret": {"name": "bouncer-notify", "items": [{"key": "slack-url", "path": "slack-url"}]}},
        {"secret": {"name": "bouncer-teams", "items": [{"key": "teams-url", "path": "teams-url"}]}},
        {"secret": {"name": "automation", "items": [{"key": "url", "path": "webhook-url"}]}},
    ]
    # The root filesystem stays read-only; only the Secret's files appear.
    assert container(cj)["securityContext"]["readOnlyRootFilesystem"] is True


def test_webhook_urls_as_env_come_from_secret_key_refs():
    values = {"notify": {**SECRETS["notify"], "mountAs": "env", "when": "always",
                         "timeout": "2s", "retries": 0}}
    cj = cronjob(values)
    env = env_of(cj)
    assert env["BOUNCER_NOTIFY_SLACK_URL"] == {"secretKeyRef": {"name": "bouncer-notify", "key": "slack-url"}}
    assert env["BOUNCER_NOTIFY_TEAMS_URL"] == {"secretKeyRef": {"name": "bouncer-teams", "key": "teams-url"}}
    assert env["BOUNCER_NOTIFY_WEBHOOK_URL"] == {"secretKeyRef": {"name": "automation", "key": "url"}}
    assert not {k for k in env if k.endswith("_FILE")}
    assert "notify" not in [v["name"] for v in pod_spec(cj)["volumes"]]
    assert {k: env[k] for k in NOTIFY_ENV} == {
        "BOUNCER_NOTIFY_ON": "always", "BOUNCER_NOTIFY_TIMEOUT": "2s", "BOUNCER_NOTIFY_RETRIES": "0"}


def test_only_the_slack_secret_mounts_only_its_file():
    cj = cronjob({"notify": {"slack": {"secretName": "s"}}})
    env = env_of(cj)
    assert "BOUNCER_NOTIFY_SLACK_URL_FILE" in env and "BOUNCER_NOTIFY_WEBHOOK_URL_FILE" not in env
    volume = next(v for v in pod_spec(cj)["volumes"] if v["name"] == "notify")
    assert [s["secret"]["name"] for s in volume["projected"]["sources"]] == ["s"]


def test_pushgateway_and_cluster_name():
    env = env_of(cronjob({"clusterName": "prod-eu", **RULE_VALUES}))
    assert env["BOUNCER_CLUSTER_NAME"] == "prod-eu"
    assert env["BOUNCER_PUSHGATEWAY_URL"] == "http://pushgateway.monitoring:9091"
    # Timeout and retries bound the push too.
    assert NOTIFY_ENV <= set(env)
    assert "BOUNCER_NOTIFY_SLACK_URL_FILE" not in env


def test_notes_name_the_targets():
    text = notes(render({**SECRETS, **RULE_VALUES}, **WITH_OPERATOR))
    assert "the chat webhook (Secret bouncer-notify), the Teams webhook (Secret bouncer-teams), " \
           "the JSON webhook (Secret automation), " \
           "the Pushgateway http://pushgateway.monitoring:9091" in text
    assert "no alert rule was installed" not in text


# --- the PrometheusRule ----------------------------------------------------------------------


def rule(values=None, **caps):
    return one(manifests(render({**RULE_VALUES, **(values or {})}, **(caps or WITH_OPERATOR))),
               "PrometheusRule")


def expected_spec(seconds: int, alert_labels: dict) -> dict:
    """files/prometheus-rules.yaml as the chart must render it."""
    spec = yaml.safe_load(RULES_FILE.read_text().replace("NO_SUCCESS_SECONDS", str(seconds)))
    for group in spec["groups"]:
        for r in group["rules"]:
            r["labels"] = {**r.get("labels", {}), **alert_labels}
    return spec


def test_the_rule_is_the_rules_file_with_its_threshold():
    pr = rule()
    assert pr["apiVersion"] == "monitoring.coreos.com/v1"
    assert pr["metadata"]["namespace"] == NAMESPACE
    assert pr["spec"] == expected_spec(3 * 900, {"severity": "warning"})
    alerts = {r["alert"]: r for r in pr["spec"]["groups"][0]["rules"]}
    assert set(alerts) == {"BouncerNoSuccessfulRun", "BouncerBounceFailed", "BouncerBreakerOpen"}
    assert "> 2700" in alerts["BouncerNoSuccessfulRun"]["expr"]
    assert "NO_SUCCESS_SECONDS" not in yaml.safe_dump(pr)
    assert '{{ "2700" | humanizeDuration }}' in alerts["BouncerNoSuccessfulRun"]["annotations"]["description"]
    assert 'result=~"failed|reverted|interrupted"' in alerts["BouncerBounceFailed"]["expr"]
    assert "bouncer_last_run_breakers_open" in alerts["BouncerBreakerOpen"]["expr"]


def test_rule_values_set_the_threshold_and_labels():
    pr = rule({"prometheusRule": {"enabled": True, "missedRuns": 4, "scheduleIntervalSeconds": 600,
                                  "labels": {"release": "kube-prometheus-stack"},
                                  "alertLabels": {"severity": "critical", "team": "ops"}}})
    assert pr["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert pr["metadata"]["labels"]["app.kubernetes.io/name"] == "bouncer"
    assert pr["spec"] == expected_spec(2400, {"severity": "critical", "team": "ops"})


def test_no_rule_without_the_crd_and_the_notes_say_so():
    rendered = render(RULE_VALUES, **V1_30)
    assert not objects_of(manifests(rendered), "PrometheusRule")
    assert "does not serve monitoring.coreos.com/v1\nPrometheusRule" in notes(rendered)


def test_no_rule_unless_enabled():
    rendered = render({"metrics": RULE_VALUES["metrics"]}, **WITH_OPERATOR)
    assert not objects_of(manifests(rendered), "PrometheusRule")


def test_the_rule_needs_the_pushgateway():
    with pytest.raises(helm.HelmError, match="prometheusRule.enabled needs metrics.pushgatewayUrl"):
        render({"prometheusRule": {"enabled": True}}, **WITH_OPERATOR)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus) not installed")
def test_promtool_accepts_the_rendered_rules(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule()["spec"]))
    out = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 3 rules found" in out.stdout, out.stdout
