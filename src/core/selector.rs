//! Label selectors over pod labels: Kubernetes matching semantics, kubectl `-l` rendering, and the
//! syntax rules for label keys, label values and DNS-1123 names that policies are checked against.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// matchLabels AND every matchExpression, as in a Kubernetes `LabelSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    /// Non-empty for In/NotIn, empty for Exists/DoesNotExist (the loader enforces both).
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Operator {
    /// The label is present and its value is one of `values`.
    In,
    /// The label is absent, or present with a value not in `values`.
    NotIn,
    /// The label is present, whatever its value.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl Selector {
    /// A selector without any requirement matches every pod; policies are never allowed one.
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether some requirement names what a pod must carry (a matchLabels entry, `In` or
    /// `Exists`). Only negative requirements (`NotIn`, `DoesNotExist`) match every pod without
    /// the label, which is nearly the whole cluster; policies are never allowed one.
    pub fn has_positive(&self) -> bool {
        !self.match_labels.is_empty()
            || self
                .match_expressions
                .iter()
                .any(|r| matches!(r.operator, Operator::In | Operator::Exists))
    }

    /// The label keys it reads: a pod's other labels cannot change whether it matches.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.match_labels
            .keys()
            .chain(self.match_expressions.iter().map(|r| &r.key))
            .map(String::as_str)
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            // Kubernetes semantics: a pod without the key is "not in" any set.
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

/// kubectl `-l` syntax, so a report line can be pasted into `kubectl get pods -l '...'`.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        parts.extend(self.match_expressions.iter().map(ToString::to_string));
        f.write_str(&parts.join(","))
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = || {
            let mut values = self.values.clone();
            values.sort();
            values.dedup();
            values.join(",")
        };
        match self.operator {
            Operator::In => write!(f, "{} in ({})", self.key, set()),
            Operator::NotIn => write!(f, "{} notin ({})", self.key, set()),
            Operator::Exists => f.write_str(&self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
        }
    }
}

/// Why `key` is not a valid label key (`[prefix/]name`), or None when it is.
pub(crate) fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && let Some(problem) = dns1123_subdomain_problem(prefix)
    {
        return Some(format!("label key prefix {problem}"));
    }
    if name.is_empty() {
        return Some("label key name part must not be empty".into());
    }
    label_name_problem(name, "label key name part")
}

/// Why `value` is not a valid label value, or None when it is (empty is valid).
pub(crate) fn label_value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    label_name_problem(value, "label value")
}

fn label_name_problem(s: &str, what: &str) -> Option<String> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok = s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'));
    (!ok).then(|| {
        format!(
            "{what} must be at most 63 characters of letters, digits, '-', '_' or '.', \
             starting and ending with a letter or digit"
        )
    })
}

/// Why `s` is not a DNS-1123 label (namespace and container names), or None when it is.
pub(crate) fn dns1123_label_problem(s: &str) -> Option<String> {
    (!is_dns1123_label(s)).then(|| {
        "must be a DNS-1123 label: at most 63 characters of lowercase letters, digits and '-', \
         starting and ending with a letter or digit"
            .into()
    })
}

/// Why `s` is not a DNS-1123 subdomain (object names), or None when it is.
pub(crate) fn dns1123_subdomain_problem(s: &str) -> Option<String> {
    let ok = s.len() <= 253 && s.split('.').all(is_dns1123_label);
    (!ok).then(|| {
        "must be a DNS-1123 subdomain: at most 253 characters of lowercase letters, digits, '-' \
         and '.', each dot-separated part starting and ending with a letter or digit"
            .into()
    })
}

fn is_dns1123_label(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, operator: Operator, values: &[&str]) -> Requirement {
        Requirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn requirement_semantics_follow_kubernetes() {
        let pod = labels(&[("app", "web"), ("tier", "canary")]);
        let cases = [
            (req("tier", Operator::In, &["canary", "edge"]), true),
            (req("tier", Operator::In, &["stable"]), false),
            (req("absent", Operator::In, &["x"]), false),
            (req("tier", Operator::NotIn, &["canary"]), false),
            (req("tier", Operator::NotIn, &["stable"]), true),
            // An absent key satisfies NotIn: "tier notin (canary)" selects untiered pods too.
            (req("absent", Operator::NotIn, &["canary"]), true),
            (req("app", Operator::Exists, &[]), true),
            (req("absent", Operator::Exists, &[]), false),
            (req("app", Operator::DoesNotExist, &[]), false),
            (req("absent", Operator::DoesNotExist, &[]), true),
        ];
        for (requirement, want) in cases {
            assert_eq!(requirement.matches(&pod), want, "{requirement}");
        }
    }

    #[test]
    fn selector_needs_every_label_and_every_expression() {
        let selector = Selector {
            match_labels: labels(&[("app", "web"), ("team", "shop")]),
            match_expressions: vec![req("debug", Operator::DoesNotExist, &[])],
        };
        assert!(selector.matches(&labels(&[("app", "web"), ("team", "shop"), ("extra", "1")])));
        assert!(!selector.matches(&labels(&[("app", "web")])));
        assert!(!selector.matches(&labels(&[("app", "web"), ("team", "other")])));
        assert!(!selector.matches(&labels(&[("app", "web"), ("team", "shop"), ("debug", "")])));
    }

    #[test]
    fn empty_selector_is_detectable() {
        assert!(Selector::default().is_empty());
        let one = Selector {
            match_expressions: vec![req("a", Operator::Exists, &[])],
            ..Selector::default()
        };
        assert!(!one.is_empty());
    }

    #[test]
    fn only_in_exists_and_match_labels_are_positive() {
        let of = |ops: &[Operator]| Selector {
            match_expressions: ops
                .iter()
                .map(|&op| {
                    let values: &[&str] = match op {
                        Operator::In | Operator::NotIn => &["x"],
                        Operator::Exists | Operator::DoesNotExist => &[],
                    };
                    req("k", op, values)
                })
                .collect(),
            ..Selector::default()
        };
        assert!(!of(&[]).has_positive());
        assert!(!of(&[Operator::NotIn, Operator::DoesNotExist]).has_positive());
        assert!(of(&[Operator::NotIn, Operator::In]).has_positive());
        assert!(of(&[Operator::DoesNotExist, Operator::Exists]).has_positive());
        let labelled = Selector {
            match_labels: labels(&[("app", "web")]),
            ..of(&[Operator::NotIn])
        };
        assert!(labelled.has_positive());
    }

    #[test]
    fn renders_as_kubectl_label_selector() {
        let selector = Selector {
            match_labels: labels(&[("tier", "api"), ("app", "x")]),
            match_expressions: vec![
                req("track", Operator::NotIn, &["canary", "beta"]),
                req("env", Operator::In, &["prod"]),
                req("owner", Operator::Exists, &[]),
                req("debug", Operator::DoesNotExist, &[]),
            ],
        };
        assert_eq!(
            selector.to_string(),
            "app=x,tier=api,track notin (beta,canary),env in (prod),owner,!debug"
        );
    }

    #[test]
    fn label_keys_and_values() {
        for ok in [
            "app",
            "app.kubernetes.io/name",
            "toolhive-name",
            "a_b.c",
            "x/Y9",
        ] {
            assert_eq!(label_key_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "/app",
            "-app",
            "app-",
            "Example.com/app",
            "a/b/c",
            "app name",
            &"k".repeat(64),
        ] {
            assert!(label_key_problem(bad).is_some(), "{bad:?}");
        }
        for ok in ["", "true", "v1.2_3-b", &"v".repeat(63)] {
            assert_eq!(label_value_problem(ok), None, "{ok}");
        }
        for bad in ["-x", "x.", "a b", "ä", &"v".repeat(64)] {
            assert!(label_value_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn dns1123_names() {
        assert_eq!(dns1123_label_problem("toolhive-system"), None);
        assert!(dns1123_label_problem("Shop").is_some());
        assert!(dns1123_label_problem("a.b").is_some());
        assert!(dns1123_label_problem(&"n".repeat(64)).is_some());
        assert_eq!(dns1123_subdomain_problem("vmcp.nightly-1"), None);
        assert!(dns1123_subdomain_problem("vmcp..nightly").is_some());
        assert!(dns1123_subdomain_problem("vmcp_nightly").is_some());
        assert!(dns1123_subdomain_problem("").is_some());
    }
}
