//! Fuzzes the policy loader: any text (valid UTF-8 or not) must load or fail with errors, never
//! panic, and whatever loads must survive the date arithmetic the planner does with it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The loader reads files as UTF-8; bytes that are not are an I/O error before it.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let policies = match bouncer::core::policy::parse_str("fuzz.yaml", text) {
        Ok(p) => p,
        Err(e) => {
            // Every error names where it is, and renders.
            assert!(!e.errors.is_empty());
            let _ = e.to_string();
            return;
        }
    };
    let now: chrono::DateTime<chrono::Utc> = "2026-03-29T01:30:00Z".parse().unwrap();
    for p in &policies {
        assert!(!p.name.is_empty() && !p.kinds.is_empty() && !p.selector.is_empty());
        if let Some(s) = &p.schedule {
            let _ = s.next_fire(now);
            let _ = s.verdict(now, Some(now - chrono::TimeDelta::days(400)));
        }
        let _ = bouncer::core::schedule::in_windows(&p.windows, now);
    }
    let inventory = bouncer::core::model::Inventory {
        workloads: Vec::new(),
        unsupported: Vec::new(),
        excluded_namespaces: Default::default(),
        pdbs: Vec::new(),
        metrics: bouncer::core::model::MetricsState::Available,
    };
    let _ = bouncer::core::plan::plan(
        &policies,
        &inventory,
        now,
        &bouncer::core::plan::Limits::max_bounces(10),
    );
});
