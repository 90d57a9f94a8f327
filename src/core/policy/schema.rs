//! The JSON Schema of one policy document, generated from the same serde types the loader parses,
//! so editors and CI linters see exactly the format `bouncer validate` accepts (minus the checks
//! a schema cannot express, such as cron syntax and duplicate names).

use super::raw::RawPolicy;

/// JSON Schema (draft 2020-12) of one BouncePolicy document. Unknown fields are rejected, and
/// `apiVersion` and `kind` are pinned to their constants.
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(RawPolicy);
    schema.insert(
        "description".into(),
        concat!(
            "A bouncer policy: which pods to watch (target), when their workloads are due for a ",
            "restart (triggers: a cron schedule, a memory threshold, or both), and how to restart ",
            "them one at a time. A file may hold many documents separated by ---."
        )
        .into(),
    );
    schema.to_value()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde::Deserialize;
    use serde_json::{Value, json};

    use super::*;

    fn documents(text: &str) -> Vec<Value> {
        serde_yaml_ng::Deserializer::from_str(text)
            .map(|doc| Value::deserialize(doc).expect("valid YAML"))
            .filter(|doc| !doc.is_null())
            .collect()
    }

    use crate::core::policy::example_document as example;

    #[test]
    fn every_example_policy_validates() {
        let validator = jsonschema::validator_for(&json_schema()).expect("the schema compiles");
        // At run time: a build cache shared between checkouts would keep another checkout's path.
        let dir = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("policies");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("policies/ exists") {
            let path = entry.expect("readable").path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            for doc in documents(&std::fs::read_to_string(&path).expect("readable")) {
                let problems: Vec<String> =
                    validator.iter_errors(&doc).map(|e| e.to_string()).collect();
                assert!(problems.is_empty(), "{}: {problems:?}", path.display());
                seen += 1;
            }
        }
        assert!(seen >= 3, "expected the example policies, found {seen}");
    }

    #[test]
    fn schema_rejects_what_the_loader_rejects_structurally() {
        let validator = jsonschema::validator_for(&json_schema()).expect("the schema compiles");
        assert!(validator.is_valid(&example()));
        type Break = fn(&mut Value);
        let broken: [(&str, Break); 8] = [
            ("unknown field", |d| {
                d["spec"]["triggers"]["shedule"] = json!({"cron": "0 3 * * *"})
            }),
            ("unknown top-level field", |d| d["status"] = json!({})),
            ("wrong apiVersion", |d| {
                d["apiVersion"] = json!("bouncer.dev/v1")
            }),
            ("wrong kind", |d| d["kind"] = json!("Deployment")),
            ("no trigger", |d| d["spec"]["triggers"] = json!({})),
            ("maxPerRun 0", |d| d["spec"]["maxPerRun"] = json!(0)),
            ("percent over 100", |d| {
                d["spec"]["triggers"]["memory"] = json!({"percentOfLimit": 101})
            }),
            ("both thresholds", |d| {
                d["spec"]["triggers"]["memory"]["percentOfLimit"] = json!(85)
            }),
        ];
        for (name, break_it) in broken {
            let mut doc = example();
            break_it(&mut doc);
            assert!(!validator.is_valid(&doc), "{name} should be rejected");
        }
    }

    #[test]
    fn schema_describes_the_format() {
        let schema = json_schema();
        assert_eq!(schema["title"], "BouncePolicy");
        assert!(
            schema["description"]
                .as_str()
                .is_some_and(|d| d.contains("one at a time"))
        );
        assert_eq!(
            schema["properties"]["apiVersion"]["const"],
            "bouncer.dev/v1alpha1"
        );
        assert_eq!(schema["properties"]["kind"]["const"], "BouncePolicy");
        // Doc comments on the raw types become field descriptions.
        let cooldown = schema.pointer("/$defs/Spec/properties/cooldown/description");
        assert!(
            cooldown
                .and_then(Value::as_str)
                .is_some_and(|d| d.contains("6h")),
            "{cooldown:?}"
        );
    }
}
