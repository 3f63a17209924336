-- Signing secrets encrypted at rest (CHIME_SECRET_KEY, src/biz_types/secrets.rs). A sealed
-- secret goes in a column of its own, `enc:v1:<key id>:<base64 nonce and ciphertext>`, and
-- the clear column is then NULL: a node of the previous release, which reads only
-- `signing_secret`, fails on such a row instead of signing callbacks with the ciphertext.
-- A row written in clear (no key, or by the previous release) keeps `signing_secret`, which
-- wins over a sealed value left beside it. Each statement takes a brief ACCESS EXCLUSIVE lock
-- on biz_types (a few rows): the nullable column and dropping NOT NULL rewrite nothing, the
-- CHECK reads the rows once. The previous release's writes always set `signing_secret`, so
-- the CHECK never refuses them.
ALTER TABLE biz_types ADD COLUMN signing_secret_sealed text;
ALTER TABLE biz_types ALTER COLUMN signing_secret DROP NOT NULL;
ALTER TABLE biz_types ADD CONSTRAINT biz_types_signing_secret_present
    CHECK (signing_secret IS NOT NULL OR signing_secret_sealed IS NOT NULL);
