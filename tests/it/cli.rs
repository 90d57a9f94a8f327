//! The command line as a user meets it: exit codes and messages for bad input, before any
//! cluster access (these tests point KUBECONFIG at nothing, so a cluster call would show as exit 3).

use std::process::Output;

fn bouncer(args: &[&str], env: &[(&str, &str)]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_bouncer"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .envs(env.iter().copied())
        .output()
        .expect("bouncer starts")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const GOOD: &str = "apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata: {name: ok}
spec:
  target: {selector: {matchLabels: {app: web}}}
  triggers: {memory: {above: 1Gi}}
";

#[test]
fn invalid_policies_exit_2_naming_file_document_and_field_without_touching_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("good.yaml"), GOOD).unwrap();
    let bad = GOOD
        .replace("name: ok", "name: bad")
        .replace("above: 1Gi", "above: lots");
    std::fs::write(dir.path().join("bad.yaml"), format!("{GOOD}---\n{bad}")).unwrap();
    let policies = dir.path().to_str().unwrap();
    for cmd in [
        &["validate", policies][..],
        &["plan", "--policies", policies],
        &["run", "--policies", policies],
    ] {
        let out = bouncer(cmd, &[]);
        let msg = text(&out);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {msg}");
        assert!(msg.contains("bad.yaml"), "{msg}");
        assert!(msg.contains("document 2"), "{msg}");
        assert!(msg.contains("spec.triggers.memory.above"), "{msg}");
        assert!(msg.contains("lots"), "{msg}");
        // The duplicate name across files is reported too (good.yaml and bad.yaml both hold "ok").
        assert!(
            msg.contains("duplicate") || msg.contains("already"),
            "{msg}"
        );
    }
}

#[test]
fn bad_settings_exit_2_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), GOOD).unwrap();
    let policies = dir.path().to_str().unwrap();
    let out = bouncer(
        &["plan", "--policies", policies],
        &[("BOUNCER_ROLLOUT_TIMEOUT", "soon")],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("BOUNCER_ROLLOUT_TIMEOUT"),
        "{}",
        text(&out)
    );
    let out = bouncer(
        &["plan", "--policies", policies],
        &[("BOUNCER_MAX_BOUNCES", "many")],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).to_lowercase().contains("max_bounces"),
        "{}",
        text(&out)
    );
}

/// A Prometheus bearer token is never sent over plain http: the run refuses to start, before any
/// cluster call, whether the token comes from a flag or the environment.
#[test]
fn a_prometheus_bearer_token_with_an_http_url_exits_2_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), GOOD).unwrap();
    std::fs::write(dir.path().join("token"), "secret").unwrap();
    let policies = dir.path().to_str().unwrap();
    let token = dir.path().join("token");
    let token = token.to_str().unwrap();
    let http = [(
        "BOUNCER_PROMETHEUS_URL",
        "http://prometheus.monitoring:9090",
    )];
    for (args, env) in [
        (
            vec!["run", "--policies", policies],
            vec![http[0], ("BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE", token)],
        ),
        (
            vec![
                "plan",
                "--policies",
                policies,
                "--prometheus-bearer-token-file",
                token,
            ],
            http.to_vec(),
        ),
    ] {
        let out = bouncer(&args, &env);
        let msg = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {msg}");
        assert!(
            msg.contains("BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE"),
            "{msg}"
        );
        assert!(msg.contains("only over https"), "{msg}");
    }
    // The same token over https passes the settings (and fails later, at the absent cluster).
    let out = bouncer(
        &["plan", "--policies", policies],
        &[
            (
                "BOUNCER_PROMETHEUS_URL",
                "https://prometheus.monitoring:9090",
            ),
            ("BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE", token),
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
}

#[test]
fn unreachable_cluster_exits_3_and_valid_input_passes_validate() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), GOOD).unwrap();
    let policies = dir.path().to_str().unwrap();
    let out = bouncer(&["validate", policies], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("1 valid policies: ok"));
    let out = bouncer(&["plan", "--policies", policies], &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
}

#[test]
fn schema_is_json_schema_for_the_policy_document() {
    let out = bouncer(&["schema"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(schema["properties"]["spec"].is_object(), "{schema:#}");
    assert!(schema.to_string().contains("bouncer.dev/v1alpha1"));
}
