//! Latency of the language server on a large model: opens a file (default
//! `examples/llama2_70b.msl`), then repeatedly edits it (one character typed into a comment,
//! an incremental change) and asks for a hover at once, timing from the edit until both the
//! hover reply and the republished diagnostics have arrived. Prints the median and worst ms.
//!
//! `cargo run --release -p mslc-lsp --example latency [FILE] [EDITS]`

use std::time::{Duration, Instant};

use lsp_server::{Connection, Message, Notification, Request, RequestId};
use serde_json::{json, Value};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = std::path::absolute(args.next().unwrap_or("examples/llama2_70b.msl".into()))
        .expect("a path");
    let edits: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(20);
    let text = std::fs::read_to_string(&path).expect("a readable file");
    let uri = format!("file://{}", path.display());

    let (server, client) = Connection::memory();
    let handle = std::thread::Builder::new()
        .stack_size(512 << 20)
        .spawn(move || mslc_lsp::serve(&server))
        .expect("a thread");
    let send = |m: Message| client.sender.send(m).expect("server alive");
    let request = |id: i32, method: &str, params: Value| {
        send(Request::new(RequestId::from(id), method.into(), params).into());
    };
    let notify = |method: &str, params: Value| {
        send(Notification::new(method.into(), params).into());
    };
    // Waits until a response to `id` and diagnostics for `version` have both arrived.
    let wait = |id: i32, version: Option<i64>| {
        let mut got_reply = false;
        let mut got_diags = version.is_none();
        while !(got_reply && got_diags) {
            match client.receiver.recv_timeout(Duration::from_secs(120)) {
                Ok(Message::Response(r)) if r.id == RequestId::from(id) => got_reply = true,
                Ok(Message::Notification(n)) if n.method == "textDocument/publishDiagnostics" => {
                    got_diags |= n.params["version"].as_i64() == version;
                }
                Ok(_) => {}
                Err(e) => panic!("no answer: {e}"),
            }
        }
    };

    request(0, "initialize", json!({ "capabilities": {} }));
    wait(0, None);
    notify("initialized", json!({}));
    let started = Instant::now();
    notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": "msl", "version": 1, "text": text } }),
    );
    let (line, character) = hover_position(&text);
    let hover = json!({ "textDocument": { "uri": uri }, "position": { "line": line, "character": character } });
    request(1, "textDocument/hover", hover.clone());
    wait(1, Some(1));
    println!(
        "first check: {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );

    let mut times = Vec::new();
    for i in 0..edits {
        let version = i as i64 + 2;
        let t = Instant::now();
        notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version },
                    "contentChanges": [{ "range": { "start": { "line": 0, "character": 2 },
                                                    "end": { "line": 0, "character": 2 } },
                                         "text": "x" }] }),
        );
        request(version as i32, "textDocument/hover", hover.clone());
        wait(version as i32, Some(version));
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "edit -> hover + diagnostics over {edits} edits: median {:.1} ms, worst {:.1} ms",
        times[times.len() / 2],
        times[times.len() - 1]
    );
    request(9999, "shutdown", Value::Null);
    wait(9999, None);
    notify("exit", Value::Null);
    let _ = handle.join();
}

/// The position of the first `let` binding's name (line, UTF-16 column); the file's start if
/// there is none.
fn hover_position(text: &str) -> (usize, usize) {
    text.lines()
        .enumerate()
        .find_map(|(n, l)| l.find("let ").map(|c| (n, c + 4)))
        .unwrap_or((0, 0))
}
