//! The plan with Prometheus: history triggers through the planner, and `blockWhen`.

use std::collections::BTreeMap;

use super::*;
use crate::core::history::{History, HttpStatus, Labels, Prometheus, QueryError};
use crate::core::model::MetricsState;
use crate::core::trend::tests::{NOW, history, leak_at, policy, t, workload};

fn inventory(w: Workload) -> Inventory {
    Inventory {
        workloads: vec![w],
        unsupported: vec![],
        excluded_namespaces: Default::default(),
        pdbs: vec![],
        metrics: MetricsState::Available,
    }
}

fn prom(history: Result<History, QueryError>) -> Prometheus {
    Prometheus {
        off: None,
        history,
        blockers: BTreeMap::new(),
    }
}

const LIMITS: Limits = Limits {
    max_bounces: 10,
    rollout_timeout: std::time::Duration::from_secs(600),
};
const BLOCK: &str = "  blockWhen: {prometheus: 'ALERTS{alertstate=\"firing\"}'}\n";

#[test]
fn a_blocker_with_results_or_without_an_answer_blocks() {
    let p = policy("{above: 1Gi}", BLOCK);
    let query = p.block_when.clone().unwrap();
    let inv = inventory(workload(2048.0));
    let mut answer = prom(Err(QueryError::NotNeeded));
    let skip = |prometheus: &Prometheus| {
        let plan = plan_with(std::slice::from_ref(&p), &inv, prometheus, t(NOW), &LIMITS);
        assert!(plan.bounces.is_empty(), "{:?}", plan.bounces);
        plan.skips[0].reason.clone()
    };
    let alert = |name: &str| Labels::from([("alertname".to_string(), name.to_string())]);
    answer.blockers.insert(
        query.clone(),
        Ok(vec![alert("NodeDown"), alert("EtcdNoLeader")]),
    );
    let reason = skip(&answer);
    assert_eq!(reason.code(), "blocked");
    assert_eq!(
        reason.to_string(),
        "blocked by blockWhen: EtcdNoLeader, NodeDown"
    );

    let refused = QueryError::Refused {
        status: HttpStatus {
            code: 400,
            reason: Some("Bad Request"),
        },
        error_type: "bad_data".into(),
        error: "parse error".into(),
    };
    answer.blockers.insert(query.clone(), Err(refused.clone()));
    let reason = skip(&answer);
    assert_eq!(reason.code(), "blockerFailed");
    assert!(
        matches!(&reason, SkipReason::BlockerFailed { error } if *error == refused),
        "{reason:?}"
    );
    assert_eq!(
        reason.to_string(),
        "blocked: the blockWhen query failed (HTTP 400 Bad Request: bad_data: parse error)"
    );

    let reason = skip(&Prometheus::off(QueryError::NotConfigured));
    assert_eq!(
        reason.to_string(),
        "blocked: the blockWhen query failed (no Prometheus configured (--prometheus-url))"
    );

    // No result: the memory trigger bounces as before.
    answer.blockers.insert(query, Ok(vec![]));
    let plan = plan_with(std::slice::from_ref(&p), &inv, &answer, t(NOW), &LIMITS);
    assert_eq!(plan.bounces.len(), 1);
}

#[test]
fn history_triggers_bounce_through_the_plan() {
    let p = policy("{growth: {above: 50Mi, per: 1h}}", "");
    let inv = inventory(workload(400.0));
    let plan = plan_with(
        std::slice::from_ref(&p),
        &inv,
        &prom(leak_at(NOW, 400.0)),
        t(NOW),
        &LIMITS,
    );
    assert_eq!(plan.bounces.len(), 1, "{:?}", plan.skips);
    assert_eq!(plan.bounces[0].triggers[0].code(), "memoryGrowth");
    // Without Prometheus: not due, with the reason, never a bounce.
    let plan = super::plan(&[p], &inv, t(NOW), &LIMITS);
    assert_eq!(
        plan.skips[0].reason.to_string(),
        "not due: memory.growth: off: no Prometheus configured (--prometheus-url)"
    );
}

#[test]
fn a_spike_metrics_server_sees_does_not_bounce_under_sustained() {
    let p = policy("{above: 1Gi, sustained: 15m}", "");
    let spike = history(t(NOW), 20, |ago| if ago == 5.0 { 2048.0 } else { 100.0 });
    // metrics-server's one sample is the spike: sustained replaces the threshold trigger.
    let inv = inventory(workload(2048.0));
    let plan = plan_with(
        std::slice::from_ref(&p),
        &inv,
        &prom(spike),
        t(NOW),
        &LIMITS,
    );
    assert!(plan.bounces.is_empty());
    assert_eq!(
        plan.skips[0].reason.to_string(),
        "not due: memory.sustained: web-1 went down to 100Mi <= 1Gi in the last 15m (61 samples)"
    );
}
