-- lockd PostgreSQL schema, version 1 (C2 §2.5). Applied once by PgLockStore::migrate.

-- One global sequence: a token is unique per grant, so (lock_key, fencing_token) pins a grant.
CREATE SEQUENCE fencing_token_seq AS bigint START WITH 1 MINVALUE 1 NO CYCLE;

-- Sessions: the liveness unit grants hang off (FR-04).
CREATE TABLE lock_session (
    session_id  text        PRIMARY KEY,
    owner_id    text        NOT NULL,
    ttl_ms      bigint      NOT NULL CHECK (ttl_ms > 0),
    expires_at  timestamptz NOT NULL
);

-- At most one grant per key; deleting a session deletes its grants.
CREATE TABLE lock_entry (
    lock_key      text        PRIMARY KEY,
    owner_id      text        NOT NULL,
    session_id    text        NOT NULL REFERENCES lock_session (session_id) ON DELETE CASCADE,
    fencing_token bigint      NOT NULL UNIQUE CHECK (fencing_token > 0),
    ttl_ms        bigint      NOT NULL CHECK (ttl_ms > 0),
    acquired_at   timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL
);
-- The reaper's scan.
CREATE INDEX lock_entry_expiry_idx ON lock_entry (expires_at);
-- The session cascade and locks_of.
CREATE INDEX lock_entry_session_idx ON lock_entry (session_id);

-- The audit trail of force-revokes (FR-08, FR-30).
CREATE TABLE lock_revocation (
    revocation_id     bigserial   PRIMARY KEY,
    lock_key          text        NOT NULL,
    operator          text        NOT NULL,
    reason            text        NOT NULL,
    previous_owner_id text,
    previous_token    bigint,
    new_token_floor   bigint      NOT NULL,
    revoked_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lock_revocation_key_idx ON lock_revocation (lock_key);
