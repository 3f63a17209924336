// Verifies requests with the Standard Webhooks specification's own JavaScript library
// (npm's `standardwebhooks`, which tests/setup.sh installs into target/standard-webhooks).
//
// node verify.js <the package's directory>: reads a JSON list of cases, {"name", "secret",
// "body", "headers"}, on stdin and prints {"<name>": true | false} on stdout: whether the
// library accepts the request.
"use strict";
const { Webhook, WebhookVerificationError } = require(process.argv[2]);

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const results = {};
  for (const c of JSON.parse(input)) {
    try {
      new Webhook(c.secret).verify(c.body, c.headers);
      results[c.name] = true;
    } catch (e) {
      if (!(e instanceof WebhookVerificationError)) throw e;
      results[c.name] = false;
    }
  }
  process.stdout.write(JSON.stringify(results));
});
