//! `bouncer explain` names a workload as kubectl does: `deploy/web -n shop`, `deploy web -n
//! shop`, or today's `deploy/shop/web`.

use crate::core::explain::parse_target;
use crate::core::model::WorkloadRef;

/// Resolves the words after `explain`. `namespaces` are the -n/--namespaces given; `current` is
/// the kubeconfig context's namespace, used when no namespace is given.
pub fn resolve(
    words: &[String],
    namespaces: &[String],
    current: &str,
) -> Result<WorkloadRef, String> {
    let joined = words.join("/");
    let parts: Vec<&str> = joined.split('/').collect();
    match parts.as_slice() {
        [kind, name] => {
            let namespace = match namespaces {
                [] => current,
                [one] => one.as_str(),
                _ => {
                    return Err(format!(
                        "{joined:?}: give one namespace with -n, not {}",
                        namespaces.join(", ")
                    ));
                }
            };
            parse_target(&format!("{kind}/{namespace}/{name}"))
        }
        [_, namespace, _] => {
            if !namespaces.is_empty() && !namespaces.iter().any(|n| n == namespace) {
                return Err(format!(
                    "{joined:?} is in namespace {namespace}, outside -n {}",
                    namespaces.join(", ")
                ));
            }
            parse_target(&joined)
        }
        _ => Err(format!(
            "{joined:?}: expected KIND/NAME (with -n NAMESPACE) or KIND/NAMESPACE/NAME, e.g. deploy/vmcp-main -n toolhive-system"
        )),
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
        for (w, ns, want) in [
            (&["deploy/web"][..], &["a", "b"][..], "give one namespace"),
            (&["deploy/shop/web"], &["other"], "outside -n other"),
            (&["web"], &[], "expected KIND/NAME"),
            (&["cronjob/web"], &[], "unknown kind"),
            (&["deploy/a/b/c"], &[], "expected KIND/NAME"),
        ] {
            let err = resolve(&words(w), &words(ns), "default").unwrap_err();
            assert!(err.contains(want), "{w:?}: {err}");
        }
    }
}
