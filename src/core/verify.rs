//! Proof that a bounce happened: the annotation is still ours and every pod is newer than the
//! bounce; otherwise, who reverted it (from managedFields).

use std::collections::BTreeSet;

use chrono::{DateTime, TimeDelta, Utc};

use super::literals::{
    BUILTIN_MANAGERS, FIELD_MANAGER, REVISION_LABEL, TOOLHIVE_RESTARTED_AT, rfc3339, whole_seconds,
};
use super::model::{Kind, Method, Uid, Workload};

/// One managedFields entry of a workload, as the revert rule reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldWrite {
    pub manager: String,
    /// When the manager last wrote (removals do not refresh it).
    pub time: Option<DateTime<Utc>>,
    /// It owns part of `spec.template`.
    pub template: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Annotation intact and `pods` pods, all started after the bounce and ready.
    Verified { pods: usize },
    /// The annotation was removed or rewritten by someone else.
    Reverted { found: Option<String> },
    /// Someone restarted the workload after bouncer did (`kubectl rollout restart`, another
    /// tool): the annotation holds a later time, not one in the future.
    Superseded { found: String },
    /// Annotation intact, but the pod template's spec is not the one restarted: a new version
    /// (an image, a command) was rolled out over bouncer's restart.
    NewTemplate,
    /// Annotation intact, but `old` pods are from before the bounce, or some are not ready.
    Incomplete { old: usize, detail: String },
}

/// Pure check of a fresh read against what the bounce wrote. A pod is new by identity: its UID
/// did not exist before the patch (and a StatefulSet's pod is at the update revision), never by
/// comparing its node's clock (startTime) with bouncer's. The desired count is not compared: an
/// autoscaler may change it during the settle, and kubectl's completion rule already counted.
/// `template`: the digest of the pod template's spec the restart was written on.
pub fn check(
    w: &Workload,
    method: Method,
    written: &str,
    old_uids: &BTreeSet<Uid>,
    template: Option<u64>,
    now: DateTime<Utc>,
) -> Verdict {
    let found = restart_annotation(method, w);
    if found.as_deref() != Some(written) {
        return match found {
            Some(found) if supersedes(&found, written, now) => Verdict::Superseded { found },
            found => Verdict::Reverted { found },
        };
    }
    if template
        .zip(w.template_spec)
        .is_some_and(|(was, is)| was != is)
    {
        return Verdict::NewTemplate;
    }
    let update_revision = match w.target.kind {
        Kind::StatefulSet => w.status.update_revision.as_deref(),
        _ => None,
    };
    let live: Vec<_> = w.pods.iter().filter(|p| !p.deleting).collect();
    let old = live
        .iter()
        .filter(|p| {
            let stale_revision = update_revision
                .zip(p.labels.get(REVISION_LABEL))
                .is_some_and(|(want, has)| want != has);
            old_uids.contains(&p.uid) || stale_revision
        })
        .count();
    let unready = live.iter().filter(|p| !p.ready).count();
    if old > 0 || unready > 0 || live.is_empty() {
        return Verdict::Incomplete {
            old,
            detail: format!(
                "{} pods: {old} from before the bounce, {unready} not ready",
                live.len()
            ),
        };
    }
    Verdict::Verified { pods: live.len() }
}

/// A restart annotation `found` in place of bouncer's `written` is a later restart: a time after
/// bouncer's and not ahead of now (a value pinned in the future, in Git say, is a revert, as is
/// any value that is not a time). Both are whole seconds as kubectl writes them.
pub fn supersedes(found: &str, written: &str, now: DateTime<Utc>) -> bool {
    let at = |v: &str| DateTime::parse_from_rfc3339(v).ok().map(|t| t.to_utc());
    // A client's clock a little ahead of bouncer's still restarted after it.
    let skew = TimeDelta::minutes(1);
    at(found)
        .zip(at(written))
        .is_some_and(|(f, w)| f > w && f <= now + skew)
}

/// The pod-template annotation whose value proves a bounce of `method`, as the workload carries
/// it now: kubectl's restartedAt (bouncer's patch), or the time ToolHive's operator wrote when
/// asked through its MCPServer. Evictions write none.
pub fn restart_annotation(method: Method, w: &Workload) -> Option<String> {
    match method {
        Method::Rollout => w.restarted_at.map(rfc3339),
        Method::Toolhive => w.toolhive.restarted_at.clone(),
        Method::Evict => None,
    }
}

/// That annotation as messages name it.
pub fn annotation_label(method: Method) -> &'static str {
    match method {
        Method::Rollout | Method::Evict => "restartedAt",
        Method::Toolhive => TOOLHIVE_RESTARTED_AT,
    }
}

/// Who reverted a bounce, as far as managedFields can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reverters {
    /// Field managers other than bouncer and the built-in controllers.
    pub managers: Vec<String>,
    /// True when they wrote the pod template at or after the bounce. False when nobody did and
    /// these are the template's other owners: removing a field does not refresh a manager's
    /// write time, so an owner that deletes restartedAt leaves only its ownership behind.
    pub wrote_after: bool,
}

impl std::fmt::Display for Reverters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.managers.is_empty(), self.wrote_after) {
            (true, _) => f.write_str("an unknown writer"),
            (false, true) => f.write_str(&self.managers.join(", ")),
            (false, false) => write!(
                f,
                "{} (owner of the pod template; removals leave no write time in managedFields)",
                self.managers.join(", ")
            ),
        }
    }
}

/// The likely reverters of a bounce patched at `since`, from the workload's managedFields.
pub fn reverters(entries: &[FieldWrite], since: DateTime<Utc>) -> Reverters {
    let recent = writers(entries, Some(since));
    if recent.is_empty() {
        Reverters {
            managers: writers(entries, None),
            wrote_after: false,
        }
    } else {
        Reverters {
            managers: recent,
            wrote_after: true,
        }
    }
}

/// Field managers (other than bouncer and the built-in controllers) owning part of the pod
/// template, only those that wrote at or after `since` when given.
fn writers(entries: &[FieldWrite], since: Option<DateTime<Utc>>) -> Vec<String> {
    let since = since.map(whole_seconds);
    let mut names: Vec<String> = entries
        .iter()
        .filter(|e| since.is_none_or(|since| e.time.is_some_and(|t| t >= since)))
        .filter(|e| e.template)
        .map(|e| e.manager.clone())
        .filter(|m| m != FIELD_MANAGER && !BUILTIN_MANAGERS.contains(&m.as_str()))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{PodSample, RolloutStatus, UpdateStrategy, WorkloadRef};

    /// The verification an hour after the restarts these tests write.
    fn now() -> DateTime<Utc> {
        "2026-01-01T04:00:00Z".parse().unwrap()
    }

    /// The check of a rollout at `now()`.
    fn rolled(w: &Workload, written: &str, old: &BTreeSet<Uid>) -> Verdict {
        check(w, Method::Rollout, written, old)
    }

    /// The check at `now()`.
    fn check(w: &Workload, method: Method, written: &str, old: &BTreeSet<Uid>) -> Verdict {
        super::check(w, method, written, old, None, now())
    }

    /// A later restart (kubectl rollout restart while bouncer waited) supersedes bouncer's; an
    /// earlier value, one in the future, or one that is not a time is a revert.
    #[test]
    fn a_later_restart_supersedes_and_anything_else_is_a_revert() {
        let written = "2026-01-01T03:00:00Z";
        let old: BTreeSet<Uid> = ["a".into()].into();
        let fresh = vec![pod("b", "2026-01-01T03:00:10Z", true)];
        let at = |v: &str| rolled(&workload(Some(v), fresh.clone()), written, &old);
        let later = "2026-01-01T03:00:07Z";
        assert_eq!(
            at(later),
            Verdict::Superseded {
                found: later.into()
            }
        );
        // Within a minute of clock skew ahead of bouncer's clock, still a restart that happened.
        assert!(matches!(
            at("2026-01-01T04:00:30Z"),
            Verdict::Superseded { .. }
        ));
        for revert in [
            "2026-01-01T02:00:00Z",
            "2026-01-01T04:05:00Z",
            "2030-01-01T00:00:00Z",
        ] {
            assert_eq!(
                at(revert),
                Verdict::Reverted {
                    found: Some(revert.into())
                },
                "{revert}"
            );
        }
        assert!(!supersedes("tomorrow", written, now()));
        assert!(!supersedes(later, "not a time", now()));
    }

    /// A new version rolled out over the restart (the spec's digest changed, restartedAt still
    /// bouncer's): superseded by it. The same spec, or one not known on either side, verifies.
    #[test]
    fn a_new_pod_template_over_the_restart_supersedes_it() {
        let written = "2026-01-01T03:00:00Z";
        let old: BTreeSet<Uid> = ["a".into()].into();
        let mut w = workload(Some(written), vec![pod("b", "2026-01-01T03:00:10Z", true)]);
        w.status.desired = 1;
        let at = |w: &Workload, template| {
            super::check(w, Method::Rollout, written, &old, template, now())
        };
        w.template_spec = Some(7);
        assert_eq!(at(&w, Some(6)), Verdict::NewTemplate);
        assert_eq!(at(&w, Some(7)), Verdict::Verified { pods: 1 });
        assert_eq!(at(&w, None), Verdict::Verified { pods: 1 });
        w.template_spec = None;
        assert_eq!(at(&w, Some(6)), Verdict::Verified { pods: 1 });
        // A revert is still a revert, whatever else changed.
        let mut reverted = w.clone();
        reverted.restarted_at = None;
        reverted.template_spec = Some(7);
        assert_eq!(at(&reverted, Some(6)), Verdict::Reverted { found: None });
    }

    fn pod(uid: &str, started: &str, ready: bool) -> PodSample {
        PodSample {
            name: format!("p-{uid}"),
            uid: uid.into(),
            labels: Default::default(),
            started: Some(started.parse().unwrap()),
            ready,
            deleting: false,
            containers: vec![],
            limit: None,
            has_metrics: false,
        }
    }

    fn workload(annotation: Option<&str>, pods: Vec<PodSample>) -> Workload {
        Workload {
            target: WorkloadRef {
                kind: Kind::Deployment,
                namespace: "ns".into(),
                name: "web".into(),
            },
            uid: None,
            template_labels: Default::default(),
            pod_selector: Default::default(),
            pod_owners: Vec::new(),
            annotations: Default::default(),
            attempt: Default::default(),
            restarted_at: annotation.map(|a| a.parse().unwrap()),
            template_spec: None,
            restart_owners: None,
            paused: false,
            strategy: UpdateStrategy::RollingUpdate,
            status: RolloutStatus {
                desired: 2,
                ..Default::default()
            },
            rolling: Default::default(),
            pods,
            mirror: false,
            deleting: None,
            toolhive: Default::default(),
        }
    }

    #[test]
    fn verified_only_when_annotation_is_ours_and_all_pods_are_new() {
        let written = "2026-01-01T03:00:00Z";
        let old: BTreeSet<Uid> = ["a".into()].into();
        let fresh = vec![
            pod("b", "2026-01-01T03:00:00Z", true),
            pod("c", "2026-01-01T03:00:05Z", true),
        ];
        assert_eq!(
            rolled(&workload(Some(written), fresh.clone()), written, &old),
            Verdict::Verified { pods: 2 }
        );
        assert_eq!(
            rolled(&workload(None, fresh.clone()), written, &old),
            Verdict::Reverted { found: None }
        );
        let other = "2026-01-01T02:00:00Z";
        assert_eq!(
            rolled(&workload(Some(other), fresh), written, &old),
            Verdict::Reverted {
                found: Some(other.into())
            }
        );
        let mixed = vec![
            pod("a", "2026-01-01T01:00:00Z", true),
            pod("c", "2026-01-01T03:00:05Z", true),
        ];
        assert!(matches!(
            rolled(&workload(Some(written), mixed), written, &old),
            Verdict::Incomplete { .. }
        ));
        let unready = vec![
            pod("b", "2026-01-01T03:00:01Z", false),
            pod("c", "2026-01-01T03:00:05Z", true),
        ];
        assert!(matches!(
            rolled(&workload(Some(written), unready), written, &old),
            Verdict::Incomplete { .. }
        ));
    }

    #[test]
    fn writers_are_recent_template_writers_other_than_us_and_builtins() {
        let entry = |manager: &str, time: &str, template: bool| FieldWrite {
            manager: manager.into(),
            time: Some(time.parse().unwrap()),
            template,
        };
        let since: DateTime<Utc> = "2026-01-01T03:00:00.5Z".parse().unwrap();
        let entries = vec![
            entry("toolhive-operator", "2026-01-01T03:00:01Z", true),
            entry("bouncer", "2026-01-01T03:00:00Z", true),
            entry("kube-controller-manager", "2026-01-01T03:00:02Z", true),
            entry("helm", "2026-01-01T02:00:00Z", true),
            entry("status-writer", "2026-01-01T03:00:03Z", false),
        ];
        assert_eq!(
            writers(&entries, Some(since)),
            vec!["toolhive-operator".to_string()]
        );
        assert_eq!(
            reverters(&entries, since),
            Reverters {
                managers: vec!["toolhive-operator".into()],
                wrote_after: true
            }
        );
    }

    #[test]
    fn a_removal_leaves_only_ownership_so_the_template_owners_are_named() {
        // What each entry owns: only `spec.template` matters to the rule.
        let entry = |manager: &str, time: &str, owns: &str| FieldWrite {
            manager: manager.into(),
            time: Some(time.parse().unwrap()),
            template: owns == "f:spec/f:template",
        };
        // What the API server keeps after an operator deleted our annotation: its entry from
        // creation (old time), the controller's status, and no entry for bouncer at all.
        let since: DateTime<Utc> = "2026-01-01T03:00:00Z".parse().unwrap();
        let entries = vec![
            entry(
                "toolhive-operator",
                "2026-01-01T02:00:00Z",
                "f:spec/f:template",
            ),
            entry(
                "kube-controller-manager",
                "2026-01-01T03:00:05Z",
                "f:status",
            ),
            entry("helm", "2026-01-01T01:00:00Z", "f:metadata/f:labels"),
        ];
        let found = reverters(&entries, since);
        assert_eq!(
            found,
            Reverters {
                managers: vec!["toolhive-operator".into()],
                wrote_after: false
            }
        );
        assert!(
            found
                .to_string()
                .starts_with("toolhive-operator (owner of the pod template"),
            "{found}"
        );
        assert_eq!(
            reverters(&entries[1..], since).to_string(),
            "an unknown writer"
        );
    }

    /// The workload with its desired count changed (an autoscaler at work).
    fn scaled_to(desired: i32, mut w: Workload) -> Workload {
        w.status.desired = desired;
        w
    }

    /// Safety case 6: a pod is new by identity (a UID that did not exist before the patch),
    /// not by comparing a node's clock (startTime) with bouncer's; and an autoscaler raising the
    /// desired count during the settle is not a failed bounce.
    #[test]
    fn case6_new_pods_are_told_by_identity_not_node_clocks() {
        // Patched at 03:00:10.400 by bouncer's clock.
        let written = "2026-01-01T03:00:10Z";
        let old: BTreeSet<Uid> = ["a".into(), "b".into()].into();
        // A node 2 s behind bouncer: the replacements' startTime is before the patch.
        let skewed = vec![
            pod("c", "2026-01-01T03:00:08Z", true),
            pod("d", "2026-01-01T03:00:09Z", true),
        ];
        assert_eq!(
            rolled(&workload(Some(written), skewed.clone()), written, &old),
            Verdict::Verified { pods: 2 }
        );
        // An HPA scaled to 3 during the settle; its pod is not there yet.
        assert_eq!(
            rolled(
                &scaled_to(3, workload(Some(written), skewed)),
                written,
                &old
            ),
            Verdict::Verified { pods: 2 }
        );
        // A pod from before the patch is old whatever its node's clock says.
        let ahead = vec![
            pod("a", "2026-01-01T03:00:30Z", true),
            pod("d", "2026-01-01T03:00:11Z", true),
        ];
        assert!(matches!(
            rolled(&workload(Some(written), ahead), written, &old),
            Verdict::Incomplete { .. }
        ));
    }
}
