//! Reads a LIST response as it arrives: each item is deserialized into its slim wire form as soon
//! as its closing brace is in, so a page (megabytes of JSON) never sits in memory whole; only the
//! item being received does. `pages` reads every page of one LIST that way.

use futures::{AsyncBufRead, AsyncBufReadExt};
use kube::Client;
use kube::api::ListParams;
use serde::de::{DeserializeOwned, Error as _};

use super::wire::{ListMeta, Object};

const SLICE: usize = 16 * 1024;
/// Objects per LIST page. Items are read as they stream, so a page costs bouncer no more memory
/// than an object does; what a page costs is a round trip and the API server's work to resume
/// from a continue token, which at pages of 500 made a LIST of 20,000 pods take 1.6 times as
/// long as one unpaged request. Pages stay (rather than one unpaged LIST) so that the API server
/// never has to build a response of a whole large cluster at once.
const PAGE: u32 = 5000;

/// Names plain JSON second, so a server that cannot convert sends the whole objects, which the
/// same metadata-only wire type reads.
const METADATA_LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// What the bytes at depth 1 (the list object's own fields) are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Other,
    Items,
    Metadata,
}

/// A value being collected until it is complete: an item, or the list's metadata.
#[derive(Debug, Clone, Copy)]
struct Capture {
    start: usize,
    /// The depth the closing bracket returns to.
    end_depth: usize,
    item: bool,
}

/// An incremental splitter of `{"metadata": {...}, "items": [{...}, ...], ...}` (fields in any
/// order, as the API server writes them for built-in types and for custom resources alike).
#[derive(Debug)]
pub struct ListSplitter {
    buf: Vec<u8>,
    /// Next byte of `buf` to scan.
    pos: usize,
    depth: usize,
    started: bool,
    in_string: bool,
    string_start: usize,
    /// At depth 1, whether the next string is a field name.
    expect_key: bool,
    field: Field,
    in_items: bool,
    capture: Option<Capture>,
    metadata: ListMeta,
}

impl Default for ListSplitter {
    fn default() -> Self {
        ListSplitter {
            buf: Vec::new(),
            pos: 0,
            depth: 0,
            started: false,
            in_string: false,
            string_start: 0,
            expect_key: false,
            field: Field::Other,
            in_items: false,
            capture: None,
            metadata: ListMeta::default(),
        }
    }
}

fn malformed(what: &str) -> serde_json::Error {
    serde_json::Error::custom(format!("malformed LIST response: {what}"))
}

impl ListSplitter {
    /// Takes the next bytes of the response; every item completed by them goes to `item`.
    pub fn feed<W: DeserializeOwned>(
        &mut self,
        bytes: &[u8],
        item: &mut impl FnMut(W),
    ) -> Result<(), serde_json::Error> {
        // In slices, so the buffer holds one item plus a slice however large the network's chunks.
        for part in bytes.chunks(SLICE) {
            self.buf.extend_from_slice(part);
            self.scan(item)?;
            // Keep only what is still needed: the value being collected, or a field name being read.
            let keep = match (self.capture, self.in_string && self.depth == 1) {
                (Some(c), _) => c.start,
                (None, true) => self.string_start,
                (None, false) => self.pos,
            };
            self.buf.drain(..keep);
            // One oversized object (a pod with a large annotation, say) must not keep its room for the
            // rest of the LIST.
            if self.buf.capacity() > 4 * SLICE && self.buf.len() <= SLICE {
                self.buf.shrink_to(2 * SLICE);
            }
            self.pos -= keep;
            self.string_start = self.string_start.saturating_sub(keep);
            if let Some(c) = &mut self.capture {
                c.start -= keep;
            }
        }
        Ok(())
    }

    /// The list's metadata, once the whole response has been fed.
    pub fn finish(self) -> Result<ListMeta, serde_json::Error> {
        if !self.started || self.depth != 0 || self.in_string {
            return Err(malformed("truncated"));
        }
        Ok(self.metadata)
    }

    fn scan<W: DeserializeOwned>(
        &mut self,
        item: &mut impl FnMut(W),
    ) -> Result<(), serde_json::Error> {
        let mut i = self.pos;
        while i < self.buf.len() {
            if self.in_string {
                let Some(offset) = self.buf[i..].iter().position(|&b| b == b'"' || b == b'\\')
                else {
                    i = self.buf.len();
                    break;
                };
                i += offset;
                if self.buf[i] == b'\\' {
                    if i + 1 == self.buf.len() {
                        break; // the escaped byte is in the next chunk
                    }
                    i += 2;
                    continue;
                }
                self.in_string = false;
                if self.depth == 1 && self.expect_key {
                    self.field = match &self.buf[self.string_start..i] {
                        b"items" => Field::Items,
                        b"metadata" => Field::Metadata,
                        _ => Field::Other,
                    };
                }
                i += 1;
                continue;
            }
            match self.buf[i] {
                b'"' => {
                    self.in_string = true;
                    self.string_start = i + 1;
                }
                open @ (b'{' | b'[') => {
                    match self.depth {
                        0 if self.started || open != b'{' => {
                            return Err(malformed("not a single object"));
                        }
                        0 => {
                            self.started = true;
                            self.expect_key = true;
                        }
                        1 if self.expect_key => return Err(malformed("unexpected bracket")),
                        1 => match (self.field, open) {
                            (Field::Metadata, b'{') => {
                                self.capture = Some(Capture {
                                    start: i,
                                    end_depth: 1,
                                    item: false,
                                })
                            }
                            (Field::Items, b'[') => self.in_items = true,
                            _ => {}
                        },
                        2 if self.in_items && open == b'{' => {
                            self.capture = Some(Capture {
                                start: i,
                                end_depth: 2,
                                item: true,
                            });
                        }
                        _ => {}
                    }
                    self.depth += 1;
                }
                b'}' | b']' => {
                    self.depth = self
                        .depth
                        .checked_sub(1)
                        .ok_or_else(|| malformed("unbalanced brackets"))?;
                    if let Some(c) = self.capture.filter(|c| c.end_depth == self.depth) {
                        let value = &self.buf[c.start..=i];
                        if c.item {
                            item(serde_json::from_slice(value)?);
                        } else {
                            self.metadata = serde_json::from_slice(value)?;
                        }
                        self.capture = None;
                    }
                    if self.depth == 1 {
                        self.in_items = false;
                    }
                }
                b':' if self.depth == 1 => self.expect_key = false,
                b',' if self.depth == 1 => self.expect_key = true,
                _ => {}
            }
            i += 1;
        }
        self.pos = i;
        Ok(())
    }
}

/// Every page of one LIST; each object goes to `item` as soon as it has arrived. Returns the
/// list's resourceVersion (where a watch of the same objects starts).
pub async fn pages<W>(
    client: &Client,
    url: &str,
    params: &ListParams,
    item: impl FnMut(W),
) -> Result<Option<String>, kube::Error>
where
    W: DeserializeOwned + Object,
{
    let first = first_page::<W>(client, url, params).await?;
    pages_from(client, url, params, first, item).await
}

/// The first page of a LIST of `W`, requested and answered but not yet read, so that the request
/// can be in flight while something its reading depends on is still being fetched.
pub async fn first_page<W: Object>(
    client: &Client,
    url: &str,
    params: &ListParams,
) -> Result<impl AsyncBufRead + use<W>, kube::Error> {
    client.request_stream(page::<W>(url, params)?).await
}

/// [`pages`], from a first page already opened by [`first_page`] with the same `url` and `params`.
pub async fn pages_from<W>(
    client: &Client,
    url: &str,
    params: &ListParams,
    first: impl AsyncBufRead,
    mut item: impl FnMut(W),
) -> Result<Option<String>, kube::Error>
where
    W: DeserializeOwned + Object,
{
    let mut meta = read_list(first, &mut item).await?;
    let mut params = params.clone();
    loop {
        match meta.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(meta.resource_version),
        }
        let body = client.request_stream(page::<W>(url, &params)?).await?;
        meta = read_list(body, &mut item).await?;
    }
}

fn page<W: Object>(url: &str, params: &ListParams) -> Result<http::Request<Vec<u8>>, kube::Error> {
    let mut req = kube::core::Request::new(url)
        .list(&params.clone().limit(PAGE))
        .map_err(kube::Error::BuildRequest)?;
    if W::METADATA_ONLY {
        req.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(METADATA_LIST),
        );
    }
    Ok(req)
}

/// One LIST response, split into items as its bytes arrive, so that memory holds one object at a
/// time rather than a page (API errors arrive as `kube::Error::Api`, as with `Api::list`).
async fn read_list<W: DeserializeOwned>(
    body: impl AsyncBufRead,
    mut item: impl FnMut(W),
) -> Result<ListMeta, kube::Error> {
    let mut body = std::pin::pin!(body);
    let mut splitter = ListSplitter::default();
    loop {
        let chunk = body
            .fill_buf()
            .await
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        if chunk.is_empty() {
            break;
        }
        let len = chunk.len();
        splitter
            .feed(chunk, &mut item)
            .map_err(kube::Error::SerdeError)?;
        body.as_mut().consume(len);
    }
    splitter.finish().map_err(kube::Error::SerdeError)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cluster::wire;

    fn split(json: &str, chunk: usize) -> Result<(Vec<String>, Option<String>), serde_json::Error> {
        let mut splitter = ListSplitter::default();
        let mut names = Vec::new();
        for part in json.as_bytes().chunks(chunk) {
            splitter.feed(part, &mut |p: wire::Pod| {
                names.push(p.metadata.name.unwrap_or_default())
            })?;
        }
        Ok((names, splitter.finish()?.continue_))
    }

    fn accept<W: Object>() -> Option<String> {
        let params = ListParams::default().continue_token("next");
        let req = page::<W>("/apis/apps/v1/replicasets", &params).unwrap();
        assert!(req.uri().query().unwrap().contains("continue=next"));
        req.headers()
            .get(http::header::ACCEPT)
            .map(|v| v.to_str().unwrap().to_string())
    }

    /// The kinds read for their metadata alone ask for it on every page, naming plain JSON as the
    /// fallback; the kinds whose spec or status is read ask for the whole objects.
    #[test]
    fn metadata_pages_ask_for_partial_metadata_with_plain_json_as_fallback() {
        for metadata_only in [accept::<wire::ReplicaSet>(), accept::<wire::Namespace>()] {
            assert_eq!(
                metadata_only.as_deref(),
                Some(
                    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
                )
            );
        }
        for whole in [
            accept::<wire::Pod>(),
            accept::<wire::Controller>(),
            accept::<wire::PodMetrics>(),
            accept::<wire::PodDisruptionBudget>(),
        ] {
            assert_eq!(whole, None);
        }
    }

    #[test]
    fn a_partial_metadata_list_splits_like_a_whole_one() {
        let body = json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "7", "continue": ""},
            "items": [{
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": {"name": "web-7d4b9c", "namespace": "a",
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                  "name": "web", "uid": "d", "controller": true}]}
            }]
        })
        .to_string();
        let mut splitter = ListSplitter::default();
        let mut owners = Vec::new();
        splitter
            .feed(body.as_bytes(), &mut |r: wire::ReplicaSet| {
                let refs = r.metadata.owner_references.unwrap_or_default();
                owners.extend(refs.into_iter().map(|o| o.name));
            })
            .unwrap();
        assert_eq!(
            splitter.finish().unwrap().resource_version.as_deref(),
            Some("7")
        );
        assert_eq!(owners, ["web"]);
    }

    #[test]
    fn items_and_continue_token_in_any_order_and_any_chunking() {
        let tricky = r#"a \"quoted\" {not [a] bracket} \\"#;
        let builtin = json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "12", "continue": "tok\"en"},
            "items": [
                {"metadata": {"name": "a", "annotations": {"note": tricky, "items": "[{"}},
                 "spec": {"containers": [{"name": "c"}]}},
                {"metadata": {"name": "b\u{e9}\u{1F600}"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            ]
        });
        // Custom resources come back with their fields sorted: items before metadata.
        let custom = format!(
            r#"{{"apiVersion":"metrics.k8s.io/v1beta1","items":{},"kind":"PodMetricsList","metadata":{{"continue":"tok\"en"}}}}"#,
            builtin["items"]
        );
        for text in [serde_json::to_string_pretty(&builtin).unwrap(), custom] {
            for chunk in [1, 2, 3, 7, 64, text.len()] {
                let (names, token) = split(&text, chunk).unwrap();
                assert_eq!(names, ["a", "b\u{e9}\u{1F600}"], "chunk {chunk}");
                assert_eq!(token.as_deref(), Some("tok\"en"), "chunk {chunk}");
            }
        }
    }

    #[test]
    fn empty_lists_and_null_items() {
        for text in [
            r#"{"metadata":{},"items":[]}"#,
            r#"{"items":null,"metadata":{"continue":""}}"#,
            "{}",
        ] {
            let (names, token) = split(text, 5).unwrap();
            assert!(names.is_empty());
            assert!(token.is_none_or(|t| t.is_empty()));
        }
    }

    #[test]
    fn truncated_or_broken_responses_are_errors() {
        for text in [
            r#"{"metadata":{},"items":[{"metadata":{"name":"a"}}"#,
            "",
            "[]",
            r#"{"items":[{"metadata":7}]}"#,
            "{}}",
        ] {
            assert!(split(text, 4).is_err(), "{text}");
        }
    }

    #[test]
    fn memory_holds_one_item_not_the_page() {
        let item = json!({"metadata": {"name": "p", "annotations": {"pad": "x".repeat(4000)}}});
        let text =
            serde_json::to_string(&json!({"metadata": {}, "items": vec![item; 200]})).unwrap();
        let mut splitter = ListSplitter::default();
        let mut count = 0;
        let mut peak = 0;
        for part in text.as_bytes().chunks(100_000) {
            splitter.feed(part, &mut |_: wire::Pod| count += 1).unwrap();
            peak = peak.max(splitter.buf.len());
        }
        splitter.finish().unwrap();
        assert_eq!(count, 200);
        assert!(
            peak < 4200 + SLICE,
            "buffered {peak} bytes of a {} byte page",
            text.len()
        );
    }
}
