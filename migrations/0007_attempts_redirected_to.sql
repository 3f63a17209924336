-- Where a 307 or 308 sent a callback (NULL: it was not redirected), so that the attempt
-- history shows it. Nullable without a default: adding it rewrites no rows.
ALTER TABLE attempts ADD COLUMN redirected_to text;
