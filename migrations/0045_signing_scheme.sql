-- A biz type's signing scheme: how its callbacks and failure notices are signed.
-- `chime`: chime's own `Chime-Signature: t=<t>,v1=<hex>` (what every biz type did before).
-- `standard-webhooks`: the Standard Webhooks headers `webhook-id`, `webhook-timestamp` and
-- `webhook-signature: v1,<base64>`, keyed by the bytes of a `whsec_<base64>` secret.
--
-- Expand only: a column with a constant default (no rewrite; a brief ACCESS EXCLUSIVE lock
-- on biz_types for the catalog change, and a scan of its few rows for the CHECK). The
-- previous release neither reads nor writes it: its nodes sign every biz type with chime's
-- scheme, so a biz type is switched once every node runs this release.
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS signing_scheme text NOT NULL DEFAULT 'chime'
    CHECK (signing_scheme IN ('chime', 'standard-webhooks'));
