//! `mslc lsp`: a language server over stdio. The protocol layer (`lsp-server`, `lsp-types`) is
//! only here; every fact comes from the checker, which never stops at the first error, so a
//! half-typed file still gets hover, navigation and completion everywhere else.
//!
//! Documents sync incrementally (UTF-16 positions); diagnostics are republished once edits
//! pause for [`DEBOUNCE`], or at once when a request needs the new text. Embedded standard
//! library files have `mslc-std:///std/NAME.msl` URIs; the `mslc/stdlibSource` request
//! (params `{ "uri": … }`) returns their text.

mod analysis;
mod complete;
mod fields;
mod index;
mod requests;
mod text;
mod tokens;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument, Notification as _,
    PublishDiagnostics,
};
use lsp_types::{
    CompletionOptions, HoverProviderCapability, OneOf, PublishDiagnosticsParams,
    SemanticTokensFullOptions, SemanticTokensOptions, SemanticTokensServerCapabilities,
    ServerCapabilities, TextDocumentSyncCapability, TextDocumentSyncKind, Uri,
};

use analysis::Analysis;
use text::Document;

pub use analysis::STD_SCHEME;

/// How long edits must pause before a document is re-checked and its diagnostics republished.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// Where each diagnostic code's page lives: `{CODE_DOCS_BASE}E0001.md` (the repository's
/// `docs/codes/`).
pub const CODE_DOCS_BASE: &str = "https://github.com/mslc/mslc/blob/main/docs/codes/";

/// Runs the server on stdin/stdout until the client says `exit`.
pub fn run_stdio() -> Result<(), String> {
    // Deeply nested input recurses deeply: give the server a large stack.
    let worker = std::thread::Builder::new()
        .stack_size(512 << 20)
        .spawn(|| {
            let (connection, io) = Connection::stdio();
            serve(&connection)?;
            drop(connection);
            io.join().map_err(|e| e.to_string())
        })
        .map_err(|e| e.to_string())?;
    worker
        .join()
        .map_err(|_| "the language server stopped unexpectedly".to_string())?
}

/// The capabilities this server offers.
pub fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(
            TextDocumentSyncKind::INCREMENTAL,
        )),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        definition_provider: Some(OneOf::Left(true)),
        references_provider: Some(OneOf::Left(true)),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(vec!["(".into(), "\"".into(), "[".into(), " ".into()]),
            ..CompletionOptions::default()
        }),
        document_symbol_provider: Some(OneOf::Left(true)),
        inlay_hint_provider: Some(OneOf::Left(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        semantic_tokens_provider: Some(SemanticTokensServerCapabilities::SemanticTokensOptions(
            SemanticTokensOptions {
                legend: tokens::legend(),
                full: Some(SemanticTokensFullOptions::Bool(true)),
                ..SemanticTokensOptions::default()
            },
        )),
        ..ServerCapabilities::default()
    }
}

/// Initializes over `connection` and serves it until `exit` or until the client hangs up.
/// Bad requests get error replies; nothing the client sends ends the loop except `exit`.
pub fn serve(connection: &Connection) -> Result<(), String> {
    let caps = serde_json::to_value(capabilities()).map_err(|e| e.to_string())?;
    connection.initialize(caps).map_err(|e| e.to_string())?;
    let mut server = Server::default();
    loop {
        let msg = match server.next_deadline() {
            Some(deadline) => {
                match connection
                    .receiver
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                {
                    Ok(msg) => msg,
                    Err(e) if e.is_timeout() => {
                        server.flush_due(connection);
                        continue;
                    }
                    Err(_) => return Ok(()),
                }
            }
            None => match connection.receiver.recv() {
                Ok(msg) => msg,
                Err(_) => return Ok(()),
            },
        };
        match msg {
            Message::Request(req) => {
                if req.method == "shutdown" {
                    match connection.handle_shutdown(&req) {
                        Ok(_) => return Ok(()),
                        Err(e) => return Err(e.to_string()),
                    }
                }
                let response = server.request(connection, req);
                send(connection, response.into());
            }
            Message::Notification(n) if n.method == "exit" => return Ok(()),
            Message::Notification(n) => server.notify(n),
            Message::Response(_) => {}
        }
    }
}

fn send(connection: &Connection, msg: Message) {
    // A client that hung up is noticed by the receiving side.
    let _ = connection.sender.send(msg);
}

/// One open document with its latest analysis.
struct Open {
    doc: Document,
    uri: Uri,
    analysis: Option<Analysis>,
    /// When the last unchecked edit arrived.
    dirty_since: Option<Instant>,
    /// URIs diagnostics were last published to for this document.
    published: Vec<Uri>,
}

/// The server's state: the open documents.
#[derive(Default)]
struct Server {
    docs: HashMap<String, Open>,
}

impl Server {
    fn next_deadline(&self) -> Option<Instant> {
        self.docs
            .values()
            .filter_map(|d| d.dirty_since)
            .min()
            .map(|t| t + DEBOUNCE)
    }

    fn flush_due(&mut self, connection: &Connection) {
        let now = Instant::now();
        let due: Vec<String> = self
            .docs
            .iter()
            .filter(|(_, d)| d.dirty_since.is_some_and(|t| t + DEBOUNCE <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.refresh(connection, &key);
        }
    }

    /// Re-checks a document if it changed since its last check, and publishes its diagnostics.
    fn refresh(&mut self, connection: &Connection, key: &str) {
        let Some(open) = self.docs.get_mut(key) else {
            return;
        };
        if open.analysis.is_some() && open.dirty_since.is_none() {
            return;
        }
        let analysis = guard(|| Analysis::new(&open.uri, &open.doc.text));
        open.dirty_since = None;
        let Some(analysis) = analysis else {
            return;
        };
        let by_uri = requests::diagnostics(&analysis);
        let mut now_published = Vec::new();
        for (uri, diagnostics) in by_uri {
            let version = (uri == open.uri).then_some(open.doc.version);
            now_published.push(uri.clone());
            publish(connection, uri, diagnostics, version);
        }
        for stale in open.published.drain(..) {
            if !now_published.contains(&stale) {
                publish(connection, stale, Vec::new(), None);
            }
        }
        open.published = now_published;
        open.analysis = Some(analysis);
    }

    fn notify(&mut self, n: Notification) {
        match n.method.as_str() {
            DidOpenTextDocument::METHOD => {
                if let Ok(p) =
                    serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(n.params)
                {
                    let uri = p.text_document.uri;
                    self.docs.insert(
                        uri.as_str().to_string(),
                        Open {
                            doc: Document::new(p.text_document.text, p.text_document.version),
                            uri,
                            analysis: None,
                            dirty_since: Some(Instant::now()),
                            published: Vec::new(),
                        },
                    );
                }
            }
            DidChangeTextDocument::METHOD => {
                if let Ok(p) =
                    serde_json::from_value::<lsp_types::DidChangeTextDocumentParams>(n.params)
                {
                    if let Some(open) = self.docs.get_mut(p.text_document.uri.as_str()) {
                        open.doc.apply(p.content_changes, p.text_document.version);
                        open.dirty_since = Some(Instant::now());
                    }
                }
            }
            DidCloseTextDocument::METHOD => {
                if let Ok(p) =
                    serde_json::from_value::<lsp_types::DidCloseTextDocumentParams>(n.params)
                {
                    self.docs.remove(p.text_document.uri.as_str());
                }
            }
            _ => {}
        }
    }

    fn request(&mut self, connection: &Connection, req: Request) -> Response {
        let id = req.id.clone();
        if req.method == "mslc/stdlibSource" {
            let uri = req.params.get("uri").and_then(|u| u.as_str()).unwrap_or("");
            return match analysis::std_text(uri) {
                Some(text) => Response::new_ok(id, text),
                None => error(
                    id,
                    ErrorCode::InvalidParams,
                    format!("no embedded file `{uri}`"),
                ),
            };
        }
        let Some(uri) = req
            .params
            .get("textDocument")
            .and_then(|t| t.get("uri"))
            .and_then(|u| u.as_str())
            .map(str::to_string)
        else {
            return match requests::known(&req.method) {
                true => error(
                    id,
                    ErrorCode::InvalidParams,
                    "missing textDocument.uri".into(),
                ),
                false => error(
                    id,
                    ErrorCode::MethodNotFound,
                    format!("unknown request `{}`", req.method),
                ),
            };
        };
        if !requests::known(&req.method) {
            return error(
                id,
                ErrorCode::MethodNotFound,
                format!("unknown request `{}`", req.method),
            );
        }
        self.refresh(connection, &uri);
        let Some(open) = self.docs.get(&uri) else {
            return error(
                id,
                ErrorCode::InvalidParams,
                format!("document `{uri}` is not open"),
            );
        };
        let Some(analysis) = &open.analysis else {
            return error(
                id,
                ErrorCode::InternalError,
                "the document could not be checked".into(),
            );
        };
        match guard(|| requests::answer(analysis, &open.doc, &req)) {
            Some(Ok(value)) => Response::new_ok(id, value),
            Some(Err(message)) => error(id, ErrorCode::InvalidParams, message),
            None => error(id, ErrorCode::InternalError, "internal error".into()),
        }
    }
}

fn publish(
    connection: &Connection,
    uri: Uri,
    diagnostics: Vec<lsp_types::Diagnostic>,
    version: Option<i32>,
) {
    let params = PublishDiagnosticsParams {
        uri,
        diagnostics,
        version,
    };
    send(
        connection,
        Notification::new(PublishDiagnostics::METHOD.to_string(), params).into(),
    );
}

fn error(id: lsp_server::RequestId, code: ErrorCode, message: String) -> Response {
    Response::new_err(id, code as i32, message)
}

/// Runs `f`, turning a panic (a bug, never expected) into `None` so the server keeps serving.
fn guard<T>(f: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}
