//! How an HTTP client's failures read in bouncer's messages, for the Prometheus client (cluster
//! edge), the settings and the notifiers (shell) alike: the error with its causes on one line, a
//! short excerpt of a body that was not the expected answer, and a URL without its credentials.

/// Characters of a response body an error message quotes at most.
pub const BODY_EXCERPT: usize = 200;

/// The error and its causes, e.g. `error sending request: client error (Connect): tcp connect
/// error: Connection refused (os error 111)`; a cause already spelt out by the one above it is
/// not repeated.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// A response body as one line of at most [`BODY_EXCERPT`] characters (whitespace collapsed).
pub fn excerpt(body: &str) -> String {
    let line = body.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(BODY_EXCERPT) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line,
    }
}

/// A URL as messages show it: without the user and password it may carry (basic auth: a
/// credential), and without the `/` the parser adds, so it reads as the user wrote it.
pub fn shown_url(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    // Only a URL that cannot be a base refuses these, and one with a host always can.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.as_str().trim_end_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_carry_no_credentials() {
        let url = "https://bouncer:secret@prometheus.monitoring:9090/prom/"
            .parse()
            .unwrap();
        assert_eq!(shown_url(&url), "https://prometheus.monitoring:9090/prom");
    }

    #[test]
    fn a_response_body_is_cut_to_one_short_line() {
        assert_eq!(excerpt("no_service\n"), "no_service");
        assert_eq!(excerpt("a\n  b\tc"), "a b c");
        let long = "x".repeat(500);
        let cut = excerpt(&long);
        assert_eq!(cut.len(), BODY_EXCERPT + 3);
        assert!(cut.ends_with("..."));
        // Cut on a character boundary.
        assert_eq!(excerpt(&"é".repeat(300)).chars().count(), BODY_EXCERPT + 3);
    }

    #[test]
    fn a_cause_is_named_once() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let e = E(
            "error sending request: connection refused",
            Some(Box::new(E(
                "connection refused",
                Some(Box::new(E("os error 111", None))),
            ))),
        );
        assert_eq!(
            chain(&e),
            "error sending request: connection refused: os error 111"
        );
    }
}
