//! The language server, driven in-process through its message loop with JSON-RPC messages:
//! diagnostics (ranges equal to the CLI's), hover, definition, references, completion,
//! symbols, inlay hints, incremental edits in UTF-16, and bad input that must not stop it.

use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use lsp_server::{Connection, Message, Notification, Request, RequestId, Response};
use mslc_check::{check_source, CheckOptions};
use mslc_driver::render::render_json;
use serde_json::{json, Value};

struct Client {
    conn: Connection,
    server: Option<JoinHandle<Result<(), String>>>,
    next: i32,
    /// Diagnostics published so far, by URI, latest last.
    published: Vec<(String, Value)>,
}

impl Client {
    fn start() -> Client {
        let (server, conn) = Connection::memory();
        let handle = std::thread::Builder::new()
            .stack_size(512 << 20)
            .spawn(move || mslc_lsp::serve(&server))
            .unwrap();
        let mut client = Client {
            conn,
            server: Some(handle),
            next: 0,
            published: Vec::new(),
        };
        let init = client.request("initialize", json!({ "capabilities": {} }));
        assert_eq!(
            init.response_result.unwrap()["capabilities"]["textDocumentSync"],
            json!(2)
        );
        client.notify("initialized", json!({}));
        client
    }

    fn notify(&self, method: &str, params: Value) {
        let n = Notification::new(method.to_string(), params);
        self.conn.sender.send(Message::Notification(n)).unwrap();
    }

    fn recv(&mut self) -> Message {
        let msg = self
            .conn
            .receiver
            .recv_timeout(Duration::from_secs(60))
            .expect("the server answers");
        if let Message::Notification(n) = &msg {
            if n.method == "textDocument/publishDiagnostics" {
                let uri = n.params["uri"].as_str().unwrap().to_string();
                self.published.push((uri, n.params["diagnostics"].clone()));
            }
        }
        msg
    }

    fn request(&mut self, method: &str, params: Value) -> Response {
        self.next += 1;
        let id = RequestId::from(self.next);
        let req = Request::new(id.clone(), method.to_string(), params);
        self.conn.sender.send(Message::Request(req)).unwrap();
        loop {
            if let Message::Response(r) = self.recv() {
                assert_eq!(r.id, id);
                return r;
            }
        }
    }

    fn ok(&mut self, method: &str, params: Value) -> Value {
        match self.request(method, params).response_result {
            Ok(v) => v,
            Err(e) => panic!("{method}: {e:?}"),
        }
    }

    /// Waits for the next diagnostics published for `uri`.
    fn diagnostics(&mut self, uri: &str) -> Vec<Value> {
        let seen = self.published.len();
        loop {
            if let Some((_, d)) = self.published[seen..].iter().rev().find(|(u, _)| u == uri) {
                return d.as_array().unwrap().clone();
            }
            self.recv();
        }
    }

    fn open(&mut self, uri: &str, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({ "textDocument": { "uri": uri, "languageId": "msl", "version": 1, "text": text } }),
        );
    }

    fn shutdown(mut self) {
        let r = self.request("shutdown", Value::Null);
        assert!(r.response_result.is_ok());
        self.notify("exit", Value::Null);
        let result = self.server.take().unwrap().join().unwrap();
        assert_eq!(result, Ok(()));
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn file_uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// The LSP position (line, UTF-16 column) of the first `needle` after `after` in `text`.
fn pos(text: &str, after: &str, needle: &str) -> Value {
    let start = text.find(after).unwrap();
    let at = start + text[start..].find(needle).unwrap();
    let line = text[..at].matches('\n').count();
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let character: usize = text[line_start..at].chars().map(char::len_utf16).sum();
    json!({ "line": line, "character": character })
}

fn at(uri: &str, position: Value) -> Value {
    json!({ "textDocument": { "uri": uri }, "position": position })
}

fn tiny_llama() -> (String, String) {
    let path = root().join("examples/tiny_llama.msl");
    (file_uri(&path), std::fs::read_to_string(&path).unwrap())
}

#[test]
fn hover_shows_symbolic_shapes_params_and_fields() {
    let (uri, text) = tiny_llama();
    let mut c = Client::start();
    c.open(&uri, &text);
    let hover = c.ok("textDocument/hover", at(&uri, pos(&text, "let h", "h")));
    let shown = hover["contents"]["value"].as_str().unwrap();
    assert!(shown.contains("f32[B=1, S=128, 256]"), "{shown}");

    let label = c.ok(
        "textDocument/hover",
        at(&uri, pos(&text, "let h", "model:")),
    );
    let shown = label["contents"]["value"].as_str().unwrap();
    assert!(shown.contains("parameter elements"), "{shown}");
    assert!(
        shown.contains("model.layers.0.self_attn.q_proj.weight"),
        "{shown}"
    );

    let field = c.ok(
        "textDocument/hover",
        at(&uri, pos(&text, "precision Mixed", "loss_scale")),
    );
    assert!(field["contents"]["value"]
        .as_str()
        .unwrap()
        .contains("Loss scaling"));
    c.shutdown();
}

#[test]
fn definition_references_symbols_and_hints() {
    let (uri, text) = tiny_llama();
    let mut c = Client::start();
    c.open(&uri, &text);
    let def = c.ok(
        "textDocument/definition",
        at(&uri, pos(&text, "let h", "LlamaModel")),
    );
    assert_eq!(def["uri"], json!("mslc-std:///std/llm.msl"));
    let std_text = c.ok(
        "mslc/stdlibSource",
        json!({ "uri": "mslc-std:///std/llm.msl" }),
    );
    assert!(std_text.as_str().unwrap().contains("block LlamaModel"));

    let def = c.ok(
        "textDocument/definition",
        at(&uri, pos(&text, "LlamaModel(tokens", "vocab")),
    );
    assert_eq!(def["range"]["start"], pos(&text, "const ", "vocab"));

    let refs = c.ok(
        "textDocument/references",
        json!({ "textDocument": { "uri": uri }, "position": pos(&text, "dims ", "B"),
                "context": { "includeDeclaration": true } }),
    );
    assert!(refs.as_array().unwrap().len() >= 2, "{refs}");

    let symbols = c.ok(
        "textDocument/documentSymbol",
        json!({ "textDocument": { "uri": uri } }),
    );
    let names: Vec<&str> = symbols
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"TinyLlama") && names.contains(&"Eight"),
        "{names:?}"
    );

    let hints = c.ok(
        "textDocument/inlayHint",
        json!({ "textDocument": { "uri": uri },
                "range": { "start": { "line": 0, "character": 0 }, "end": { "line": 999, "character": 0 } } }),
    );
    assert!(
        hints.to_string().contains(": f32[B=1, S=128, 256]"),
        "{hints}"
    );
    c.shutdown();
}

#[test]
fn completion_by_context() {
    let (uri, text) = tiny_llama();
    let mut c = Client::start();
    c.open(&uri, &text);
    let labels = |v: Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|i| i["label"].as_str().unwrap().to_string())
            .collect()
    };
    let mut shard = pos(&text, "shard \"model.embed", "model.embed");
    let items = labels(c.ok("textDocument/completion", at(&uri, shard.clone())));
    assert!(
        items.contains(&"model.layers.*.self_attn.q_proj.weight".to_string()),
        "{items:?}"
    );
    shard = pos(&text, "shard \"model.embed", "mp, _]");
    let items = labels(c.ok("textDocument/completion", at(&uri, shard)));
    assert!(
        items.contains(&"dp".to_string()) && items.contains(&"mp".to_string()),
        "{items:?}"
    );
    let items = labels(c.ok(
        "textDocument/completion",
        at(&uri, pos(&text, "precision Mixed", "level")),
    ));
    assert!(items.contains(&"loss_scale".to_string()), "{items:?}");
    let items = labels(c.ok(
        "textDocument/completion",
        at(&uri, pos(&text, "level =", " O2")),
    ));
    assert!(items.contains(&"O1".to_string()), "{items:?}");
    let items = labels(c.ok(
        "textDocument/completion",
        at(&uri, pos(&text, "let h", "model:")),
    ));
    assert!(items.contains(&"Linear".to_string()) && items.contains(&"matmul".to_string()));
    let items = labels(c.ok(
        "textDocument/completion",
        at(&uri, pos(&text, "LlamaModel(", "tokens")),
    ));
    assert!(items.contains(&"eps:".to_string()), "{items:?}");
    c.shutdown();
}

/// The LSP range the CLI's JSON output gives (1-based lines and character columns; the inputs
/// are ASCII, so characters are UTF-16 units).
fn cli_ranges(name: &str, text: &str) -> Vec<(String, Value)> {
    let checked = check_source(name, text, &CheckOptions::default());
    checked
        .diagnostics
        .iter()
        .filter(|d| d.primary.file == mslc_core::diag::FileId(0))
        .map(|d| {
            let j: Value = serde_json::from_str(&render_json(d, &checked.sources)).unwrap();
            let p = |l: &str, c: &str| json!({ "line": j[l].as_u64().unwrap() - 1, "character": j[c].as_u64().unwrap() - 1 });
            (
                d.code.as_str().to_string(),
                json!({ "start": p("line_start", "column_start"), "end": p("line_end", "column_end") }),
            )
        })
        .collect()
}

#[test]
fn unused_code_is_a_warning_marked_unnecessary() {
    let path = root().join("tests/ui/lint_dropped_instance.msl");
    let text = std::fs::read_to_string(&path).unwrap();
    let uri = file_uri(&path);
    let mut c = Client::start();
    c.open(&uri, &text);
    let got = c.diagnostics(&uri);
    assert_eq!(got.len(), 2, "{got:?}");
    for d in &got {
        assert_eq!(d["code"], "W0011");
        assert_eq!(d["severity"], 2, "a warning");
        assert_eq!(d["tags"], json!([1]), "DiagnosticTag::Unnecessary");
    }
    c.shutdown();
}

#[test]
fn diagnostics_match_the_cli() {
    let missing_bracket = "model M {\n    input x: f32[2, 8\n    output y = x\n}\n".to_string();
    let cases = [
        ("missing_bracket.msl".to_string(), missing_bracket),
        ("tests/ui/name_unknown_block.msl".to_string(), String::new()),
        (
            "tests/ui/shape_matmul_mismatch.msl".to_string(),
            String::new(),
        ),
        (
            "tests/ui/policy_unknown_field.msl".to_string(),
            String::new(),
        ),
    ];
    let mut c = Client::start();
    for (name, inline) in cases {
        let path = root().join(&name);
        let text = if inline.is_empty() {
            std::fs::read_to_string(&path).unwrap()
        } else {
            inline
        };
        let uri = file_uri(&path);
        c.open(&uri, &text);
        let got: Vec<(String, Value)> = c
            .diagnostics(&uri)
            .iter()
            .map(|d| {
                assert!(d["codeDescription"]["href"]
                    .as_str()
                    .unwrap()
                    .ends_with(".md"));
                (d["code"].as_str().unwrap().to_string(), d["range"].clone())
            })
            .collect();
        let want = cli_ranges(&path.display().to_string(), &text);
        assert!(!want.is_empty(), "{name}");
        assert_eq!(got, want, "{name}");
    }
    c.shutdown();
}

#[test]
fn incremental_edits_count_utf16() {
    let path = root().join("tests/ui/name_unknown_block.msl");
    let text = format!(
        "// é😀 ünïcode\n{}",
        std::fs::read_to_string(&path).unwrap()
    );
    let uri = "file:///tmp/edited.msl";
    let mut c = Client::start();
    c.open(uri, &text);
    assert_eq!(c.diagnostics(uri).len(), 1);
    // Rename `Linaer` to `Linear` with a ranged edit, then add a 😀 comment on line 0 after
    // the emoji (positions in UTF-16 units), and check the diagnostics are gone.
    let start = pos(&text, "proj:", "Linaer");
    let end =
        json!({ "line": start["line"], "character": start["character"].as_u64().unwrap() + 6 });
    c.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 2 },
                "contentChanges": [
                    { "range": { "start": start, "end": end }, "text": "Linear" },
                    { "range": { "start": { "line": 0, "character": 6 }, "end": { "line": 0, "character": 6 } }, "text": "😀" }
                ] }),
    );
    assert_eq!(c.diagnostics(uri), Vec::<Value>::new());
    let hover = c.ok(
        "textDocument/hover",
        at(uri, pos(&text, "output y", "y = ")),
    );
    assert!(hover.is_null() || hover["contents"].is_object());
    let line0 = c.ok(
        "textDocument/documentSymbol",
        json!({ "textDocument": { "uri": uri } }),
    );
    assert!(line0.to_string().contains("\"M\""));
    c.shutdown();
}

#[test]
fn bad_input_never_stops_the_server() {
    let mut c = Client::start();
    let nested = format!(
        "model M {{\n output y = {}1{}\n}}\n",
        "(".repeat(10_000),
        ")".repeat(10_000)
    );
    let big = format!(
        "model M {{\n{}}}\n",
        "    const a = 1 // padding padding padding\n".repeat(25_000)
    );
    let garbage: String = (0..4096u32)
        .map(|i| char::from_u32(33 + (i * 7919) % 90).unwrap())
        .collect();
    for (i, text) in [
        nested,
        big,
        garbage,
        "\u{0}\u{feff}]]]{{{".to_string(),
        "model M {\n  let y = x.😀(".to_string(),
    ]
    .iter()
    .enumerate()
    {
        let uri = format!("file:///tmp/bad{i}.msl");
        c.open(&uri, text);
        let _ = c.diagnostics(&uri);
        let r = c.request(
            "textDocument/hover",
            at(&uri, json!({ "line": 1, "character": 5 })),
        );
        assert!(r.response_result.is_ok());
        let r = c.request(
            "textDocument/completion",
            at(&uri, json!({ "line": 99999, "character": 99999 })),
        );
        assert!(r.response_result.is_ok());
    }
    // Requests for unopened documents, unknown methods, malformed params: error replies.
    let r = c.request(
        "textDocument/hover",
        at("file:///nowhere.msl", json!({ "line": 0, "character": 0 })),
    );
    assert!(r.response_result.is_err());
    let r = c.request("textDocument/frobnicate", json!({}));
    assert!(r.response_result.is_err());
    let r = c.request(
        "textDocument/hover",
        json!({ "textDocument": { "uri": "file:///tmp/bad0.msl" }, "position": "x" }),
    );
    assert!(r.response_result.is_err());
    let r = c.request("textDocument/definition", json!(42));
    assert!(r.response_result.is_err());
    c.notify("textDocument/didChange", json!({ "garbage": true }));
    c.notify("$/unknown", json!(null));
    // Still serving.
    let (uri, text) = tiny_llama();
    c.open(&uri, &text);
    let hover = c.ok("textDocument/hover", at(&uri, pos(&text, "let h", "h")));
    assert!(hover["contents"]["value"]
        .as_str()
        .unwrap()
        .contains("f32["));
    c.shutdown();
}

#[test]
fn edits_in_quick_succession_are_checked_once() {
    let uri = "file:///tmp/debounce.msl";
    let good = "model M {\n    input x: f32[2, 8]\n    output y = x\n}\n";
    let mut c = Client::start();
    c.open(uri, good);
    assert!(c.diagnostics(uri).is_empty());
    for version in 2..7 {
        let text = if version % 2 == 0 {
            good.replace("output", "outptu")
        } else {
            good.into()
        };
        c.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version },
                    "contentChanges": [{ "text": text }] }),
        );
    }
    let diags = c.diagnostics(uri);
    assert!(!diags.is_empty(), "the last version (6) is broken");
    // Nothing else is published for it: a request answers without a second publication.
    let before = c.published.len();
    c.ok(
        "textDocument/documentSymbol",
        json!({ "textDocument": { "uri": uri } }),
    );
    std::thread::sleep(Duration::from_millis(300));
    let r = c.request(
        "textDocument/documentSymbol",
        json!({ "textDocument": { "uri": uri } }),
    );
    assert!(r.response_result.is_ok());
    assert_eq!(c.published.len(), before, "one check for five edits");
    c.shutdown();
}

#[test]
fn semantic_tokens_class_blocks_dims_and_keywords() {
    let (uri, text) = tiny_llama();
    let mut c = Client::start();
    c.open(&uri, &text);
    let r = c.ok(
        "textDocument/semanticTokens/full",
        json!({ "textDocument": { "uri": uri } }),
    );
    let data: Vec<u64> = r["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(data.len() % 5, 0);
    // Decode and find the token at `LlamaModel(` of the `let h` line: a type (index 1).
    let want = pos(&text, "let h", "LlamaModel");
    let (mut line, mut col) = (0u64, 0u64);
    let mut found = None;
    for t in data.chunks(5) {
        if t[0] > 0 {
            col = 0;
        }
        line += t[0];
        col += t[1];
        if json!({ "line": line, "character": col }) == want {
            found = Some(t[3]);
        }
    }
    assert_eq!(found, Some(1));
    c.shutdown();
}

#[test]
fn formatting_is_mslc_fmt() {
    let uri = "file:///tmp/mslc-lsp-format.msl";
    let messy = "model M {\n  input x: f32[2,   3]   // the input\n    output y = x\n}\n";
    let mut c = Client::start();
    c.open(uri, messy);
    let edits = c.ok(
        "textDocument/formatting",
        json!({ "textDocument": { "uri": uri }, "options": { "tabSize": 4, "insertSpaces": true } }),
    );
    let edits = edits.as_array().unwrap();
    assert_eq!(edits.len(), 1);
    let formatted = edits[0]["newText"].as_str().unwrap();
    let want = mslc_syntax::format::format_source(mslc_core::diag::FileId(0), messy).unwrap();
    assert_eq!(formatted, want);
    assert!(formatted.contains("// the input"));
    // Formatted text needs no edit; a file with a syntax error gets none either.
    c.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 2 }, "contentChanges": [{ "text": formatted }] }),
    );
    let none = c.ok("textDocument/formatting", json!({ "textDocument": { "uri": uri }, "options": { "tabSize": 4, "insertSpaces": true } }));
    assert_eq!(none, json!([]));
    c.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 3 }, "contentChanges": [{ "text": "model M { input x: f32[2, 3\n" }] }),
    );
    let none = c.ok("textDocument/formatting", json!({ "textDocument": { "uri": uri }, "options": { "tabSize": 4, "insertSpaces": true } }));
    assert_eq!(none, json!([]));
    c.shutdown();
}
