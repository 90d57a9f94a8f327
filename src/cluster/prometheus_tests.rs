//! The Prometheus client at the edge: answers read into the core's data, and every way a query or
//! the client's setup fails, as the variant a caller matches and the text a person reads.

use super::*;

fn data(json: serde_json::Value) -> Data {
    serde_json::from_value::<Answer>(json)
        .unwrap()
        .data
        .unwrap()
}

#[test]
fn a_matrix_becomes_per_pod_series() {
    let d = data(
        serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"namespace": "shop", "pod": "web-1", "container": "app"},
             "values": [[1700000000, "100"], [1700000015.5, "NaN"], [1700000030, "300"]]},
            {"metric": {"namespace": "shop", "pod": "web-1", "container": "proxy"}, "values": [[1700000000, "5"]]},
            {"metric": {"pod": "no-namespace", "container": "x"}, "values": [[1700000000, "1"]]}
        ]}}),
    );
    let h = to_history(d, Duration::from_secs(15)).unwrap();
    let web = &h.pods[&("shop".to_string(), "web-1".to_string())];
    assert_eq!(web.len(), 2);
    assert_eq!(web[0].container, "app");
    assert_eq!(web[0].samples, [(1.7e9, 100.0), (1_700_000_030.0, 300.0)]);
    assert_eq!(h.pods.len(), 1);
}

/// Even settings made without the command line's check never send a token in clear.
#[test]
fn a_bearer_token_is_never_sent_to_plain_http() {
    let settings = |url: &str| Settings {
        url: url.parse().unwrap(),
        bearer_token_file: Some("/nonexistent/token".into()),
        ca_file: None,
        timeout: Duration::from_secs(1),
    };
    let Err(e) = Api::new(&settings(
        "http://bouncer:secret@prometheus.monitoring:9090",
    )) else {
        panic!("an http URL with a token was accepted");
    };
    assert!(matches!(e, ClientError::TokenInClear { .. }), "{e:?}");
    // The message names the server, not the password in its URL.
    assert_eq!(
        e.to_string(),
        "a bearer token is sent only over https, not to http://prometheus.monitoring:9090: use an https:// URL"
    );
    // Over https the same settings get as far as reading the token file.
    let Err(e) = Api::new(&settings("https://prometheus.monitoring:9090")) else {
        panic!("a missing token file was accepted");
    };
    assert!(
        matches!(&e, ClientError::TokenFile { path, .. } if path.ends_with("token")),
        "{e:?}"
    );
    assert!(
        chain(&e).starts_with("cannot read the token file /nonexistent/token: "),
        "{e}"
    );
}

#[test]
fn a_ca_file_that_is_missing_or_not_pem_stops_the_client() {
    let settings = |ca: &std::path::Path| Settings {
        url: "https://prometheus.monitoring:9090".parse().unwrap(),
        bearer_token_file: None,
        ca_file: Some(ca.to_path_buf()),
        timeout: Duration::from_secs(1),
    };
    let missing = std::path::Path::new("/nonexistent/ca.pem");
    let Err(e) = Api::new(&settings(missing)) else {
        panic!("a missing CA file was accepted");
    };
    assert!(matches!(e, ClientError::CaFile { .. }), "{e:?}");
    let dir = std::env::temp_dir().join(format!("bouncer-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("ca.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let got = Api::new(&settings(&garbage));
    std::fs::remove_dir_all(&dir).unwrap();
    let Err(e) = got else {
        panic!("a CA file that is not PEM was accepted");
    };
    assert!(matches!(e, ClientError::CaNotPem { .. }), "{e:?}");
    assert!(e.to_string().contains("is not PEM: builder error"), "{e}");
}

/// A redirect refused is the cause the request's error names.
#[test]
fn a_refused_redirect_says_where_it_led() {
    let to = shown(&"http://admin:pw@prometheus.example/api".parse().unwrap());
    assert_eq!(
        RedirectError::InClear { to }.to_string(),
        "a redirect to http://prometheus.example/api would send the bearer token in clear"
    );
    assert_eq!(RedirectError::TooMany.to_string(), "too many redirects");
}

#[test]
fn an_answer_that_is_not_the_api_or_an_error_says_what_came_back() {
    let url: reqwest::Url = "http://admin:pw@prometheus.monitoring:9090"
        .parse()
        .unwrap();
    let proxy = answer(
        &url,
        status(reqwest::StatusCode::BAD_GATEWAY),
        "<html>\n  <h1>502 Bad Gateway</h1>\n</html>",
    );
    let Err(e) = proxy else {
        panic!("HTML read as an answer")
    };
    assert!(
        matches!(&e, QueryError::NotAnAnswer { status, .. } if status.code == 502),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "HTTP 502 Bad Gateway from http://prometheus.monitoring:9090: not a Prometheus API answer (expected value at line 1 column 1): <html> <h1>502 Bad Gateway</h1> </html>"
    );
    let refused = answer(
        &url,
        status(reqwest::StatusCode::BAD_REQUEST),
        r#"{"status":"error","errorType":"bad_data","error":"1:6: parse error: unexpected end of input"}"#,
    );
    assert!(
        matches!(&refused, Err(QueryError::Refused { error_type, .. }) if error_type == "bad_data"),
        "{refused:?}"
    );
    let ok = answer(
        &url,
        status(reqwest::StatusCode::OK),
        r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
    );
    assert_eq!(to_results(ok.unwrap()).unwrap(), Vec::<Labels>::new());
}

fn local(url: &str, timeout: Duration) -> Api {
    Api::new(&Settings {
        url: url.parse().unwrap(),
        bearer_token_file: None,
        ca_file: None,
        timeout,
    })
    .unwrap()
}

/// Nothing listens, or the server never answers: each says so, naming the server only.
#[tokio::test]
async fn no_answer_is_unreachable_or_timed_out() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let api = local(
        &format!("http://user:pw@127.0.0.1:{port}"),
        Duration::from_secs(5),
    );
    let e = api.query("query", &[]).await.unwrap_err();
    let QueryError::Unreachable { url, detail } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(url, &format!("http://127.0.0.1:{port}"));
    assert!(detail.contains("onnection refused"), "{detail}");
    assert!(!e.to_string().contains("pw"), "{e}");

    // Accepts the connection and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let api = local(
        &format!("http://127.0.0.1:{port}"),
        Duration::from_millis(200),
    );
    let e = api.query("query", &[]).await.unwrap_err();
    assert!(
        matches!(&e, QueryError::TimedOut { after, .. } if *after == Duration::from_millis(200)),
        "{e:?}"
    );
    drop(silent);
}

#[test]
fn blocker_answers() {
    let firing = data(
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"alertname": "NodeDown", "severity": "critical"}, "value": [1700000000, "1"]}
        ]}}),
    );
    let got = to_results(firing).unwrap();
    assert_eq!(history::result_names(&got), ["NodeDown"]);
    let empty = data(
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": []}}),
    );
    assert_eq!(to_results(empty).unwrap(), Vec::<Labels>::new());
    let matrix = data(
        serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": []}}),
    );
    assert!(matches!(to_results(matrix), Err(QueryError::NotInstant { got }) if got == "matrix"));
    let odd = data(
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": "x"}}),
    );
    assert!(matches!(
        to_results(odd),
        Err(QueryError::Unreadable { what: "vector", .. })
    ));
}

#[test]
fn a_history_answer_must_be_a_matrix() {
    let vector = data(
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": []}}),
    );
    assert!(matches!(
        to_history(vector, Duration::from_secs(15)),
        Err(QueryError::NotAMatrix { got }) if got == "vector"
    ));
    let odd = data(
        serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": [1]}}),
    );
    assert!(matches!(
        to_history(odd, Duration::from_secs(15)),
        Err(QueryError::Unreadable { what: "matrix", .. })
    ));
}
