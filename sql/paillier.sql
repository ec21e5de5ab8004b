-- privmatch: hand-written schema of one party, the packed Paillier modality (device-held face
-- templates, Game-Set-MATCH, Agrawal et al., CCS 2020). Only the service provider (the party
-- named by privmatch.paillier_sp_party, P0 by default) fills these tables. Runs after
-- sql/common.sql. Design: docs/protocols/paillier.md.

-- ---------------------------------------------------------------------------------------------
-- The signed template record (σ of [ABMR20] §6.1): device id, parameters, Paillier public key,
-- packed ciphertexts, expiry and the SP's Ed25519 signature. Layout: core/src/paillier/record.rs;
-- text form: hex. The C functions are in extension/src/paillier/types.rs.
-- ---------------------------------------------------------------------------------------------
CREATE TYPE privmatch.paillier_template;
CREATE FUNCTION privmatch.paillier_template_in(cstring, oid, integer) RETURNS privmatch.paillier_template
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'paillier_template_in';
CREATE FUNCTION privmatch.paillier_template_out(privmatch.paillier_template) RETURNS cstring
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'paillier_template_out';
CREATE FUNCTION privmatch.paillier_template_recv(internal, oid, integer) RETURNS privmatch.paillier_template
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'paillier_template_recv';
CREATE FUNCTION privmatch.paillier_template_send(privmatch.paillier_template) RETURNS bytea
    IMMUTABLE STRICT PARALLEL SAFE LANGUAGE c AS 'MODULE_PATHNAME', 'paillier_template_send';
CREATE TYPE privmatch.paillier_template (
    INPUT = privmatch.paillier_template_in,
    OUTPUT = privmatch.paillier_template_out,
    RECEIVE = privmatch.paillier_template_recv,
    SEND = privmatch.paillier_template_send,
    INTERNALLENGTH = VARIABLE,
    ALIGNMENT = int4,
    STORAGE = external
);
COMMENT ON TYPE privmatch.paillier_template IS
    'A device''s packed Paillier-encrypted face template, signed by the service provider';

-- The service provider's public material: the public half of its Ed25519 signing key (the
-- seed is in the party's key file) and the ring-Pedersen parameters devices prove their key in.
CREATE TABLE privmatch.paillier_service (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    signing_public bytea   NOT NULL CHECK (length(signing_public) = 32),
    ring_pedersen  bytea   NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- The parameters (canonical encoding of core's Params) the SP enrols under, one set per
-- protocol (1 = Π1, 2 = Π2, 3 = Π3), and how long a new record is valid.
CREATE TABLE privmatch.paillier_params (
    protocol   smallint PRIMARY KEY CHECK (protocol BETWEEN 1 AND 3),
    params     bytea    NOT NULL,
    valid_days integer  NOT NULL CHECK (valid_days BETWEEN 1 AND 3650),
    set_at     timestamptz NOT NULL DEFAULT now()
);

-- Enrolled devices: one signed record each (protocol and expiry repeated from it for listing).
CREATE TABLE privmatch.paillier_devices (
    device_id   text     PRIMARY KEY CHECK (length(device_id) BETWEEN 1 AND 64),
    protocol    smallint NOT NULL CHECK (protocol BETWEEN 1 AND 3),
    record      privmatch.paillier_template NOT NULL,
    expires_at  timestamptz NOT NULL,
    enrolled_at timestamptz NOT NULL DEFAULT now()
);

-- Enrolments between their two calls: the SP's state (core's ServiceEnrolment::to_bytes; its
-- seed gives the norm challenge's secret α, so no role but the owner reads it). Rows older than
-- 10 minutes are refused and swept. UNLOGGED: the seed is in no WAL record, physical backup
-- or replica; a crash empties the table and the device enrols again (a pending enrolment is
-- minutes old at most).
CREATE UNLOGGED TABLE privmatch.paillier_pending (
    device_id  text  PRIMARY KEY CHECK (length(device_id) BETWEEN 1 AND 64),
    state      bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX paillier_pending_created ON privmatch.paillier_pending (created_at);

-- Π2 and Π3 sessions between the terminal's rounds, which the SP runs for the terminal: the
-- terminal's state after its Round 2 (Π2: threshold, a, b; Π3: threshold, a, b, pad, the OT
-- session id) or, in Π3, after its Round 4 (the two labels of each output wire), core's
-- Pi2Terminal/Pi3Terminal::suspend bytes, under the 16-byte session id of the terminal's sealed
-- input. Secret (a and b are what stop a cheating device from shifting its answer): no role
-- but the owner reads it, it is not dumped, and it is UNLOGGED, so the secrets are in no WAL
-- record or replica (a crash drops running sessions; their terminals start again). The
-- terminal's last round deletes the row; rows older than 10 minutes are refused and swept.
CREATE UNLOGGED TABLE privmatch.paillier_sessions (
    session    bytea    PRIMARY KEY CHECK (length(session) = 16),
    device_id  text     NOT NULL CHECK (length(device_id) BETWEEN 1 AND 64),
    protocol   smallint NOT NULL CHECK (protocol IN (2, 3)),
    stage      smallint NOT NULL CHECK (stage = 2 OR (protocol = 3 AND stage = 4)),
    state      bytea    NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX paillier_sessions_created ON privmatch.paillier_sessions (created_at);
CREATE INDEX paillier_sessions_device ON privmatch.paillier_sessions (device_id);

-- The session policy per protocol (issue 34 item 10; extension/src/paillier/policy.rs): the one
-- threshold every session compares with (a terminal cannot choose another) and the sessions
-- allowed per device and per terminal per hour. Set by the SP's operator with
-- privmatch.paillier_set_policy(); without a policy no session of the protocol opens (55000).
CREATE TABLE privmatch.paillier_policy (
    protocol                   smallint PRIMARY KEY CHECK (protocol BETWEEN 1 AND 3),
    threshold                  bigint   NOT NULL,
    device_sessions_per_hour   integer  NOT NULL CHECK (device_sessions_per_hour >= 0),
    terminal_sessions_per_hour integer  NOT NULL CHECK (terminal_sessions_per_hour >= 0),
    set_at                     timestamptz NOT NULL DEFAULT now()
);

-- Every matching session the SP opened (privmatch.paillier_session_open): its id (the
-- terminal's, from its sealed input; never reused), device, protocol, the terminal as the
-- coordinator named it, the transaction that opened it (a Round 2 is refused in that same
-- transaction, so the budget charge commits first) and when its one Round 2 was given. Not
-- secret; logged, so a restart forgets nothing. Rows older than a day are swept.
CREATE TABLE privmatch.paillier_session_log (
    session     bytea    PRIMARY KEY CHECK (length(session) = 16),
    device_id   text     NOT NULL CHECK (length(device_id) BETWEEN 1 AND 64),
    protocol    smallint NOT NULL CHECK (protocol BETWEEN 1 AND 3),
    terminal    text     NOT NULL CHECK (length(terminal) BETWEEN 1 AND 128),
    opened_xact bigint   NOT NULL,
    opened_at   timestamptz NOT NULL DEFAULT now(),
    round2_at   timestamptz
);
CREATE INDEX paillier_session_log_opened ON privmatch.paillier_session_log (opened_at);

-- Sessions used per device and per terminal in each hour (the budgets of paillier_policy);
-- refused past the limit with 53400. Logged: budgets survive restarts.
CREATE TABLE privmatch.paillier_budget_use (
    kind text        NOT NULL CHECK (kind IN ('device', 'terminal')),
    key  text        NOT NULL,
    hour timestamptz NOT NULL,
    used integer     NOT NULL,
    PRIMARY KEY (kind, key, hour)
);
