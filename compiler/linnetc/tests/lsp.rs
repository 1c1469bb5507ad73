//! A scripted editor session with `linnetc lsp`: open the model packages,
//! type mistakes into unsaved text and expect diagnostics at their ranges,
//! hover over lets for their shapes, jump to definitions across modules and
//! packages, find references, list symbols, and format; a change to a
//! dependency re-checks the packages that use it.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: i64,
}

impl Client {
    fn start() -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_linnetc"))
            .arg("lsp")
            .env("LINNET_STDLIB", root().join("stdlib"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("linnetc lsp starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut client = Client { child, stdin, stdout, next_id: 0 };
        client.request("initialize", json!({ "capabilities": {} }));
        client.notify("initialized", json!({}));
        client
    }

    fn send(&mut self, message: Value) {
        let body = message.to_string();
        write!(self.stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        self.stdin.flush().unwrap();
    }

    fn receive(&mut self) -> Value {
        let mut length = 0;
        loop {
            let mut line = String::new();
            self.stdout.read_line(&mut line).unwrap();
            let line = line.trim();
            if line.is_empty() {
                break;
            }
            if let Some(value) = line.strip_prefix("Content-Length: ") {
                length = value.parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        self.stdout.read_exact(&mut body).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({ "jsonrpc": "2.0", "method": method, "params": params }));
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        loop {
            let message = self.receive();
            if message["id"] == json!(id) {
                return message["result"].clone();
            }
        }
    }

    /// Sends a request and counts the diagnostics published before its answer.
    fn publications_before_answer(&mut self, method: &str, params: Value) -> usize {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        let mut published = 0;
        loop {
            let message = self.receive();
            if message["id"] == json!(id) {
                return published;
            }
            published += usize::from(message["method"] == "textDocument/publishDiagnostics");
        }
    }

    /// The next diagnostics published for `uri`.
    fn diagnostics_for(&mut self, uri: &str) -> Vec<Value> {
        loop {
            let message = self.receive();
            if message["method"] == "textDocument/publishDiagnostics" && message["params"]["uri"] == uri {
                return message["params"]["diagnostics"].as_array().unwrap().clone();
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).canonicalize().unwrap()
}

/// A file of `models/`, its URI and its text.
fn file(relative: &str) -> (String, String) {
    let path = root().join("models").join(relative);
    let uri = format!("file://{}", path.display());
    (uri, std::fs::read_to_string(path).unwrap())
}

fn position_of(text: &str, needle: &str, within: usize) -> Value {
    let at = text.find(needle).unwrap_or_else(|| panic!("`{needle}` not in the file")) + within;
    let line = text[..at].matches('\n').count();
    let column = at - text[..at].rfind('\n').map_or(0, |i| i + 1);
    json!({ "line": line, "character": column })
}

fn hover(client: &mut Client, uri: &str, text: &str, needle: &str) -> String {
    let result = client.request(
        "textDocument/hover",
        json!({ "textDocument": { "uri": uri }, "position": position_of(text, needle, 1) }),
    );
    result["contents"]["value"].as_str().unwrap_or_default().to_string()
}

#[test]
fn an_editor_session_on_the_dense_package() {
    let mut client = Client::start();
    let (uri, text) = file("qwen3.8-27b/src/attention.linnet");
    client.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": "linnet", "version": 1, "text": text } }),
    );
    assert!(client.diagnostics_for(&uri).is_empty(), "the package opens clean");

    // Hover: lets in attention with their symbolic and concrete shapes.
    let shown = hover(&mut client, &uri, &text, "v = reshape(v_proj");
    assert!(
        shown.contains("Tensor[B, S, KvHeads, HeadDim; T]") && shown.contains("[1, 8, 4, 256] bf16, 16.0 KiB"),
        "{shown}"
    );
    let shown = hover(&mut client, &uri, &text, "mixed = grouped_attention(");
    assert!(shown.contains("Tensor[B, Heads, S, HeadDim; T]"), "{shown}");

    // Go to definition across modules: `tables` lives in rope.linnet,
    // `grouped_attention` in the standard library.
    let at = position_of(&text, "tables<S, HeadDim / 4, T>(Theta)", 1);
    let target = client.request("textDocument/definition", json!({ "textDocument": { "uri": uri }, "position": at }));
    assert!(target["uri"].as_str().unwrap().ends_with("src/rope.linnet"), "{target}");
    let at = position_of(&text, "grouped_attention(\n", 1);
    let target = client.request("textDocument/definition", json!({ "textDocument": { "uri": uri }, "position": at }));
    assert!(target["uri"].as_str().unwrap().ends_with("stdlib/nn/attention.linnet"), "{target}");

    // References of a sub: its declaration and every use.
    let at = position_of(&text, "sub q_proj", 5);
    let found = client.request(
        "textDocument/references",
        json!({ "textDocument": { "uri": uri }, "position": at, "context": { "includeDeclaration": true } }),
    );
    assert!(found.as_array().unwrap().len() >= 2, "{found}");

    // A generic: its declaration and its uses in signatures and bodies.
    let at = position_of(&text, "KvHeads: Dim", 1);
    let found = client.request(
        "textDocument/references",
        json!({ "textDocument": { "uri": uri }, "position": at, "context": { "includeDeclaration": false } }),
    );
    assert!(found.as_array().unwrap().len() >= 12, "{found}");
    // A state's declaration shows its shape.
    let shown = hover(&mut client, &uri, &text, "cache_k: Tensor");
    assert!(shown.contains("[1, 4, 262144, 256] bf16, 512.0 MiB"), "{shown}");

    // A size the card sets shows its value, where it is declared and used.
    let shown = hover(&mut client, &uri, &text, "KvHeads: Dim");
    assert!(shown.contains("KvHeads = 4"), "{shown}");
    let shown = hover(&mut client, &uri, &text, "HeadDim / 4, T>(Theta)");
    assert!(shown.contains("HeadDim = 256"), "{shown}");

    // Outline.
    let symbols = client.request("textDocument/documentSymbol", json!({ "textDocument": { "uri": uri } }));
    assert_eq!(symbols[0]["name"], "GatedAttention");
    assert!(symbols[0]["children"].as_array().unwrap().iter().any(|c| c["name"] == "decode_rows"));

    // Mistakes in unsaved text, each reported at its range; time each change.
    let mut timings = Vec::new();
    let mistakes = [
        (
            "rotate<B, KvHeads, S>(k, cos_table, sin_table)",
            "rotate<B, Heads, S>(k, cos_table, sin_table)",
            "shape-mismatch",
            20,
        ),
        ("[B, S, KvHeads, HeadDim])\n", "[B, S, Heads, HeadDim])\n", "reshape-size", 0),
        (
            "rows<1, HeadDim / 4, T>(at, Theta)",
            "rows<1, HeadDim / 4, T>(reshape(pos, [1]), Theta)",
            "dtype-mismatch",
            24,
        ),
    ];
    for (version, (find, replace, code, within)) in mistakes.iter().enumerate() {
        let changed = text.replacen(find, replace, 1);
        let started = Instant::now();
        client.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version + 2 }, "contentChanges": [{ "text": changed }] }),
        );
        let diagnostics = client.diagnostics_for(&uri);
        timings.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
        assert_eq!(diagnostics[0]["code"], *code);
        let expected_line = position_of(&changed, replace, *within)["line"].clone();
        assert_eq!(diagnostics[0]["range"]["start"]["line"], expected_line, "{diagnostics:?}");
    }
    // A typo's fix is offered as a quick fix to confirm; an unused name's,
    // certain, is preferred. Applied, each leaves the file clean.
    let fixes = [
        ("let v = reshape(v_proj", "let v = reshape(v_prj", "v_proj", false),
        (
            "let v = reshape(v_proj",
            "let v_unread = v_proj.forward(x)\n        let v = reshape(v_proj",
            "_v_unread",
            true,
        ),
    ];
    for (version, (find, replace, fixed, preferred)) in fixes.iter().enumerate() {
        let changed = text.replacen(find, replace, 1);
        client.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version + 5 }, "contentChanges": [{ "text": changed }] }),
        );
        let diagnostics = client.diagnostics_for(&uri);
        assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
        let range = diagnostics[0]["range"].clone();
        let context = json!({ "diagnostics": diagnostics });
        let actions = client.request(
            "textDocument/codeAction",
            json!({ "textDocument": { "uri": uri }, "range": range, "context": context }),
        );
        assert_eq!(actions.as_array().map(Vec::len), Some(1), "{actions}");
        let action = &actions[0];
        assert_eq!(action["kind"], "quickfix");
        assert_eq!(action["isPreferred"], *preferred, "{action}");
        let edit = &action["edit"]["changes"][&uri][0];
        assert_eq!(edit["range"], range, "{action}");
        assert_eq!(edit["newText"], *fixed, "{action}");
    }
    // Half-typed code: no crash, a syntax error.
    let broken = text.replacen("let v = reshape(", "let v = reshape(v_proj.", 1);
    client.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 9 }, "contentChanges": [{ "text": broken }] }),
    );
    assert!(client.diagnostics_for(&uri).iter().any(|d| d["code"] == "syntax-error"));
    client.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 10 }, "contentChanges": [{ "text": text }] }),
    );
    assert!(client.diagnostics_for(&uri).is_empty());
    eprintln!("diagnostics after a change: {:?} ms", timings.iter().map(|t| format!("{t:.1}")).collect::<Vec<_>>());

    // Formatting the file changes nothing; a messy line is fixed.
    let edits = client.request(
        "textDocument/formatting",
        json!({ "textDocument": { "uri": uri }, "options": { "tabSize": 4, "insertSpaces": true } }),
    );
    assert_eq!(edits, json!([]));
    let messy = text.replacen("let (q, gate, k, v) = project<B, S>(x)", "let (q,gate,k,v)=project<B,S>( x )", 1);
    client.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 11 }, "contentChanges": [{ "text": messy }] }),
    );
    let edits = client.request(
        "textDocument/formatting",
        json!({ "textDocument": { "uri": uri }, "options": { "tabSize": 4, "insertSpaces": true } }),
    );
    assert_eq!(edits[0]["newText"].as_str().unwrap(), text);
    // A file with a syntax error is left as it is: no edits at all.
    let gap = messy.replacen("let v = reshape(", "let v = reshape(v_proj.", 1);
    client.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 12 }, "contentChanges": [{ "text": gap }] }),
    );
    client.diagnostics_for(&uri);
    let edits = client.request(
        "textDocument/formatting",
        json!({ "textDocument": { "uri": uri }, "options": { "tabSize": 4, "insertSpaces": true } }),
    );
    assert_eq!(edits, Value::Null);

    client.request("shutdown", Value::Null);
    client.notify("exit", Value::Null);
}

#[test]
fn hover_in_deltanet_shows_shapes() {
    let mut client = Client::start();
    let (uri, text) = file("qwen3.8-27b/src/deltanet.linnet");
    client.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": "linnet", "version": 1, "text": text } }),
    );
    assert!(client.diagnostics_for(&uri).is_empty());
    // A name bound by a tuple pattern shows its own type.
    let shown = hover(&mut client, &uri, &text, "(q, k, v) = heads<B, S>");
    assert!(shown.contains("Tensor[B, S, KeyHeads, KeyDim; T]"), "{shown}");
    let shown = hover(&mut client, &uri, &text, "final = permute");
    assert!(
        shown.contains("Tensor[B, ValueHeads, KeyDim, ValueDim; f32]")
            && shown.contains("[1, 48, 128, 128] f32, 3.0 MiB"),
        "{shown}"
    );
    let shown = hover(&mut client, &uri, &text, "inside[b, s] =");
    assert!(shown.contains("Tensor[B, S; bool]"), "{shown}");
    let shown = hover(&mut client, &uri, &text, "heads<B: Dim");
    assert!(shown.contains("fn heads<B: Dim, S: Dim>(") && shown.contains("split into L2-normalized"), "{shown}");
}

/// A copy of `models/` (the two packages, one depending on the other) in
/// a fresh folder, for edits on disk.
fn models_copy(name: &str) -> PathBuf {
    let target = std::env::temp_dir().join(format!("linnet-lsp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&target);
    let mut stack = vec![(root().join("models"), target.clone())];
    while let Some((from, to)) = stack.pop() {
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(&from).unwrap() {
            let path = entry.unwrap().path();
            let into = to.join(path.file_name().unwrap());
            if path.is_dir() {
                stack.push((path, into));
            } else {
                std::fs::copy(&path, &into).unwrap();
            }
        }
    }
    target
}

/// Thirty keystrokes in a burst are checked once they settle (or when a
/// request needs an answer), and only files whose diagnostics changed are
/// published; a change to `nest.toml` on disk, reported by the editor's
/// file watcher, re-checks the package; a standard-library file opened by
/// navigation is served from the package that read it.
#[test]
fn checks_settle_publish_changes_only_and_follow_files_on_disk() {
    let models = models_copy("settle");
    let package = models.join("qwen3.8-27b");
    let mut client = Client::start();
    let path = package.join("src/attention.linnet");
    let uri = format!("file://{}", path.display());
    let text = std::fs::read_to_string(&path).unwrap();
    client.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": "linnet", "version": 1, "text": text } }),
    );
    assert!(client.diagnostics_for(&uri).is_empty());

    // The first check published every file of the package once.
    client.publications_before_answer("textDocument/documentSymbol", json!({ "textDocument": { "uri": uri } }));
    let typed = "let unused = 1 + undefined_name";
    let anchor = "let v = reshape(";
    for (version, end) in (1..=typed.len()).step_by(typed.len().div_ceil(30)).enumerate() {
        let partial = text.replacen(anchor, &format!("{}\n        {anchor}", &typed[..end]), 1);
        client.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version + 2 }, "contentChanges": [{ "text": partial }] }),
        );
    }
    let published =
        client.publications_before_answer("textDocument/documentSymbol", json!({ "textDocument": { "uri": uri } }));
    assert_eq!(published, 1, "publications for one burst of typing in one file");

    let nest = package.join("nest.toml");
    let card = std::fs::read_to_string(&nest).unwrap();
    std::fs::write(&nest, card.replacen("KvHeads = 4", "KvHeads = 5", 1)).unwrap();
    let nest_uri = format!("file://{}", nest.display());
    client.notify("workspace/didChangeWatchedFiles", json!({ "changes": [{ "uri": nest_uri, "type": 2 }] }));
    let diagnostics = client.diagnostics_for(&nest_uri);
    assert!(diagnostics.iter().any(|d| d["code"] == "unsatisfied-where"), "{diagnostics:?}");

    let stdlib = root().join("stdlib/nn/attention.linnet");
    let stdlib_uri = format!("file://{}", stdlib.display());
    let stdlib_text = std::fs::read_to_string(&stdlib).unwrap();
    client.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": stdlib_uri, "languageId": "linnet", "version": 1, "text": stdlib_text } }),
    );
    let symbols = client.request("textDocument/documentSymbol", json!({ "textDocument": { "uri": stdlib_uri } }));
    assert!(symbols.as_array().is_some_and(|s| s.iter().any(|s| s["name"] == "grouped_attention")), "{symbols}");
    std::fs::remove_dir_all(&models).unwrap();
}

/// The mixture-of-experts package uses the dense one's blocks: hover and
/// go to definition follow its `use` into the other package, and a change
/// to the dependency's file re-checks the package that uses it, which
/// reports what broke where it is used.
#[test]
fn a_dependency_is_followed_and_its_changes_recheck_its_users() {
    let models = models_copy("dependency");
    let mut client = Client::start();
    let lib = models.join("qwen3.6-35b-a3b/src/lib.linnet");
    let lib_uri = format!("file://{}", lib.display());
    let lib_text = std::fs::read_to_string(&lib).unwrap();
    client.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": lib_uri, "languageId": "linnet", "version": 1, "text": lib_text } }),
    );
    assert!(client.diagnostics_for(&lib_uri).is_empty());

    let at = position_of(&lib_text, "LayerGroup<\n", 1);
    let target =
        client.request("textDocument/definition", json!({ "textDocument": { "uri": lib_uri }, "position": at }));
    let dense = models.join("qwen3.8-27b/src/lib.linnet");
    assert_eq!(target["uri"].as_str().unwrap(), format!("file://{}", dense.display()), "{target}");
    let shown = hover(&mut client, &lib_uri, &lib_text, "KvHeads: Dim");
    assert!(shown.contains("KvHeads = 2"), "the MoE card's value: {shown}");

    // Renaming the block in the dependency breaks the import in the user.
    let attention_uri = format!("file://{}", dense.display());
    let attention_text = std::fs::read_to_string(&dense).unwrap();
    let renamed = attention_text.replacen("pub block LayerGroup<", "pub block Group<", 1);
    client.notify("textDocument/didOpen", json!({ "textDocument": { "uri": attention_uri, "languageId": "linnet", "version": 1, "text": attention_text } }));
    client.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": attention_uri, "version": 2 }, "contentChanges": [{ "text": renamed }] }),
    );
    let diagnostics = client.diagnostics_for(&lib_uri);
    assert!(diagnostics.iter().any(|d| d["code"] == "unknown-import"), "{diagnostics:?}");
    client.notify("textDocument/didChange", json!({ "textDocument": { "uri": attention_uri, "version": 3 }, "contentChanges": [{ "text": attention_text }] }));
    assert!(client.diagnostics_for(&lib_uri).is_empty());
    std::fs::remove_dir_all(&models).unwrap();
}

/// Block generics, seen through: in the dense stack, `mlp.forward` on a sub
/// whose block is the generic `F` goes to the signature its bound
/// promises, `F` to its declaration (and its references are its uses, each
/// block's `F` its own), the bound to its trait; the root `type` shows its
/// declaration.
#[test]
fn definitions_see_through_block_generics() {
    let mut client = Client::start();
    let (uri, text) = file("qwen3.8-27b/src/lib.linnet");
    client.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": "linnet", "version": 1, "text": text } }),
    );
    assert!(client.diagnostics_for(&uri).is_empty(), "the package opens clean");
    let definition = |client: &mut Client, needle: &str, within: usize| {
        let at = position_of(&text, needle, within);
        client.request("textDocument/definition", json!({ "textDocument": { "uri": uri }, "position": at }))
    };
    let target = definition(&mut client, "mlp.forward(post_attention_layernorm", 5);
    assert!(target["uri"].as_str().unwrap().ends_with("stdlib/nn/mlp.linnet"), "{target}");
    let target = definition(&mut client, "sub mlp: F", 9);
    let declared = position_of(&text, "F: FeedForward<H, T>,", 0);
    assert_eq!(target["range"]["start"], declared, "{target}");
    let target = definition(&mut client, "F: FeedForward<H, T>,", 4);
    assert!(target["uri"].as_str().unwrap().ends_with("stdlib/nn/mlp.linnet"), "{target}");
    let found = client.request(
        "textDocument/references",
        json!({ "textDocument": { "uri": uri }, "position": declared, "context": { "includeDeclaration": false } }),
    );
    assert_eq!(found.as_array().unwrap().len(), 1, "`DeltaLayer`'s `F` is used by `sub mlp` alone: {found}");
    let group = text.find("pub block LayerGroup<").unwrap();
    let group_generic = &text[..group + text[group..].find("F: FeedForward").unwrap()];
    let at = json!({ "line": group_generic.matches('\n').count(), "character": 4 });
    let found = client.request(
        "textDocument/references",
        json!({ "textDocument": { "uri": uri }, "position": at, "context": { "includeDeclaration": false } }),
    );
    assert_eq!(found.as_array().unwrap().len(), 2, "`LayerGroup`'s `F`, given to both kinds of layer: {found}");
    let target = definition(&mut client, "SwiGlu<H, Inner, T>\n    >", 1);
    assert!(target["uri"].as_str().unwrap().ends_with("stdlib/nn/mlp.linnet"), "{target}");
    let shown = hover(&mut client, &uri, &text, "Model<\n");
    assert!(shown.contains("pub type Model<") && shown.contains("= Decoder<"), "{shown}");
}
