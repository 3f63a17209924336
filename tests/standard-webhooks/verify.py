"""Verifies requests with the Standard Webhooks specification's own Python library (PyPI's
`standardwebhooks`, which tests/setup.sh installs into target/standard-webhooks-venv).

Reads a JSON list of cases, {"name", "secret", "body", "headers"}, on stdin and prints
{"<name>": true | false} on stdout: whether the library accepts the request.
"""

import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

results = {}
for case in json.load(sys.stdin):
    try:
        Webhook(case["secret"]).verify(case["body"].encode(), case["headers"])
        results[case["name"]] = True
    except WebhookVerificationError:
        results[case["name"]] = False
json.dump(results, sys.stdout)
