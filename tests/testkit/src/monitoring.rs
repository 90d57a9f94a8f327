//! Real receivers for what a run sends at its end: an HTTP server that records webhook requests
//! (answering 200, 500, or never), and Debian's Prometheus Pushgateway and Prometheus, each
//! started on a free loopback port for one test and killed with it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long a server may take to say it is ready (two busy cores).
const STARTUP: Duration = Duration::from_secs(60);

/// What a [`Receiver`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// This HTTP status, with a short text body.
    Status(u16),
    /// Nothing, ever: the request is read and recorded, the connection held open.
    Hang,
}

/// One request a [`Receiver`] got.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names lowercased.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }
}

/// A minimal HTTP/1.1 server on loopback that records every request. Bodies must come with a
/// Content-Length (a chunked one is answered 411, so the test notices).
pub struct Receiver {
    port: u16,
    requests: Arc<Mutex<Vec<Received>>>,
    task: JoinHandle<()>,
}

impl Receiver {
    pub async fn start(answer: Answer) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, answer, seen.clone()));
            }
        });
        Receiver {
            port,
            requests,
            task,
        }
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.requests.lock().expect("receiver lock").clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, answer: Answer, seen: Arc<Mutex<Vec<Received>>>) {
    loop {
        let Some((request, chunked)) = read_request(&mut stream).await else {
            return;
        };
        seen.lock().expect("receiver lock").push(request);
        let (status, text) = match (chunked, answer) {
            (true, _) => (411, "Length Required"),
            (false, Answer::Status(s)) => (s, if s < 300 { "ok" } else { "receiver says no" }),
            (false, Answer::Hang) => {
                // Held until the client gives up (its timeout) or the test ends.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
        };
        let response = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{text}",
            text.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Reads one request; None at the end of the connection. The flag says it was chunked.
async fn read_request(stream: &mut TcpStream) -> Option<(Received, bool)> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"));
    let length: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    let request = Received {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).to_string(),
    };
    Some((request, chunked))
}

/// A port nothing listens on right now.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn http() -> reqwest::Client {
    // reqwest is built without a crypto provider of its own (as in bouncer).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client")
}

async fn get_json(url: &str) -> Result<serde_json::Value> {
    let text = http()
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    serde_json::from_str(&text).with_context(|| format!("{url} answered no JSON: {text}"))
}

/// A server process of the test: its own directory (config, data, log), killed on drop, and
/// killed with the test process too (`setpriv --pdeathsig`), even when no Drop runs.
struct Server {
    name: &'static str,
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Server {
    fn spawn(
        name: &'static str,
        binary: &str,
        args: impl Fn(u16, &Path) -> Vec<String>,
    ) -> Result<Server> {
        let path = which(binary).with_context(|| {
            format!(
                "{binary} is not installed (Debian: apt-get install {binary}; scripts/test does)"
            )
        })?;
        let dir = std::env::temp_dir().join(format!(
            "bouncer-{name}-{:08x}",
            rand::rng().random::<u32>()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let port = free_port()?;
        let log = std::fs::File::create(dir.join("log"))?;
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(&path)
            .args(args(port, &dir))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", path.display()))?;
        Ok(Server {
            name,
            child,
            dir,
            port,
        })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = http();
        let deadline = tokio::time::Instant::now() + STARTUP;
        let ready = format!("{}/-/ready", self.url());
        loop {
            if let Ok(r) = client.get(&ready).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "{} exited at startup ({status}):\n{}",
                    self.name,
                    self.log()
                );
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "{} not ready within {STARTUP:?}:\n{}",
                    self.name,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("{} log:\n{}", self.name, self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn which(binary: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(binary))
        .find(|p| p.is_file())
}

/// One sample of a text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the Prometheus text format: `name{label="value",...} value [timestamp]`.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => continue,
        };
        let mut labels = BTreeMap::new();
        let mut rest = rest;
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices();
            let (mut key, mut value, mut in_value, mut escaped) =
                (String::new(), String::new(), false, false);
            let mut end = inner.len();
            while let Some((i, c)) = chars.next() {
                match (in_value, c) {
                    (false, '}') => {
                        end = i + 1;
                        break;
                    }
                    (false, '=') => {
                        in_value = true;
                        chars.next(); // the opening quote
                    }
                    (false, ',') => {}
                    (false, c) => key.push(c),
                    (true, '\\') if !escaped => escaped = true,
                    (true, '"') if !escaped => {
                        labels.insert(std::mem::take(&mut key), std::mem::take(&mut value));
                        in_value = false;
                    }
                    (true, c) => {
                        value.push(match (escaped, c) {
                            (true, 'n') => '\n',
                            (_, c) => c,
                        });
                        escaped = false;
                    }
                }
            }
            rest = &inner[end..];
        }
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse().ok()) else {
            continue;
        };
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

/// Debian's `prometheus-pushgateway`, in memory (no persistence file).
pub struct Pushgateway {
    server: Server,
}

impl Pushgateway {
    pub async fn start() -> Result<Pushgateway> {
        let mut server = Server::spawn("pushgateway", "prometheus-pushgateway", |port, _| {
            vec![format!("--web.listen-address=127.0.0.1:{port}")]
        })?;
        server.wait_ready().await?;
        Ok(Pushgateway { server })
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    /// `host:port`, as a scrape target.
    pub fn target(&self) -> String {
        format!("127.0.0.1:{}", self.server.port)
    }

    /// Every sample the Pushgateway exposes now.
    pub async fn samples(&self) -> Result<Vec<Sample>> {
        let text = http()
            .get(format!("{}/metrics", self.url()))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(parse_exposition(&text))
    }
}

/// Debian's `prometheus`, scraping `targets` every second with `honor_labels` (as a Pushgateway
/// must be scraped) and evaluating `rules` (a rule file's text) every second.
pub struct Prometheus {
    server: Server,
}

impl Prometheus {
    pub async fn start(targets: &[String], rules: &str) -> Result<Prometheus> {
        Prometheus::start_with_history(targets, rules, None).await
    }

    /// As `start`, with `history` (OpenMetrics text, ending `# EOF`) written into its storage by
    /// `promtool tsdb create-blocks-from openmetrics` first: hours of samples without waiting.
    pub async fn start_with_history(
        targets: &[String],
        rules: &str,
        history: Option<&str>,
    ) -> Result<Prometheus> {
        let config = serde_json::json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{
                "job_name": "pushgateway",
                "honor_labels": true,
                "static_configs": [{"targets": targets}],
            }],
        });
        let mut server = Server::spawn("prometheus", "prometheus", |port, dir| {
            // JSON is YAML: the config needs no YAML writer.
            let written = std::fs::write(dir.join("prometheus.yml"), config.to_string())
                .and_then(|()| std::fs::write(dir.join("rules.yaml"), rules));
            written.expect("write the Prometheus config");
            if let Some(history) = history {
                let file = dir.join("history.om");
                std::fs::write(&file, history).expect("write the history");
                let out = std::process::Command::new("promtool")
                    .args(["tsdb", "create-blocks-from", "openmetrics"])
                    .arg(&file)
                    .arg(dir.join("data"))
                    .output()
                    .expect("promtool runs (Debian: apt-get install prometheus)");
                assert!(
                    out.status.success(),
                    "promtool: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            vec![
                "--config.file=prometheus.yml".into(),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
            ]
        })?;
        server.wait_ready().await?;
        Ok(Prometheus { server })
    }

    /// The result vector of an instant query (`/api/v1/query`).
    pub async fn query(&self, promql: &str) -> Result<Vec<serde_json::Value>> {
        let mut url = reqwest::Url::parse(&format!("{}/api/v1/query", self.server.url()))?;
        url.query_pairs_mut().append_pair("query", promql);
        let body = get_json(url.as_str()).await?;
        if body["status"] != "success" {
            bail!("query {promql:?} failed: {body}");
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Prometheus's own count of the API requests it served, by handler (e.g. "/api/v1/query").
    pub async fn requests_served(&self, handler: &str) -> Result<f64> {
        let text = http()
            .get(format!("{}/metrics", self.server.url()))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(parse_exposition(&text)
            .iter()
            .filter(|s| {
                s.name == "prometheus_http_requests_total"
                    && s.labels.get("handler").is_some_and(|h| h == handler)
            })
            .map(|s| s.value)
            .sum())
    }

    /// `/api/v1/rules`: the rule groups with each rule's health and last error.
    pub async fn rules(&self) -> Result<serde_json::Value> {
        get_json(&format!("{}/api/v1/rules", self.server.url())).await
    }

    /// Polls `promql` every 250 ms until `done` holds for its result, or `timeout` passes.
    pub async fn wait_for(
        &self,
        promql: &str,
        timeout: Duration,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Result<Vec<serde_json::Value>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let result = self.query(promql).await?;
            if done(&result) {
                return Ok(result);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{promql:?} still {result:?} after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_text_format() {
        let text = "# HELP a x\n# TYPE a gauge\na 1.5\nb{job=\"bouncer\",cluster=\"x\\\"y\",instance=\"\"} 2 1700000000\nc{} NaN\n";
        let s = parse_exposition(text);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].name.as_str(), s[0].value), ("a", 1.5));
        assert!(s[0].labels.is_empty());
        assert_eq!(s[1].labels["cluster"], "x\"y");
        assert_eq!(s[1].labels["instance"], "");
        assert_eq!(s[1].value, 2.0);
        assert!(s[2].value.is_nan());
    }
}
