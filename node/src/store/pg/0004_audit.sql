-- lockd PostgreSQL schema, version 4: reading the force-revoke audit log newest first
-- (AdminService.ListRevocations). Applied once by PgLockStore::migrate after version 2; never
-- edit it, add a version.
--
-- The log's order is new_token_floor (drawn from fencing_token_seq, so unique, and higher for a
-- later revoke of a key); pages continue below the last floor they answered, and the store keeps
-- the newest lock_api::limits::AUDIT_LOG_MAX rows (pg/audit.rs).
CREATE INDEX lock_revocation_floor_idx ON lock_revocation (new_token_floor);
CREATE INDEX lock_revocation_key_floor_idx ON lock_revocation (lock_key, new_token_floor);
