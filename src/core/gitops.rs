//! Whether a GitOps controller manages a workload, and whether bouncer's restart of it will hold,
//! from the workload's labels and managedFields (which `bouncer explain` reads).
//!
//! What Flux's kustomize-controller does on every reconcile (v1.9.6, with fluxcd/pkg/ssa):
//! it takes over the managedFields entries of managers whose name starts with `kubectl` (and
//! `before-first-apply` and its own), then force-applies Git's manifest, which drops whatever
//! those entries held and Git does not. A restart written by another manager (`bouncer`) is not
//! in its entries and survives, unless Git itself sets `kubectl.kubernetes.io/restartedAt`: then
//! kustomize-controller owns that key and writes Git's value back.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::core::literals::RESTARTED_AT;

/// The manager kustomize-controller applies as.
pub const FLUX_MANAGER: &str = "kustomize-controller";
/// The labels kustomize-controller puts on every object it applies: its Kustomization.
pub const FLUX_NAME_LABEL: &str = "kustomize.toolkit.fluxcd.io/name";
pub const FLUX_NAMESPACE_LABEL: &str = "kustomize.toolkit.fluxcd.io/namespace";
/// The prefix of the managers whose fields Flux takes over (`kubectl`, `kubectl-rollout`, ...).
pub const KUBECTL_PREFIX: &str = "kubectl";

/// One managedFields entry, reduced to what the verdict reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedEntry {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// It owns the pod template's `kubectl.kubernetes.io/restartedAt`.
    pub owns_restarted_at: bool,
}

/// What the edge reads from the workload object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub labels: BTreeMap<String, String>,
    pub managed: Vec<ManagedEntry>,
}

/// The verdict `bouncer explain` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GitOps {
    /// The controller that manages the workload.
    pub controller: &'static str,
    /// `namespace/name` of the Kustomization, from its labels; None when only managedFields
    /// tell.
    pub source: Option<String>,
    /// False when the controller will write its own value over bouncer's restart.
    pub restart_holds: bool,
    pub detail: String,
}

/// None when no GitOps controller bouncer knows manages the workload.
pub fn assess(facts: &Facts) -> Option<GitOps> {
    let source = facts.labels.get(FLUX_NAME_LABEL).map(|name| {
        match facts.labels.get(FLUX_NAMESPACE_LABEL) {
            Some(ns) => format!("{ns}/{name}"),
            None => name.clone(),
        }
    });
    let by_flux = facts.managed.iter().any(|e| e.manager == FLUX_MANAGER);
    if source.is_none() && !by_flux {
        return None;
    }
    let owners: Vec<&str> = facts
        .managed
        .iter()
        .filter(|e| e.owns_restarted_at)
        .map(|e| e.manager.as_str())
        .collect();
    let kustomization = source
        .as_deref()
        .map(|s| format!("Kustomization {s}"))
        .unwrap_or_else(|| "its Kustomization".into());
    let (restart_holds, detail) = if owners.contains(&FLUX_MANAGER) {
        (
            false,
            format!(
                "Git sets {RESTARTED_AT} ({FLUX_MANAGER} owns it): Flux writes Git's value back on \
                 its next reconcile of {kustomization}, undoing bouncer's restart and rolling the \
                 pods again; remove the annotation from Git, or let onRevert evict"
            ),
        )
    } else {
        let kubectl: Vec<&str> = owners
            .iter()
            .copied()
            .filter(|m| m.starts_with(KUBECTL_PREFIX))
            .collect();
        let mut detail = format!(
            "Git does not set {RESTARTED_AT}: bouncer's restart (field manager bouncer) holds \
             through Flux's reconciles of {kustomization}"
        );
        if !kubectl.is_empty() {
            detail.push_str(&format!(
                "; the current value, written by {}, is removed by Flux's next reconcile",
                kubectl.join(", ")
            ));
        }
        (true, detail)
    };
    Some(GitOps {
        controller: "Flux",
        source,
        restart_holds,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(manager: &str, operation: &str, owns: bool) -> ManagedEntry {
        ManagedEntry {
            manager: manager.into(),
            operation: operation.into(),
            owns_restarted_at: owns,
        }
    }

    fn flux_labels() -> BTreeMap<String, String> {
        BTreeMap::from([
            (FLUX_NAME_LABEL.to_string(), "apps".to_string()),
            (FLUX_NAMESPACE_LABEL.to_string(), "flux-system".to_string()),
        ])
    }

    #[test]
    fn unmanaged_workloads_have_no_verdict() {
        let facts = Facts {
            labels: BTreeMap::from([("app".into(), "web".into())]),
            managed: vec![
                entry("kubectl-client-side-apply", "Update", false),
                entry("kube-controller-manager", "Update", false),
                entry("bouncer", "Update", true),
            ],
        };
        assert_eq!(assess(&facts), None);
        assert_eq!(assess(&Facts::default()), None);
    }

    #[test]
    fn flux_labels_name_the_kustomization_and_bouncers_restart_holds() {
        let facts = Facts {
            labels: flux_labels(),
            managed: vec![
                entry(FLUX_MANAGER, "Apply", false),
                entry("bouncer", "Update", true),
            ],
        };
        let v = assess(&facts).unwrap();
        assert_eq!(v.controller, "Flux");
        assert_eq!(v.source.as_deref(), Some("flux-system/apps"));
        assert!(v.restart_holds);
        assert!(
            v.detail.contains("Kustomization flux-system/apps"),
            "{}",
            v.detail
        );
        assert!(!v.detail.contains("removed"), "{}", v.detail);
    }

    #[test]
    fn managed_fields_alone_tell_flux_manages_it() {
        let facts = Facts {
            labels: BTreeMap::new(),
            managed: vec![entry(FLUX_MANAGER, "Apply", false)],
        };
        let v = assess(&facts).unwrap();
        assert_eq!(v.source, None);
        assert!(v.restart_holds);
        assert!(v.detail.contains("its Kustomization"), "{}", v.detail);
    }

    #[test]
    fn git_pinning_the_restart_annotation_means_it_will_not_hold() {
        let facts = Facts {
            labels: flux_labels(),
            managed: vec![entry(FLUX_MANAGER, "Apply", true)],
        };
        let v = assess(&facts).unwrap();
        assert!(!v.restart_holds);
        assert!(v.detail.contains("Git sets"), "{}", v.detail);
        assert!(v.detail.contains(FLUX_MANAGER), "{}", v.detail);
    }

    #[test]
    fn a_kubectl_restart_is_named_as_one_flux_removes() {
        let facts = Facts {
            labels: flux_labels(),
            managed: vec![
                entry(FLUX_MANAGER, "Apply", false),
                entry("kubectl-rollout", "Update", true),
            ],
        };
        let v = assess(&facts).unwrap();
        assert!(v.restart_holds, "bouncer's own restart would still hold");
        assert!(
            v.detail.contains("written by kubectl-rollout, is removed"),
            "{}",
            v.detail
        );
    }

    #[test]
    fn labels_without_the_namespace_label_give_the_name_alone() {
        let facts = Facts {
            labels: BTreeMap::from([(FLUX_NAME_LABEL.to_string(), "apps".to_string())]),
            managed: vec![],
        };
        assert_eq!(assess(&facts).unwrap().source.as_deref(), Some("apps"));
    }
}
