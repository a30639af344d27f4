-- lockd PostgreSQL schema, version 2: the waiter queues and the request memory that
-- lock_api::RequestStore needs (docs/DESIGN.md D-wait, D-idempotency). Applied once by
-- PgLockStore::migrate after version 1; never edit it, add a version.
--
-- Request ids are u64 on the wire and stored "biased" (the id XOR 2^63, as a bigint), so that
-- SQL's signed order is the ids' unsigned order (store/pg.rs `request_id_sql`).

-- The highest request id of the session whose answer the reaper has forgotten: a request at or
-- below it that is not remembered may be a retry whose outcome can no longer be told, so it is
-- answered "unknown outcome" instead of being guessed at (lock_api::request_store).
ALTER TABLE lock_session
    ADD COLUMN request_floor bigint NOT NULL DEFAULT -9223372036854775808;

-- One queue per key, FIFO by arrival: waiter_id is drawn when the acquire reaches the database,
-- under the key's advisory lock, so id order is arrival order on that key.
CREATE TABLE lock_waiter (
    waiter_id   bigserial   PRIMARY KEY,
    lock_key    text        NOT NULL,
    session_id  text        NOT NULL REFERENCES lock_session (session_id) ON DELETE CASCADE,
    request_id  bigint      NOT NULL,
    ttl_ms      bigint      NOT NULL CHECK (ttl_ms > 0),
    -- Past it the waiter is dropped, never granted; a waiter whose deadline equals now() is
    -- still live (as on Raft).
    deadline    timestamptz NOT NULL,
    queued_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, request_id),
    -- A session waits at most once per key (as on Raft).
    UNIQUE (lock_key, session_id)
);
-- The hand-off's "first waiter of the key" and waiter_count.
CREATE INDEX lock_waiter_key_idx ON lock_waiter (lock_key, waiter_id);
-- The reaper's scan of lapsed waits.
CREATE INDEX lock_waiter_deadline_idx ON lock_waiter (deadline);

-- Every request's answer, written in the transaction of its effect, so a retry finds it.
--   kind 'acquire': state 'granted' (fencing_token, ttl_ms, grant_expires_at of the grant),
--                   'queued' (a lock_waiter row exists), 'not_granted', or 'cancelled' (a
--                   tombstone: the cancel came first, so the acquire does nothing).
--   kind 'release': state 'released' or 'not_released'.
-- cancel is the answer of a cancel_request of the same id, returned again on its retry.
CREATE TABLE lock_request (
    session_id       text        NOT NULL REFERENCES lock_session (session_id) ON DELETE CASCADE,
    request_id       bigint      NOT NULL,
    kind             text        NOT NULL CHECK (kind IN ('acquire', 'release')),
    lock_key         text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('granted', 'queued', 'not_granted',
                                                           'cancelled', 'released',
                                                           'not_released')),
    fencing_token    bigint,
    ttl_ms           bigint,
    grant_expires_at timestamptz,
    cancel           text        CHECK (cancel IN ('withdrawn', 'kept', 'released', 'nothing')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, request_id),
    CHECK (state <> 'granted' OR (fencing_token IS NOT NULL AND ttl_ms IS NOT NULL
                                  AND grant_expires_at IS NOT NULL))
);
-- The reaper's scan of answers past lock_api::limits::REQUEST_RETENTION.
CREATE INDEX lock_request_created_idx ON lock_request (created_at);

-- Revoke dedup by (key, operator, request_id) within lock_api::limits::REVOKE_RETRY_WINDOW;
-- NULL for a revoke without a request id (never deduplicated).
ALTER TABLE lock_revocation ADD COLUMN request_id bigint;
CREATE INDEX lock_revocation_request_idx ON lock_revocation (lock_key, operator, request_id)
    WHERE request_id IS NOT NULL;
