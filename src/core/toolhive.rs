//! ToolHive's own restart of an MCPServer (`restart.method: toolhive`), decided from plain data:
//! whether the resource may be asked at all, and the request value its operator will act on.
//!
//! The operator (`handleRestartAnnotation` in `mcpserver_controller.go`) acts when the
//! resource's `restarted-at` is later than its `last-processed-restart`, then restarts the
//! server the way its `restart-strategy` says: `rolling` (the default) writes its own
//! annotation on the proxy Deployment's pod template, so the Deployment controller rolls the
//! pods; `immediate` deletes every pod of the server at once, which bouncer never asks for.
//!
//! The operator rolls the Deployment named after the server (`deploymentForMCPServer` creates
//! it under `m.Name`, and the rolling restart reads it back by that name, in v0.44.0 and
//! v0.45.0), whatever Deployment bouncer was looking at. So only that Deployment, owned by that
//! very server, may go through the resource: any other one that names the server as its
//! controller (anyone who may create Deployments can write such an ownerReference) would have
//! bouncer restart a workload it never selected, gated or marked.

use chrono::{DateTime, TimeDelta, Utc};

use crate::core::gates::operator_proxy;
use crate::core::literals::{TOOLHIVE_ROLLING, rfc3339, whole_seconds};
use crate::core::model::{McpServerRef, Workload};
use crate::core::reasons::{NotProxy, SkipReason};

/// The UID and restart annotations of an MCPServer as read right before asking.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpServerState {
    pub name: String,
    /// `metadata.uid`: the server the Deployment's ownerReference must name.
    pub uid: String,
    /// `mcpserver.toolhive.stacklok.dev/restart-strategy`, if set.
    pub strategy: Option<String>,
    /// `mcpserver.toolhive.stacklok.dev/last-processed-restart`, if set.
    pub last_processed: Option<String>,
    /// The resource's version as read: the request is conditional on it, so a strategy changed
    /// in between (say to `immediate`) makes the server refuse the request.
    pub resource_version: String,
    /// `mcpserver.toolhive.stacklok.dev/restarted-at`, if set: the pending or last request.
    pub restarted_at: Option<String>,
    /// Whether bouncer's field manager owns `restarted-at` (managedFields): bouncer wrote the
    /// value it holds, nobody wrote another since.
    pub requested_by_bouncer: bool,
}

/// The request to withdraw on `server`, as read for a request an interrupted run left
/// (`in_flight::LeftRequest`): the value it holds, when that server is the one the proxy names
/// (its UID), bouncer wrote it, and the operator has not processed it. Anything else (another
/// server under the name, somebody else's request, one the operator acted on, none) is left
/// as it is.
pub fn left_value(server: &McpServerState, named: &McpServerRef) -> Option<String> {
    let at = |v: &str| DateTime::parse_from_rfc3339(v).ok().map(|t| t.to_utc());
    let value = server.restarted_at.as_deref()?;
    let requested = at(value)?;
    let processed = server
        .last_processed
        .as_deref()
        .and_then(at)
        .is_some_and(|last| last >= requested);
    let same = !named.uid.is_empty() && named.uid == server.uid;
    (same && server.requested_by_bouncer && !processed).then(|| value.to_string())
}

/// The `restarted-at` value to write on `server`, read right before asking, for a restart of
/// `proxy` (as freshly read): `at`, or one second after the last processed request when that
/// is not older (the operator ignores a request that is not later, and times here are whole
/// seconds). A Deployment that is not the operator's own proxy of that very server is a skip
/// (`notOperatorOwned`), as is a strategy other than rolling: `immediate` deletes all pods of
/// the server at once, and an unknown one may do anything.
pub fn restart_request(
    server: &McpServerState,
    proxy: &Workload,
    at: DateTime<Utc>,
) -> Result<String, SkipReason> {
    let not_proxy = |why| SkipReason::NotOperatorOwned {
        server: server.name.clone(),
        why,
    };
    match operator_proxy(proxy)? {
        Some(owner) if owner.name != server.name => return Err(not_proxy(NotProxy::Name)),
        // An empty UID is no proof either way: fail closed.
        Some(owner) if owner.uid.is_empty() || owner.uid != server.uid => {
            return Err(not_proxy(NotProxy::Uid {
                owner: owner.uid.clone(),
                server: server.uid.clone(),
            }));
        }
        Some(_) => {}
        None => return Err(not_proxy(NotProxy::NoOwner)),
    }
    if let Some(strategy) = server
        .strategy
        .as_deref()
        .filter(|s| *s != TOOLHIVE_ROLLING)
    {
        return Err(SkipReason::RestartStrategy {
            server: server.name.clone(),
            strategy: strategy.to_string(),
        });
    }
    let at = whole_seconds(at);
    let last = server
        .last_processed
        .as_deref()
        .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
        .map(|t| t.with_timezone(&Utc));
    let value = match last {
        Some(last) if last >= at => last + TimeDelta::seconds(1),
        _ => at,
    };
    Ok(rfc3339(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn server(strategy: Option<&str>, last: Option<&str>) -> McpServerState {
        McpServerState {
            name: "fetch".into(),
            uid: "uid-fetch".into(),
            strategy: strategy.map(Into::into),
            last_processed: last.map(Into::into),
            resource_version: "1".into(),
            restarted_at: None,
            requested_by_bouncer: false,
        }
    }

    #[test]
    fn only_bouncers_own_unprocessed_request_on_that_very_server_is_withdrawn() {
        let named = McpServerRef {
            api_version: "toolhive.stacklok.dev/v1beta1".into(),
            name: "fetch".into(),
            uid: "uid-fetch".into(),
        };
        let left = |value: Option<&str>, last: Option<&str>, ours: bool| McpServerState {
            restarted_at: value.map(Into::into),
            requested_by_bouncer: ours,
            ..server(None, last)
        };
        let asked = "2026-12-03T10:00:00Z";
        let pending = left(Some(asked), Some("2026-12-03T09:00:00Z"), true);
        assert_eq!(left_value(&pending, &named).as_deref(), Some(asked));
        assert_eq!(
            left_value(&left(Some(asked), None, true), &named).as_deref(),
            Some(asked)
        );
        // The operator processed it (or a later one): nothing is pending.
        assert_eq!(
            left_value(&left(Some(asked), Some(asked), true), &named),
            None
        );
        let later = left(Some(asked), Some("2026-12-03T10:00:01Z"), true);
        assert_eq!(left_value(&later, &named), None);
        // Somebody else wrote the value since; no request at all; one no operator can read.
        assert_eq!(left_value(&left(Some(asked), None, false), &named), None);
        assert_eq!(left_value(&left(None, None, true), &named), None);
        assert_eq!(left_value(&left(Some("soon"), None, true), &named), None);
        // Another server under the name, or no UID to prove it is the one: left alone.
        let recreated = McpServerState {
            uid: "uid-other".into(),
            ..pending.clone()
        };
        assert_eq!(left_value(&recreated, &named), None);
        let unproven = McpServerRef {
            uid: String::new(),
            ..named.clone()
        };
        let blank = McpServerState {
            uid: String::new(),
            ..pending
        };
        assert_eq!(left_value(&blank, &unproven), None);
    }

    #[test]
    fn the_request_is_now_in_whole_seconds_unless_a_later_one_was_processed() {
        let at = t("2026-12-03T10:00:00.700Z");
        let cases = [
            (None, "2026-12-03T10:00:00Z"),
            (Some("2026-12-03T09:00:00Z"), "2026-12-03T10:00:00Z"),
            // A request in this very second, or by a clock ahead of ours: one after it.
            (Some("2026-12-03T10:00:00Z"), "2026-12-03T10:00:01Z"),
            (Some("2026-12-03T10:05:00Z"), "2026-12-03T10:05:01Z"),
            // The operator cannot parse it either, so it acts on any request.
            (Some("yesterday"), "2026-12-03T10:00:00Z"),
        ];
        for (last, want) in cases {
            let got = restart_request(&server(None, last), &proxy("fetch", "fetch"), at).unwrap();
            assert_eq!(got, want, "last processed {last:?}");
        }
    }

    /// Deployment `name` in namespace mcp, controlled by MCPServer `owner` (UID `uid-<owner>`).
    fn proxy(name: &str, owner: &str) -> Workload {
        use crate::core::plan::tests::{OLD, deployment, pod};
        let mut w = deployment("mcp", name, "x", vec![pod(name, "x", OLD, Some(900))]);
        w.toolhive.server = Some(Box::new(McpServerRef {
            api_version: "toolhive.stacklok.dev/v1beta1".into(),
            name: owner.into(),
            uid: format!("uid-{owner}"),
        }));
        w
    }

    /// The operator restarts the Deployment named after the server: a request for any other
    /// Deployment that names the server as its controller would restart the real proxy,
    /// unselected and ungated. So would one for a server deleted and created again under the
    /// same name since the ownerReference was written.
    #[test]
    fn only_the_operators_own_proxy_of_that_very_server_is_asked_for() {
        let at = t("2026-12-03T10:00:00Z");
        let fetch = server(None, None);
        assert!(restart_request(&fetch, &proxy("fetch", "fetch"), at).is_ok());

        let forged = proxy("forged", "fetch");
        let err = restart_request(&fetch, &forged, at).unwrap_err();
        assert_eq!(err.code(), "notOperatorOwned");
        assert_eq!(
            err.to_string(),
            "not the proxy Deployment of MCPServer fetch: the operator's proxy Deployment carries the server's name"
        );
        assert_eq!(
            operator_proxy(&forged).unwrap_err(),
            err,
            "the plan says so too"
        );

        let recreated = McpServerState {
            uid: "uid-new".into(),
            ..server(None, None)
        };
        let err = restart_request(&recreated, &proxy("fetch", "fetch"), at).unwrap_err();
        assert_eq!(err.code(), "notOperatorOwned");
        assert!(err.to_string().contains(r#"UID "uid-fetch""#), "{err}");

        let mut unknown = proxy("fetch", "fetch");
        unknown.toolhive.server.as_mut().unwrap().uid.clear();
        let err = restart_request(&fetch, &unknown, at).unwrap_err();
        assert_eq!(err.code(), "notOperatorOwned", "no UID is no proof");

        let mut orphan = proxy("fetch", "fetch");
        orphan.toolhive.server = None;
        let err = restart_request(&fetch, &orphan, at).unwrap_err();
        assert_eq!(err.code(), "notOperatorOwned");
        assert!(operator_proxy(&orphan).unwrap().is_none());

        // Another server's proxy read back by mistake is not this server's either.
        let other = proxy("github", "github");
        let err = restart_request(&fetch, &other, at).unwrap_err();
        assert_eq!(err.code(), "notOperatorOwned");
    }

    #[test]
    fn only_the_rolling_strategy_is_asked_for() {
        let at = t("2026-12-03T10:00:00Z");
        let fetch = proxy("fetch", "fetch");
        assert!(restart_request(&server(Some("rolling"), None), &fetch, at).is_ok());
        for strategy in ["immediate", "Rolling", "surge"] {
            let err = restart_request(&server(Some(strategy), None), &fetch, at).unwrap_err();
            assert_eq!(err.code(), "restartStrategy");
            assert!(err.to_string().contains(strategy), "{err}");
        }
    }

    /// `restart.method: toolhive` goes through the MCPServer only where one controls the
    /// Deployment; anything else is restarted as `auto` would. `auto` never picks it: where the
    /// operator reverts restartedAt (v0.44.0 and before) it reverts its own restart too.
    #[test]
    fn the_method_goes_through_an_mcp_server_only_where_one_owns_the_deployment() {
        use crate::core::model::{McpServerRef, Method, UpdateStrategy};
        use crate::core::plan::tests::{OLD, deployment, inventory, over, pod, policy, run};
        use crate::core::policy::RestartMethod;

        let proxy = |name: &str| deployment("mcp", name, "x", vec![pod(name, "x", OLD, Some(900))]);
        let mut owned = proxy("fetch");
        owned.toolhive.server = Some(Box::new(McpServerRef {
            api_version: "toolhive.stacklok.dev/v1beta1".into(),
            name: "fetch".into(),
            uid: "uid-fetch".into(),
        }));
        let mut forged = proxy("forged");
        forged.toolhive.server = owned.toolhive.server.clone();
        let plain = proxy("plain");
        let mut ondelete = crate::core::plan::tests::statefulset("db", 2, UpdateStrategy::OnDelete);
        ondelete.target.namespace = "mcp".into();
        for pod in &mut ondelete.pods {
            pod.labels = crate::core::plan::tests::labels(&[("app", "x")]).into();
            pod.containers[0].usage = Some(900 << 20);
            pod.has_metrics = true;
        }
        let inv = inventory(vec![owned, forged, plain, ondelete]);
        let method_of = |method: RestartMethod| {
            let mut p = over(policy("m", "x"), 512);
            p.restart.method = method;
            let plan = run(&[p], &inv);
            let mut got: Vec<(String, Method)> = plan
                .bounces
                .iter()
                .map(|b| (b.target.name.clone(), b.method))
                .collect();
            got.sort_by(|a, b| a.0.cmp(&b.0));
            got
        };
        let toolhive = method_of(RestartMethod::Toolhive);
        assert_eq!(
            toolhive,
            [
                ("db".to_string(), Method::Evict),
                ("fetch".to_string(), Method::Toolhive),
                ("plain".to_string(), Method::Rollout),
            ]
        );
        // A Deployment that names fetch as its controller but is not fetch's proxy: the plan
        // skips it rather than ask fetch's operator to restart its real proxy.
        let mut p = over(policy("m", "x"), 512);
        p.restart.method = RestartMethod::Toolhive;
        let plan = run(&[p], &inv);
        let skip = plan.skips.iter().find(|s| s.target.name == "forged");
        let reason = skip.map(|s| s.reason.code());
        assert_eq!(reason, Some("notOperatorOwned"), "{:?}", plan.skips);
        let auto = method_of(RestartMethod::Auto);
        assert!(auto.iter().all(|(_, m)| *m != Method::Toolhive), "{auto:?}");
    }
}
