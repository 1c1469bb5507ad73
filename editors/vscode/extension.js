// Starts `linnetc lsp` for .linnet files.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const command = vscode.workspace.getConfiguration("linnet").get("server.path", "linnetc");
  const server = { command, args: ["lsp"] };
  client = new LanguageClient(
    "linnet",
    "Linnet",
    { run: server, debug: server },
    { documentSelector: [{ scheme: "file", language: "linnet" }] }
  );
  context.subscriptions.push({ dispose: () => client && client.stop() });
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
