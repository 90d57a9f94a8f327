//! Loading policies: files and directories of multi-document YAML, parsed and validated into
//! `Policy` values, with every problem in every document reported at once.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml_ng::Value;

use super::Policy;
use super::check::Check;
use super::validate::{header_ok, validate};

/// One problem in one place. Displays as
/// `policies/vmcp.yaml: document 2 (vmcp-leak): spec.triggers.schedule.cron: "0 25 * * *": hour 25 out of range 0-23`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// The file (or parse_str's source name); None for problems with the arguments as a whole.
    pub file: Option<String>,
    /// 1-based, counting empty documents too, so it matches the `---` separators in the file.
    pub document: Option<usize>,
    /// metadata.name when the document got far enough to have one.
    pub policy: Option<String>,
    /// 1-based line and column, for problems the YAML parser located.
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// Dotted path such as `spec.triggers.memory.above`.
    pub field: Option<String>,
    /// The offending value as written, quoted when it is a string.
    pub value: Option<String>,
    pub problem: String,
}

/// All the problems found; the CLI turns this into exit code 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct LoadError {
    pub errors: Vec<PolicyError>,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            f.write_str(file)?;
            if let (Some(line), Some(column)) = (self.line, self.column) {
                write!(f, ":{line}:{column}")?;
            }
            f.write_str(": ")?;
        }
        if let Some(document) = self.document {
            write!(f, "document {document}")?;
            if let Some(policy) = &self.policy {
                write!(f, " ({policy})")?;
            }
            f.write_str(": ")?;
        }
        for part in [&self.field, &self.value].into_iter().flatten() {
            write!(f, "{part}: ")?;
        }
        f.write_str(&self.problem)
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.errors.iter().map(ToString::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl PolicyError {
    fn general(file: Option<&str>, problem: impl Into<String>) -> Self {
        PolicyError {
            file: file.map(str::to_owned),
            document: None,
            policy: None,
            line: None,
            column: None,
            field: None,
            value: None,
            problem: problem.into(),
        }
    }
}

/// Loads every policy under `paths`, sorted by name. A path is a file (read whatever its name) or
/// a directory, whose `*.yaml` and `*.yml` files are read in name order; directories are not
/// descended into, and hidden entries are skipped (a mounted ConfigMap keeps its real files in
/// hidden `..data` directories beside the visible links). Finding no policy at all is an error:
/// a scheduled run with nothing to do is a misconfiguration, not a success.
pub fn load_paths(paths: &[PathBuf]) -> Result<Vec<Policy>, LoadError> {
    let mut errors = Vec::new();
    if paths.is_empty() {
        errors.push(PolicyError::general(
            None,
            "no policy file or directory given",
        ));
    }
    let mut loaded = Vec::new();
    for path in paths {
        for file in policy_files(path, &mut errors) {
            let name = file.display().to_string();
            match std::fs::read_to_string(&file) {
                Ok(text) => parse_documents(&name, &text, &mut loaded, &mut errors),
                Err(e) => errors.push(PolicyError::general(
                    Some(&name),
                    format!("cannot read: {e}"),
                )),
            }
        }
    }
    if loaded.is_empty() && errors.is_empty() {
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        errors.push(PolicyError::general(
            Some(&names.join(", ")),
            "no BouncePolicy found (a run without policies would do nothing)",
        ));
    }
    finish(loaded, errors)
}

/// Parses the documents of one text as if it were a file named `source`. Unlike `load_paths`,
/// a text without policies is not an error.
pub fn parse_str(source: &str, text: &str) -> Result<Vec<Policy>, LoadError> {
    let (mut loaded, mut errors) = (Vec::new(), Vec::new());
    parse_documents(source, text, &mut loaded, &mut errors);
    finish(loaded, errors)
}

/// A validated policy with where it came from, kept apart until duplicates are checked.
struct Loaded {
    policy: Policy,
    file: String,
    document: usize,
}

fn policy_files(path: &Path, errors: &mut Vec<PolicyError>) -> Vec<PathBuf> {
    let shown = path.display().to_string();
    let cannot =
        |e: std::io::Error| PolicyError::general(Some(&shown), format!("cannot read: {e}"));
    match std::fs::metadata(path) {
        Err(e) => {
            errors.push(cannot(e));
            Vec::new()
        }
        Ok(meta) if !meta.is_dir() => vec![path.to_owned()],
        Ok(_) => match std::fs::read_dir(path) {
            Err(e) => {
                errors.push(cannot(e));
                Vec::new()
            }
            Ok(entries) => {
                let mut files: Vec<PathBuf> = entries
                    .filter_map(Result::ok)
                    .map(|entry| entry.path())
                    .filter(|p| {
                        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or(".");
                        let yaml = p.extension().is_some_and(|e| e == "yaml" || e == "yml");
                        // metadata() follows symlinks, as ConfigMap mounts need.
                        !name.starts_with('.')
                            && yaml
                            && std::fs::metadata(p).is_ok_and(|m| m.is_file())
                    })
                    .collect();
                files.sort();
                files
            }
        },
    }
}

fn parse_documents(
    file: &str,
    text: &str,
    loaded: &mut Vec<Loaded>,
    errors: &mut Vec<PolicyError>,
) {
    // First pass: plain values, to skip empty documents, find names for messages and check
    // apiVersion/kind before serde reports a foreign object's fields as unknown. A YAML error
    // ends the stream: after a syntax error the parser repeats it for every further document,
    // and after an unknown alias (`*name`) serde_yaml_ng 0.10 panics on the next document (found
    // by the fuzzer: "- *y\n---\n- z"). The `take` is a backstop: no text holds more documents
    // than bytes.
    let mut values: Vec<Option<Value>> = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text).take(text.len() + 1) {
        match Value::deserialize(document) {
            Ok(value) => values.push(Some(value)),
            Err(e) => {
                errors.push(serde_error(file, values.len() + 1, None, &e));
                values.push(None);
                break;
            }
        }
    }
    let documents = serde_yaml_ng::Deserializer::from_str(text).take(values.len());
    for (index, (value, document)) in values.into_iter().zip(documents).enumerate() {
        let number = index + 1;
        let Some(value) = value.filter(|v| !v.is_null()) else {
            continue;
        };
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut check = Check::new(file, number, name.clone(), errors);
        if !header_ok(&value, &mut check) {
            continue;
        }
        match super::raw::RawPolicy::deserialize(document) {
            Err(e) => errors.push(serde_error(file, number, name, &e)),
            Ok(raw) => {
                if let Some(policy) = validate(raw, &mut check) {
                    loaded.push(Loaded {
                        policy,
                        file: file.to_owned(),
                        document: number,
                    });
                }
            }
        }
    }
}

/// Turns serde_yaml_ng's "path: message at line L column C" into separate fields, and names the
/// offending key itself for unknown and missing fields.
fn serde_error(
    file: &str,
    document: usize,
    policy: Option<String>,
    e: &serde_yaml_ng::Error,
) -> PolicyError {
    let location = e.location();
    let mut text = e.to_string();
    if let Some(loc) = &location {
        text = text.replacen(
            &format!(" at line {} column {}", loc.line(), loc.column()),
            "",
            1,
        );
    }
    let (mut field, mut problem) = match text.split_once(": ") {
        Some((path, rest)) if !path.is_empty() && !path.contains(char::is_whitespace) => {
            (Some(path.to_owned()), rest.to_owned())
        }
        _ => (None, text.clone()),
    };
    for (prefix, replacement) in [
        ("unknown field `", "unknown field"),
        ("missing field `", "required field is missing"),
    ] {
        if let Some((key, tail)) = problem
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once('`'))
        {
            field = Some(field.map_or_else(|| key.to_owned(), |path| format!("{path}.{key}")));
            problem = format!("{replacement}{tail}");
            break;
        }
    }
    PolicyError {
        file: Some(file.to_owned()),
        document: Some(document),
        policy,
        line: location.as_ref().map(|l| l.line()),
        column: location.as_ref().map(|l| l.column()),
        field,
        value: None,
        problem,
    }
}

/// Names must be unique across everything loaded; the later definition is the error and it
/// names the earlier one.
fn finish(loaded: Vec<Loaded>, mut errors: Vec<PolicyError>) -> Result<Vec<Policy>, LoadError> {
    let mut first: BTreeMap<&str, &Loaded> = BTreeMap::new();
    for item in &loaded {
        match first.get(item.policy.name.as_str()) {
            None => {
                first.insert(&item.policy.name, item);
            }
            Some(earlier) => errors.push(PolicyError {
                file: Some(item.file.clone()),
                document: Some(item.document),
                policy: Some(item.policy.name.clone()),
                line: None,
                column: None,
                field: Some("metadata.name".into()),
                value: Some(format!("{:?}", item.policy.name)),
                problem: format!(
                    "duplicate policy name, first defined in {}",
                    earlier.policy.source
                ),
            }),
        }
    }
    if !errors.is_empty() {
        return Err(LoadError { errors });
    }
    let mut policies: Vec<Policy> = loaded.into_iter().map(|l| l.policy).collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(policies)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value as Json, json};

    use super::*;
    use crate::core::model::Kind;
    use crate::core::policy::{OnRevert, RestartMethod, Threshold};

    use crate::core::policy::example_document as base;

    fn yaml(doc: &Json) -> String {
        serde_yaml_ng::to_string(doc).unwrap()
    }

    fn messages(result: Result<Vec<Policy>, LoadError>) -> Vec<String> {
        result
            .expect_err("should fail")
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn example_policies_load() {
        // At run time: a build cache shared between checkouts would keep another checkout's path.
        let dir = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("policies");
        let policies = load_paths(&[dir]).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["leaky-api", "mcp-servers-memory", "vmcp-nightly"]);

        let vmcp = &policies[2];
        assert_eq!(vmcp.namespaces, ["toolhive-system"]);
        assert_eq!(vmcp.kinds, [Kind::Deployment]);
        let schedule = vmcp.schedule.as_ref().expect("nightly schedule");
        assert_eq!(
            (schedule.time_zone, schedule.starting_deadline),
            (chrono_tz::Europe::Berlin, Duration::from_secs(7200))
        );
        assert_eq!(
            vmcp.memory.as_ref().map(|m| m.threshold),
            Some(Some(Threshold::Bytes(1536 << 20)))
        );
        assert_eq!(vmcp.restart.on_revert, OnRevert::Evict);

        let mcp = &policies[1];
        assert_eq!(
            mcp.selector.to_string(),
            "toolhive=true,toolhive-name in (fetch,filesystem,github)"
        );
        assert_eq!(
            mcp.memory.as_ref().map(|m| m.threshold),
            Some(Some(Threshold::PercentOfLimit(85.0)))
        );
        assert_eq!(mcp.group_by.as_deref(), Some("toolhive-name"));
        assert_eq!(mcp.restart.on_revert, OnRevert::Evict);
        assert_eq!(
            (mcp.max_per_run, mcp.cooldown),
            (Some(2), Duration::from_secs(6 * 3600))
        );
        // Any time of day (the night window is shown commented out), single replicas allowed.
        assert!(mcp.windows.is_empty());
        assert!(mcp.allow_downtime);
        assert_eq!(mcp.namespaces, ["toolhive"]);

        let leaky = &policies[0];
        assert_eq!(
            leaky.memory.as_ref().map(|m| m.threshold),
            Some(Some(Threshold::Bytes(1 << 30)))
        );
        assert_eq!(leaky.cooldown, Duration::from_secs(7200));
        assert_eq!(
            leaky.breaker,
            Some(crate::core::policy::Breaker {
                max_bounces: 4,
                per: Duration::from_secs(86400)
            })
        );
    }

    #[test]
    fn defaults_are_applied() {
        let policies = parse_str("p.yaml", &yaml(&base())).unwrap();
        let p = &policies[0];
        assert_eq!(p.source, "p.yaml (document 1)");
        assert!(p.namespaces.is_empty());
        // Pod only when listed (safety case 2).
        assert_eq!(p.kinds, Kind::CONTROLLERS);
        let schedule = p.schedule.as_ref().unwrap();
        assert_eq!(
            (schedule.time_zone, schedule.starting_deadline),
            (chrono_tz::Tz::UTC, Duration::from_secs(7200))
        );
        assert_eq!(
            (p.cooldown, p.max_per_run, p.allow_downtime, p.breaker),
            (Duration::from_secs(3600), None, false, None)
        );
        assert_eq!(
            (p.restart.method, p.restart.timeout, p.restart.on_revert),
            (RestartMethod::Auto, None, OnRevert::Fail)
        );
    }

    #[test]
    fn windows_default_to_the_schedule_zone_else_utc() {
        let window = json!([{"days": ["mon", "Tuesday"], "from": "01:00", "to": "05:00"}]);
        let mut doc = base();
        doc["spec"]["windows"] = window.clone();
        doc["spec"]["triggers"]["schedule"]["timeZone"] = json!("Asia/Kolkata");
        let with_schedule = parse_str("p.yaml", &yaml(&doc)).unwrap();
        assert_eq!(
            with_schedule[0].windows[0].time_zone,
            chrono_tz::Asia::Kolkata
        );
        assert_eq!(
            with_schedule[0].windows[0].days,
            [chrono::Weekday::Mon, chrono::Weekday::Tue]
        );
        doc["spec"]["triggers"]["schedule"] = Json::Null;
        let memory_only = parse_str("p.yaml", &yaml(&doc)).unwrap();
        assert_eq!(memory_only[0].windows[0].time_zone, chrono_tz::Tz::UTC);
    }

    #[test]
    fn many_documents_with_empty_ones_come_back_sorted() {
        let mut second = base();
        second["metadata"]["name"] = json!("api");
        let text = format!(
            "---\n---\n# nothing here\n---\n{}---\n{}",
            yaml(&base()),
            yaml(&second)
        );
        let policies = parse_str("multi.yaml", &text).unwrap();
        let got: Vec<(&str, &str)> = policies
            .iter()
            .map(|p| (p.name.as_str(), p.source.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("api", "multi.yaml (document 4)"),
                ("web", "multi.yaml (document 3)")
            ]
        );
    }

    #[test]
    fn all_problems_of_all_documents_are_collected_and_named() {
        let mut first = base();
        first["spec"]["triggers"]["schedule"]["cron"] = json!("0 25 * * *");
        first["spec"]["cooldown"] = json!("soon");
        let mut third = base();
        third["metadata"]["name"] = json!("api");
        third["spec"]["triggers"]["memory"]["treshold"] = json!(1);
        let text = format!(
            "{}---\n{}---\n{}",
            yaml(&first),
            yaml(&{
                let mut d = base();
                d["metadata"]["name"] = json!("ok");
                d
            }),
            yaml(&third)
        );
        let err = parse_str("policies/vmcp.yaml", &text).unwrap_err();
        let lines: Vec<String> = err.to_string().lines().map(str::to_owned).collect();
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert_eq!(
            lines[0],
            r#"policies/vmcp.yaml: document 1 (web): spec.triggers.schedule.cron: "0 25 * * *": hour 25 out of range 0-23"#
        );
        assert!(
            lines[1].starts_with(
                r#"policies/vmcp.yaml: document 1 (web): spec.cooldown: "soon": not a duration"#
            ),
            "{}",
            lines[1]
        );
        // serde's location is kept, so editors can jump to it.
        let unknown = &err.errors[2];
        assert_eq!(
            (unknown.document, unknown.policy.as_deref()),
            (Some(3), Some("api"))
        );
        assert!(unknown.line.is_some_and(|l| l > 20), "{unknown:?}");
        assert!(lines[2].starts_with("policies/vmcp.yaml:"), "{}", lines[2]);
        assert!(
            lines[2].contains(": document 3 (api): spec.triggers.memory.treshold: unknown field"),
            "{}",
            lines[2]
        );
    }

    #[test]
    fn syntax_error_is_reported_once_and_ends_the_file() {
        let text = format!(
            "{}---\nmetadata: {{name: [broken\n---\n{}",
            yaml(&base()),
            yaml(&base())
        );
        let got = messages(parse_str("bad.yaml", &text));
        assert_eq!(got.len(), 1, "{got:#?}");
        assert!(
            got[0].starts_with("bad.yaml:") && got[0].contains("document 2"),
            "{}",
            got[0]
        );
        let not_a_mapping = messages(parse_str("list.yaml", "- a\n- b\n"));
        assert_eq!(
            not_a_mapping,
            ["list.yaml: document 1: expected a BouncePolicy mapping, found a list"]
        );
    }

    /// Found by `cargo fuzz` (tests/fuzz): an unknown alias followed by another document made
    /// serde_yaml_ng panic; it is one error naming the document, and the file is not read on.
    #[test]
    fn an_unknown_alias_is_an_error_not_a_panic() {
        for text in [
            "- *y\n---\n- z\n",
            "a: [x, *y]\n---\nb: z\n",
            &format!(
                "{}---\nmetadata: {{name: *nope}}\n---\n{}",
                yaml(&base()),
                yaml(&base())
            ),
        ] {
            let got = messages(parse_str("alias.yaml", text));
            assert_eq!(got.len(), 1, "{got:#?}");
            assert!(got[0].contains("unknown anchor"), "{}", got[0]);
        }
    }

    #[test]
    fn directories_are_read_by_extension_and_duplicates_name_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        let mut api = base();
        api["metadata"]["name"] = json!("api");
        write("a.yaml", &yaml(&base()));
        write("b.yml", &yaml(&api));
        write("notes.txt", "not yaml");
        write(".hidden.yaml", "not: [valid");
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        let names = |r: Result<Vec<Policy>, LoadError>| {
            r.unwrap().into_iter().map(|p| p.name).collect::<Vec<_>>()
        };
        assert_eq!(names(load_paths(&[dir.path().to_owned()])), ["api", "web"]);

        write("c.yaml", &format!("---\n{}", yaml(&base())));
        let got = messages(load_paths(&[dir.path().to_owned()]));
        let a = dir.path().join("a.yaml").display().to_string();
        let c = dir.path().join("c.yaml").display().to_string();
        assert_eq!(
            got,
            [format!(
                r#"{c}: document 1 (web): metadata.name: "web": duplicate policy name, first defined in {a} (document 1)"#
            )]
        );
    }

    #[test]
    fn nothing_to_load_is_an_error() {
        assert_eq!(
            messages(load_paths(&[])),
            ["no policy file or directory given"]
        );
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().to_owned();
        let got = messages(load_paths(std::slice::from_ref(&empty)));
        assert_eq!(
            got,
            [format!(
                "{}: no BouncePolicy found (a run without policies would do nothing)",
                empty.display()
            )]
        );
        let comments = dir.path().join("only-comments.yaml");
        std::fs::write(&comments, "# nothing yet\n---\n").unwrap();
        assert!(messages(load_paths(&[comments]))[0].contains("no BouncePolicy found"));
        let missing = dir.path().join("missing.yaml");
        let got = messages(load_paths(std::slice::from_ref(&missing)));
        assert!(
            got[0].starts_with(&format!("{}: cannot read:", missing.display())),
            "{got:?}"
        );
        assert_eq!(parse_str("empty.yaml", "").unwrap().len(), 0);
    }
}
