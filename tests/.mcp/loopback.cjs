// Preloaded into a Node MCP server the tests start (node --require loopback.cjs): a server that
// listens on a bare port is made to listen on 127.0.0.1 only, and its bound port is printed as
// "LISTENING <port>" on stderr, so a test can start it on port 0 and wait for its word.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const bare = (typeof args[0] === "number" || typeof args[0] === "string") &&
    (args.length === 1 || typeof args[1] === "function");
  if (bare) args.splice(1, 0, "127.0.0.1");
  this.once("listening", () => process.stderr.write(`LISTENING ${this.address().port}\n`));
  return listen.apply(this, args);
};
