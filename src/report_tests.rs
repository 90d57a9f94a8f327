//! Golden-text tests of the report renderers.

use std::time::Duration;

use super::*;
use crate::core::model::Kind;
use crate::core::outcome::{Failure, FailureCode, Outcome, Status};
use crate::core::plan::{Bounce, Skip};
use crate::core::policy::OnRevert;
use crate::core::reasons::SkipReason;

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn target(kind: Kind, ns: &str, name: &str) -> WorkloadRef {
    WorkloadRef {
        kind,
        namespace: ns.into(),
        name: name.into(),
    }
}

fn fixture() -> (Plan, Vec<Outcome>) {
    let bounce = |name: &str, usage: u64| Bounce {
        policy: "mcp".into(),
        target: target(Kind::StatefulSet, "toolhive", name),
        method: Method::Rollout,
        instead: None,
        triggers: vec![Trigger::Memory {
            pod: format!("{name}-0"),
            usage,
            threshold: 435 << 20,
        }],
        pods: 1,
        memory: Some(MemoryReading {
            pod: format!("{name}-0"),
            usage,
            threshold: Some(435 << 20),
            missing: 0,
        }),
        group: None,
        seen_restarted_at: None,
        seen_uid: None,
        timeout: None,
        on_revert: OnRevert::Fail,
        allow_downtime: true,
        cooldown: Duration::from_secs(3600),
    };
    let plan = Plan {
        now: t("2026-12-02T16:20:51Z"),
        bounces: vec![bounce("fetch", 501 << 20), bounce("github", 480 << 20)],
        skips: vec![Skip {
            group: None,
            policy: "api".into(),
            target: target(Kind::Deployment, "shop", "leaky-api"),
            pods: 3,
            memory: Some(MemoryReading {
                pod: "leaky-api-1".into(),
                usage: 86 << 20,
                threshold: Some(1 << 30),
                missing: 0,
            }),
            reason: SkipReason::Paused,
        }],
        metrics_unavailable: None,
        dry_run: vec![],
        dry_run_policies: Default::default(),
        suspended_policies: Default::default(),
        left_requests: vec![],
    };
    let outcome = |name: &str, status: Status, secs: i64| Outcome {
        policy: "mcp".into(),
        target: target(Kind::StatefulSet, "toolhive", name),
        method: Method::Rollout,
        instead: None,
        status,
        started: Some(t("2026-12-02T16:20:51Z")),
        patched_at: Some(t("2026-12-02T16:20:51Z")),
        completed_at: Some(t("2026-12-02T16:20:51Z") + chrono::Duration::seconds(secs)),
        finished: Some(t("2026-12-02T16:20:51Z") + chrono::Duration::seconds(secs)),
        verification: Some("restartedAt intact, 1/1 pods new and ready".into()),
        written: Some("2026-12-02T16:20:51Z".into()),
        attempt: None,
        last_confirmed: Some(t("2026-12-02T16:21:10Z")),
    };
    let outcomes = vec![
        outcome("fetch", Status::Bounced, 9),
        Outcome {
            started: None,
            patched_at: None,
            completed_at: None,
            finished: None,
            verification: None,
            last_confirmed: None,
            ..outcome("github", Status::NotAttempted(None), 0)
        },
    ];
    (plan, outcomes)
}

#[test]
fn table_shows_every_row_with_its_decision_and_reason() {
    let (plan, outcomes) = fixture();
    let got = table(&build(plan.clone(), Mode::Run, Some(&outcomes)));
    let want = "\
POLICY  WORKLOAD                     PODS  MEMORY (MAX POD / THRESHOLD)  TRIGGER  DECISION        REASON
mcp     statefulset/toolhive/fetch   1     501Mi / 435Mi                 memory   bounced (9.0s)  memory (fetch-0 501Mi > 435Mi); restartedAt intact, 1/1 pods new and ready
mcp     statefulset/toolhive/github  1     480Mi / 435Mi                 memory   notAttempted    not attempted: an earlier bounce halted the queue
api     deployment/shop/leaky-api    3     86Mi / 1Gi                    -        skip            deployment is paused

1 bounced, 0 failed, 1 not attempted, 1 skipped
";
    assert_eq!(got, want, "\n{got}");
}

#[test]
fn a_restart_group_is_a_column_in_table_and_markdown_and_a_field_in_json() {
    let (mut plan, mut outcomes) = fixture();
    let group = crate::core::group::Group {
        label: "toolhive-name".into(),
        value: "fetch".into(),
    };
    for b in &mut plan.bounces {
        b.group = Some(group.clone());
    }
    outcomes[1].status = Status::NotAttempted(Some(plan.bounces[0].target.clone()));
    let report = build(plan.clone(), Mode::Run, Some(&outcomes));
    let got = table(&report);
    let want = "\
POLICY  WORKLOAD                     GROUP                PODS  MEMORY (MAX POD / THRESHOLD)  TRIGGER  DECISION        REASON
mcp     statefulset/toolhive/fetch   toolhive-name=fetch  1     501Mi / 435Mi                 memory   bounced (9.0s)  memory (fetch-0 501Mi > 435Mi); restartedAt intact, 1/1 pods new and ready
mcp     statefulset/toolhive/github  toolhive-name=fetch  1     480Mi / 435Mi                 memory   notAttempted    not attempted: statefulset/toolhive/fetch of its group was not bounced
api     deployment/shop/leaky-api    -                    3     86Mi / 1Gi                    -        skip            deployment is paused
";
    assert!(got.starts_with(want), "\n{got}");
    let md = markdown(&report);
    assert!(
        md.contains("| # | Policy | Workload | Group | Pods |"),
        "{md}"
    );
    assert!(
        md.contains("| 1 | mcp | `statefulset/toolhive/fetch` | toolhive-name=fetch | 1 |"),
        "{md}"
    );
    let json: serde_json::Value = serde_json::to_value(&report).unwrap();
    assert_eq!(json["rows"][0]["group"], "toolhive-name=fetch");
    assert!(json["rows"][2]["group"].is_null());
}

#[test]
fn plan_table_says_what_would_happen() {
    let (plan, _) = fixture();
    let got = table(&build(plan.clone(), Mode::DryRun, None));
    assert!(got.contains("would bounce #1"), "{got}");
    assert!(got.contains("would bounce #2"), "{got}");
    assert!(
        got.ends_with("2 to bounce, 1 skipped (dry run: nothing was changed)\n"),
        "{got}"
    );
}

#[test]
fn markdown_is_a_table_for_a_pr_comment() {
    let (plan, outcomes) = fixture();
    let got = markdown(&build(plan.clone(), Mode::Run, Some(&outcomes)));
    let want = "\
### bouncer run (2026-12-02T16:20:51Z)

1 bounced, 0 failed, 1 not attempted, 1 skipped

| # | Policy | Workload | Pods | Memory (max pod / threshold) | Trigger | Decision | Reason |
|---|---|---|---|---|---|---|---|
| 1 | mcp | `statefulset/toolhive/fetch` | 1 | 501Mi / 435Mi | memory | **bounced (9.0s)** | memory (fetch-0 501Mi > 435Mi); restartedAt intact, 1/1 pods new and ready |
| 2 | mcp | `statefulset/toolhive/github` | 1 | 480Mi / 435Mi | memory | **notAttempted** | not attempted: an earlier bounce halted the queue |
|  | api | `deployment/shop/leaky-api` | 3 | 86Mi / 1Gi | - | **skip** | deployment is paused |
";
    assert_eq!(got, want, "\n{got}");
}

#[test]
fn json_has_the_documented_stable_fields() {
    let (plan, outcomes) = fixture();
    let report = build(plan.clone(), Mode::Run, Some(&outcomes));
    let v: serde_json::Value = serde_json::from_str(&render(&report, Format::Json, true)).unwrap();
    assert_eq!(v["apiVersion"], "bouncer.dev/v1alpha1");
    assert_eq!(v["kind"], "BounceReport");
    assert_eq!(v["mode"], "run");
    assert_eq!(
        v["summary"],
        serde_json::json!({"planned": 2, "bounced": 1, "failed": 0, "skipped": 1, "notAttempted": 1, "superseded": 0, "dryRun": 0})
    );
    let first = &v["rows"][0];
    assert_eq!(first["order"], 1);
    assert_eq!(
        first["workload"],
        serde_json::json!({"kind": "StatefulSet", "namespace": "toolhive", "name": "fetch"})
    );
    assert_eq!(first["decision"], "bounced");
    assert_eq!(first["method"], "rollout");
    assert_eq!(first["durationSeconds"], 9.0);
    assert_eq!(first["memory"]["usage"], 501u64 << 20);
    assert_eq!(first["triggers"][0]["type"], "memory");
    assert_eq!(first["patchedAt"], "2026-12-02T16:20:51Z");
    assert_eq!(first["lastConfirmed"], "2026-12-02T16:21:10Z");
    let skip = &v["rows"][2];
    assert_eq!(skip["order"], serde_json::Value::Null);
    assert_eq!(skip["reasonCode"], "paused");
    // One line in clusters, where report and JSON logs share the stream.
    assert_eq!(render(&report, Format::Json, true).lines().count(), 1);
}

/// A failed bounce carries a stable code in `reasonCode`, like a skip, and its message.
#[test]
fn a_failure_has_a_stable_reason_code() {
    let (plan, mut outcomes) = fixture();
    outcomes[0].status = Status::Failed(Failure::new(
        FailureCode::RolloutTimedOut,
        "rollout of statefulset/toolhive/fetch did not complete within 10m: 0 of 1 pods ready",
    ));
    let report = build(plan.clone(), Mode::Run, Some(&outcomes));
    let v: serde_json::Value = serde_json::from_str(&render(&report, Format::Json, true)).unwrap();
    let row = &v["rows"][0];
    assert_eq!(row["decision"], "failed");
    assert_eq!(row["reasonCode"], "rolloutTimedOut");
    assert!(
        row["reason"]
            .as_str()
            .unwrap()
            .starts_with("rollout of statefulset/toolhive/fetch did not complete"),
        "{row}"
    );
    assert_eq!(v["summary"]["failed"], 1);
}

/// Issue 40: a restart an applier pins is evicted instead (the row says so and names the owner)
/// or skipped as `restartPinned` with the owner in `restartOwner`.
#[test]
fn a_pinned_restart_names_its_owner_in_the_row() {
    let pinned = SkipReason::RestartPinned {
        manager: "kustomize-controller".into(),
        kustomization: Some("flux-system/apps".into()),
    };
    let (mut plan, mut outcomes) = fixture();
    plan.bounces[0].method = Method::Evict;
    plan.bounces[0].instead = Some(pinned.clone());
    outcomes[0].method = Method::Evict;
    outcomes[0].instead = Some(pinned.clone());
    plan.skips[0].reason = pinned;
    let report = build(plan.clone(), Mode::Run, Some(&outcomes));
    let v: serde_json::Value = serde_json::from_str(&render(&report, Format::Json, true)).unwrap();
    let evicted = &v["rows"][0];
    assert_eq!(evicted["decision"], "bounced");
    assert_eq!(evicted["method"], "evict");
    assert_eq!(evicted["restartOwner"], "kustomize-controller");
    let reason = evicted["reason"].as_str().unwrap();
    assert!(
        reason.ends_with(
            "; pods evicted instead of a restart: restartedAt is pinned by kustomize-controller \
             (Kustomization flux-system/apps), whose next apply would undo a restart"
        ),
        "{reason}"
    );
    // The bounce not attempted says nothing of an eviction it never did.
    assert_eq!(v["rows"][1]["restartOwner"], serde_json::Value::Null);
    let skip = &v["rows"][2];
    assert_eq!(skip["reasonCode"], "restartPinned");
    assert_eq!(skip["restartOwner"], "kustomize-controller");
    assert!(
        skip["reason"]
            .as_str()
            .unwrap()
            .contains("flux-system/apps"),
        "{skip}"
    );
    // Planned (not yet run): the eviction is what would happen.
    let planned = build(plan, Mode::Plan, None);
    assert!(
        planned.rows[0]
            .reason
            .contains("pods evicted instead of a restart")
    );
    assert_eq!(
        planned.rows[0].restart_owner.as_deref(),
        Some("kustomize-controller")
    );
}
