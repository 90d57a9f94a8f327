"""The Prometheus source in the chart: the URL and timeout as BOUNCER_PROMETHEUS_* variables, and a
bearer token and CA bundle as files from a Secret the kubelet mounts (bouncer cannot read Secrets)."""

from __future__ import annotations

import helm_python as helm
import pytest

from conftest import V1_30, container, env_of, manifests, one, render


def cronjob(values=None):
    return one(manifests(render(values, **V1_30)), "CronJob")


def test_no_prometheus_by_default():
    cj = cronjob()
    assert not {k for k in env_of(cj) if "PROMETHEUS" in k}
    assert "prometheus" not in [m["name"] for m in container(cj)["volumeMounts"]]


def test_url_timeout_token_and_ca():
    cj = cronjob({"prometheus": {"url": "https://prometheus.monitoring:9091", "timeout": "3s",
                                 "secretName": "prom-client", "bearerTokenKey": "token", "caKey": "ca.pem"}})
    env = env_of(cj)
    assert {k: v for k, v in env.items() if "PROMETHEUS" in k} == {
        "BOUNCER_PROMETHEUS_URL": "https://prometheus.monitoring:9091",
        "BOUNCER_PROMETHEUS_TIMEOUT": "3s",
        "BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE": "/etc/bouncer/prometheus/token",
        "BOUNCER_PROMETHEUS_CA_FILE": "/etc/bouncer/prometheus/ca.crt",
    }
    mount = next(m for m in container(cj)["volumeMounts"] if m["name"] == "prometheus")
    assert mount == {"name": "prometheus", "mountPath": "/etc/bouncer/prometheus", "readOnly": True}
    volumes = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["volumes"]
    volume = next(v for v in volumes if v["name"] == "prometheus")
    assert volume["secret"] == {"secretName": "prom-client", "items": [
        {"key": "token", "path": "token"}, {"key": "ca.pem", "path": "ca.crt"}]}


def test_url_alone_mounts_nothing():
    cj = cronjob({"prometheus": {"url": "http://prometheus.monitoring:9090"}})
    env = env_of(cj)
    assert env["BOUNCER_PROMETHEUS_TIMEOUT"] == "10s"
    assert "BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE" not in env and "BOUNCER_PROMETHEUS_CA_FILE" not in env
    assert "prometheus" not in [m["name"] for m in container(cj)["volumeMounts"]]


@pytest.mark.parametrize("values", [
    {"prometheus": {"url": "prometheus:9090"}},
    {"prometheus": {"timeout": "10"}},
    {"prometheus": {"token": "abc"}},
])
def test_bad_values_are_rejected(values):
    with pytest.raises(helm.HelmError):
        render(values, **V1_30)


def test_a_bearer_token_is_refused_with_an_http_url():
    values = {"prometheus": {"url": "http://prometheus.monitoring:9090", "secretName": "prom-client",
                             "bearerTokenKey": "token"}}
    with pytest.raises(helm.HelmError, match="prometheus.bearerTokenKey: a bearer token is sent only over https"):
        render(values, **V1_30)
    # A CA bundle alone over http is no secret; the token over https is fine.
    render({"prometheus": {**values["prometheus"], "bearerTokenKey": "", "caKey": "ca.pem"}}, **V1_30)
    render({"prometheus": {**values["prometheus"], "url": "https://prometheus.monitoring:9090"}}, **V1_30)
