-- privmatch: hand-written schema of one party, part 2 of 3: the iris modality (share types,
-- enrolled templates). Runs after sql/common.sql.

-- ---------------------------------------------------------------------------------------------
-- Share types. Payload layout and text form: see core/src/wire/storage.rs. Both are fixed and
-- versioned; every input path (text, binary recv, typmod coercion) re-validates. The C
-- functions are in extension/src/iris/types.rs.
-- ---------------------------------------------------------------------------------------------
CREATE TYPE privmatch.iris_code_share;
CREATE FUNCTION privmatch.iris_code_share_in(cstring, oid, integer) RETURNS privmatch.iris_code_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_in';
CREATE FUNCTION privmatch.iris_code_share_out(privmatch.iris_code_share) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_out';
CREATE FUNCTION privmatch.iris_code_share_recv(internal, oid, integer) RETURNS privmatch.iris_code_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_recv';
CREATE FUNCTION privmatch.iris_code_share_send(privmatch.iris_code_share) RETURNS bytea
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_send';
CREATE FUNCTION privmatch.iris_code_share_typmod_in(cstring[]) RETURNS integer
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_typmod_in';
CREATE FUNCTION privmatch.iris_code_share_typmod_out(integer) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_typmod_out';
CREATE TYPE privmatch.iris_code_share (
    INPUT = privmatch.iris_code_share_in,
    OUTPUT = privmatch.iris_code_share_out,
    RECEIVE = privmatch.iris_code_share_recv,
    SEND = privmatch.iris_code_share_send,
    TYPMOD_IN = privmatch.iris_code_share_typmod_in,
    TYPMOD_OUT = privmatch.iris_code_share_typmod_out,
    INTERNALLENGTH = VARIABLE,
    ALIGNMENT = int4,
    STORAGE = external
);
CREATE FUNCTION privmatch.iris_code_share(privmatch.iris_code_share, integer, boolean)
    RETURNS privmatch.iris_code_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_code_share_apply_typmod';
CREATE CAST (privmatch.iris_code_share AS privmatch.iris_code_share)
    WITH FUNCTION privmatch.iris_code_share(privmatch.iris_code_share, integer, boolean) AS IMPLICIT;
COMMENT ON TYPE privmatch.iris_code_share IS
    'One party''s degree-1 Shamir share over GR(2^16,4) of an encoded iris code (mask - 2*(code AND mask)); length = number of Z_2^16 coefficients';

CREATE TYPE privmatch.iris_mask_share;
CREATE FUNCTION privmatch.iris_mask_share_in(cstring, oid, integer) RETURNS privmatch.iris_mask_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_in';
CREATE FUNCTION privmatch.iris_mask_share_out(privmatch.iris_mask_share) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_out';
CREATE FUNCTION privmatch.iris_mask_share_recv(internal, oid, integer) RETURNS privmatch.iris_mask_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_recv';
CREATE FUNCTION privmatch.iris_mask_share_send(privmatch.iris_mask_share) RETURNS bytea
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_send';
CREATE FUNCTION privmatch.iris_mask_share_typmod_in(cstring[]) RETURNS integer
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_typmod_in';
CREATE FUNCTION privmatch.iris_mask_share_typmod_out(integer) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_typmod_out';
CREATE TYPE privmatch.iris_mask_share (
    INPUT = privmatch.iris_mask_share_in,
    OUTPUT = privmatch.iris_mask_share_out,
    RECEIVE = privmatch.iris_mask_share_recv,
    SEND = privmatch.iris_mask_share_send,
    TYPMOD_IN = privmatch.iris_mask_share_typmod_in,
    TYPMOD_OUT = privmatch.iris_mask_share_typmod_out,
    INTERNALLENGTH = VARIABLE,
    ALIGNMENT = int4,
    STORAGE = external
);
CREATE FUNCTION privmatch.iris_mask_share(privmatch.iris_mask_share, integer, boolean)
    RETURNS privmatch.iris_mask_share
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'iris_mask_share_apply_typmod';
CREATE CAST (privmatch.iris_mask_share AS privmatch.iris_mask_share)
    WITH FUNCTION privmatch.iris_mask_share(privmatch.iris_mask_share, integer, boolean) AS IMPLICIT;
COMMENT ON TYPE privmatch.iris_mask_share IS
    'One party''s degree-1 Shamir share over GR(2^16,4) of an iris mask (real parts only); length = number of Z_2^16 coefficients';

CREATE TYPE privmatch.eye AS ENUM ('left', 'right');

-- ---------------------------------------------------------------------------------------------
-- Enrolled iris templates (this party's shares). Source of truth for the matching engine.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE privmatch.iris_templates (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject     text NOT NULL CHECK (length(subject) BETWEEN 1 AND 256),
    eye         privmatch.eye NOT NULL,
    code_share  privmatch.iris_code_share(12800) NOT NULL,
    mask_share  privmatch.iris_mask_share(6400) NOT NULL,
    enrolled_at timestamptz NOT NULL DEFAULT now(),
    -- What the three parties agreed at enrolment: SHA-256 over the hashes of the record's
    -- three sealed envelopes (core/src/iris/binding.rs); the set digest of every search
    -- commits to it. Rows from before 0.11.0 carry the legacy id derived from subject and
    -- eye (not bound until re-enrolled).
    enrolment_id bytea NOT NULL CHECK (length(enrolment_id) = 32),
    CONSTRAINT iris_templates_subject_eye_key UNIQUE (subject, eye)
);

-- Iris search sessions started at this party: a session id is single-use, and this table is
-- what makes that survive a restart of the party (the engine's memory of used ids does not).
-- A row is kept for twice the lifetime of a sealed probe (core/src/iris/probe.rs,
-- PROBE_LIFETIME_SECS), after which any probe of that session is refused as stale anyway.
CREATE TABLE privmatch.iris_used_sessions (
    session bytea PRIMARY KEY CHECK (length(session) = 16),
    used_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX iris_used_sessions_used_at ON privmatch.iris_used_sessions (used_at);

-- The iris threshold policy of this party (at most one row; none = the install default,
-- τ = 0.345): every search must use threshold τ = threshold_num / 10,000, whoever calls
-- iris_search_start. Written only by iris_set_policy, an operator-signed command
-- (extension/src/iris/policy.rs). Dumped with the templates, so a restored party keeps it.
CREATE TABLE privmatch.iris_policy (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    threshold_num integer NOT NULL CHECK (threshold_num BETWEEN 1 AND 5000),
    set_at        timestamptz NOT NULL DEFAULT now()
);
