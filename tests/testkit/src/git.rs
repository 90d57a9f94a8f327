//! A Git repository served over git's smart HTTP on loopback, as a GitOps controller fetches it:
//! a work tree the test commits to, and a minimal HTTP server that hands each request to git's own
//! CGI program (`git http-backend`). Flux refuses `git://` URLs, and a real protocol keeps the
//! controller's clone path the one it takes against any Git host.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// git's CGI program, which Debian's `git` package installs with git itself.
const HTTP_BACKEND: &str = "/usr/lib/git-core/git-http-backend";
/// The branch every commit goes to.
pub const BRANCH: &str = "main";

/// A repository in `dir/repo` (a work tree; its `.git` is what the server exports) and the
/// server answering for it until dropped.
#[derive(Debug)]
pub struct GitServer {
    root: PathBuf,
    port: u16,
    stop: Arc<AtomicBool>,
}

impl GitServer {
    /// Creates an empty repository under `root` (created, emptied first) and serves it.
    pub fn start(root: &Path) -> Result<Self> {
        if !Path::new(HTTP_BACKEND).is_file() {
            bail!("{HTTP_BACKEND} is missing (Debian's git package installs it)");
        }
        let _ = std::fs::remove_dir_all(root);
        let repo = root.join("repo");
        std::fs::create_dir_all(&repo).with_context(|| format!("creating {}", repo.display()))?;
        git(&repo, &["init", "-q", "-b", BRANCH])?;
        let listener = TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, project) = (stop.clone(), root.to_path_buf());
        std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let project = project.clone();
                        std::thread::spawn(move || {
                            let _ = serve(stream, &project);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(Self {
            root: root.to_path_buf(),
            port,
            stop,
        })
    }

    /// The URL a GitRepository fetches.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/repo/.git", self.port)
    }

    /// Writes `files` (path in the repository, content; an empty content removes the file),
    /// commits them and returns the commit's SHA.
    pub fn commit(&self, files: &[(&str, &str)], message: &str) -> Result<String> {
        let repo = self.root.join("repo");
        for (path, content) in files {
            let file = repo.join(path);
            if content.is_empty() {
                let _ = std::fs::remove_file(&file);
                continue;
            }
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&file, content)
                .with_context(|| format!("writing {}", file.display()))?;
        }
        git(&repo, &["add", "-A"])?;
        git(
            &repo,
            &[
                "-c",
                "user.name=bouncer tests",
                "-c",
                "user.email=tests@bouncer.invalid",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                message,
            ],
        )?;
        Ok(git(&repo, &["rev-parse", "HEAD"])?.trim().to_string())
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One HTTP request: its head, its body (by Content-Length or chunked), the CGI program's answer
/// turned into an HTTP response, then the connection closes.
fn serve(stream: TcpStream, project: &Path) -> Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    );
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        read_chunked(&mut reader)?
    } else {
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        reader.read_exact(&mut body)?;
        body
    };
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut cgi = Command::new(HTTP_BACKEND);
    cgi.env_clear()
        .env("GIT_PROJECT_ROOT", project)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("CONTENT_TYPE", header("content-type").unwrap_or_default());
    if let Some(v) = header("content-encoding") {
        cgi.env("HTTP_CONTENT_ENCODING", v);
    }
    if let Some(v) = header("git-protocol") {
        cgi.env("GIT_PROTOCOL", v);
    }
    let mut child = cgi
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting git-http-backend")?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&body);
    });
    let out = child.wait_with_output()?;
    let _ = writer.join();
    respond(stream, &out.stdout)
}

fn read_chunked(reader: &mut impl BufRead) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        reader.read_line(&mut size)?;
        let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)?;
        let mut chunk = vec![0; n + 2];
        reader.read_exact(&mut chunk)?;
        if n == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&chunk[..n]);
    }
}

/// The CGI answer (headers, a blank line, the body) as an HTTP/1.1 response.
fn respond(mut stream: TcpStream, cgi: &[u8]) -> Result<()> {
    let split = cgi
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| cgi.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let Some((at, sep)) = split else {
        stream.write_all(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
        return Ok(());
    };
    let head = String::from_utf8_lossy(&cgi[..at]);
    let body = &cgi[at + sep..];
    let mut status = "200 OK".to_string();
    let mut out = String::new();
    for h in head.lines() {
        match h.split_once(':') {
            Some((k, v)) if k.eq_ignore_ascii_case("status") => status = v.trim().to_string(),
            Some(_) => out.push_str(&format!("{h}\r\n")),
            None => {}
        }
    }
    let response = format!(
        "HTTP/1.1 {status}\r\n{out}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(response.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()?;
    Ok(())
}
