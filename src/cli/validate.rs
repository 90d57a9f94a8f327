//! `bouncer validate` output: text, JSON, or GitHub workflow commands that put each error on
//! its policy file's line in a pull request. Errors the YAML parser did not locate are placed by
//! finding their field in the file.

use serde_json::json;

use super::ValidateFormat;
use crate::core::policy::{LoadError, PolicyError};

/// The output for one validation result. `read` returns a file's text (to place errors).
pub fn render(
    result: &Result<Vec<String>, LoadError>,
    format: ValidateFormat,
    read: impl Fn(&str) -> Option<String>,
) -> String {
    let errors: Vec<(&PolicyError, Option<(usize, usize)>)> = match result {
        Ok(_) => Vec::new(),
        Err(e) => e
            .errors
            .iter()
            .map(|err| (err, place(err, &read)))
            .collect(),
    };
    match format {
        ValidateFormat::Text => match result {
            Ok(names) => format!("{} valid policies: {}\n", names.len(), names.join(", ")),
            Err(e) => format!("bouncer: invalid policies:\n{e}\n"),
        },
        ValidateFormat::Json => {
            let errors: Vec<serde_json::Value> = errors
                .iter()
                .map(|(e, at)| {
                    json!({
                        "file": e.file, "document": e.document, "policy": e.policy,
                        "line": at.map(|a| a.0), "column": at.map(|a| a.1),
                        "field": e.field, "value": e.value, "problem": e.problem,
                        "message": e.to_string(),
                    })
                })
                .collect();
            let policies = result.as_ref().map(Vec::as_slice).unwrap_or_default();
            let doc = json!({"valid": result.is_ok(), "policies": policies, "errors": errors});
            format!("{}\n", serde_json::to_string_pretty(&doc).expect("JSON"))
        }
        ValidateFormat::Github => match result {
            Ok(names) => format!(
                "::notice title=bouncer validate::{}\n",
                escape_data(&format!(
                    "{} valid policies: {}",
                    names.len(),
                    names.join(", ")
                ))
            ),
            Err(_) => errors.iter().map(|(e, at)| annotation(e, *at)).collect(),
        },
    }
}

/// One `::error` workflow command. Properties and data are escaped as the runner expects.
fn annotation(e: &PolicyError, at: Option<(usize, usize)>) -> String {
    let mut props = Vec::new();
    if let Some(file) = &e.file {
        props.push(format!("file={}", escape_property(file)));
        if let Some((line, column)) = at {
            props.push(format!("line={line},col={column}"));
        }
    }
    let title = match &e.policy {
        Some(p) => format!("bouncer: policy {p}"),
        None => "bouncer: policies".into(),
    };
    props.push(format!("title={}", escape_property(&title)));
    let mut message = String::new();
    for part in [&e.field, &e.value].into_iter().flatten() {
        message.push_str(part);
        message.push_str(": ");
    }
    message.push_str(&e.problem);
    format!("::error {}::{}\n", props.join(","), escape_data(&message))
}

fn escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// The parser's location, else the field's line in the file, else the document's first line.
fn place(e: &PolicyError, read: impl Fn(&str) -> Option<String>) -> Option<(usize, usize)> {
    if let Some(line) = e.line {
        return Some((line, e.column.unwrap_or(1)));
    }
    let text = read(e.file.as_deref()?)?;
    locate(&text, e.document?, e.field.as_deref())
}

/// Where `field` (a dotted path such as `spec.windows[0].from`) sits in document `document`
/// (1-based, counting `---` separators) of `text`: 1-based line and column. Block and flow
/// mappings are followed as far as the path can be found; the document's first line when no
/// part of it can.
pub fn locate(text: &str, document: usize, field: Option<&str>) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let (mut number, mut seen, mut start) = (1, false, None);
    let mut end = lines.len();
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("---") {
            if seen {
                number += 1;
            }
            seen = true;
            if number == document + 1 {
                end = i;
                break;
            }
            continue;
        }
        let content = !line.trim().is_empty() && !line.trim_start().starts_with('#');
        if content && !seen {
            seen = true;
        }
        if number == document && start.is_none() && content {
            start = Some(i);
        }
    }
    let start = start?;
    let mut found = (start + 1, 1);
    let Some(field) = field else {
        return Some(found);
    };
    // Search range and the indentation its keys must exceed.
    let (mut from, mut to, mut parent) = (start, end, -1_isize);
    for key in field.split('.').map(|k| k.split('[').next().unwrap_or(k)) {
        let mut hit = None;
        for (i, line) in lines.iter().enumerate().take(to).skip(from) {
            let indent = (line.len() - line.trim_start().len()) as isize;
            let body = line.trim_start().trim_start_matches("- ");
            if indent > parent && body.starts_with(&format!("{key}:")) {
                hit = Some((i, line.len() - body.len(), indent, false));
                break;
            }
            // In a flow mapping (`memory: {above: 1Gi}`) the key follows `{` or `, `.
            for lead in ["{", ", ", ","] {
                if let Some(at) = line.find(&format!("{lead}{key}:")) {
                    let column = at + lead.len();
                    hit = Some((i, column, indent, true));
                    break;
                }
            }
            if hit.is_some() {
                break;
            }
        }
        let Some((line, column, indent, flow)) = hit else {
            break;
        };
        found = (line + 1, column + 1);
        // `triggers: {memory: ...}`: the rest of the path is in the flow mapping on this line.
        let rest = &lines[line][column + key.len() + 1..];
        if flow || rest.trim_start().starts_with('{') {
            // The rest of the path is on this line: keep looking only here.
            from = line;
            to = line + 1;
            parent = -1;
            continue;
        }
        from = line + 1;
        to = (from..end)
            .find(|&j| {
                let l = lines[j];
                !l.trim().is_empty()
                    && !l.trim_start().starts_with('#')
                    && ((l.len() - l.trim_start().len()) as isize) <= indent
            })
            .unwrap_or(end);
        // The key's own line may carry its value (`from: "1:00"`): the next key, if any, is
        // below it.
        if from == to {
            break;
        }
        parent = indent;
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# policies
apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata: {name: a}
spec:
  target: {selector: {matchLabels: {app: web}}}
  triggers: {memory: {above: 1Gi}}
---
apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata:
  name: b
spec:
  target:
    selector: {matchLabels: {app: web}}
  triggers:
    memory:
      above: lots
  windows:
    - days: [Mon]
      from: \"1:00\"
";

    #[test]
    fn fields_are_found_in_block_and_flow_mappings() {
        for (document, field, want) in [
            (2, Some("spec.triggers.memory.above"), (18, 7)),
            (2, Some("spec.windows[0].from"), (21, 7)),
            (2, Some("metadata.name"), (12, 3)),
            (1, Some("spec.triggers.memory.above"), (7, 23)),
            (1, Some("spec.cooldown"), (5, 1)),
            (1, None, (2, 1)),
            (2, None, (9, 1)),
        ] {
            assert_eq!(
                locate(FILE, document, field),
                Some(want),
                "{document} {field:?}"
            );
        }
        assert_eq!(locate(FILE, 3, None), None);
        // A file opening with `---` still starts document 1 there.
        assert_eq!(locate("---\na: 1\n---\nb: 2\n", 2, Some("b")), Some((4, 1)));
    }

    fn error(field: &str, problem: &str) -> PolicyError {
        PolicyError {
            file: Some("p/b.yaml".into()),
            document: Some(2),
            policy: Some("b".into()),
            line: None,
            column: None,
            field: Some(field.into()),
            value: Some("\"lots\"".into()),
            problem: problem.into(),
        }
    }

    #[test]
    fn github_annotations_carry_file_line_and_escaped_text() {
        let result = Err(LoadError {
            errors: vec![error(
                "spec.triggers.memory.above",
                "not a quantity, e.g. 1Gi\n100%",
            )],
        });
        let out = render(&result, ValidateFormat::Github, |f| {
            (f == "p/b.yaml").then(|| FILE.to_string())
        });
        assert_eq!(
            out,
            "::error file=p/b.yaml,line=18,col=7,title=bouncer%3A policy b::spec.triggers.memory.above: \"lots\": not a quantity%2C e.g. 1Gi%0A100%25\n"
                .replace("%2C e.g.", ", e.g.")
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&result, ValidateFormat::Json, |_| None)).unwrap();
        assert_eq!(json["valid"], false);
        assert_eq!(json["errors"][0]["field"], "spec.triggers.memory.above");
        assert_eq!(json["errors"][0]["line"], serde_json::Value::Null);
        let ok = Ok(vec!["a".to_string()]);
        let json: serde_json::Value =
            serde_json::from_str(&render(&ok, ValidateFormat::Json, |_| None)).unwrap();
        assert_eq!(
            json,
            json!({"valid": true, "policies": ["a"], "errors": []})
        );
    }
}
