//! ToolHive's own restart of an MCPServer (`restart.method: toolhive`), decided from plain data:
//! whether the resource may be asked at all, and the request value its operator will act on.
//!
//! The operator (`handleRestartAnnotation` in `mcpserver_controller.go`) acts when the
//! resource's `restarted-at` is later than its `last-processed-restart`, then restarts the
//! server the way its `restart-strategy` says: `rolling` (the default) writes its own
//! annotation on the proxy Deployment's pod template, so the Deployment controller rolls the
//! pods; `immediate` deletes every pod of the server at once, which bouncer never asks for.

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};

use crate::core::literals::{TOOLHIVE_ROLLING, rfc3339};
use crate::core::reasons::SkipReason;

/// The restart annotations of an MCPServer as read right before asking.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpServerState {
    pub name: String,
    /// `mcpserver.toolhive.stacklok.dev/restart-strategy`, if set.
    pub strategy: Option<String>,
    /// `mcpserver.toolhive.stacklok.dev/last-processed-restart`, if set.
    pub last_processed: Option<String>,
    /// The resource's version as read: the request is conditional on it, so a strategy changed
    /// in between (say to `immediate`) makes the server refuse the request.
    pub resource_version: String,
}

/// The `restarted-at` value to write: `at`, or one second after the last processed request
/// when that is not older (the operator ignores a request that is not later, and times here
/// are whole seconds). A strategy other than rolling is a skip: `immediate` deletes all pods of
/// the server at once, and an unknown one may do anything.
pub fn restart_request(server: &McpServerState, at: DateTime<Utc>) -> Result<String, SkipReason> {
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
    // Compared as written: whole seconds.
    let at = at.trunc_subsecs(0);
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
            strategy: strategy.map(Into::into),
            last_processed: last.map(Into::into),
            resource_version: "1".into(),
        }
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
            let got = restart_request(&server(None, last), at).unwrap();
            assert_eq!(got, want, "last processed {last:?}");
        }
    }

    #[test]
    fn only_the_rolling_strategy_is_asked_for() {
        let at = t("2026-12-03T10:00:00Z");
        assert!(restart_request(&server(Some("rolling"), None), at).is_ok());
        for strategy in ["immediate", "Rolling", "surge"] {
            let err = restart_request(&server(Some(strategy), None), at).unwrap_err();
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
        owned.toolhive.server = Some(McpServerRef {
            api_version: "toolhive.stacklok.dev/v1beta1".into(),
            name: "fetch".into(),
        });
        let plain = proxy("plain");
        let mut ondelete = crate::core::plan::tests::statefulset("db", 2, UpdateStrategy::OnDelete);
        ondelete.target.namespace = "mcp".into();
        for pod in &mut ondelete.pods {
            pod.labels = crate::core::plan::tests::labels(&[("app", "x")]).into();
            pod.containers[0].usage = Some(900 << 20);
            pod.has_metrics = true;
        }
        let inv = inventory(vec![owned, plain, ondelete]);
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
        let auto = method_of(RestartMethod::Auto);
        assert!(auto.iter().all(|(_, m)| *m != Method::Toolhive), "{auto:?}");
    }
}
