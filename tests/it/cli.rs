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

/// Checked-in help text: a change to a flag or a heading shows in review. Regenerate with
/// `BOUNCER_TEST_BLESS=1 cargo test --test it cli::help` after a deliberate change.
#[test]
fn help_output_matches_the_golden_text() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/help");
    let bless = std::env::var_os("BOUNCER_TEST_BLESS").is_some();
    let mut stale = Vec::new();
    for cmd in [
        "",
        "validate",
        "plan",
        "run",
        "explain",
        "schema",
        "completion",
        "version",
    ] {
        let args: Vec<&str> = [cmd, "--help"]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let out = bouncer(&args, &[]);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        let name = if cmd.is_empty() { "bouncer" } else { cmd };
        let file = dir.join(format!("{name}.txt"));
        let got = String::from_utf8(out.stdout).unwrap();
        if bless {
            std::fs::write(&file, &got).unwrap();
        } else if std::fs::read_to_string(&file).ok().as_deref() != Some(got.as_str()) {
            stale.push(format!("{}:\n{got}", file.display()));
        }
    }
    assert!(
        stale.is_empty(),
        "help differs from the golden text (BOUNCER_TEST_BLESS=1 to regenerate):\n{}",
        stale.join("\n")
    );
}

#[test]
fn help_groups_flags_by_topic_with_examples_and_exit_codes() {
    let help = text(&bouncer(&["run", "--help"], &[]));
    for heading in [
        "Cluster:",
        "Policies:",
        "Output:",
        "Prometheus:",
        "Logging:",
        "Run:",
    ] {
        assert!(help.contains(heading), "{heading} in {help}");
    }
    assert!(
        help.contains("Examples:") && help.contains("Exit codes:"),
        "{help}"
    );
    assert!(
        help.contains("  3  cluster unreachable or forbidden"),
        "{help}"
    );
    // Offline commands carry no cluster flags, and refuse them.
    let help = text(&bouncer(&["validate", "--help"], &[]));
    assert!(
        !help.contains("--context") && !help.contains("Cluster:"),
        "{help}"
    );
    let out = bouncer(&["schema", "--context", "x"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// A typo in a setting's name must never mean the setting's default: BOUNCER_DRYRUN=true
/// would otherwise be a real run. Exit 2 before any cluster call (a call would exit 3 here).
#[test]
fn an_unknown_bouncer_variable_exits_2_naming_the_closest_known_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), GOOD).unwrap();
    let policies = dir.path().to_str().unwrap();
    for (var, closest) in [
        ("BOUNCER_DRYRUN", "BOUNCER_DRY_RUN"),
        ("BOUNCER_DRY_RNU", "BOUNCER_DRY_RUN"),
        ("BOUNCER_NAMESPACE", "BOUNCER_NAMESPACES"),
    ] {
        for args in [
            &["run", "--policies", policies][..],
            &["plan", "--policies", policies],
            &["validate", policies],
        ] {
            let out = bouncer(args, &[(var, "true")]);
            let cmd = args[0];
            let msg = text(&out);
            assert_eq!(out.status.code(), Some(2), "{cmd} {var}: {msg}");
            assert!(
                msg.contains(&format!(
                    "unknown environment variable {var} (did you mean {closest}?)"
                )),
                "{msg}"
            );
        }
    }
    // The test kit's own variables are not settings and do not stop a run: it reaches the
    // (absent) cluster.
    let out = bouncer(
        &["plan", "--policies", policies],
        &[
            ("BOUNCER_CACHE_DIR", "/x"),
            ("BOUNCER_TEST_KUBECONFIG", "/x"),
            ("BOUNCER_DRY_RUN", "true"),
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
}

#[test]
fn validate_reports_json_and_github_annotations_on_the_policy_lines() {
    let dir = tempfile::tempdir().unwrap();
    let bad = GOOD.replace("above: 1Gi", "above: lots");
    let unknown = GOOD.replace("name: ok", "name: typo") + "  cooldwn: 1h\n";
    std::fs::write(
        dir.path().join("bad.yaml"),
        format!("{GOOD}---\n{bad}---\n{unknown}"),
    )
    .unwrap();
    let policies = dir.path().to_str().unwrap();
    let file = dir.path().join("bad.yaml");
    let file = file.to_str().unwrap();

    let out = bouncer(&["validate", "-o", "github", policies], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    // The quantity error comes from validation (no parser location): found by its field, on
    // line 13 (`  triggers: {memory: {above: lots}}` of document 2). The unknown field is where
    // the parser stopped, on its key: line 21.
    assert!(
        lines.iter().any(|l| l.starts_with(&format!("::error file={file},line=13,col=23,title=bouncer%3A policy ok::spec.triggers.memory.above: "))),
        "{stdout}"
    );
    assert!(
        lines.iter().any(
            |l| l.starts_with(&format!("::error file={file},line=21,col=3,"))
                && l.contains("cooldwn")
        ),
        "{stdout}"
    );

    let out = bouncer(&["validate", "-o", "json", policies], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["valid"], false);
    let errors = v["errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e["field"] == "spec.triggers.memory.above"
                && e["line"] == 13
                && e["document"] == 2),
        "{v:#}"
    );

    std::fs::write(dir.path().join("bad.yaml"), GOOD).unwrap();
    let out = bouncer(&["validate", "-o", "json", policies], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        v,
        serde_json::json!({"valid": true, "policies": ["ok"], "errors": []})
    );
    // Without paths, BOUNCER_POLICIES names them.
    let out = bouncer(&["validate"], &[("BOUNCER_POLICIES", policies)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn version_and_completion() {
    let out = bouncer(&["version", "-o", "json"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["kubernetesApi"], "1.36");
    for field in ["gitCommit", "buildDate"] {
        assert!(v[field].as_str().is_some_and(|s| !s.is_empty()), "{v:#}");
    }
    let text_out = String::from_utf8(bouncer(&["version"], &[]).stdout).unwrap();
    assert!(
        text_out.starts_with(&format!("bouncer {}\n", env!("CARGO_PKG_VERSION"))),
        "{text_out}"
    );
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef bouncer"),
        ("fish", "complete -c bouncer"),
    ] {
        let out = bouncer(&["completion", shell], &[]);
        let script = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        assert!(
            script.contains(marker) && script.contains("explain"),
            "{shell}: {script}"
        );
    }
}

/// The kubectl-style cluster flags against the real API server: `--kubeconfig` and `--context`
/// pick the cluster, the context's namespace or `-n` completes `explain deploy/NAME`, `-n`
/// scopes a plan, and `-o yaml` is the JSON report's fields.
#[tokio::test]
async fn kubeconfig_context_namespace_and_kubectl_targets_on_a_real_cluster() {
    use bouncer_testkit::{Kind, TestNs, client, create, deployment, wait_rollout_complete};
    let client = client().await;
    let ns = TestNs::new(&client, "cli").await;
    let n = ns.name();
    create(&client, n, &deployment("api", 1, &[("app", "api")]))
        .await
        .expect("create deployment");
    wait_rollout_complete(
        &client,
        Kind::Deployment,
        n,
        "api",
        std::time::Duration::from_secs(120),
    )
    .await
    .expect("deployment ready");
    let policy = crate::harness::policy(
        "mem",
        n,
        "{app: api}",
        "  triggers:\n    memory: {above: 1Gi}\n",
    );
    let policies = crate::harness::Policies::new(&[("mem.yaml", &policy)]);
    let policies = policies.path();
    let policies = policies.to_str().unwrap();

    // A kubeconfig whose current context points nowhere, and a second context (the test
    // cluster's) with the test namespace as its default.
    let real = &bouncer_testkit::cluster().kubeconfig;
    let mut config: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(real).unwrap()).unwrap();
    let context = config["contexts"][0].clone();
    let mut dead = context.clone();
    dead["name"] = "dead".into();
    dead["context"]["cluster"] = "dead".into();
    let mut good = context;
    good["name"] = "good".into();
    good["context"]["namespace"] = n.into();
    let mut dead_cluster = config["clusters"][0].clone();
    dead_cluster["name"] = "dead".into();
    dead_cluster["cluster"]["server"] = "https://127.0.0.1:1".into();
    config["clusters"]
        .as_sequence_mut()
        .unwrap()
        .push(dead_cluster);
    config["contexts"] = serde_yaml_ng::Value::Sequence(vec![dead, good]);
    config["current-context"] = "dead".into();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    std::fs::write(&kubeconfig, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap();

    let run = |args: Vec<&str>| {
        std::process::Command::new(env!("CARGO_BIN_EXE_bouncer"))
            .args(&args)
            .args(["--policies", policies, "--lease-namespace", n])
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("bouncer starts")
    };
    let k = ["--kubeconfig", kubeconfig];
    // The current context is dead: exit 3. --context good reaches the cluster, and its
    // namespace completes the kubectl-style target.
    let out = run([&["explain", "deploy/api"][..], &k].concat());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    for target in [
        &["deploy/api"][..],
        &["deployment", "api"],
        &[&format!("deploy/{n}/api")],
    ] {
        let args = [
            &["explain"],
            target,
            &k,
            &["--context", "good", "-o", "json"],
        ]
        .concat();
        let out = run(args.clone());
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        let e: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(e["workload"]["namespace"], n, "{e:#}");
        assert_eq!(e["workload"]["name"], "api", "{e:#}");
    }
    // -n names the namespace whatever the context says; a wrong one finds nothing (exit 1).
    let args = [
        &["explain", "sts/api", "-n", n][..],
        &k,
        &["--context", "good"],
    ]
    .concat();
    assert_eq!(run(args).status.code(), Some(1));
    let args = [
        &["explain", "deploy/api", "-n", "default"][..],
        &k,
        &["--context", "good"],
    ]
    .concat();
    assert_eq!(run(args).status.code(), Some(1));
    // -n scopes a plan; -o yaml carries the JSON report's fields.
    let args = [
        &["plan", "-n", n, "-o", "yaml"][..],
        &k,
        &["--context", "good"],
    ]
    .concat();
    let out = run(args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).expect("YAML");
    assert_eq!(report["kind"], "BounceReport", "{report:?}");
    let rows = report["rows"].as_sequence().expect("rows");
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["workload"]["namespace"] == n),
        "{report:?}"
    );
    let args = [
        &["plan", "-n", "default", "-o", "yaml"][..],
        &k,
        &["--context", "good"],
    ]
    .concat();
    let out = run(args);
    let other: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).expect("YAML");
    assert_eq!(
        other["rows"].as_sequence().map(Vec::len),
        Some(0),
        "{other:?}"
    );
}

/// A stuck rollout is not silent until its timeout: every 30 s bouncer says what it waits for,
/// with the time spent and the time left.
#[tokio::test]
async fn a_long_wait_says_what_it_waits_for_with_elapsed_and_remaining_time() {
    use bouncer_testkit::{PodTemplateExt, TestNs, client, wait_pod_memory};
    let client = client().await;
    let ns = TestNs::new(&client, "cli-wait").await;
    let n = ns.name();
    let d = crate::harness::stuck_on_restart(&client, "slow", &[("app", "slow")])
        .await
        .with_memory("300Mi", "0");
    crate::harness::deploy(&client, n, d).await;
    for pod in crate::harness::pods(&client, n, "app=slow").await {
        let name = pod.metadata.name.clone().unwrap_or_default();
        wait_pod_memory(
            &client,
            n,
            &name,
            std::time::Duration::from_secs(120),
            |m| m.is_some(),
        )
        .await
        .expect("metrics-server reports the pod")
        .expect("metrics present");
    }
    let extra =
        "  triggers:\n    memory: {above: 256Mi}\n  cooldown: 1s\n  restart: {timeout: 40s}\n";
    let policies = crate::harness::Policies::new(&[(
        "p.yaml",
        &crate::harness::policy("slow", n, "{app: slow}", extra),
    )]);
    let run = crate::harness::bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 1, "{}\n{:#}", run.stderr, run.report);
    let ticks: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("still waiting for the rollout of deployment/"))
        .collect();
    assert_eq!(ticks.len(), 1, "{}", run.stderr);
    assert!(
        ticks[0].contains(&format!("deployment/{n}/slow: 30s elapsed, "))
            && ticks[0].contains(" left before the timeout"),
        "{}",
        ticks[0]
    );
}
