-- lockd PostgreSQL schema, version 3: sessions bound to principals (docs/SECURITY.md §3).
-- The principal that opened a session, NULL for a session opened on an --insecure node
-- (unbound). Written with the row and never updated; the node refuses every call presenting
-- the session from another principal. Existing sessions stay unbound.
ALTER TABLE lock_session ADD COLUMN principal text;
