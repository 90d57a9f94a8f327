//! `bouncer explain` names a workload as kubectl does: `deploy/web -n shop`, `deploy web -n
//! shop`, or today's `deploy/shop/web`.

use crate::core::explain::{TargetError, parse_target};
use crate::core::model::WorkloadRef;

/// Why the words after `explain` name no workload; each message starts with the target as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("{target:?}: give one namespace with -n, not {}", .namespaces.join(", "))]
    ManyNamespaces {
        target: String,
        namespaces: Vec<String>,
    },
    #[error("{target:?} is in namespace {namespace}, outside -n {}", .namespaces.join(", "))]
    OutsideNamespaces {
        target: String,
        namespace: String,
        namespaces: Vec<String>,
    },
    #[error(
        "{target:?}: expected KIND/NAME (with -n NAMESPACE) or KIND/NAMESPACE/NAME, e.g. deploy/vmcp-main -n toolhive-system"
    )]
    Shape { target: String },
    #[error(transparent)]
    Target(#[from] TargetError),
}

/// Resolves the words after `explain`. `namespaces` are the -n/--namespaces given; `current` is
/// the kubeconfig context's namespace, used when no namespace is given.
pub fn resolve(
    words: &[String],
    namespaces: &[String],
    current: &str,
) -> Result<WorkloadRef, ResolveError> {
    let joined = words.join("/");
    let parts: Vec<&str> = joined.split('/').collect();
    match parts.as_slice() {
        [kind, name] => {
            let namespace = match namespaces {
                [] => current,
                [one] => one.as_str(),
                _ => {
                    return Err(ResolveError::ManyNamespaces {
                        target: joined,
                        namespaces: namespaces.to_vec(),
                    });
                }
            };
            Ok(parse_target(&format!("{kind}/{namespace}/{name}"))?)
        }
        [_, namespace, _] => {
            if !namespaces.is_empty() && !namespaces.iter().any(|n| n == namespace) {
                return Err(ResolveError::OutsideNamespaces {
                    namespace: namespace.to_string(),
                    target: joined,
                    namespaces: namespaces.to_vec(),
                });
            }
            Ok(parse_target(&joined)?)
        }
        _ => Err(ResolveError::Shape { target: joined }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Kind;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kubectl_forms_resolve() {
        let shop = words(&["shop"]);
        for (w, ns, kind, namespace) in [
            (&["deploy/web"][..], &shop[..], Kind::Deployment, "shop"),
            (&["deployments", "web"], &shop, Kind::Deployment, "shop"),
            (&["sts/web"], &[], Kind::StatefulSet, "current"),
            (&["DaemonSet/web"], &[], Kind::DaemonSet, "current"),
            (&["po", "web"], &shop, Kind::Pod, "shop"),
            (&["deploy/shop/web"], &[], Kind::Deployment, "shop"),
            (&["deploy/shop/web"], &shop, Kind::Deployment, "shop"),
        ] {
            let t = resolve(&words(w), ns, "current").unwrap();
            assert_eq!(
                (t.kind, t.namespace.as_str(), t.name.as_str()),
                (kind, namespace, "web"),
                "{w:?}"
            );
        }
    }

    #[test]
    fn ambiguous_or_malformed_targets_are_refused() {
        let refused =
            |w: &[&str], ns: &[&str]| resolve(&words(w), &words(ns), "default").unwrap_err();
        assert!(matches!(
            refused(&["deploy/web"], &["a", "b"]),
            ResolveError::ManyNamespaces { ref namespaces, .. } if namespaces == &["a", "b"]
        ));
        assert!(matches!(
            refused(&["deploy/shop/web"], &["other"]),
            ResolveError::OutsideNamespaces { ref namespace, .. } if namespace == "shop"
        ));
        assert!(matches!(refused(&["web"], &[]), ResolveError::Shape { .. }));
        assert!(matches!(
            refused(&["deploy/a/b/c"], &[]),
            ResolveError::Shape { .. }
        ));
        assert!(matches!(
            refused(&["cronjob/web"], &[]),
            ResolveError::Target(TargetError::UnknownKind { ref kind, .. }) if kind == "cronjob"
        ));
        // The words a person reads after "bouncer: explain: ".
        for (w, ns, want) in [
            (
                &["deploy/web"][..],
                &["a", "b"][..],
                "\"deploy/web\": give one namespace with -n, not a, b",
            ),
            (
                &["deploy/shop/web"],
                &["other", "more"],
                "\"deploy/shop/web\" is in namespace shop, outside -n other, more",
            ),
            (
                &["web"],
                &[],
                "\"web\": expected KIND/NAME (with -n NAMESPACE) or KIND/NAMESPACE/NAME, e.g. deploy/vmcp-main -n toolhive-system",
            ),
            (
                &["cronjob", "web"],
                &[],
                "\"cronjob/default/web\": unknown kind \"cronjob\" (deploy, sts, ds or pod)",
            ),
        ] {
            assert_eq!(refused(w, ns).to_string(), want, "{w:?}");
        }
    }
}
