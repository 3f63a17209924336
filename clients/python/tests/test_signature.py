import json
import os
import unittest

from chime_client import verify_signature, verify_webhook

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "signature-vectors.json")


class SignatureVectors(unittest.TestCase):
    """The vectors the server's signing is tested on too (src/engine/deliver.rs)."""

    def test_every_vector(self):
        with open(VECTORS, encoding="utf-8") as f:
            vectors = json.load(f)
        self.assertGreater(len(vectors["verify"]), 20)
        for case in vectors["verify"]:
            with self.subTest(case["name"]):
                got = verify_signature(case["body"].encode(), case["header"], case["secrets"],
                                       tolerance=case["tolerance"], now=case["now"])
                self.assertIs(got, case["expected"])

    def test_the_servers_headers_verify(self):
        with open(VECTORS, encoding="utf-8") as f:
            vectors = json.load(f)
        for v in vectors["signatures"]:
            with self.subTest(v["name"]):
                self.assertTrue(verify_signature(v["body"].encode(), v["header"], [v["secret"]], now=v["t"]))

    def test_every_standard_webhooks_vector(self):
        with open(VECTORS, encoding="utf-8") as f:
            vectors = json.load(f)["standard_webhooks"]
        self.assertGreater(len(vectors["verify"]), 20)
        for case in vectors["verify"]:
            with self.subTest(case["name"]):
                got = verify_webhook(case["body"].encode(), case["headers"], case["secrets"],
                                     tolerance=case["tolerance"], now=case["now"])
                self.assertIs(got, case["expected"])
        for v in vectors["signatures"]:
            with self.subTest(v["name"]):
                headers = {"webhook-id": v["id"], "webhook-timestamp": str(v["t"]), "webhook-signature": v["signature"]}
                self.assertTrue(verify_webhook(v["body"], headers, v["secret"], now=v["t"]))

    def test_odd_arguments_are_refused_not_raised(self):
        self.assertFalse(verify_signature(b"{}", None, ["s"]))
        self.assertFalse(verify_signature(b"{}", "t=1,v1=" + "0" * 64, [None, ""], now=1))
        self.assertFalse(verify_webhook(b"{}", {"webhook-signature": "v1,x", "webhook-id": "m", "webhook-timestamp": "1"}, [None, ""], now=1))


if __name__ == "__main__":
    unittest.main()
